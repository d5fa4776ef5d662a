"""The data of ``tokentape report``: a run drawn from its step log, its plan and its loss log.

Everything is computed from the plan in closed form and from the logs in one pass each: the
timeline (batch shapes, resumes, plan changes, phases, excisions), the mixture (planned against
realised shares, counted with the blend's prefix counts, never by resolving the run's
positions), repetition (passes per source, and the documents trained most), the loss (overall
and per source) with spikes flagged by a stated rule, each with its top documents as
``tokentape replay`` gives them. The result is a JSON-ready dict (``--json``); the HTML page
(``render.report``) draws exactly that dict, so every number on the page is one of it.

Series longer than ``MAX_POINTS`` are downsampled by the rule in ``DOWNSAMPLING``.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokentape._src.audit.losschild import LossReader
from tokentape._src.audit.losslog import LossLog, place_lines
from tokentape._src.audit.replay import preview, replay, top_documents
from tokentape._src.audit.runinfo import plan_json
from tokentape._src.audit.runs import open_step_log
from tokentape._src.objects.client import is_url
from tokentape._src.objects.whole import local_copy
from tokentape._src.plan.plan import Plan
from tokentape._src.tape.excise import draws_at, kept_counts
from tokentape._src.tape.resolve import Tape
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import hash_dtype
from tokentape._src.train.schedule import Schedule
from tokentape._src.train.steplog import LineTrace, StepLog, short_hash
from tokentape.errors import ArgumentError, InputError

REPORT_VERSION = 1
MAX_POINTS = 2000
"""The most points a drawn series has."""
STRETCHES = 400
"""The mixture over the run is counted in at most this many stretches of whole steps."""
SPIKE_WINDOW = 51
MAX_SPIKE_WINDOW = 1001
SPIKE_Z = 6.0
"""About 5 steps in 10**6 of Gaussian noise score this high with a window of 51."""
SHOWN_SPIKES = 12
"""Flagged steps listed with their documents (the highest scores; all are counted)."""
SPIKE_DOCS = 5
TOP_DOCS = 10
MAX_CANDIDATES = 4096
"""The longest documents per source whose exposure is counted exactly (see ``_most_trained``)."""
MAD_TO_SIGMA = 1.4826

DOWNSAMPLING = (
    f"A series of more than {MAX_POINTS:,} steps is cut into {MAX_POINTS:,} buckets of equal "
    "step width: the line is each bucket's mean, the band its min and max; flagged steps are "
    "drawn at their exact step."
)


@dataclass(frozen=True)
class ReportConfig:
    """How the report flags spikes and how much it lists."""

    spike_window: int = SPIKE_WINDOW
    """Logged steps in the centred window of the robust z-score (odd, >= 5)."""
    spike_z: float = SPIKE_Z
    """A step is flagged when its robust z-score is at least this."""
    top: int = TOP_DOCS
    """Documents listed as the most trained."""

    def __post_init__(self) -> None:
        w = self.spike_window
        if type(w) is not int or w < 5 or w % 2 == 0 or w > MAX_SPIKE_WINDOW:
            raise ArgumentError(
                f"spike window must be an odd integer in [5, {MAX_SPIKE_WINDOW}], got {w!r}"
            )
        z = self.spike_z
        if type(z) not in (int, float) or not math.isfinite(z) or z <= 0:
            raise ArgumentError(f"spike z must be a positive number, got {z!r}")
        if type(self.top) is not int or not 1 <= self.top <= 1000:
            raise ArgumentError(f"top must be an integer in [1, 1000], got {self.top!r}")

    @property
    def spike_rule(self) -> str:
        return (
            f"A logged step is flagged when its robust z-score is at least {self.spike_z:g}: "
            f"z = (loss − m) / s, m the median of the {self.spike_window} logged steps centred "
            "on it (near the ends, as many on each side as there are), s the noise of the "
            "same stretch: 1.4826 · MAD / √2 of its step-to-step changes (a steady trend does "
            "not count as noise), at least 10⁻⁴ · |m|. The first two and last two logged steps "
            "are never flagged. Only rises are flagged; a NaN or infinite loss is listed apart."
        )


def _local(path: str, what: str) -> str:
    """``path``, or for an object URL a local copy of the object."""
    if not is_url(path):
        return path
    try:
        return str(local_copy(path))
    except FileNotFoundError:
        raise InputError(f"{what} '{path}': no such object") from None


def run_report(
    plan: Plan,
    plan_path: str,
    log_path: str,
    loss_path: str | None = None,
    config: ReportConfig | None = None,
) -> dict[str, Any]:
    """The report of the run whose step log is ``log_path`` under ``plan`` (the plan it ended
    under, ``plan_path`` as the caller named it), with the loss log ``loss_path`` when given."""
    config = config or ReportConfig()
    names = [s.name for s in plan.sources]
    # A big loss log is read in a second process while this one reads the step log.
    loss_file = None if loss_path is None else _local(loss_path, "loss log")
    reader = None if loss_file is None else LossReader(loss_file, names)
    losses: LossLog | None = None
    try:
        log = open_step_log(log_path, plan, trace=True)
        if reader is not None and loss_file is not None:
            losses = place_lines(loss_file, reader.lines(), log.steps)
    finally:
        if reader is not None:
            reader.close()
    tape = plan.tape()
    batcher = Batcher(plan, hash_dtype(plan))
    run = _Run(plan, tape, log, batcher, config, plan_path, log_path)
    data: dict[str, Any] = finite_json(
        {
            "kind": "report",
            "version": REPORT_VERSION,
            "identity": plan_json(plan_path, plan),
            "run": run.summary(loss_path, losses),
            "timeline": run.timeline(),
            "mixture": run.mixture(),
            "repetition": run.repetition(),
            "loss": None if losses is None else run.loss(losses),
            "commands": run.commands(loss_path),
            "rules": {"downsampling": DOWNSAMPLING, "spikes": config.spike_rule},
        }
    )
    return data


def finite_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (strict JSON has none)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_json(v) for v in value]
    return value


class _Run:
    """One report's inputs, and a method per section."""

    def __init__(
        self,
        plan: Plan,
        tape: Tape,
        log: StepLog,
        batcher: Batcher,
        config: ReportConfig,
        plan_path: str,
        log_path: str,
    ) -> None:
        self.plan, self.tape, self.log, self.batcher = plan, tape, log, batcher
        self.config, self.plan_path, self.log_path = config, plan_path, log_path
        self.schedule: Schedule = log.schedule
        self.steps, self.consumed = log.steps, log.end
        self.names = [s.name for s in plan.sources]
        self.base_end = int(self._base([self.consumed])[0])  # base positions the run reached

    # --- positions -------------------------------------------------------------------------

    def _base(self, limits: Any) -> np.ndarray:
        """Base positions below which lie exactly the tape's positions below each limit."""
        n = np.asarray(limits, dtype=np.int64)
        x = self.tape.excision
        if x is None:
            return n
        return np.where(n > 0, x.to_base(np.maximum(n - 1, 0)) + 1, 0)

    def _step_of_base(self, base: int) -> int:
        """The step holding base position ``base`` (the run's steps when it lies beyond)."""
        x = self.tape.excision
        new = int(x.to_new(np.asarray([base]))[0][0]) if x is not None else base
        if new >= self.consumed:
            return self.steps
        return int(self.schedule.place(np.asarray([new])).step[0])

    def _step_of(self, position: int) -> int:
        if position >= self.consumed:
            return self.steps
        return int(self.schedule.place(np.asarray([position])).step[0])

    def _planned(self, base_limits: np.ndarray) -> np.ndarray:
        """(sources, len): the samples each source should have drawn below each base limit,
        by the phases' weights (fractions of a sample)."""
        b = np.asarray(base_limits, dtype=np.float64)
        out = np.zeros((len(self.names), b.size))
        spans = self.plan.phase_spans
        for (lo, hi), units, den in zip(
            spans, self.plan.phase_units, self.plan.phase_denominators, strict=True
        ):
            end = math.inf if (lo, hi) == spans[-1] else hi  # the last phase runs on
            inside = np.clip(np.minimum(b, end) - lo, 0, None)
            out += np.outer(np.asarray(units, dtype=np.float64) / den, inside)
        return out

    # --- sections --------------------------------------------------------------------------

    def summary(self, loss_path: str | None, losses: LossLog | None) -> dict[str, Any]:
        trace = self.log.trace
        assert trace is not None
        resumes = self._resumes(trace)
        times = trace.time[np.isfinite(trace.time)]
        return {
            "step_log": self.log_path,
            "loss_log": loss_path,
            "steps": self.steps,
            "consumed": self.consumed,
            "tokens": self.consumed * self.plan.seq_len,
            "lines": int(trace.step.size),
            "first_time": float(times[0]) if times.size else None,
            "last_time": float(times[-1]) if times.size else None,
            "resumes": len(resumes),
            "superseded_steps": sum(r["superseded"] for r in resumes),
            "plans": len(self.log.plans),
            "loss_lines": None if losses is None else losses.lines,
            "loss_lines_beyond": None if losses is None else losses.beyond,
        }

    @staticmethod
    def _resumes(trace: LineTrace) -> list[dict[str, int]]:
        """Lines that went back: a resume from a checkpoint before the step logged last."""
        prev = trace.step[:-1]
        back = np.flatnonzero(trace.step[1:] <= prev) + 1
        return [
            {
                "line": int(trace.line[i]),
                "step": int(trace.step[i]),
                "superseded": int(trace.step[i - 1]) + 1 - int(trace.step[i]),
            }
            for i in back.tolist()
        ]

    def timeline(self) -> dict[str, Any]:
        trace = self.log.trace
        assert trace is not None
        events: list[dict[str, Any]] = [
            {"step": 0, "kind": "start", "text": "the run starts (consumed 0)"}
        ]
        shapes: list[dict[str, int]] = []
        changes = self.schedule.changes
        for i, c in enumerate(changes):
            until = changes[i + 1].step if i + 1 < len(changes) else self.steps
            if shapes and (shapes[-1]["dp"], shapes[-1]["micro"], shapes[-1]["accum"]) == (
                c.dp_size, c.micro, c.accum
            ):  # fmt: skip
                shapes[-1]["until_step"] = until  # a change of plan alone
                continue
            b = c.config.global_batch
            shapes.append({"step": c.step, "until_step": until, "consumed": c.consumed,
                           "dp": c.dp_size, "micro": c.micro, "accum": c.accum,
                           "global_batch": b})  # fmt: skip
            if i:
                events.append({"step": c.step, "kind": "shape",
                               "text": f"batch shape dp {c.dp_size} × micro {c.micro} × accum "
                                       f"{c.accum} (global batch {b:,})"})  # fmt: skip
        for r in self._resumes(trace):
            events.append({"step": r["step"], "kind": "resume",
                           "text": f"resumed at step {r['step']:,} (log line {r['line']:,}): "
                                   f"{_count(r['superseded'], 'logged step')} redone"})  # fmt: skip
        for step, h in self.log.plans[1:]:
            events.append({"step": step, "kind": "plan",
                           "text": f"plan {short_hash(h)}… from here"})  # fmt: skip
        for i, start in enumerate(self.plan.phase_starts[1:], start=2):
            step = self._step_of_base(start)
            if step < self.steps:
                events.append({"step": step, "kind": "phase",
                               "text": f"phase {i} starts (sample {start:,})"})  # fmt: skip
        for e in self.plan.excisions:
            step = self._step_of(e.from_consumed)
            text = f"excision from consumed {e.from_consumed:,}: {_count(e.count, 'sample')} of "
            events.append({"step": step, "kind": "excision", "text": f"{text}{e.what} left out"})
        order = {"start": 0, "resume": 1, "shape": 2, "plan": 3, "phase": 4, "excision": 5}
        events.sort(key=lambda e: (e["step"], order[e["kind"]]))
        return {
            "steps": self.steps,
            "events": events,
            "shapes": shapes,
            "plans": [{"first_step": s, "index_hash": h} for s, h in self.log.plans],
            "trace": _trace_points(trace),
        }

    def mixture(self) -> dict[str, Any]:
        edges = np.unique(np.linspace(0, self.steps, min(self.steps, STRETCHES) + 1).round())
        edge_steps = edges.astype(np.int64)
        new = self.schedule.consumed_at(edge_steps)
        base = self._base(new)
        counts = kept_counts(self.tape, base)
        planned = self._planned(base)
        width = np.diff(new).astype(np.float64)
        planned_share = np.diff(planned, axis=1) / np.maximum(np.diff(base), 1)
        realised_share = np.diff(counts, axis=1) / np.maximum(width, 1)
        end = counts[:, -1]
        total_planned = planned[:, -1]
        seq_len = self.plan.seq_len
        return {
            "series": {
                "step": edge_steps.tolist(),
                "planned": {n: _round(planned_share[d]) for d, n in enumerate(self.names)},
                "realised": {n: _round(realised_share[d]) for d, n in enumerate(self.names)},
            },
            "phases": self._phases(),
            "totals": [
                {
                    "source": n,
                    "samples": int(end[d]),
                    "tokens": int(end[d]) * seq_len,
                    "share": float(end[d]) / max(1, self.consumed),
                    "planned_share": float(total_planned[d]) / max(1, int(self.base_end)),
                    "max_gap_samples": float(np.max(np.abs(counts[d] - planned[d]))),
                }
                for d, n in enumerate(self.names)
            ],
            "rule": (
                f"Counted over {edge_steps.size - 1} stretches of whole steps, each the share "
                "of the stretch's samples drawn from the source; planned: the phases' weights "
                "over the same positions. The gap is realised minus planned samples over the "
                "run so far, at each stretch's end."
            ),
        }

    def _phases(self) -> list[dict[str, Any]]:
        out = []
        for i, ((lo, hi), units, den) in enumerate(
            zip(self.plan.phase_spans, self.plan.phase_units, self.plan.phase_denominators,
                strict=True)
        ):  # fmt: skip
            reached = lo < self.base_end
            top = min(hi, int(self.base_end))
            counts = kept_counts(self.tape, np.asarray([lo, max(lo, top)]))
            got = counts[:, 1] - counts[:, 0]
            total = int(got.sum())
            out.append(
                {
                    "phase": i + 1,
                    "start": lo,
                    "end": hi,
                    "start_step": self._step_of_base(lo),
                    "end_step": self._step_of_base(top) if reached else None,
                    "reached": reached,
                    "samples": total,
                    "planned": {n: u / den for n, u in zip(self.names, units, strict=True)},
                    "realised": {
                        n: (int(got[d]) / total if total else None)
                        for d, n in enumerate(self.names)
                    },
                    "samples_by_source": {n: int(got[d]) for d, n in enumerate(self.names)},
                }
            )
        return out

    def repetition(self) -> dict[str, Any]:
        drawn = kept_counts(self.tape, np.asarray([self.base_end]))[:, 0]
        sources = [
            {
                "source": s.name,
                "n_samples": s.n_samples,
                "draws": int(drawn[d]),
                "passes": int(drawn[d]) / s.n_samples if s.n_samples else 0.0,
                "horizon_draws": s.draws,
                "horizon_passes": s.passes,
                "max_repeats": s.max_repeats,
            }
            for d, s in enumerate(self.plan.sources)
        ]
        docs, exact = _most_trained(self.tape, self.batcher, drawn, int(self.base_end),
                                    self.config.top)  # fmt: skip
        rows = [self._doc(d, doc, {"trained_windows": trained, "doc_windows": windows,
                                   "times": trained / windows if windows else 0.0})
                for d, doc, trained, windows in docs]  # fmt: skip
        return {
            "sources": sources,
            "top_documents": rows,
            "exact": exact,
            "rule": (
                "A document's exposure is the number of samples trained so far that hold a "
                "token of it (each draw counts; 'times' divides by the windows the document "
                "spans). "
                + (
                    "The list is exact: no other document can have been trained more."
                    if exact
                    else f"Counted among the {MAX_CANDIDATES:,} longest documents of each "
                    "source (a bound on the rest did not settle the list)."
                )
            ),
        }

    def _doc(self, d: int, doc: int, extra: dict[str, Any]) -> dict[str, Any]:
        src = self.batcher.sources[d]
        lo, hi = src.doc_span(doc)
        origin = src.provenance(doc)
        return {
            "source": self.names[d],
            "doc": doc,
            **extra,
            "tokens": hi - lo,
            "origin": None if origin is None else origin.to_json(),
            "where": None if origin is None else origin.where,
            "preview": preview(self.batcher, d, doc, 80),
            "command": _command(
                "locate", self.plan_path, self.names[d], str(doc), "--log", self.log_path
            ),
        }

    def loss(self, losses: LossLog) -> dict[str, Any]:
        steps = np.flatnonzero(losses.has)
        values = losses.loss[steps]
        finite = np.isfinite(values)
        s, v = steps[finite], values[finite]
        buckets = _Buckets(self.steps)
        by_source = None
        if losses.by_source is not None:
            by_source = {}
            for d, n in enumerate(self.names):
                col = losses.by_source[:, d]
                ok = np.flatnonzero(np.isfinite(col))
                if ok.size:
                    by_source[n] = buckets.series(ok, col[ok], bands=False)
        z, baseline = robust_z(v, self.config.spike_window)
        flagged = np.flatnonzero(z >= self.config.spike_z)
        ranked = flagged[np.argsort(-z[flagged], kind="stable")][:SHOWN_SPIKES]
        spikes = [self._spike(int(s[i]), float(v[i]), float(baseline[i]), float(z[i]))
                  for i in sorted(ranked.tolist(), key=lambda i: int(s[i]))]  # fmt: skip
        bad = steps[~finite]
        tokens = None
        if losses.tokens is not None:
            tokens = {n: int(np.nansum(losses.tokens[:, d])) for d, n in enumerate(self.names)}
        return {
            "logged_steps": int(steps.size),
            "series": buckets.series(s, v, bands=True),
            "by_source": by_source,
            "flagged": int(flagged.size),
            "flagged_steps": s[flagged][:1000].tolist(),
            "spikes": spikes,
            "non_finite": {"count": int(bad.size), "steps": bad[:1000].tolist()},
            "tokens_by_source": tokens,
        }

    def _spike(self, step: int, loss: float, baseline: float, z: float) -> dict[str, Any]:
        r = replay(self.plan, step, self.schedule, self.batcher)
        hits = top_documents(r, self.batcher)[:SPIKE_DOCS]
        return {
            "step": step,
            "consumed": r.consumed,
            "loss": loss,
            "baseline": baseline,
            "z": z,
            "global_batch": r.global_batch,
            "tokens_hash": r.tokens_hash,
            "top_documents": [
                self._doc(
                    h.source, h.doc, {"windows": h.windows, "share": h.windows / r.global_batch}
                )
                for h in hits
            ],
            "command": _command(
                "replay", self.plan_path, "--step", str(step), "--log", self.log_path
            ),
        }

    def commands(self, loss_path: str | None) -> dict[str, str]:
        plan, log = self.plan_path, self.log_path
        loss = () if loss_path is None else ("--loss", loss_path)
        return {
            "plan": _command("info", plan),
            "run": _command("info", log),
            "report": _command("report", log, "--plan", plan, *loss, "--json"),
            "replay": _command("replay", plan, "--step", "STEP", "--log", log),
            "verify": _command("verify", plan),
        }


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _command(*args: str) -> str:
    return "tokentape " + shlex.join(args)


def _round(x: np.ndarray) -> list[float]:
    """Shares for drawing and for the JSON: 6 significant digits (the page shows fewer)."""
    return [float(f"{v:.6g}") for v in x.tolist()]


def _trace_points(trace: LineTrace) -> dict[str, Any] | None:
    """Step against seconds since the first line, for each line (downsampled, every resume's
    line and the one before kept); None when the lines carry no times."""
    t = trace.time
    if t.size < 2 or not np.all(np.isfinite(t)) or float(t.max()) <= float(t.min()):
        return None
    keep = np.zeros(t.size, dtype=bool)
    if t.size <= MAX_POINTS:
        keep[:] = True
    else:
        keep[np.linspace(0, t.size - 1, MAX_POINTS).round().astype(np.int64)] = True
        back = np.flatnonzero(trace.step[1:] <= trace.step[:-1]) + 1
        keep[back[:MAX_POINTS]] = True
        keep[back[:MAX_POINTS] - 1] = True
    return {
        "seconds": [round(float(x), 3) for x in (t[keep] - t[0]).tolist()],
        "step": trace.step[keep].tolist(),
        "lines": int(t.size),
    }


class _Buckets:
    """The drawing grid of per-step series over steps [0, steps): one step a bucket up to
    ``MAX_POINTS`` steps, else ``MAX_POINTS`` buckets of equal width (``DOWNSAMPLING``)."""

    def __init__(self, steps: int) -> None:
        self.width = max(1, -(-steps // MAX_POINTS))

    def series(self, steps: np.ndarray, values: np.ndarray, bands: bool) -> dict[str, Any]:
        """Each bucket's mean step and mean value (and min and max with ``bands``), for the
        buckets holding a value; ``steps`` ascending."""
        if self.width == 1 or steps.size == 0:
            out: dict[str, Any] = {"step": steps.tolist(), "mean": values.tolist()}
            if bands:
                out["min"], out["max"] = out["mean"], out["mean"]
            return out
        bucket = steps // self.width
        starts = np.flatnonzero(np.concatenate([[True], bucket[1:] != bucket[:-1]]))
        n = np.diff(np.append(starts, steps.size))
        out = {
            "step": _round(np.add.reduceat(steps.astype(np.float64), starts) / n),
            "mean": (np.add.reduceat(values, starts) / n).tolist(),
        }
        if bands:
            out["min"] = np.minimum.reduceat(values, starts).tolist()
            out["max"] = np.maximum.reduceat(values, starts).tolist()
        return out


def rolling_median(x: np.ndarray, window: int) -> np.ndarray:
    """The median of the ``window`` values centred on each value of ``x`` (odd ``window``).
    Near the ends the window shrinks to stay centred (value i of m: the 2·min(i, m−1−i) + 1
    values around it), so that a steady trend does not bias it."""
    m, h = x.size, window // 2
    out = np.empty(m)
    if m > 2 * h:
        view = np.lib.stride_tricks.sliding_window_view(x, 2 * h + 1)
        for a in range(0, view.shape[0], 1 << 14):  # an odd window's median: its middle value
            chunk = np.partition(view[a : a + (1 << 14)], h, axis=1)[:, h]
            out[h + a : h + a + chunk.shape[0]] = chunk
    for i in [*range(min(h, m)), *range(max(h, m - h), m)]:
        half = min(i, m - 1 - i, h)
        out[i] = np.median(x[i - half : i + half + 1])
    return out


def noise_scale(x: np.ndarray, window: int) -> np.ndarray:
    """The noise around each value: 1.4826 · MAD / √2 of the step-to-step differences in its
    centred window (the larger of the windows of the differences on either side of it)."""
    if x.size < 2:
        return np.zeros(x.shape)
    d = np.diff(x)
    spread = rolling_median(np.abs(d - rolling_median(d, window)), window)
    noise = MAD_TO_SIGMA / math.sqrt(2) * np.concatenate([spread[:1], spread])
    noise[1:-1] = np.maximum(noise[1:-1], noise[2:])  # value i sits between Δ i-1 and Δ i
    return noise


def robust_z(x: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Each value's robust z-score against its centred window (``ReportConfig.spike_rule``),
    and the window's median; 0 where the window holds fewer than 5 values (the first two and
    last two).

    The noise scale comes from the step-to-step differences Δ: with independent noise of
    deviation σ, Δ − median(Δ) has deviation σ·√2 whatever a steady trend adds, and one spike
    moves only two of them (a MAD of the values themselves would count the trend as noise, or,
    on a steep curve, find almost none)."""
    x = np.asarray(x, dtype=np.float64)
    m = rolling_median(x, window)
    resid = x - m
    scale = np.maximum(noise_scale(x, window), 1e-4 * np.abs(m))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = np.where(scale > 0, resid / scale, np.where(resid > 0, np.inf, 0.0))
    i = np.arange(x.size)
    z[np.minimum(i, x.size - 1 - i) < 2] = 0.0
    return z, m


@dataclass(frozen=True)
class _Longest:
    """One source's documents as ``_most_trained`` needs them: each document's samples
    [first, stop), and its longest documents, longest first (``MAX_CANDIDATES`` + 1 of them)."""

    first: np.ndarray
    stop: np.ndarray
    order: np.ndarray
    passes: int  # ceil(draws so far / samples): a bound on any sample's draws so far

    @classmethod
    def of(cls, starts: np.ndarray, n_tokens: int, seq_len: int, n: int, drawn: int) -> _Longest:
        ends = np.append(starts[1:], n_tokens)
        first = np.maximum(0, -(-starts // seq_len) - 1)
        stop = np.maximum(first, np.minimum(n, (ends - 1) // seq_len + 1))
        windows = stop - first
        k = min(windows.size, MAX_CANDIDATES + 1)
        some = np.argpartition(-windows, k - 1)[:k] if k < windows.size else np.arange(k)
        order = some[np.argsort(-windows[some], kind="stable")]
        return cls(first, stop, order, -(-drawn // n))

    def windows(self, doc: int) -> int:
        return int(self.stop[doc] - self.first[doc])


def _most_trained(
    tape: Tape, batcher: Batcher, drawn: np.ndarray, base_end: int, top: int
) -> tuple[list[tuple[int, int, int, int]], bool]:
    """The ``top`` documents whose windows were trained most (each draw of a sample holding a
    token of the document counts), as (source, doc, trained windows, windows), most first;
    and whether the list is exact.

    A document spanning w windows of a source drawn D times over n samples was trained at most
    w·ceil(D/n) times. The exposure of the longest documents of each source is counted
    exactly (their samples' draws below the run's end, excised ones left out); candidates
    grow until no document outside them can beat the list, or ``MAX_CANDIDATES``."""
    seq_len = batcher.plan.seq_len
    longest: dict[int, _Longest] = {}
    for d, src in enumerate(batcher.sources):
        n = tape.n_samples[d]
        if drawn[d] > 0 and n > 0 and src.n_docs > 0:
            starts = np.asarray(src.doc_starts, dtype=np.int64)
            longest[d] = _Longest.of(starts, src.n_tokens, seq_len, n, int(drawn[d]))
    k = dict.fromkeys(longest, top)
    exposure: dict[tuple[int, int], int] = {}
    while True:
        for d, docs in longest.items():
            todo = [int(i) for i in docs.order[: k[d]] if (d, int(i)) not in exposure]
            got = _exposures(tape, d, docs.first, docs.stop, todo, base_end)
            exposure.update(((d, doc), g) for doc, g in zip(todo, got, strict=True))
        ranked = sorted(exposure.items(), key=lambda kv: (-kv[1], kv[0]))
        bar = ranked[top - 1][1] if len(ranked) >= top else 0
        grow = [
            d
            for d, docs in longest.items()
            if k[d] < docs.order.size and docs.windows(int(docs.order[k[d]])) * docs.passes > bar
        ]
        if not grow or all(k[d] >= MAX_CANDIDATES for d in grow):
            rows = [(d, doc, got, longest[d].windows(doc)) for (d, doc), got in ranked[:top]
                    if got > 0]  # fmt: skip
            return rows, not grow
        for d in grow:
            k[d] = min(MAX_CANDIDATES, k[d] * 4)


def _exposures(
    tape: Tape, d: int, first: np.ndarray, stop: np.ndarray, docs: list[int], base_end: int
) -> list[int]:
    """Trained windows of each of ``docs`` of source ``d`` below base position ``base_end``."""
    if not docs:
        return []
    spans = [(int(first[i]), max(int(first[i]), int(stop[i]))) for i in docs]
    ks = np.unique(np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in spans]))
    _, _, sample = _kept_draws(tape, d, ks, base_end)
    hits = np.bincount(np.searchsorted(ks, sample), minlength=ks.size)
    cum = np.concatenate([[0], np.cumsum(hits)])
    return [int(cum[np.searchsorted(ks, b)] - cum[np.searchsorted(ks, a)]) for a, b in spans]


def _kept_draws(
    tape: Tape, d: int, samples: np.ndarray, base_end: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base position, epoch, sample) of the draws of ``samples`` below ``base_end`` that the
    tape keeps."""
    position, epoch, sample = draws_at(tape.base, d, samples, base_end)
    if tape.excision is not None:
        kept = tape.excision.to_new(position)[1]
        position, epoch, sample = position[kept], epoch[kept], sample[kept]
    return position, epoch, sample


__all__ = [
    "DOWNSAMPLING",
    "MAX_POINTS",
    "MAX_SPIKE_WINDOW",
    "REPORT_VERSION",
    "ReportConfig",
    "finite_json",
    "noise_scale",
    "robust_z",
    "rolling_median",
    "run_report",
]

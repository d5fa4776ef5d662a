"""``tokentape report``'s page: the report's data (``audit.report``) as one HTML file.

The page is self-contained and static: inline CSS, charts as inline SVG, no script, no font,
image or link that could load anything (a Content-Security-Policy of ``default-src 'none'``
says so to the browser as well). Every text that comes from a file (paths, ids, previews) is
escaped. A number drawn from the data carries ``data-path`` (where it is in ``--json``) and
``data-value`` (its exact value), so a test can hold the page to the JSON.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PALETTE = ("#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#e377c2",
           "#7f7f7f", "#bcbd22", "#aec7e8")  # fmt: skip
SPIKE_COLOUR = "#d62728"
EVENT_COLOURS = {"start": "#555", "resume": "#d62728", "shape": "#1f77b4", "plan": "#9467bd",
                 "phase": "#2ca02c", "excision": "#ff7f0e"}  # fmt: skip
WIDTH, HEIGHT = 960, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 14, 40

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1000px;padding:16px 20px;
color:#222;background:#fff}
h1{font-size:22px;margin:4px 0 2px}h2{font-size:18px;margin:28px 0 6px;
border-bottom:1px solid #ddd;padding-bottom:3px}h3{font-size:15px;margin:16px 0 4px}
table{border-collapse:collapse;margin:6px 0 10px;font-size:13px}
td,th{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font:12px ui-monospace,monospace;word-break:break-all}
.note{color:#555;font-size:13px;margin:4px 0}.legend span{margin-right:14px;font-size:13px}
.sw{display:inline-block;width:12px;height:3px;vertical-align:middle;margin-right:4px}
svg{display:block;margin:6px 0}svg text{font:11px system-ui,sans-serif;fill:#444}
.bad{color:#b00}.ok{color:#080}nav a{margin-right:12px}
"""


def render_report(data: dict[str, Any]) -> str:
    """The page of ``data`` (``audit.report.run_report``)."""
    ident, run = data["identity"], data["run"]
    names = [s["name"] for s in ident["sources"]]
    colours = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    parts = [
        _head(ident, run),
        _identity(data),
        _timeline(data),
        _mixture(data, names, colours),
        _repetition(data, colours),
        _loss(data, names, colours),
        _commands(data),
        "</body></html>\n",
    ]
    return "".join(parts)


# --- small pieces ------------------------------------------------------------------------------


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _num(value: Any, path: str, text: str | None = None) -> str:
    """A number from the data, tagged with where it is and its exact value."""
    shown = text if text is not None else _fmt(value)
    return f'<span data-path="{_e(path)}" data-value="{_e(json.dumps(value))}">{_e(shown)}</span>'


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and abs(value) < 1e-3:
            return f"{value:.2e}"
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    """Cells are HTML already (escape before)."""
    th = "".join(f'<th class="{"n" if i in numeric else ""}">{_e(h)}</th>'
                 for i, h in enumerate(header))  # fmt: skip
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"n" if i in numeric else ""}">{c}</td>' for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _legend(items: Sequence[tuple[str, str, bool]]) -> str:
    spans = "".join(
        f'<span><i class="sw" style="background:{c};{"opacity:.5" if dashed else ""}"></i>'
        f"{_e(n)}</span>"
        for n, c, dashed in items
    )
    return f'<div class="legend">{spans}</div>'


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round values spanning [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    out = []
    v = first
    while v <= hi + step * 1e-9:
        out.append(round(v, 12))
        v += step
    return out


def _tick_text(v: float) -> str:
    if v == int(v) and abs(v) >= 1:
        return f"{int(v):,}"
    return f"{v:.3g}"


@dataclass
class _Chart:
    """An SVG chart over [x0, x1] × [y0, y1]; elements are added in data coordinates."""

    x0: float
    x1: float
    y0: float
    y1: float
    label_x: str
    label_y: str
    kind: str
    height: int = HEIGHT
    y_ticks: bool = True
    items: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        if self.y1 <= self.y0:
            pad = abs(self.y0) * 0.05 or 1.0
            self.y0, self.y1 = self.y0 - pad, self.y1 + pad

    def x(self, v: float) -> float:
        return LEFT + (v - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def y(self, v: float) -> float:
        return (
            self.height
            - BOTTOM
            - (v - self.y0) / (self.y1 - self.y0) * (self.height - TOP - BOTTOM)
        )

    def _pts(self, xs: Sequence[float], ys: Sequence[float]) -> str:
        return " ".join(
            f"{self.x(a):.1f},{self.y(b):.1f}"
            for a, b in zip(xs, ys, strict=True)
            if math.isfinite(b)
        )

    def line(self, xs: Sequence[float], ys: Sequence[float], colour: str, name: str,
             dashed: bool = False, width: float = 1.4, steps: bool = False) -> None:  # fmt: skip
        if steps and xs:  # a value holds until the next x
            sx, sy = [xs[0]], [ys[0]]
            for a, b in zip(xs[1:], ys[1:], strict=True):
                sx += [a, a]
                sy += [sy[-1], b]
            xs, ys = sx, sy
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.items.append(
            f'<polyline class="series" data-series="{_e(name)}" fill="none" stroke="{colour}" '
            f'stroke-width="{width}"{dash} points="{self._pts(xs, ys)}"><title>{_e(name)}</title>'
            "</polyline>"
        )

    def band(self, xs: Sequence[float], lo: Sequence[float], hi: Sequence[float],
             colour: str) -> None:  # fmt: skip
        pts = self._pts(list(xs) + list(xs)[::-1], list(hi) + list(lo)[::-1])
        self.items.append(
            f'<polygon class="band" fill="{colour}" fill-opacity="0.18" stroke="none" '
            f'points="{pts}"/>'
        )

    def vline(self, at: float, colour: str, title: str, kind: str) -> None:
        x = self.x(at)
        self.items.append(
            f'<line class="event" data-kind="{_e(kind)}" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" '
            f'y2="{self.height - BOTTOM}" stroke="{colour}" stroke-width="1.2" '
            f'stroke-dasharray="3 3"><title>{_e(title)}</title></line>'
        )

    def dot(self, at: float, value: float, colour: str, title: str, cls: str) -> None:
        self.items.append(
            f'<circle class="{cls}" cx="{self.x(at):.1f}" cy="{self.y(value):.1f}" r="4.5" '
            f'fill="none" stroke="{colour}" stroke-width="2"><title>{_e(title)}</title></circle>'
        )

    def svg(self) -> str:
        h = self.height
        grid = []
        for v in _ticks(self.y0, self.y1) if self.y_ticks else []:
            y = self.y(v)
            grid.append(
                f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                f'stroke="#eee"/><text x="{LEFT - 6}" y="{y + 4:.1f}" '
                f'text-anchor="end">{_tick_text(v)}</text>'
            )
        for v in _ticks(self.x0, self.x1, 8):
            x = self.x(v)
            grid.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{h - BOTTOM}" y2="{h - BOTTOM + 4}" '
                f'stroke="#999"/><text x="{x:.1f}" y="{h - BOTTOM + 16}" '
                f'text-anchor="middle">{_tick_text(v)}</text>'
            )
        axes = (
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{h - BOTTOM}" y2="{h - BOTTOM}" '
            f'stroke="#999"/><line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{h - BOTTOM}" '
            f'stroke="#999"/>'
            f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{h - 6}" text-anchor="middle">'
            f"{_e(self.label_x)}</text>"
            f'<text transform="translate(14,{(TOP + h - BOTTOM) / 2:.0f}) rotate(-90)" '
            f'text-anchor="middle">{_e(self.label_y)}</text>'
        )
        return (
            f'<svg class="chart" data-chart="{_e(self.kind)}" role="img" '
            f'aria-label="{_e(self.kind)}" width="{WIDTH}" height="{h}" '
            f'viewBox="0 0 {WIDTH} {h}" xmlns="http://www.w3.org/2000/svg">'
            + "".join(grid)
            + axes
            + "".join(self.items)
            + "</svg>"
        )


# --- sections ----------------------------------------------------------------------------------


def _head(ident: dict[str, Any], run: dict[str, Any]) -> str:
    title = f"tokentape report: {run['step_log']}"
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    nav = "".join(
        f'<a href="#{k}">{k}</a>'
        for k in ("identity", "timeline", "mixture", "repetition", "loss", "commands")
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f'<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>tokentape report</h1>"
        f'<p class="note">step log <code>{_e(run["step_log"])}</code> · plan '
        f"<code>{_e(ident['plan'])}</code> · {_num(run['steps'], 'run.steps')} steps, "
        f"{_num(run['consumed'], 'run.consumed')} samples, "
        f"{_num(run['tokens'], 'run.tokens')} tokens</p><nav>{nav}</nav>"
    )


def _identity(data: dict[str, Any]) -> str:
    ident, run = data["identity"], data["run"]
    rows = [
        ("index hash", f'<span class="mono">{_e(ident["index_hash"])}</span>'),
        ("algorithm", _num(ident["algorithm_version"], "identity.algorithm_version")),
        ("seq_len", _num(ident["seq_len"], "identity.seq_len")),
        ("seed", _num(ident["seed"], "identity.seed")),
        ("horizon", _num(ident["horizon_samples"], "identity.horizon_samples") + " samples"),
        ("step log lines", _num(run["lines"], "run.lines")),
        ("resumes", _num(run["resumes"], "run.resumes")),
        ("steps redone", _num(run["superseded_steps"], "run.superseded_steps")),
        ("plans in the log", _num(run["plans"], "run.plans")),
    ]
    head = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    sources = []
    for i, s in enumerate(ident["sources"]):
        p = f"identity.sources.{i}"
        sources.append([
            _e(s["name"]), _e(s["format"]), _num(s["weight"], f"{p}.weight"),
            _num(s["n_tokens"], f"{p}.n_tokens"), _num(s["n_samples"], f"{p}.n_samples"),
            _num(s["max_repeats"], f"{p}.max_repeats"),
            f'<span class="mono">{_e(s["content_hash"])}</span>', f"<code>{_e(s['path'])}</code>",
        ])  # fmt: skip
    table = _table(["source", "format", "weight", "tokens", "samples", "max_repeats",
                    "content hash", "path"], sources, {2, 3, 4, 5})  # fmt: skip
    phases = [
        [str(i + 1), _num(p["start_samples"], f"identity.phases.{i}.start_samples"),
         _e(", ".join(f"{n} {w}" for n, w in p["weights"].items()))]
        for i, p in enumerate(ident["phases"])
    ]  # fmt: skip
    out = f'<h2 id="identity">The plan</h2><table>{head}</table>{table}<h3>Phases</h3>' + _table(
        ["phase", "from sample", "weights"], phases, {0, 1}
    )
    if ident["excisions"]:
        rows_x = [
            [_num(x["from_consumed"], f"identity.excisions.{i}.from_consumed"),
             _num(x["count"], f"identity.excisions.{i}.count"),
             _e(", ".join(f"{s} {d}" for s, d in x["docs"]) or "-"),
             _e(", ".join(f"{k} {v:,}" for k, v in x["removed"].items()))]
            for i, x in enumerate(ident["excisions"])
        ]  # fmt: skip
        out += "<h3>Excisions</h3>" + _table(
            ["from consumed", "samples left out", "documents", "per source"], rows_x, {0, 1}
        )
    return out


def _timeline(data: dict[str, Any]) -> str:
    t = data["timeline"]
    steps = t["steps"]
    strip = _Chart(0, steps, 0, 1, "step", "", "timeline", height=150, y_ticks=False)
    for i, s in enumerate(t["shapes"]):
        x0, x1 = strip.x(s["step"]), strip.x(s["until_step"])
        label = f"dp {s['dp']} × micro {s['micro']} × accum {s['accum']}"
        strip.items.append(
            f'<rect class="shape" x="{x0:.1f}" y="{TOP + 24}" width="{max(1.0, x1 - x0):.1f}" '
            f'height="36" fill="{PALETTE[i % len(PALETTE)]}" fill-opacity="0.25" stroke="#888">'
            f"<title>steps {s['step']:,}..{s['until_step'] - 1:,}: {_e(label)}</title></rect>"
            f'<text x="{x0 + 4:.1f}" y="{TOP + 46}">{_e(label)}</text>'
        )
    for e in t["events"]:
        if e["kind"] != "start":
            strip.vline(e["step"], EVENT_COLOURS[e["kind"]], f"step {e['step']:,}: {e['text']}",
                        e["kind"])  # fmt: skip
    kinds = sorted({e["kind"] for e in t["events"]} - {"start"})
    legend = _legend([(k, EVENT_COLOURS[k], False) for k in kinds])
    rows = [[_num(e["step"], f"timeline.events.{i}.step"), _e(e["kind"]), _e(e["text"])]
            for i, e in enumerate(t["events"])]  # fmt: skip
    out = (
        '<h2 id="timeline">Timeline</h2><p class="note">Batch shapes over the steps; dashed '
        "lines mark events (hover for what).</p>"
        + strip.svg().replace("<svg ", '<svg data-steps="' + str(steps) + '" ', 1)
        + legend
    )
    trace = t["trace"]
    if trace is not None:
        secs, st = trace["seconds"], trace["step"]
        chart = _Chart(0, max(secs), 0, max(steps, max(st) + 1), "seconds since the first line",
                       "step", "progress")  # fmt: skip
        chart.line(secs, st, "#1f77b4", "step logged")
        for e in t["events"]:
            if e["kind"] == "resume":
                hit = [s for s, v in zip(secs, st, strict=True) if v == e["step"]]
                if hit:
                    chart.dot(hit[-1], e["step"], EVENT_COLOURS["resume"], e["text"], "resume")
        out += (
            '<h3>Steps against time</h3><p class="note">Every line of the step log; a drop is a '
            "resume from an earlier checkpoint (its steps are redone).</p>" + chart.svg()
        )
    return out + _table(["step", "event", "what"], rows, {0})


def _mixture(data: dict[str, Any], names: list[str], colours: dict[str, str]) -> str:
    m = data["mixture"]
    series = m["series"]
    edges = series["step"]
    xs = edges[:-1]
    top = max([max(v, default=0) for v in series["realised"].values()] +
              [max(v, default=0) for v in series["planned"].values()] + [0.01])  # fmt: skip
    chart = _Chart(0, edges[-1] if edges else 1, 0, min(1.0, top * 1.1), "step",
                   "share of the stretch's samples", "mixture")  # fmt: skip
    for n in names:
        if xs:
            chart.line([*xs, edges[-1]], [*series["realised"][n], series["realised"][n][-1]],
                       colours[n], f"{n} realised", steps=True)  # fmt: skip
            chart.line([*xs, edges[-1]], [*series["planned"][n], series["planned"][n][-1]],
                       colours[n], f"{n} planned", dashed=True, width=1.0, steps=True)  # fmt: skip
    legend = _legend([(n, colours[n], False) for n in names] + [("dashed: planned", "#999", True)])
    totals = [
        [_e(r["source"]), _num(r["samples"], f"mixture.totals.{i}.samples"),
         _num(r["tokens"], f"mixture.totals.{i}.tokens"),
         _num(r["share"], f"mixture.totals.{i}.share", _pct(r["share"])),
         _num(r["planned_share"], f"mixture.totals.{i}.planned_share", _pct(r["planned_share"])),
         _num(r["max_gap_samples"], f"mixture.totals.{i}.max_gap_samples")]
        for i, r in enumerate(m["totals"])
    ]  # fmt: skip
    phase_rows = []
    for i, p in enumerate(m["phases"]):
        if not p["reached"]:
            phase_rows.append([str(p["phase"]), "not reached", "", "", ""])
            continue
        for n in names:
            phase_rows.append([
                _num(p["phase"], f"mixture.phases.{i}.phase"),
                f"{p['start_step']:,}..{max(p['start_step'], p['end_step'] - 1):,}", _e(n),
                _num(p["planned"][n], f"mixture.phases.{i}.planned.{n}", _pct(p["planned"][n])),
                _num(p["realised"][n], f"mixture.phases.{i}.realised.{n}",
                     _pct(p["realised"][n])),
            ])  # fmt: skip
    return (
        '<h2 id="mixture">Mixture</h2>'
        f'<p class="note">{_e(m["rule"])}</p>'
        + chart.svg()
        + legend
        + "<h3>Over the run so far</h3>"
        + _table(
            ["source", "samples", "tokens", "share", "planned", "largest gap (samples)"],
            totals,
            {1, 2, 3, 4, 5},
        )
        + "<h3>Per phase</h3>"
        + _table(["phase", "steps", "source", "planned", "realised"], phase_rows, {3, 4})
    )


def _repetition(data: dict[str, Any], colours: dict[str, str]) -> str:
    r = data["repetition"]
    sources = r["sources"]
    top = max([max(s["horizon_passes"], s["passes"], s["max_repeats"]) for s in sources] + [1])
    bar_h, gap = 18, 14
    height = TOP + BOTTOM + len(sources) * (2 * bar_h + gap)
    chart = _Chart(0, top * 1.05, 0, 1, "passes over the source", "", "repetition", height,
                   y_ticks=False)  # fmt: skip
    for i, s in enumerate(sources):
        y = TOP + i * (2 * bar_h + gap)
        c = colours.get(s["source"], "#888")
        x0 = chart.x(0)
        for j, (value, opacity, what) in enumerate(
            ((s["passes"], 0.9, "so far"), (s["horizon_passes"], 0.35, "at the horizon"))
        ):
            w = chart.x(value) - x0
            chart.items.append(
                f'<rect class="passes" data-source="{_e(s["source"])}" x="{x0:.1f}" '
                f'y="{y + j * bar_h}" width="{max(0.5, w):.1f}" height="{bar_h - 2}" fill="{c}" '
                f'fill-opacity="{opacity}"><title>{_e(s["source"])}: {value:.3f} passes '
                f"{what}</title></rect>"
            )
        bx = chart.x(s["max_repeats"])
        chart.items.append(
            f'<line class="budget" x1="{bx:.1f}" x2="{bx:.1f}" y1="{y - 2}" '
            f'y2="{y + 2 * bar_h}" stroke="#b00" stroke-width="3"><title>{_e(s["source"])}: '
            f"budget {s['max_repeats']:g} passes</title></line>"
            f'<text x="{x0 + 4:.1f}" y="{y + 12}">{_e(s["source"])}</text>'
        )
    rows = [
        [_e(s["source"]), _num(s["n_samples"], f"repetition.sources.{i}.n_samples"),
         _num(s["draws"], f"repetition.sources.{i}.draws"),
         _num(s["passes"], f"repetition.sources.{i}.passes"),
         _num(s["horizon_passes"], f"repetition.sources.{i}.horizon_passes"),
         _num(s["max_repeats"], f"repetition.sources.{i}.max_repeats")]
        for i, s in enumerate(sources)
    ]  # fmt: skip
    docs = [
        [_e(d["source"]), _num(d["doc"], f"repetition.top_documents.{i}.doc"),
         _num(d["trained_windows"], f"repetition.top_documents.{i}.trained_windows"),
         _num(d["times"], f"repetition.top_documents.{i}.times"), _origin(d),
         _e(d["preview"]), f"<code>{_e(d['command'])}</code>"]
        for i, d in enumerate(r["top_documents"])
    ]  # fmt: skip
    return (
        '<h2 id="repetition">Repetition</h2><p class="note">Passes over each source so far '
        "(dark), at the plan's horizon (light), and its budget <code>max_repeats</code> "
        "(red).</p>"
        + chart.svg()
        + _table(
            ["source", "samples", "draws so far", "passes so far", "passes at horizon", "budget"],
            rows,
            {1, 2, 3, 4, 5},
        )
        + f'<h3>The documents trained most so far</h3><p class="note">{_e(r["rule"])}</p>'
        + _table(
            ["source", "doc", "windows trained", "times", "origin", "preview", "locate"],
            docs,
            {1, 2, 3},
        )
    )


def _origin(d: dict[str, Any]) -> str:
    o = d.get("origin")
    if o is None:
        return "no provenance"
    ident = f"<br>id <code>{_e(o['id'])}</code>" if o.get("id") is not None else ""
    return f"<code>{_e(d['where'])}</code>{ident}"


def _loss(data: dict[str, Any], names: list[str], colours: dict[str, str]) -> str:
    loss = data["loss"]
    if loss is None:
        return (
            '<h2 id="loss">Loss</h2><p class="note">No loss log given (<code>--loss '
            'LOSS.jsonl</code>: one line a step, <code>{"step", "loss", '
            '"loss_by_source"}</code>).</p>'
        )
    s = loss["series"]
    steps = data["run"]["steps"]
    lo = [v for v in s["min"] if math.isfinite(v)]
    hi = [v for v in s["max"] if math.isfinite(v)]
    by = loss["by_source"] or {}
    for series in by.values():
        lo += [v for v in series["mean"] if math.isfinite(v)]
        hi += [v for v in series["mean"] if math.isfinite(v)]
    y0, y1 = min(lo, default=0.0), max(hi, default=1.0)
    pad = 0.04 * (y1 - y0)
    chart = _Chart(0, max(1, steps - 1), y0 - pad, y1 + pad, "step", "loss", "loss")
    if s["step"] and s["min"] != s["mean"]:
        chart.band(s["step"], s["min"], s["max"], "#444")
    for n in names:
        if n in by:
            chart.line(by[n]["step"], by[n]["mean"], colours[n], f"{n} loss", width=1.0)
    chart.line(s["step"], s["mean"], "#222", "loss", width=1.6)
    for sp in loss["spikes"]:
        title = f"step {sp['step']:,}: loss {sp['loss']:.4g}, z {sp['z']:.1f}"
        chart.dot(sp["step"], sp["loss"], SPIKE_COLOUR, title, "spike")
    items = [("loss", "#222", False)] + [(f"{n}", colours[n], False) for n in names if n in by]
    out = (
        '<h2 id="loss">Loss</h2>'
        f'<p class="note">{_num(loss["logged_steps"], "loss.logged_steps")} steps logged; '
        f"{_num(loss['flagged'], 'loss.flagged')} flagged. {_e(data['rules']['spikes'])} "
        f"{_e(data['rules']['downsampling'])}</p>"
        + chart.svg()
        + _legend([*items, ("flagged step", SPIKE_COLOUR, False)])
    )
    if loss["non_finite"]["count"]:
        shown = ", ".join(f"{x:,}" for x in loss["non_finite"]["steps"][:20])
        out += (
            f'<p class="bad">{_num(loss["non_finite"]["count"], "loss.non_finite.count")} steps '
            f"logged a NaN or infinite loss: {_e(shown)}</p>"
        )
    for i, sp in enumerate(loss["spikes"]):
        p = f"loss.spikes.{i}"
        docs = [
            [_e(d["source"]), _num(d["doc"], f"{p}.top_documents.{j}.doc"),
             _num(d["windows"], f"{p}.top_documents.{j}.windows"),
             _num(d["share"], f"{p}.top_documents.{j}.share", _pct(d["share"])), _origin(d),
             _e(d["preview"])]
            for j, d in enumerate(sp["top_documents"])
        ]  # fmt: skip
        z = _num(sp["z"], f"{p}.z", f"{sp['z']:.1f}")
        out += (
            f'<h3 class="spike-head">Step {_num(sp["step"], f"{p}.step")}: loss '
            f"{_num(sp['loss'], f'{p}.loss')} against {_num(sp['baseline'], f'{p}.baseline')} "
            f"(z {z})</h3>"
            f'<p class="note"><code>{_e(sp["command"])}</code></p>'
            + _table(["source", "doc", "windows", "share", "origin", "preview"], docs, {1, 2, 3})
        )
    if loss["tokens_by_source"]:
        rows = [[_e(n), _num(v, f"loss.tokens_by_source.{n}")]
                for n, v in loss["tokens_by_source"].items()]  # fmt: skip
        out += "<h3>Tokens per source, as the trainer logged them</h3>" + _table(
            ["source", "tokens"], rows, {1}
        )
    return out


def _commands(data: dict[str, Any]) -> str:
    rows = [[_e(k), f"<code>{_e(v)}</code>"] for k, v in data["commands"].items()]
    return (
        '<h2 id="commands">Reproduce</h2><p class="note">Every figure here comes from these '
        "(STEP: any step; each spike and document above names its own).</p>"
        + _table(["what", "command"], rows, set())
    )


__all__ = ["render_report"]

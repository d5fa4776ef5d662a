"""`tokentape report`'s data, held to the plan and the logs directly: every count is
recomputed here by resolving every position the run trained (the report counts in closed form),
every event from what the test did to the run, every spike's documents from `replay`."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers import REPORT_SPIKE, report_run
from hypothesis import given, settings
from hypothesis import strategies as st

import tokentape
from tokentape._src.audit.report import (
    MAX_POINTS,
    SPIKE_Z,
    ReportConfig,
    _Buckets,
    noise_scale,
    robust_z,
    rolling_median,
    run_report,
)
from tokentape._src.audit.runinfo import plan_json

SPIKE = REPORT_SPIKE


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    plan, at = report_run(root)
    return root, plan, at


@pytest.fixture(scope="module")
def report(run):
    root, plan, _ = run
    return run_report(plan, "plan.json", str(root / "steps.jsonl"), str(root / "loss.jsonl"))


def _consumed(report) -> int:
    return report["run"]["consumed"]


def test_the_run_and_its_timeline_are_what_was_done(run, report):
    _, plan, at = run
    # steps 0-6 of 4, 7-25 of 8; 3 lines (7-9) redone at the first resume, 2 (14, 15) at the second
    assert report["run"]["steps"] == 26 and _consumed(report) == 7 * 4 + 19 * 8
    assert report["run"]["resumes"] == 2 and report["run"]["superseded_steps"] == 5
    assert report["run"]["lines"] == 10 + 9 + 12
    kinds = [(e["step"], e["kind"]) for e in report["timeline"]["events"]]
    phase_step = 7 + (60 - 28) // 8  # position 60 is in step 11
    assert kinds == [(0, "start"), (7, "resume"), (7, "shape"), (7, "plan"),
                     (phase_step, "phase"), (14, "resume"), (14, "plan"),
                     (14, "excision")]  # fmt: skip
    shapes = [(s["step"], s["until_step"], s["dp"], s["micro"], s["accum"])
              for s in report["timeline"]["shapes"]]  # fmt: skip
    assert shapes == [(0, 7, 2, 2, 1), (7, 26, 1, 2, 4)]
    assert [p["first_step"] for p in report["timeline"]["plans"]] == [0, 7, 14]
    assert report["timeline"]["plans"][-1]["index_hash"] == plan.index_hash
    assert plan.excisions[0].from_consumed == at == 7 * 4 + 7 * 8
    assert report["identity"] == plan_json("plan.json", plan)
    json.dumps(report, allow_nan=False)  # strict JSON


def _resolved(plan, consumed):
    return plan.tape().resolve(np.arange(consumed, dtype=np.int64))


def test_the_mixture_is_the_count_of_every_trained_position(run, report):
    _, plan, _ = run
    consumed = _consumed(report)
    r = _resolved(plan, consumed)
    names = [s.name for s in plan.sources]
    counts = np.bincount(r.source, minlength=len(names))
    totals = {t["source"]: t for t in report["mixture"]["totals"]}
    for d, n in enumerate(names):
        assert totals[n]["samples"] == counts[d]
        assert totals[n]["tokens"] == counts[d] * plan.seq_len
        assert totals[n]["share"] == pytest.approx(counts[d] / consumed)
    # each phase: the trained positions whose base position falls in it
    base = plan.tape().excision.to_base(np.arange(consumed))
    phase = np.searchsorted(np.asarray(plan.phase_starts), base, side="right") - 1
    for i, p in enumerate(report["mixture"]["phases"]):
        mine = r.source[phase == i]
        assert p["samples"] == mine.size
        assert p["samples_by_source"] == {n: int(np.sum(mine == d)) for d, n in enumerate(names)}
    # each stretch of the series
    series = report["mixture"]["series"]
    steps = series["step"]
    starts = _step_starts(report)
    for j in range(len(steps) - 1):
        a, b = starts[steps[j]], starts[steps[j + 1]]
        for d, n in enumerate(names):
            assert series["realised"][n][j] == pytest.approx(np.mean(r.source[a:b] == d), rel=1e-5)


def _step_starts(report) -> dict[int, int]:
    """consumed before each step, from the shapes the timeline gives."""
    out = {}
    for s in report["timeline"]["shapes"]:
        b = s["dp"] * s["micro"] * s["accum"]
        for k in range(s["step"], s["until_step"] + 1):
            out[k] = s["consumed"] + (k - s["step"]) * b
    return out


def test_planned_shares_follow_the_phase_of_each_stretch(run, report):
    _, plan, _ = run
    series = report["mixture"]["series"]
    starts = _step_starts(report)
    base = plan.tape().excision
    for j in range(len(series["step"]) - 1):
        a = int(base.to_base(np.asarray([starts[series["step"][j]]]))[0])
        phase = 0 if a < 60 else 1
        units, den = plan.phase_units[phase], plan.phase_denominators[phase]
        b_end = starts[series["step"][j + 1]]
        if (a < 60) == (int(base.to_base(np.asarray([b_end - 1]))[0]) < 60):  # not across
            for d, n in enumerate(s.name for s in plan.sources):
                assert series["planned"][n][j] == pytest.approx(units[d] / den, rel=1e-5)


def test_repetition_counts_the_draws_and_the_most_trained_documents(run, report):
    root, plan, _ = run
    consumed = _consumed(report)
    r = _resolved(plan, consumed)
    stores = [tokentape.open_source(s.path) for s in plan.sources]
    exposure: Counter = Counter()
    for d, k in zip(r.source.tolist(), r.sample.tolist(), strict=True):
        for doc in stores[d].docs_in(k, plan.seq_len):
            exposure[(d, doc)] += 1
    rep = report["repetition"]
    for d, s in enumerate(rep["sources"]):
        assert s["draws"] == int(np.sum(r.source == d))
        assert s["passes"] == pytest.approx(s["draws"] / plan.sources[d].n_samples)
        assert s["horizon_passes"] == plan.sources[d].passes
    names = [s.name for s in plan.sources]
    for top in (10, 40):
        data = run_report(plan, "plan.json", str(root / "steps.jsonl"), None,
                          ReportConfig(top=top))  # fmt: skip
        expected = sorted(exposure.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        got = [((names.index(x["source"]), x["doc"]), x["trained_windows"])
               for x in data["repetition"]["top_documents"]]  # fmt: skip
        assert data["repetition"]["exact"]
        assert got == expected


def test_the_loss_spike_is_flagged_with_the_documents_replay_gives(run, report):
    root, plan, _ = run
    loss = report["loss"]
    assert loss["logged_steps"] == 26
    assert loss["flagged_steps"] == [SPIKE]
    (spike,) = loss["spikes"]
    assert spike["step"] == SPIKE and spike["loss"] == pytest.approx(4.0 - 0.05 * SPIKE + 1.5 +
                                                                   0.01 * (SPIKE % 3))  # fmt: skip
    r = tokentape.replay(plan, SPIKE, step_log=root / "steps.jsonl")
    assert spike["consumed"] == r.consumed and spike["tokens_hash"] == r.tokens_hash
    windows: Counter = Counter()
    stores = [tokentape.open_source(s.path) for s in plan.sources]
    for d, k in zip(r.batch.source.tolist(), r.batch.sample.tolist(), strict=True):
        for doc in stores[d].docs_in(k, plan.seq_len):
            windows[(d, doc)] += 1
    expected = sorted(windows.items(), key=lambda kv: (-kv[1], kv[0]))[:5]  # replay's order
    names = [s.name for s in plan.sources]
    got = [((names.index(x["source"]), x["doc"]), x["windows"]) for x in spike["top_documents"]]
    assert got == expected
    # the per-source series hold the logged values of the effective lines
    by = loss["by_source"]
    assert by["code"]["step"] == list(range(26))
    assert by["code"]["mean"] == pytest.approx([2.1 + 0.01 * (s % 3) for s in range(26)])


# --- the rules, as properties ------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
       st.sampled_from([5, 7, 11]))  # fmt: skip
def test_rolling_median_is_the_median_of_each_centred_window(xs, window):
    x = np.asarray(xs)
    h = window // 2
    halves = [min(i, x.size - 1 - i, h) for i in range(x.size)]  # centred, shrunk at the ends
    expected = [np.median(x[i - k : i + k + 1]) for i, k in enumerate(halves)]
    assert rolling_median(x, window).tolist() == pytest.approx(expected)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=5, max_size=80),
       st.floats(1e-3, 1e3))  # fmt: skip
def test_the_robust_z_score_ignores_the_losses_scale(xs, scale):
    x = np.asarray(xs)
    z, m = robust_z(x, 11)
    z2, m2 = robust_z(scale * x, 11)
    assert m2 == pytest.approx(scale * m, rel=1e-9, abs=1e-12)
    finite = np.isfinite(z)
    assert np.array_equal(finite, np.isfinite(z2))
    assert z2[finite] == pytest.approx(z[finite], rel=1e-6, abs=1e-9)
    i = np.arange(x.size)
    assert np.all(z[np.minimum(i, x.size - 1 - i) < 2] == 0)  # never the first or last two


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=5, max_size=80),
       st.floats(-5, 5), st.floats(-0.01, 0.01))  # fmt: skip
def test_a_steady_trend_does_not_change_the_noise_scale(xs, offset, slope):
    # the scale is taken from step-to-step changes, which a line only shifts
    x = np.asarray(xs) + 10.0
    line = offset + slope * np.arange(x.size)
    assert noise_scale(x + line, 11) == pytest.approx(noise_scale(x, 11), abs=1e-9)


def test_a_spike_on_a_steep_noisy_curve_is_flagged_and_nothing_else():
    rng = np.random.default_rng(7)
    steps = np.arange(3000)
    x = 2 + 3 * np.exp(-steps / 400) + rng.normal(0, 0.01, steps.size)
    x[1234] += 0.2
    z, _ = robust_z(x, 51)
    assert np.flatnonzero(z >= SPIKE_Z).tolist() == [1234]


def test_a_long_run_is_drawn_from_at_most_max_points_buckets():
    b = _Buckets(10 * MAX_POINTS + 7)
    steps = np.arange(0, 10 * MAX_POINTS + 7, 3)
    values = np.sin(steps / 100.0)
    s = b.series(steps, values, bands=True)
    assert len(s["step"]) <= MAX_POINTS
    width = b.width
    first = steps[steps // width == 0]
    assert s["mean"][0] == pytest.approx(np.mean(values[: first.size]))
    assert s["max"][0] == pytest.approx(np.max(values[: first.size]))
    assert min(s["min"]) == pytest.approx(values.min()) and max(s["max"]) == values.max()
    assert all(math.isfinite(v) for v in s["step"])


def test_the_report_of_a_plan_without_a_loss_log_has_no_loss(run):
    root, plan, _ = run
    data = run_report(plan, "plan.json", str(root / "steps.jsonl"))
    assert data["loss"] is None and data["run"]["loss_log"] is None


def test_paths_for_the_commands_are_quoted(run):
    root, plan, _ = run
    odd = root / "a dir; rm -rf x"
    odd.mkdir(exist_ok=True)
    log = odd / "steps.jsonl"
    log.write_bytes((root / "steps.jsonl").read_bytes())
    data = run_report(plan, "plan.json", str(log))
    assert f"--log '{log}'" in data["commands"]["run"] or f"'{log}'" in data["commands"]["run"]
    assert Path(log).exists()

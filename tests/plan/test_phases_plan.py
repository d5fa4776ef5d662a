"""Phases in plan files (``[[phase]]``): parsing, resolving, PLAN.json, the repeat table;
hostile phase tables and crafted PLAN.json phases refused in one line naming the phase, a phase
at the edge of the position range, `tokentape plan` and its ``--json``, the index hash.

Expectations are derived independently of the code under test: shares by exact fractions of
the weights as written, draws by counting a brute-force resolve of every position.
"""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from helpers import PLAN, plan_of, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan, index_hash
from tokentape._src.program import main
from tokentape._src.render.text import plan_text
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState
from tokentape.errors import ArgumentError, PlanError, TokentapeError

ANNEAL = """
[[phase]]
start_samples = 1500
weights = { math = 3, code = 1 }
"""
PHASE2 = "\n[[phase]]\nstart_samples = {start}\nweights = {{ math = 3, code = 1 }}\n"
"""The annealing phase from any start (``ANNEAL`` is it from sample 1500)."""


@pytest.fixture(scope="module")
def stores(mixture_stores: Path) -> Path:
    return mixture_stores


def test_a_phase_changes_the_mixture_from_its_start_and_draws_continue(stores):
    plan = plan_of(stores, PLAN + ANNEAL)
    assert [(p.start, p.weight_units, p.denominator) for p in plan.phases] == [(1500, (0, 1, 3), 4)]
    r = plan.tape().resolve(np.arange(plan.horizon_samples))
    names = [s.name for s in plan.sources]
    before, after = r.source[:1500], r.source[1500:]
    assert [int(np.count_nonzero(before == d)) for d in range(3)] == [900, 450, 150]
    assert [int(np.count_nonzero(after == d)) for d in range(3)] == [0, 125, 375]
    for d, s in enumerate(plan.sources):  # the whole run's draws, as the table prints them
        assert s.draws == int(np.count_nonzero(r.source == d)), names[d]
        # each source's draws continue: pass e, then the next, never a sample twice in a pass
        mine = np.flatnonzero(r.source == d)
        assert np.array_equal(r.epoch[mine], np.arange(mine.size) // s.n_samples)
        for e in np.unique(r.epoch[mine]).tolist():
            got = r.sample[mine][r.epoch[mine] == e]
            assert len(set(got.tolist())) == got.size


def test_plan_json_keeps_the_phases_and_a_plan_without_them_is_unchanged(stores, tmp_path):
    plan = plan_of(stores, PLAN + ANNEAL)
    plan.save(tmp_path / "p.json")
    again = load_plan(tmp_path / "p.json")
    assert again == plan and again.phases == plan.phases
    data = json.loads(plan.to_json())
    assert data["phases"] == [
        {"start": 1500, "weights": [0, 1, 3], "weight_units": [0, 1, 3], "denominator": 4}
    ]
    one = plan_of(stores)
    assert "phases" not in json.loads(one.to_json())
    rows = [(s.name, s.weight_units, s.n_tokens, s.dtype, s.content_hash) for s in one.sources]
    assert one.index_hash == index_hash(one.seq_len, one.seed, one.denominator, rows)
    assert plan.index_hash != one.index_hash
    moved = plan_of(stores, PLAN + ANNEAL.replace("1500", "1501"))
    assert len({moved.index_hash, plan.index_hash, one.index_hash}) == 3


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("start", 0, "field 'start': expected an integer >= 1"),
        ("start", 2000, "below the horizon 2000"),
        ("weight_units", [0, 1], "expected one value per source"),
        ("weight_units", [0, 1, 4], "must sum to the denominator"),
        ("weight_units", [1, 0, 3], "a weight and its units disagree on 0"),
        ("denominator", 5, "must sum to the denominator"),
        ("weights", [0, 1, -3], "expected a finite number >= 0"),
    ],
)
def test_a_damaged_phase_in_plan_json_is_refused(stores, tmp_path, field, value, message):
    data = json.loads(plan_of(stores, PLAN + ANNEAL).to_json())
    data["phases"][0][field] = value
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match=message) as info:
        load_plan(tmp_path / "p.json")
    assert "\n" not in str(info.value)


def test_an_edited_phase_that_keeps_its_shape_fails_the_index_hash(stores, tmp_path):
    data = json.loads(plan_of(stores, PLAN + ANNEAL).to_json())
    data["phases"][0]["start"] = 1400
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match="index_hash does not match its contents"):
        load_plan(tmp_path / "p.json")


def test_start_tokens_round_up_to_whole_samples(stores):
    text = PLAN + ANNEAL.replace("start_samples = 1500", 'start_tokens = "96.01K"')
    assert plan_of(stores, text).phases[0].start == 1501  # 96,010 tokens / 64 = 1500.16


def test_every_phase_is_exact_and_weight_denominator_applies_to_each(stores):
    text = PLAN + ANNEAL.replace("math = 3, code = 1", "math = 0.55, code = 0.3, web = 0.15")
    plan = plan_of(stores, text)
    assert (plan.phases[0].weight_units, plan.phases[0].denominator) == ((3, 6, 11), 20)
    rounded = plan_of(stores, text.replace("seed = 1234", "seed = 1234\nweight_denominator = 7"))
    assert rounded.denominator == rounded.phases[0].denominator == 7
    assert sum(rounded.phases[0].weight_units) == 7
    assert "exact rationals per phase: the stated weights rounded (see target) in phase 1, 2" in (
        plan_text(rounded)
    )


def test_a_source_may_first_appear_in_a_later_phase(stores):
    text = PLAN.replace("weight = 10", "weight = 0") + ANNEAL
    plan = plan_of(stores, text)
    r = plan.tape().resolve(np.arange(plan.horizon_samples))
    math = np.flatnonzero(r.source == 2)
    assert math.min() == 1500 and math.size == plan.sources[2].draws == 375
    n = plan.sources[2].n_samples  # its first pass is whole before any sample repeats
    assert sorted(r.sample[math][:n].tolist()) == list(range(n))


@pytest.mark.parametrize(
    ("phase", "message"),
    [
        ("start_samples = 0\nweights = { web = 1 }", "'start_samples': must be positive"),
        ("start_samples = 2000\nweights = { web = 1 }", "at or beyond the horizon of 2,000"),
        ("start_samples = 10\nstart_tokens = 9\nweights = { web = 1 }", "exactly one of"),
        ("weights = { web = 1 }", "exactly one of 'start_tokens' or 'start_samples'"),
        ("start_samples = 10\nweights = { webb = 1 }", "names 'webb', not a source"),
        ("start_samples = 10\nweights = { web = 0 }", "every weight is 0"),
        ("start_samples = 10\nweights = { web = -1 }", "'web' must be a finite number >= 0"),
        ("start_samples = 10\nweights = 3", "'weights' must be a table of source name"),
        ("start_samples = 10\nweights = { web = 1 }\ncolour = 2", "unknown key 'colour'"),
    ],
)
def test_bad_phases_are_refused_in_one_line(stores, phase, message):
    with pytest.raises(TokentapeError, match=message) as info:
        plan_of(stores, PLAN + "[[phase]]\n" + phase + "\n")
    assert "\n" not in str(info.value) and "phase[0] (phase 2)" in str(info.value)


def test_phases_must_start_in_order_and_sources_must_be_drawn_somewhere(stores):
    two = "[[phase]]\nstart_samples = 900\nweights = { web = 1 }\n"
    with pytest.raises(PlanError, match=r"phase\[1\] \(phase 3\): starts at sample 900, not after"):
        plan_of(stores, PLAN + ANNEAL + two)
    never = PLAN.replace("weight = 10", "weight = 0")
    with pytest.raises(PlanError, match="source 'math' has weight 0 in every phase"):
        plan_of(stores, never + "[[phase]]\nstart_samples = 10\nweights = { web = 1 }\n")
    with pytest.raises(PlanError, match="source 'math' has weight 0 in every phase"):
        plan_of(stores, never)


def test_max_repeats_applies_to_the_whole_run(stores):
    # math: 150 draws in phase 1, 375 in phase 2, over 30 samples: 17.5 passes
    with pytest.raises(PlanError, match=r"source 'math' would be read 17\.500 times"):
        Plan.build(
            {
                "web": {"path": "stores/web", "weight": 60, "max_repeats": 8},
                "code": {"path": "stores/code", "weight": 30, "max_repeats": 6},
                "math": {"path": "stores/math", "weight": 10, "max_repeats": 17},
            },
            seq_len=64,
            seed=1234,
            total_samples=2000,
            base_dir=stores,
            phases=[{"start_samples": 1500, "weights": {"math": 3, "code": 1}}],
        )


def test_the_repeat_table_shows_the_whole_run_and_each_phase(stores, tmp_path, capsys):
    (tmp_path / "mix.toml").write_text(PLAN + ANNEAL)
    (tmp_path / "stores").symlink_to(stores / "stores")
    assert main(["plan", str(tmp_path / "mix.toml")]) == 0
    out = capsys.readouterr().out
    assert "phases      2 (each below)" in out
    whole, first, second = out.split("\n\n")[1:]
    assert whole.startswith("  whole run") and "17.500" in whole
    assert first.startswith(
        "  phase 1: samples [0, 1,500) = 96,000 tokens, exact rationals over 10"
    )
    assert second.startswith("  phase 2: samples [1,500, 2,000) = 32,000 tokens")
    math_row = next(line for line in second.splitlines() if line.strip().startswith("math"))
    assert math_row.split()[1:] == ["75.0000%", "3/4", "=", "75.0000%", "375", "12.500"]


def test_plot_draws_a_plan_in_phases(stores, tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "mix.toml").write_text(PLAN + ANNEAL)
    (tmp_path / "stores").symlink_to(stores / "stores")
    assert main(["plan", str(tmp_path / "mix.toml"), "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


weights = st.lists(st.integers(0, 6), min_size=3, max_size=3).filter(any)


@settings(max_examples=40, deadline=None)
@given(
    first=weights,
    later=st.lists(st.tuples(st.integers(1, 400), weights), min_size=1, max_size=3),
)
def test_every_prefix_of_every_phase_keeps_its_stated_weights(stores, first, later):
    """Counted from each phase's start, every source stays within one sample of the phase's
    weights as written, at every prefix of the phase."""
    names = ["web", "code", "math"]
    starts = np.cumsum([s for s, _ in later]).tolist()
    all_weights = [first, *(w for _, w in later)]
    for d in range(3):  # every source is drawn somewhere, or the plan is refused
        if not any(w[d] for w in all_weights):
            all_weights[0] = [*all_weights[0][:d], 1, *all_weights[0][d + 1 :]]
    horizon = starts[-1] + 300
    sources = {
        n: {"path": f"stores/{n}", "weight": all_weights[0][d], "max_repeats": 1000}
        for d, n in enumerate(names)
    }
    phases = [
        {"start_samples": s, "weights": dict(zip(names, w, strict=True))}
        for s, w in zip(starts, all_weights[1:], strict=True)
    ]
    plan = Plan.build(
        sources, seq_len=64, seed=3, total_samples=horizon, base_dir=stores, phases=phases
    )
    source = plan.tape().resolve(np.arange(horizon)).source
    bounds = [0, *starts, horizon]
    for i, w in enumerate(all_weights):
        piece = source[bounds[i] : bounds[i + 1]]
        n = np.arange(1, piece.size + 1)
        for d in range(3):
            share = Fraction(w[d], sum(w))
            counts = np.cumsum(piece == d)
            gap = counts * share.denominator - n * share.numerator
            assert np.abs(gap).max() < share.denominator, (i, d)


def test_a_plan_json_with_more_tokens_than_a_tape_can_number_is_refused(stores, tmp_path):
    """n_tokens beyond 2**62 would wrap the tape's int64 draws: refused in one line, even with
    n_samples and the index hash made to agree."""
    from tokentape._src.plan.plan import plan_index_hash

    plan = plan_of(stores, PLAN + ANNEAL)
    big = dataclasses.replace(plan.sources[0], n_tokens=2**64, n_samples=(2**64 - 1) // 64)
    with pytest.raises(ArgumentError, match=r"sources\[0\] \('web'\): n_tokens must be"):
        dataclasses.replace(plan, sources=(big, *plan.sources[1:]))  # nor built in Python
    data = json.loads(plan.to_json())
    data["sources"][0] |= {"n_tokens": big.n_tokens, "n_samples": big.n_samples}
    sources = (big, *plan.sources[1:])
    data["index_hash"] = plan_index_hash(
        sources, plan.seq_len, plan.seed, plan.denominator, plan.algorithm_version, plan.phases
    )
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match=r"sources\[0\]: field 'n_tokens': \d+ exceeds 2\*\*62"):
        load_plan(tmp_path / "p.json")


# --- hostile plan files and PLAN.json -------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "message"),
    [
        ("start_samples = 10\nweights = { math = true }", "'math' must be a number, got bool"),
        ("start_samples = 10\nweights = { math = nan }", "'math' must be a finite number >= 0"),
        ("start_samples = 10\nweights = { math = inf }", "'math' must be a finite number >= 0"),
        ("start_samples = 10\nweights = { math = -0.5 }", "'math' must be a finite number >= 0"),
        ("start_samples = true\nweights = { math = 1 }", "'start_samples': expected an integer"),
        ("start_samples = 10.5\nweights = { math = 1 }", "'start_samples': expected an integer"),
        ('start_tokens = "many"\nweights = { math = 1 }', "'start_tokens'"),
        ("start_samples = 4611686018427387904\nweights = { math = 1 }", "phase 2"),
        ("start_samples = 10\nweights = { math = 1, web = 1e-300 }", "phase 2: source 'web'"),
    ],
)
def test_hostile_phase_tables_are_refused_in_one_line_naming_the_phase(stores, phase, message):
    with pytest.raises(TokentapeError, match=message) as info:
        plan_of(stores, PLAN + "[[phase]]\n" + phase + "\n")
    text = str(info.value)
    assert "\n" not in text and text.startswith("mix.toml: ") and "phase 2" in text


def test_a_weight_that_rounds_to_0_in_a_later_phase_is_refused_naming_it(stores):
    fixed = PLAN.replace("seed = 1234", "seed = 1234\nweight_denominator = 100")
    later = "[[phase]]\nstart_samples = 100\nweights = { math = 1, web = 1e-9 }\n"
    with pytest.raises(PlanError, match=r"^mix\.toml: phase 2: source 'web': weight 1e-09 rounds"):
        plan_of(stores, fixed + later)
    cap = "[[phase]]\nstart_samples = 100\nweights = { math = 1, web = 1e-30 }\n"
    with pytest.raises(PlanError, match=r"phase 2: source 'web'.*weight_denominator") as info:
        plan_of(stores, PLAN + cap)
    assert "\n" not in str(info.value)
    # the second phase rounds, the first does not: the plan says which one
    third = "[[phase]]\nstart_samples = 100\nweights = { math = 1, web = 2 }\n"
    plan = plan_of(stores, fixed + third)
    assert plan.phases[0].weight_units == (67, 0, 33)
    assert "the stated weights rounded (see target) in phase 2" in plan_text(plan)


def test_a_source_with_weight_0_in_the_first_phase_draws_nothing_before_its_phase(stores, tmp_path):
    plan = plan_of(stores, PLAN.replace("weight = 10", "weight = 0") + PHASE2.format(start=777))
    r = plan.tape().resolve(np.arange(plan.horizon_samples))
    math = np.flatnonzero(r.source == 2)
    assert math.min() == 777 and plan.sources[2].weight_units == 0
    assert plan.sources[2].tokenizer_fingerprint == plan.sources[0].tokenizer_fingerprint
    # PLAN.json keeps the 0 and reads back
    assert load_plan_text(plan, tmp=tmp_path) == plan


def load_plan_text(plan: Plan, edit=None, *, tmp: Path) -> Plan:
    """``plan`` written as PLAN.json (``edit``-ed first) and read back."""
    data = json.loads(plan.to_json())
    if edit is not None:
        edit(data)
    path = tmp / "review-plan.json"
    path.write_text(json.dumps(data))
    return load_plan(path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["phases"][0].update(start=True), "field 'start': expected an integer"),
        (lambda d: d["phases"][0].update(start=2**70), "below the horizon"),
        (lambda d: d["phases"][0]["weights"].__setitem__(1, True), "expected a finite number"),
        (lambda d: d["phases"][0]["weight_units"].__setitem__(1, True), "expected an integer"),
        (lambda d: d.update(phases={}), "'phases' must be a non-empty list"),
        (lambda d: d.update(phases=[]), "'phases' must be a non-empty list"),
        (lambda d: d["phases"].append(dict(d["phases"][0])), "is not after 1,?500"),
        (lambda d: d["phases"][0].update(extra=1), "unknown field 'extra'"),
    ],
)
def test_a_crafted_plan_json_phase_is_refused_in_one_line(stores, tmp_path, edit, message):
    plan = plan_of(stores, PLAN + PHASE2.format(start=1500))
    with pytest.raises(PlanError, match=message) as info:
        load_plan_text(plan, edit, tmp=tmp_path)
    assert "\n" not in str(info.value) and "review-plan.json" in str(info.value)


def test_nan_in_plan_json_phase_weights_is_refused(stores, tmp_path):
    plan = plan_of(stores, PLAN + PHASE2.format(start=1500))
    text = plan.to_json().replace('"weights": [\n        0,\n        1,', '"weights": [0, NaN,')
    assert "NaN" in text
    (tmp_path / "p.json").write_text(text)
    with pytest.raises(PlanError, match="expected a finite number") as info:
        load_plan(tmp_path / "p.json")
    assert "\n" not in str(info.value)


# --- the edge of the position range -----------------------------------------------------------


def test_a_phase_just_below_2_62_resolves_and_reads_back(stores, tmp_path):
    top = 2**62
    text = PLAN.replace("total_samples = 2000", f"total_samples = {top - 1}")
    plan = plan_of(stores, text + PHASE2.format(start=top - 2))
    assert plan.phases[0].start == top - 2
    tape = plan.tape()
    last = tape.resolve([top - 2])  # phase 2's only position below the horizon
    assert int(last.source[0]) in (1, 2)  # code or math, never web
    draws = [int(tape.blend.count(d, top - 1)) for d in range(3)]
    assert [s.draws for s in plan.sources] == draws and sum(draws) == top - 1
    # the draw numbering continues: the last position's draw is the count before it
    before = int(tape.blend.count(int(last.source[0]), top - 2))
    n = plan.sources[int(last.source[0])].n_samples
    assert int(last.epoch[0]) == before // n
    assert int(tape.position_of(int(last.source[0]), last.sample, last.epoch)[0]) == top - 2
    assert load_plan_text(plan, tmp=tmp_path) == plan
    table = plan_text(plan)
    assert f"phase 2: samples [{top - 2:,}, {top - 1:,}) = 64 tokens" in table


# --- the command line ---------------------------------------------------------------------------


def test_plan_json_on_the_command_line_carries_the_phases(stores, tmp_path):
    (tmp_path / "mix.toml").write_text(PLAN + PHASE2.format(start=1500))
    (tmp_path / "stores").symlink_to(stores / "stores")
    shown = run_cli("plan", str(tmp_path / "mix.toml"), "--json")
    assert shown.returncode == 0, shown.stderr
    out = run_cli("plan", str(tmp_path / "mix.toml"), "--out", str(tmp_path / "PLAN.json"))
    assert out.returncode == 0, out.stderr
    saved = json.loads((tmp_path / "PLAN.json").read_text())
    assert json.loads(shown.stdout) == saved
    assert saved["phases"][0]["start"] == 1500 and saved["phases"][0]["denominator"] == 4


def test_a_bad_phase_on_the_command_line_is_one_line_exit_2(stores, tmp_path):
    (tmp_path / "stores").symlink_to(stores / "stores")
    for phase in ("start_samples = 5000\nweights = { math = 1 }", "weights = { math = 1 }"):
        (tmp_path / "mix.toml").write_text(PLAN + "[[phase]]\n" + phase + "\n")
        for extra in ((), ("--json",)):
            bad = run_cli("plan", str(tmp_path / "mix.toml"), *extra)
            assert bad.returncode == 2 and bad.stdout == ""
            assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
            assert "mix.toml: phase[0] (phase 2)" in bad.stderr


# --- the index hash ---------------------------------------------------------------------------


def test_the_index_hash_follows_the_exact_weights_not_how_they_are_written(stores):
    a = plan_of(stores, PLAN + PHASE2.format(start=1500))
    b = plan_of(
        stores, PLAN + PHASE2.format(start=1500).replace("math = 3, code = 1", "code = 2, math = 6")
    )
    assert a.index_hash == b.index_hash
    c = plan_of(
        stores,
        PLAN
        + PHASE2.format(start=1500).replace(
            "math = 3, code = 1", "math = 0.75, code = 0.25, web = 0"
        ),
    )
    assert c.index_hash == a.index_hash
    # a phase whose table is the first phase's, from a whole period on: the same tape, and
    # another hash (the hash is of the plan, not the tape) that a run may move to
    same = "\n[[phase]]\nstart_samples = 1000\nweights = { web = 60, code = 30, math = 10 }\n"
    repeated = plan_of(stores, PLAN + same)
    one = plan_of(stores)
    positions = np.arange(2000)
    assert np.array_equal(
        repeated.tape().resolve(positions).source, one.tape().resolve(positions).source
    )
    assert repeated.index_hash != one.index_hash
    state = DataState.start(one)
    for _ in range(200):
        state = state.commit(BatchConfig(2, 4))
    assert state.resume_on(repeated).plan_changes[0].consumed == 1600

"""Review of phases in plan files (issue 13, items 2 and 4): hostile plan files and PLAN.json,
phases at the edge of the position range, ``tokentape plan`` and its ``--json``, and the claims
of docs/plan.md's "Phases" and "Changing the plan of a running run" on real plans.

Expectations are derived independently of the code under test: counts by resolving positions,
shares by exact fractions of the weights as written, one-line errors naming file and field.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import PLAN, SIZES, make_store, plan_of, run_cli

from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.render.text import plan_text
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState
from tokentape.errors import PlanError, ResumeRefused, TokentapeError

ANNEAL = "\n[[phase]]\nstart_samples = {start}\nweights = {{ math = 3, code = 1 }}\n"


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("phases-review")
    for name, n in SIZES.items():
        make_store(root, name, n)
    (root / "edited").mkdir()
    make_store(root / "edited", "math", SIZES["math"], edit=" (edited)")
    return root


# --- hostile plan files -----------------------------------------------------------------------


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
    plan = plan_of(stores, PLAN.replace("weight = 10", "weight = 0") + ANNEAL.format(start=777))
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
    plan = plan_of(stores, PLAN + ANNEAL.format(start=1500))
    with pytest.raises(PlanError, match=message) as info:
        load_plan_text(plan, edit, tmp=tmp_path)
    assert "\n" not in str(info.value) and "review-plan.json" in str(info.value)


def test_nan_in_plan_json_phase_weights_is_refused(stores, tmp_path):
    plan = plan_of(stores, PLAN + ANNEAL.format(start=1500))
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
    plan = plan_of(stores, text + ANNEAL.format(start=top - 2))
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
    (tmp_path / "mix.toml").write_text(PLAN + ANNEAL.format(start=1500))
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
    a = plan_of(stores, PLAN + ANNEAL.format(start=1500))
    b = plan_of(
        stores, PLAN + ANNEAL.format(start=1500).replace("math = 3, code = 1", "code = 2, math = 6")
    )
    assert a.index_hash == b.index_hash
    c = plan_of(
        stores,
        PLAN
        + ANNEAL.format(start=1500).replace(
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


# --- docs/plan.md: what may change mid-run, on real plans ---------------------------------------


def _state_at(plan: Plan, steps: int) -> DataState:
    state = DataState.start(plan)
    for _ in range(steps):
        state = state.commit(BatchConfig(2, 4))
    return state


def test_the_docs_accepted_changes_are_accepted(stores):
    first = plan_of(stores)
    state = _state_at(first, 10)  # consumed 80
    assert state.resume_on(plan_of(stores, PLAN + ANNEAL.format(start=80))).plan_changes
    same_tape = {  # not in the index hash: the same plan as far as a run is concerned
        "a longer horizon": PLAN.replace("total_samples = 2000", "total_samples = 4000"),
        "a shorter horizon": PLAN.replace("total_samples = 2000", "total_samples = 100"),
        "other max_repeats": PLAN.replace("max_repeats = 8", "max_repeats = 9"),
    }
    for why, text in same_tape.items():
        assert state.resume_on(plan_of(stores, text)) is state, why
    later = plan_of(stores, PLAN + ANNEAL.format(start=500))
    on_later = state.resume_on(later)
    for why, text in {
        "a later phase edited": PLAN + ANNEAL.format(start=500).replace("code = 1", "code = 2"),
        "a later phase moved": PLAN + ANNEAL.format(start=90),
        "a later phase removed": PLAN,
    }.items():
        assert on_later.resume_on(plan_of(stores, text)).plan_changes[-1].consumed == 80, why


def test_a_source_not_yet_drawn_may_change_store_be_removed_or_reordered(stores):
    """docs/plan.md lists 'a source removed or reordered' among the refusals; a source the run
    has not drawn yet may be (the rule: accepted exactly when no sample below consumed moves)."""
    late = PLAN.replace("weight = 10", "weight = 0") + ANNEAL.format(start=1000)
    first = plan_of(stores, late)
    state = _state_at(first, 10)
    edited = late.replace('path = "stores/math"', 'path = "edited/stores/math"')
    assert plan_of(stores, edited).sources[2].content_hash != first.sources[2].content_hash
    assert state.resume_on(plan_of(stores, edited)).plan_changes
    removed = PLAN.split('[[source]]\nname = "math"')[0]
    assert state.resume_on(plan_of(stores, removed)).plan_changes
    web, code, math = ("[[source]]" + s for s in late.split("[[source]]")[1:])
    head = late.split("[[source]]")[0]
    phase = "\n[[phase]]" + math.split("[[phase]]")[1]
    math = math.split("[[phase]]")[0]
    reordered = head + web + math + code.rstrip("\n") + "\n" + phase
    moved = plan_of(stores, reordered)
    assert [s.name for s in moved.sources] == ["web", "math", "code"]
    assert state.resume_on(moved).plan_changes
    # drawn already: each of these is refused
    with pytest.raises(ResumeRefused, match="the store of source 'math' changed"):
        _state_at(first, 150).resume_on(plan_of(stores, edited))


def test_the_docs_refused_changes_are_refused_naming_a_position(stores):
    first = plan_of(stores)
    state = _state_at(first, 10)  # consumed 80
    refused = {
        "a phase before consumed": PLAN + ANNEAL.format(start=40),
        "a changed seed": PLAN.replace("seed = 1234", "seed = 1235"),
        "a changed seq_len": PLAN.replace("seq_len = 64", "seq_len = 32"),
        "a changed first-phase weight": PLAN.replace("weight = 60", "weight = 50"),
    }
    for why, text in refused.items():
        with pytest.raises(ResumeRefused, match=r"^refusing to resume at consumed 80: ") as info:
            state.resume_on(plan_of(stores, text))
        assert "\n" not in str(info.value) and "position" in str(info.value), why

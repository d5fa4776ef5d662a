"""docs/plan.md's "Changing the plan of a running run", on real plans: the changes it lists as
accepted are accepted, those it lists as refused are refused in one line naming a position,
and a source the run has not drawn yet may change its store, be removed or be reordered (the
rule: accepted exactly when no sample below consumed moves).

Expectations are derived independently of the code under test: what the docs say.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import PLAN, SIZES, make_store, plan_of

from tokentape._src.plan.plan import Plan
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState
from tokentape.errors import ResumeRefused

ANNEAL = "\n[[phase]]\nstart_samples = {start}\nweights = {{ math = 3, code = 1 }}\n"


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("running-plan")
    for name, n in SIZES.items():
        make_store(root, name, n)
    (root / "edited").mkdir()
    make_store(root / "edited", "math", SIZES["math"], edit=" (edited)")
    return root


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

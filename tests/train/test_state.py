"""Data state: commit, batch history, JSON round trip, and refusal on a changed tape."""

from __future__ import annotations

import itertools
import json
import re
import shutil

import pytest
from helpers import PLAN, SIZES, make_store, plan_of
from hypothesis import given
from hypothesis import strategies as st

from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState, identity_hash
from tokentape.errors import OutOfRangeError, TokentapeError

configs = st.builds(
    BatchConfig, dp_size=st.integers(1, 8), micro=st.integers(1, 4), accum=st.integers(1, 4)
)


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("state")
    for name, n in SIZES.items():
        make_store(root, name, n)
    return root


BARE_IDENTITY = {
    "algorithm_version": 1,
    "seq_len": 8,
    "seed": 0,
    "denominator": 1,
    "sources": [
        {"name": "a", "weight_units": 1, "n_tokens": 99, "dtype": "uint16", "content_hash": "c"}
    ],
}


def bare_state() -> DataState:
    """A state of a one-source plan identity (no stores needed), its index hash its own."""
    identity = json.loads(json.dumps(BARE_IDENTITY))
    return DataState(index_hash=identity_hash(identity), identity=identity)


@given(steps=st.lists(configs, min_size=1, max_size=30))
def test_consumed_before_every_step_matches_the_running_sum(steps):
    state, running = bare_state(), []
    for config in steps:
        running.append((state.consumed, config))
        state = state.commit(config)
    assert state.step == len(steps)
    assert state.consumed == sum(c.global_batch for c in steps)
    for step, expected in enumerate(running):
        assert state.consumed_before(step) == expected
    # One history entry per change of shape, not per step.
    changes = 1 + sum(a != b for a, b in itertools.pairwise(steps))
    assert len(state.history) == changes
    again = DataState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again == state


def test_step_outside_the_history():
    state = bare_state().commit(BatchConfig(2, 2))
    with pytest.raises(TokentapeError, match="step 1 is not in the history"):
        state.consumed_before(1)


def test_malformed_state_is_refused():
    with pytest.raises(TokentapeError, match="version 1"):
        DataState.from_dict({"consumed": 3})
    data = bare_state().to_dict()
    del data["consumed"]
    with pytest.raises(TokentapeError, match="'consumed' must be an integer >= 0, got None"):
        DataState.from_dict(data)


def _saved() -> dict:
    """Two steps of 4, then one of 6: consumed 14."""
    state = bare_state().commit(BatchConfig(2, 2)).commit(BatchConfig(2, 2))
    return state.commit(BatchConfig(3, 2)).to_dict()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"consumed": 7.9}, "'consumed' must be an integer"),
        ({"consumed": -1}, "'consumed' must be an integer >= 0"),
        ({"step": True}, "'step' must be an integer"),
        ({"consumed": 15}, "consumed 15 does not follow from the history (expected 14"),
        ({"step": 4}, "does not follow from the history"),
        ({"history": []}, "the history is empty"),
        ({"history": "x"}, "'history' must be a list"),
        ({"history": [{"step": 0, "consumed": 0, "dp_size": "x", "micro": 2, "accum": 1}]},
         "history[0]: 'dp_size' must be an integer >= 1"),
        ({"history": [{"step": 0, "consumed": 0, "dp_size": 2, "micro": 2, "accum": 1},
                      {"step": 2, "consumed": 9, "dp_size": 3, "micro": 2, "accum": 1}]},
         "history[1] (step 2, consumed 9) does not follow"),
        ({"index_hash": 5}, "'index_hash'"),
        ({"step": 1, "consumed": 2**62,
          "history": [{"step": 0, "consumed": 0, "dp_size": 2**61, "micro": 4, "accum": 1}]},
         "data state: history[0]: BatchConfig: a global batch"),
    ],
)  # fmt: skip
def test_an_inconsistent_state_is_refused(edit: dict, message: str):
    saved = _saved()
    assert DataState.from_dict(saved).consumed == 14  # the unedited state loads
    with pytest.raises(TokentapeError, match=re.escape(message)):
        DataState.from_dict({**saved, **edit})


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("seed = 1234", "seed = 1235"), "seed: 1234 → 1235"),
        (("seq_len = 64", "seq_len = 32"), "seq_len: 64 → 32"),
        # 60/30/10 is 6/3/1 over 10, 70/30/10 is 7/3/1 over 11
        (("weight = 60", "weight = 70"), "denominator: 10 → 11; source 'web': weight_units 6 → 7"),
        (('name = "math"', 'name = "maths"'), "source 'math' removed"),
    ],
)
def test_resume_on_a_changed_plan_names_what_changed(plan_dir, edit, expected):
    state = DataState.start(plan_of(plan_dir))
    for _ in range(5):  # 40 samples drawn: every source among them
        state = state.commit(BatchConfig(2, 4))
    state.check_plan(plan_of(plan_dir))  # the same plan resumes
    with pytest.raises(TokentapeError) as info:
        state.check_plan(plan_of(plan_dir, PLAN.replace(*edit)))
    assert expected in str(info.value) and "refusing to resume" in str(info.value)


def test_resume_on_a_retokenized_store_or_reordered_sources(plan_dir, tmp_path):
    state = DataState.start(plan_of(plan_dir)).commit(BatchConfig(4, 10))
    shutil.copytree(plan_dir / "stores", tmp_path / "stores")
    shutil.rmtree(tmp_path / "stores" / "code")
    make_store(tmp_path, "code", SIZES["code"], edit="!")
    with pytest.raises(TokentapeError, match=r"source 'code': content_hash sha256:\w+ → sha256:"):
        state.check_plan(plan_of(tmp_path))
    blocks = PLAN.split("[[source]]")
    reordered = "[[source]]".join([blocks[0], blocks[2], blocks[1], blocks[3]])
    with pytest.raises(TokentapeError, match="source order"):
        state.check_plan(plan_of(plan_dir, reordered))


def test_a_state_whose_identity_disagrees_with_its_index_hash_is_refused(plan_dir):
    """The identity is what a refusal names as changed: it must be the one the hash covers."""
    saved = DataState.start(plan_of(plan_dir)).commit(BatchConfig(2, 4)).to_dict()
    DataState.from_dict(saved)
    edited = json.loads(json.dumps(saved))
    edited["identity"]["seed"] = 99
    with pytest.raises(TokentapeError, match=r"'index_hash' 'sha256:[0-9a-f]+'… does not match"):
        DataState.from_dict(edited)
    edited = json.loads(json.dumps(saved))
    edited["identity"]["sources"][0]["n_tokens"] = "many"
    with pytest.raises(TokentapeError, match="'identity' is not a plan identity"):
        DataState.from_dict(edited)


@pytest.mark.parametrize("consumed", [2**62 + 8, 10**30])
def test_a_state_past_2_62_is_refused(consumed):
    saved = bare_state().to_dict()
    saved.update(consumed=consumed, step=consumed // 8)
    saved["history"] = [{"step": 0, "consumed": 0, "dp_size": 2, "micro": 4, "accum": 1}]
    with pytest.raises(TokentapeError, match=r"'consumed' must be at most 2\*\*62"):
        DataState.from_dict(saved)


def test_a_state_committed_up_to_2_62_loads_again():
    """commit may reach 2**62 (the last step ends at the last position): that state is saved
    and loaded like any other, and its next step is refused."""
    saved = bare_state().to_dict()
    saved.update(consumed=2**62 - 8, step=2**59 - 1)
    saved["history"] = [{"step": 0, "consumed": 0, "dp_size": 2, "micro": 4, "accum": 1}]
    at_end = DataState.from_dict(saved).commit(BatchConfig(2, 4))
    assert at_end.consumed == 2**62
    assert DataState.from_dict(at_end.to_dict()) == at_end
    with pytest.raises(OutOfRangeError, match=r"2\*\*62"):
        at_end.commit(BatchConfig(1, 1))

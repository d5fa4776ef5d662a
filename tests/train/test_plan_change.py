"""Safe mid-run plan changes: a resume on another plan is accepted exactly when every position
below ``consumed`` keeps its sample, and refused naming the first position that would change.

The property compares ``past_change`` (decided from the two plans' blends, with bounded work)
with a brute-force resolve of every position below ``consumed`` under both plans.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import PLAN, plan_of
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tokentape._src.api import locate, replay
from tokentape._src.train.identity import identity_hash, identity_tape, past_change
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState
from tokentape._src.train.steplog import read_step_log
from tokentape.errors import InputError, PlanError, ResumeRefused

SEQ = 8


def identity(sources: list[dict], phases: list[tuple[int, list[int]]], seed: int = 5) -> dict:
    """A plan identity: ``sources`` as (name, units, n_tokens, content) dicts."""
    out = {
        "algorithm_version": 2,
        "seq_len": SEQ,
        "seed": seed,
        "denominator": sum(s["weight_units"] for s in sources),
        "sources": [{"dtype": "uint16", **s} for s in sources],
    }
    if phases:
        out["phases"] = [{"start": a, "weight_units": list(u)} for a, u in phases]
    assert identity_hash(out) is not None
    return out


def brute_first_change(old: dict, new: dict, below: int) -> int | None:
    """The first position below ``below`` whose sample (source name and store, pass, index)
    differs between the two plans, by resolving every position."""
    keys = []
    for ident in (old, new):
        tape = identity_tape(ident)
        r = tape.resolve(np.arange(below))
        content = [s["content_hash"] for s in ident["sources"]]
        keys.append(
            [
                (tape.names[d], content[d], e, k)
                for d, e, k in zip(
                    r.source.tolist(), r.epoch.tolist(), r.sample.tolist(), strict=True
                )
            ]
        )
    return next((p for p, (a, b) in enumerate(zip(*keys, strict=True)) if a != b), None)


units = st.integers(0, 5)


@st.composite
def plans(draw):
    n = draw(st.integers(2, 4))
    names = ["a", "b", "c", "d"][:n]
    first = draw(st.lists(units, min_size=n, max_size=n).filter(any))
    sources = [
        {
            "name": name,
            "weight_units": first[i],
            "n_tokens": draw(st.integers(SEQ + 1, 120)),
            "content_hash": f"sha256:{name}",
        }
        for i, name in enumerate(names)
    ]
    phases, start = [], 0
    for _ in range(draw(st.integers(0, 3))):
        start += draw(st.integers(1, 60))
        phases.append((start, draw(st.lists(units, min_size=n, max_size=n).filter(any))))
    return sources, phases


@st.composite
def changes(draw, sources, phases):
    """A change a training team makes to a running plan, at a random place in it."""
    n = len(sources)
    sources = [dict(s) for s in sources]
    phases = list(phases)
    kind = draw(
        st.sampled_from(["append", "move", "reweigh", "drop", "new source", "store", "reorder"])
    )
    last = phases[-1][0] if phases else 0
    if kind == "append" or (kind in ("move", "drop") and not phases):
        phases.append(
            (
                last + draw(st.integers(1, 80)),
                draw(st.lists(units, min_size=n, max_size=n).filter(any)),
            )
        )
    elif kind == "move":
        k = draw(st.integers(0, len(phases) - 1))
        low = phases[k - 1][0] + 1 if k else 1
        high = phases[k + 1][0] - 1 if k + 1 < len(phases) else last + 80
        if low <= high:
            phases[k] = (draw(st.integers(low, high)), phases[k][1])
    elif kind == "drop":
        del phases[draw(st.integers(0, len(phases) - 1))]
    elif kind == "reweigh":
        k = draw(st.integers(0, len(phases)))
        new = draw(st.lists(units, min_size=n, max_size=n).filter(any))
        if k == 0:
            for s, u in zip(sources, new, strict=True):
                s["weight_units"] = u
        else:
            phases[k - 1] = (phases[k - 1][0], new)
    elif kind == "new source":  # weight 0 until a phase appended for it
        sources.append({"name": "e", "weight_units": 0, "n_tokens": 50, "content_hash": "sha256:e"})
        phases = [(a, [*u, 0]) for a, u in phases]
        phases.append((last + draw(st.integers(1, 80)), [*[0] * n, draw(st.integers(1, 5))]))
    elif kind == "store":
        d = draw(st.integers(0, n - 1))
        sources[d]["content_hash"] = "sha256:changed"
        if draw(st.booleans()):
            sources[d]["n_tokens"] += draw(st.integers(1, 40))
    else:  # two sources swap places in the list
        i, j = draw(st.permutations(range(n)))[:2]
        sources[i], sources[j] = sources[j], sources[i]
        phases = [
            (a, [u[j] if x == i else u[i] if x == j else u[x] for x in range(n)]) for a, u in phases
        ]
    return sources, phases


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_change_is_accepted_exactly_when_no_position_below_consumed_changes(data):
    sources, phases = data.draw(plans(), label="plan")
    new_sources, new_phases = data.draw(changes(sources, phases), label="change")
    horizon = max([0, *(a for a, _ in phases), *(a for a, _ in new_phases)]) + 100
    consumed = data.draw(st.integers(0, horizon), label="consumed")
    old, new = identity(sources, phases), identity(new_sources, new_phases)
    got = past_change(old, new, consumed)
    want = brute_first_change(old, new, consumed)
    event("accepted" if got is None else "refused")
    assert (got is None) == (want is None), (got, want)
    if got is not None:
        assert got[0] == want


def test_the_refusal_names_the_phase_and_the_first_position_at_any_scale():
    sources = [
        {"name": "web", "weight_units": 6, "n_tokens": 10**9, "content_hash": "sha256:w"},
        {"name": "math", "weight_units": 4, "n_tokens": 10**8, "content_hash": "sha256:m"},
    ]
    old = identity(sources, [])
    new = identity(sources, [(1_200_000, [1, 9])])
    position, why = past_change(old, new, 1_536_000)
    assert why.startswith("phase 2 starts at 1,200,000 < consumed 1,536,000; position ")
    assert position >= 1_200_000 and f"position {position:,} would draw 'math'" in why
    assert past_change(old, new, 1_200_000) is None  # appended at consumed: accepted
    later = identity(sources, [(1_300_000, [1, 9])])
    assert (
        "phase 2 started at 1,200,000 < consumed 1,536,000 and would start at 1,300,000"
        in (past_change(new, later, 1_536_000)[1])
    )
    reweighed = identity(sources, [(1_200_000, [2, 8])])
    assert (
        "phase 2 (from 1,200,000 < consumed 1,536,000) changes weights: web 1/10 → 2/10"
        in (past_change(new, reweighed, 1_536_000)[1])
    )


def test_seed_and_seq_len_changes_are_refused_from_position_0():
    sources = [{"name": "a", "weight_units": 1, "n_tokens": 10**6, "content_hash": "sha256:a"}]
    old = identity(sources, [])
    assert past_change(old, identity(sources, [], seed=6), 1) == (
        0,
        "the seed reorders every source, from position 0",
    )
    longer = {**old, "seq_len": SEQ * 2}
    assert past_change(old, longer, 5)[0] == 0
    assert past_change(old, identity(sources, [], seed=6), 0) is None


# --- the loader, the data state and the audits across a change ----------------------------------


@pytest.fixture(scope="module")
def stores(mixture_stores: Path) -> Path:
    return mixture_stores


ANNEAL = "\n[[phase]]\nstart_samples = {start}\nweights = {{ math = 3, code = 1 }}\n"
CONFIG = BatchConfig(2, 4)  # 8 samples a step


def _run(plan, state, steps: int, log: Path, seen: list) -> DataState:
    with Loader(plan, 0, CONFIG, state=state, prefetch=0, step_log=log) as loader:
        for _ in range(steps):
            step = loader.step()
            seen.extend(
                (m.positions.copy(), m.source.copy(), m.sample.copy()) for m in step.micro_batches
            )
            loader.commit()
        return DataState.from_dict(json.loads(json.dumps(loader.state_dict())))


def test_an_appended_phase_is_taken_up_and_the_past_stays_auditable(stores, tmp_path):
    log = tmp_path / "steps.jsonl"
    first = plan_of(stores)
    seen: list = []
    state = _run(first, None, 10, log, seen)  # consumed 80
    annealed = plan_of(stores, PLAN + ANNEAL.format(start=80))
    state = _run(annealed, state, 10, log, seen)
    assert state.plan_changes[0].__dict__ == {
        "step": 10,
        "consumed": 80,
        "old_index_hash": first.index_hash,
        "new_index_hash": annealed.index_hash,
    }
    assert state.index_hash == annealed.index_hash and state.consumed == 160
    # the step log names the plan in force at each step
    records = read_step_log(log)
    assert [r.index_hash for r in records] == [first.index_hash] * 10 + [annealed.index_hash] * 10
    # every step's tokens, rebuilt with the newer plan, are the ones trained on
    for r in records:
        assert replay(annealed, r.step, step_log=log).tokens_hash == r.tokens_hash
    # what the loader gave rank 0, before and after the change, is the newer plan's tape
    tape = annealed.tape()
    for positions, source, sample in seen:
        r = tape.resolve(positions)
        assert np.array_equal(r.source, source) and np.array_equal(r.sample, sample)
    # after the change, the phase draws only code and math
    assert set(tape.resolve(np.arange(80, 160)).source.tolist()) == {1, 2}
    # locate: the newer plan answers for the whole log; the older one is refused
    found = locate(annealed, "math", 0, step_log=log)
    trained = found.position < 160
    assert found.placement is not None and trained.sum() >= 4  # seen before and after step 10
    assert np.array_equal(found.placement.step[trained], found.position[trained] // 8)
    assert (found.placement.step[~trained] == -1).all()
    before = locate(first, "math", 0, global_batch=8).position
    assert np.array_equal(before[before < 80], found.position[found.position < 80])
    with pytest.raises(PlanError, match="from step 10 on, the run went on under a later plan"):
        locate(first, "math", 0, step_log=log)


def test_a_change_below_consumed_is_refused_and_the_loader_keeps_its_state(stores, tmp_path):
    first = plan_of(stores)
    state = _run(first, None, 10, tmp_path / "steps.jsonl", [])
    early = plan_of(stores, PLAN + ANNEAL.format(start=40))
    with pytest.raises(
        ResumeRefused,
        match=r"at consumed 80: phase 2 starts at 40 < consumed 80; position 4\d would draw",
    ):
        Loader(early, 0, CONFIG, state=state)
    with Loader(first, 0, CONFIG, state=state) as loader:
        with pytest.raises(ResumeRefused):
            Loader(early, 0, CONFIG).load_state_dict(state.to_dict())
        assert loader.state == state


def test_a_new_source_first_drawn_in_a_later_phase_may_be_added(stores, tmp_path):
    three = PLAN.replace("weight = 10", "weight = 0") + ANNEAL.format(start=1500)
    two = plan_of(stores, PLAN.split('[[source]]\nname = "math"')[0])
    state = _run(two, None, 5, tmp_path / "steps.jsonl", [])
    moved = state.resume_on(plan_of(stores, three))
    assert len(moved.plan_changes) == 1


def test_plan_changes_round_trip_and_a_damaged_list_is_refused(stores, tmp_path):
    first = plan_of(stores)
    state = _run(first, None, 3, tmp_path / "steps.jsonl", [])
    assert "plan_changes" not in state.to_dict()  # a run on one plan saves what it always did
    moved = state.resume_on(plan_of(stores, PLAN + ANNEAL.format(start=24)))
    saved = json.loads(json.dumps(moved.to_dict()))
    assert DataState.from_dict(saved) == moved
    for edit, message in [
        ({"consumed": 16}, r"plan_changes\[0\]: consumed 16 is not the history's at step 3"),
        ({"step": 4}, r"plan_changes\[0\]: does not follow the change before it"),
        ({"new_index_hash": "sha256:x"}, "the last of 'plan_changes' does not lead to"),
        ({"old_index_hash": 5}, "'old_index_hash' must be an index hash"),
        ({"extra": 1}, "expected an object of step, consumed"),
    ]:
        damaged = json.loads(json.dumps(saved))
        damaged["plan_changes"][0].update(edit)
        with pytest.raises(InputError, match=message):
            DataState.from_dict(damaged)
    with pytest.raises(InputError, match="'plan_changes' must be a non-empty list"):
        DataState.from_dict({**saved, "plan_changes": []})


def test_a_crafted_identity_that_hashes_right_but_cannot_be_a_plan_is_refused(stores, tmp_path):
    """The identity is rebuilt into a tape to compare plans: one no plan could have (a period
    beyond 2**24, a source without one sample, a phase out of order) is refused on load."""
    from tokentape._src.train.identity import identity_hash as hash_of

    saved = DataState.start(plan_of(stores)).commit(CONFIG).to_dict()
    for edit in (
        lambda i: i["sources"][0].update(weight_units=2**25) or i.update(denominator=2**25 + 4),
        lambda i: i["sources"][0].update(n_tokens=SEQ),
        lambda i: i.update(
            phases=[
                {"start": 5, "weight_units": [1, 1, 1]},
                {"start": 5, "weight_units": [1, 0, 0]},
            ]
        ),
        lambda i: i.update(phases=[{"start": 5, "weight_units": [0, 0, 0]}]),
    ):
        data = json.loads(json.dumps(saved))
        edit(data["identity"])
        assert hash_of(data["identity"]) is None
        data["index_hash"] = "sha256:" + "0" * 64
        with pytest.raises(InputError, match="'identity' is not a plan identity"):
            DataState.from_dict(data)

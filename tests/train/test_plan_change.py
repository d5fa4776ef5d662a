"""Safe mid-run plan changes: a resume on another plan is accepted exactly when every position
below ``consumed`` keeps its sample, and refused naming the first position that would change.

The property compares ``past_change`` (decided from the two plans' blends, with bounded work)
with a brute-force resolve of every position below ``consumed`` under both plans, for the
changes a training team makes and in corners the main property does not draw (a rename, a
removed or reordered source, a phase repeating the table before it, a version 1 identity).
The loader, the data state and the step log across changes follow what a team does: append a
phase, roll back, change twice and back, resume a rank without a log.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from helpers import PLAN, plan_of, run_cli
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tokentape._src.api import locate, replay
from tokentape._src.train.identity import (
    identity_hash,
    identity_tape,
    past_change,
    plan_identity,
)
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import BatchChange, DataState
from tokentape._src.train.steplog import read_step_log, scan_step_log
from tokentape.errors import InputError, PlanError, ResumeRefused

SEQ = 8


def identity(
    sources: list[dict],
    phases: Sequence[tuple[int, Sequence[int]]] = (),
    seed: int = 5,
    version: int = 2,
) -> dict:
    """A plan identity: ``sources`` as (name, units, n_tokens, content[, dtype]) dicts, the dtype
    uint16 unless given."""
    out = {
        "algorithm_version": version,
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


def source(name: str, units: int, n_tokens: int = 50, content: str | None = None) -> dict:
    return {
        "name": name,
        "weight_units": units,
        "n_tokens": n_tokens,
        "dtype": "uint16",
        "content_hash": content or f"sha256:{name}",
    }


def brute(old: dict, new: dict, below: int) -> int | None:
    """The first position below ``below`` whose sample differs, by resolving every position."""
    keys = []
    for ident in (old, new):
        tape = identity_tape(ident)
        r = tape.resolve(np.arange(below))
        store = [(s["content_hash"], s["n_tokens"], s["dtype"]) for s in ident["sources"]]
        keys.append(
            [
                (tape.names[d], store[d], e, k)
                for d, e, k in zip(
                    r.source.tolist(), r.epoch.tolist(), r.sample.tolist(), strict=True
                )
            ]
        )
    return next((p for p, (a, b) in enumerate(zip(*keys, strict=True)) if a != b), None)


def agrees(old: dict, new: dict, consumed: int) -> None:
    got = past_change(old, new, consumed)
    want = brute(old, new, consumed)
    assert (got is None) == (want is None), (got, want)
    if got is not None:
        assert got[0] == want
        assert "\n" not in got[1]


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


# --- past_change against brute force, in corners ----------------------------------------------


def test_a_renamed_source_is_refused_from_its_first_draw():
    old = identity([source("a", 1), source("b", 1)])
    renamed = identity([source("a", 1), source("z", 1, content="sha256:b")])
    agrees(old, renamed, 10)
    assert past_change(old, renamed, 10)[0] == 1
    # never drawn yet: a rename is no change to the past
    later = identity([source("a", 1), source("b", 0)], [(40, [0, 1])])
    later_renamed = identity([source("a", 1), source("z", 0)], [(40, [0, 1])])
    for consumed in (39, 40, 41):
        agrees(later, later_renamed, consumed)
    assert past_change(later, later_renamed, 40) is None


def test_reordered_sources_with_zero_weights_are_accepted_until_they_are_drawn():
    old = identity(
        [source("a", 1), source("b", 2), source("c", 0), source("d", 0)], [(100, [0, 0, 1, 1])]
    )
    new = identity(
        [source("a", 1), source("b", 2), source("d", 0), source("c", 0)], [(100, [0, 0, 1, 1])]
    )
    for consumed in (0, 1, 99, 100, 101, 150):
        agrees(old, new, consumed)
    assert past_change(old, new, 100) is None
    assert past_change(old, new, 101)[0] == 100


def test_a_removed_source_that_was_never_drawn_is_accepted():
    old = identity([source("a", 1), source("b", 2), source("c", 0)], [(100, [0, 0, 1])])
    new = identity([source("a", 1), source("b", 2)])
    for consumed in (50, 100, 101):
        agrees(old, new, consumed)
    assert past_change(old, new, 100) is None
    assert past_change(old, new, 101)[0] == 100


def test_phases_whose_tables_coincide_are_compared_by_offset():
    same = [source("a", 1), source("b", 1)]
    plain = identity(same)
    agrees(identity(same, [(100, [1, 1])]), plain, 1000)  # restarts in step with the period
    assert past_change(identity(same, [(100, [1, 1])]), plain, 1000) is None
    agrees(identity(same, [(101, [1, 1])]), plain, 1000)  # out of step: differs at 101
    assert past_change(identity(same, [(101, [1, 1])]), plain, 1000)[0] == 101
    scaled = identity(same, [(101, [1, 1]), (103, [2, 2])])
    agrees(scaled, identity(same, [(103, [2, 2])]), 1000)
    # a phase identical to the one before, moved by a whole period: the same names throughout
    agrees(identity(same, [(100, [1, 1])]), identity(same, [(102, [1, 1])]), 500)
    assert past_change(identity(same, [(100, [1, 1])]), identity(same, [(102, [1, 1])]), 500) is (
        None
    )


def test_consumed_exactly_at_a_phase_start_and_far_beyond_the_horizon():
    old = identity([source("a", 3), source("b", 1)])
    new = identity([source("a", 3), source("b", 1)], [(40, [1, 3])])
    assert past_change(old, new, 40) is None
    assert past_change(old, new, 41)[0] == 40
    big = [source("a", 3, 10**12), source("b", 1, 10**12)]
    top = 2**62
    last_a = identity(big, [(top - 1, [1, 0])])
    assert past_change(last_a, identity(big), top - 1) is None
    position, why = past_change(last_a, identity(big), top)
    assert position == top - 1 and why.startswith(f"phase 2 started at {top - 1:,} < consumed")
    # the plain blend draws 'b' there too (and the same draw of it): no change at all
    last_b = identity(big, [(top - 1, [0, 1])])
    r = [identity_tape(i).resolve([top - 1]) for i in (last_b, identity(big))]
    assert (r[0].source, r[0].epoch, r[0].sample) == (r[1].source, r[1].epoch, r[1].sample)
    assert past_change(last_b, identity(big), top) is None


def test_a_version_1_identity_with_the_same_units_keeps_the_tape():
    sources = [source("a", 3), source("b", 1)]
    assert past_change(identity(sources, version=1), identity(sources), 10**6) is None
    assert past_change(identity(sources, version=1), identity(sources, seed=6), 1) is not None


names = ["a", "b", "c", "d"]


@st.composite
def corner_changes(draw):
    """A plan, and a change among those the main property does not draw: a rename, a removed
    source, sources reordered while some have weight 0, a phase duplicating the table before."""
    n = draw(st.integers(2, 4))
    first = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n).filter(any))
    sources = [
        source(names[i], first[i], draw(st.integers(SEQ + 1, 80)), f"sha256:{names[i]}")
        for i in range(n)
    ]
    phases, start = [], 0
    for _ in range(draw(st.integers(0, 3))):
        start += draw(st.integers(1, 40))
        if draw(st.booleans()):
            units = list(phases[-1][1]) if phases else list(first)
        else:
            units = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n).filter(any))
        phases.append((start, units))
    for d in range(n):  # every source drawn in some phase
        if not any([first[d], *(u[d] for _, u in phases)]):
            sources[d]["weight_units"] = 1
            first[d] = 1
    new_sources = [dict(s) for s in sources]
    new_phases = [(a, list(u)) for a, u in phases]
    kind = draw(st.sampled_from(["rename", "remove", "reorder", "duplicate", "version"]))
    if kind == "rename":
        d = draw(st.integers(0, n - 1))
        new_sources[d]["name"] = "z"
    elif kind == "remove":
        d = draw(st.integers(0, n - 1))
        del new_sources[d]
        new_phases = [(a, [x for i, x in enumerate(u) if i != d]) for a, u in new_phases]
        if not any(s["weight_units"] for s in new_sources):
            new_sources[0]["weight_units"] = 1
        new_phases = [(a, u if any(u) else [1, *u[1:]]) for a, u in new_phases]
    elif kind == "reorder":
        order = draw(st.permutations(range(n)))
        new_sources = [new_sources[i] for i in order]
        new_phases = [(a, [u[i] for i in order]) for a, u in new_phases]
    elif kind == "duplicate":  # the last table once more, from a later start
        last = new_phases[-1][0] if new_phases else 0
        units = new_phases[-1][1] if new_phases else [s["weight_units"] for s in new_sources]
        new_phases.append((last + draw(st.integers(1, 40)), list(units)))
    return sources, phases, new_sources, new_phases, kind


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_corner_changes_are_decided_exactly_as_brute_force(data):
    sources, phases, new_sources, new_phases, kind = data.draw(corner_changes())
    old = identity(sources, phases)
    new = identity(new_sources, new_phases, version=1 if kind == "version" else 2)
    horizon = max([0, *(a for a, _ in phases), *(a for a, _ in new_phases)]) + 60
    consumed = data.draw(st.integers(0, horizon))
    agrees(old, new, consumed)


def test_a_reorder_is_refused_naming_the_order():
    old = identity([source("a", 1), source("b", 1)])
    new = identity([source("b", 1), source("a", 1)])
    position, why = past_change(old, new, 10)
    assert position == 0
    assert "another order" in why


def test_a_crafted_identity_with_a_duplicate_source_name_is_refused():
    one = identity([source("a", 2)])
    ident = {**one, "sources": [source("a", 1), source("a", 1)]}  # no plan has two 'a'
    assert past_change(ident, one, 8) is None  # accepted, yet the samples differ:
    assert brute(ident, one, 8) is not None
    state = DataState(identity_hash(ident) or "sha256:" + "0" * 64, ident).to_dict()
    with pytest.raises(InputError, match="not a plan identity"):
        DataState.from_dict(state)


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


def test_a_crafted_identity_too_large_for_a_tape_is_refused_as_input(stores):
    plan = plan_of(stores)
    ident = plan_identity(plan)
    ident["seq_len"] = 1  # with 2**64 - 1 tokens: 2**64 - 2 samples, beyond int64
    for s, units in zip(ident["sources"], (1, 1, 1), strict=True):
        s.update(n_tokens=2**64 - 1, weight_units=units)
    ident["denominator"] = 3
    saved = DataState(identity_hash(ident), ident, 16, 2, (BatchChange(0, 0, 1, 8, 1),))
    try:
        state = DataState.from_dict(json.loads(json.dumps(saved.to_dict())))
    except InputError:
        return  # refused on load
    with pytest.raises(ResumeRefused):
        state.resume_on(plan)


def _train(plan, state, steps: int, log: Path | None, rank: int = 0) -> DataState:
    with Loader(plan, rank, CONFIG, state=state, prefetch=0, step_log=log) as loader:
        for _ in range(steps):
            loader.step()
            loader.commit()
        return DataState.from_dict(json.loads(json.dumps(loader.state_dict())))


def test_load_state_dict_after_construction_accepts_a_log_of_the_older_plan(stores, tmp_path):
    log = tmp_path / "steps.jsonl"
    first = plan_of(stores)
    saved = _train(first, None, 10, log).to_dict()
    annealed = plan_of(stores, PLAN + ANNEAL.format(start=80))
    with Loader(annealed, 0, CONFIG, prefetch=0, step_log=log) as loader:
        loader.load_state_dict(saved)  # the log ends under the plan the state changes from
        step = loader.step()
        assert (step.step, step.consumed) == (10, 80)
        loader.commit()
    assert [h for _, h in scan_step_log(log).plans] == [first.index_hash, annealed.index_hash]
    # without a state, the loader refuses the older plan's log at the first step
    fresh = tmp_path / "fresh.jsonl"
    _train(first, None, 2, fresh)
    with (
        Loader(annealed, 0, CONFIG, prefetch=0, step_log=fresh) as loader,
        pytest.raises(PlanError, match="written for another plan"),
    ):
        loader.step()


def test_a_run_that_changes_plans_twice_and_back_stays_auditable(stores, tmp_path):
    """A → B (a phase far ahead) → A (the phase dropped before it began): every change is
    accepted, the log holds three stretches, and A answers for every step while B is refused
    naming the step from which the run went on under A again."""
    log = tmp_path / "steps.jsonl"
    a = plan_of(stores)
    b = plan_of(stores, PLAN + ANNEAL.format(start=1000))
    state = _train(a, None, 10, log)
    state = _train(b, state, 5, log)
    state = _train(a, state, 5, log)
    assert [(c.step, c.consumed) for c in state.plan_changes] == [(10, 80), (15, 120)]
    assert state.index_hash == a.index_hash
    assert scan_step_log(log).plans == ((0, a.index_hash), (10, b.index_hash), (15, a.index_hash))
    logged = {r.step: r.tokens_hash for r in read_step_log(log)}
    for step in (3, 12, 17):
        assert replay(a, step, step_log=log).tokens_hash == logged[step], step
    with pytest.raises(PlanError, match="from step 15 on, the run went on under a later plan"):
        replay(b, 12, step_log=log)
    found = locate(a, "math", 0, step_log=log)
    assert found.placement is not None


def test_a_checkpoint_saved_right_after_a_change_resumes_on_either_plan(stores, tmp_path):
    """A crash between a plan change and its first commit: the state saved then records the
    change; resuming on the newer plan keeps it, on the older one records the way back."""
    log = tmp_path / "steps.jsonl"
    a = plan_of(stores)
    b = plan_of(stores, PLAN + ANNEAL.format(start=80))
    state = _train(a, None, 10, log)
    with Loader(b, 0, CONFIG, state=state, prefetch=0, step_log=log) as loader:
        saved = loader.state_dict()  # no step under b yet
    assert saved["plan_changes"][0]["step"] == 10
    again = _train(b, DataState.from_dict(saved), 1, log)
    assert [c.new_index_hash for c in again.plan_changes] == [b.index_hash]
    back = _train(a, DataState.from_dict(saved), 1, tmp_path / "back.jsonl")
    assert [c.new_index_hash for c in back.plan_changes] == [b.index_hash, a.index_hash]


def test_a_rank_without_a_step_log_takes_the_change_too(stores):
    a = plan_of(stores)
    b = plan_of(stores, PLAN + ANNEAL.format(start=80))
    state = _train(a, None, 10, None, rank=1)
    moved = _train(b, state, 2, None, rank=1)
    assert moved.plan_changes[0].consumed == 80 and moved.consumed == 96


def test_an_older_state_on_the_newer_plan_is_refused_once_past_the_phase(stores, tmp_path):
    a = plan_of(stores)
    b = plan_of(stores, PLAN + ANNEAL.format(start=80))
    state = _train(a, None, 10, None)
    on_b = _train(b, state, 2, None)  # consumed 96, beyond b's phase start
    with pytest.raises(ResumeRefused, match=r"phase 2 started at 80 < consumed 96 and is removed"):
        on_b.resume_on(a)


def test_a_phase_starting_inside_a_step_and_two_changes_at_one_step(stores, tmp_path):
    """A phase from the middle of the next step (positions 83.., the step covers 80..95), then
    a second change before any step under the first: both recorded at step 10, and the log and
    a replay of every step agree with the last plan."""
    log = tmp_path / "steps.jsonl"
    a = plan_of(stores)
    b = plan_of(stores, PLAN + ANNEAL.format(start=83))
    c = plan_of(stores, PLAN + ANNEAL.format(start=83) + ANNEAL.format(start=150))
    state = _train(a, None, 10, log)
    with Loader(b, 0, CONFIG, state=state, prefetch=0, step_log=log) as loader:
        saved = loader.state_dict()
    state = _train(c, DataState.from_dict(saved), 10, log)
    assert [(x.step, x.new_index_hash) for x in state.plan_changes] == [
        (10, b.index_hash),
        (10, c.index_hash),
    ]
    assert scan_step_log(log).plans == ((0, a.index_hash), (10, c.index_hash))
    logged = {r.step: r.tokens_hash for r in read_step_log(log)}
    for step in range(20):
        assert replay(c, step, step_log=log).tokens_hash == logged[step], step
    sources = c.tape().resolve(np.arange(80, 96)).source.tolist()
    assert sources[:3] == a.tape().resolve(np.arange(80, 83)).source.tolist()
    assert set(sources[3:]) <= {1, 2}  # from 83 on: code and math only


def test_rolling_back_to_the_checkpoint_before_a_change_keeps_the_log(stores, tmp_path):
    """The annealing phase went badly: back to the checkpoint taken before it, on the plan it
    ran on. The steps logged under the abandoned plan are superseded by the ones retrained."""
    log = tmp_path / "steps.jsonl"
    a = plan_of(stores)
    b = plan_of(stores, PLAN + ANNEAL.format(start=80))
    checkpoint = _train(a, None, 10, log)
    _train(b, checkpoint, 3, log)  # committed and logged, then abandoned (no checkpoint kept)
    state = _train(a, checkpoint, 3, log)
    assert state.step == 13 and not state.plan_changes
    assert scan_step_log(log).plans == ((0, a.index_hash),)
    logged = {r.step: r.tokens_hash for r in read_step_log(log)}
    assert replay(a, 11, step_log=log).tokens_hash == logged[11]


def test_replay_and_locate_on_the_command_line_with_a_log_of_two_plans(stores, tmp_path):
    log = tmp_path / "steps.jsonl"
    a = plan_of(stores)
    b = plan_of(stores, PLAN + ANNEAL.format(start=80))
    _train(b, _train(a, None, 10, log), 2, log)
    a.save(tmp_path / "a.json")
    b.save(tmp_path / "b.json")
    ok = run_cli("replay", str(tmp_path / "b.json"), "--step", "3", "--log", str(log), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["log_tokens_hash_matches"] is True
    ok = run_cli("locate", str(tmp_path / "b.json"), "math", "0", "--log", str(log), "--json")
    assert ok.returncode == 0, ok.stderr
    for args in (
        ("replay", str(tmp_path / "a.json"), "--step", "3", "--log", str(log)),
        ("locate", str(tmp_path / "a.json"), "math", "0", "--log", str(log)),
    ):
        bad = run_cli(*args)
        assert bad.returncode == 2 and bad.stdout == ""
        assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
        assert str(log) in bad.stderr and "from step 10 on" in bad.stderr

"""Excision of documents from a plan (``Plan.excise``), against brute force over the positions.

The truth is computed independently of the closed form: every position of the old plan is
resolved one by one to its sample, the sample's documents read from the store
(``Source.docs_in``), and the positions holding an excised document filtered out in Python.
Properties: (a) every position below C gives the same sample; (b) no position from C on (to
the horizon) holds a token of an excised document; (c) from C on, the new sequence is the
old one minus those positions, in order; (d) a run resumed across the excision, on another
data-parallel size, trains every position of the new plan once, none lost or repeated, and
a checkpoint past the first excised position is refused, naming it.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan, PlanPhase
from tokentape._src.store.reader import Source
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState
from tokentape.errors import OutOfRangeError, PlanError, ResumeRefused

HORIZON = 240
SEQ_LEN = 16
PROPERTY = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def base(mixture_stores):
    weights = {"web": 3, "code": 2, "math": 1}
    plan = Plan.build(
        {n: {"path": str(mixture_stores / "stores" / n), "weight": w, "max_repeats": 1000}
         for n, w in weights.items()},
        seq_len=SEQ_LEN, seed=11, total_samples=HORIZON,
    )  # fmt: skip
    stores = {s.name: Source(s.path) for s in plan.sources}
    return plan, stores


def _at(plan: Plan, p: int) -> tuple[str, int, int]:
    """(source name, epoch, sample) at position ``p``, resolved alone."""
    r = plan.tape().resolve(np.array([p]))
    return plan.sources[int(r.source[0])].name, int(r.epoch[0]), int(r.sample[0])


def _docs_at(plan: Plan, stores, p: int) -> set[tuple[str, int]]:
    name, _, k = _at(plan, p)
    return {(name, d) for d in stores[name].docs_in(k, SEQ_LEN)}


@st.composite
def excisions(draw, plan_and_stores):
    plan, stores = plan_and_stores
    c = draw(st.integers(0, HORIZON - 1))
    # documents drawn at a position from C on (so there is something to excise), plus maybe one
    # drawn anywhere
    p = draw(st.integers(c, HORIZON - 1))
    docs = sorted(_docs_at(plan, stores, p))[: draw(st.integers(1, 2))]
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(stores)))
        docs.append((name, draw(st.integers(0, stores[name].n_docs - 1))))
    return c, docs


def _property(base, data):
    plan, stores = base
    c, docs = data.draw(excisions(base))
    return plan, stores, c, docs, plan.excise(c, docs=docs)


@PROPERTY
@given(st.data())
def test_below_c_nothing_changes_and_from_c_the_old_sequence_minus_the_excised(base, data):
    plan, stores, c, docs, new = _property(base, data)
    cut = set(docs)
    # (a)
    old_r, new_r = plan.tape().resolve(np.arange(c)), new.tape().resolve(np.arange(c))
    for f in ("source", "epoch", "sample"):
        assert np.array_equal(getattr(old_r, f), getattr(new_r, f))
    # (b) and (c), brute force
    kept_old = [p for p in range(c, 3 * HORIZON) if not _docs_at(plan, stores, p) & cut]
    for q in range(c, HORIZON):
        assert not _docs_at(new, stores, q) & cut, q
        assert _at(new, q) == _at(plan, kept_old[q - c])
    record = new.excisions[-1]
    left_out = [p for p in range(c, kept_old[HORIZON - c - 1]) if _docs_at(plan, stores, p) & cut]
    assert record.count == len(left_out) and record.first == left_out[0]
    assert dict(record.removed) == {
        n: sum(_at(plan, p)[0] == n for p in left_out) for n in {_at(plan, p)[0] for p in left_out}
    }
    assert load_plan_text(new) == new  # the plan file keeps it


def load_plan_text(plan: Plan) -> Plan:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "PLAN.json"
        plan.save(path)
        back = load_plan(path)
    assert back.index_hash == plan.index_hash and back.to_json() == plan.to_json()
    return back


@PROPERTY
@given(st.data())
def test_excisions_compose(base, data):
    """A second excision on top of the first: below its C nothing changes, from it on the
    first's sequence minus every excised document (the second's, and the first's draws that
    the horizon, growing by what the second leaves out, now reaches)."""
    _, stores, c, docs, once = _property(base, data)
    c2 = data.draw(st.integers(c, HORIZON - 1))
    p = data.draw(st.integers(c2, HORIZON - 1))
    more = sorted(_docs_at(once, stores, p))[:1]
    twice = once.excise(c2, docs=more)
    assert len(twice.excisions) == 2 and load_plan_text(twice) == twice
    cut = set(docs) | set(more)
    kept = [q for q in range(c2, 3 * HORIZON) if not _docs_at(once, stores, q) & cut]
    for q in range(c2, HORIZON):
        assert not _docs_at(twice, stores, q) & cut
        assert _at(twice, q) == _at(once, kept[q - c2])
    assert [_at(twice, q) for q in range(c2)] == [_at(once, q) for q in range(c2)]


def _train(plan: Plan, config: BatchConfig, state: dict | None, steps: int):
    """Run ``steps`` steps on every rank (from ``state``); the (position, source, sample) each
    step applied, and the state after."""
    loaders = [Loader(plan, r, config, prefetch=1) for r in range(config.dp_size)]
    rows = []
    try:
        for lo in loaders:
            if state is not None:
                lo.load_state_dict(json.loads(json.dumps(state)))
        for _ in range(steps):
            got = [lo.step() for lo in loaders]
            for s in got:
                for b in s.micro_batches:
                    rows += zip(b.positions.tolist(), b.source.tolist(), b.sample.tolist(),
                                strict=True)  # fmt: skip
            for lo in loaders:
                lo.commit()
        return rows, loaders[0].state_dict()
    finally:
        for lo in loaders:
            lo.close()


@PROPERTY
@given(st.data())
def test_a_run_resumes_across_the_excision_on_another_dp_size_exactly(base, data):
    """(d): train on the old plan to a checkpoint at or before the first excised position,
    resume on the new plan with another dp size: every position is trained once, each with the
    new plan's sample; a checkpoint past the first excised position is refused."""
    plan, stores = base
    before = BatchConfig(data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    after = BatchConfig(data.draw(st.integers(1, 4)), data.draw(st.integers(1, 2)))
    steps = data.draw(st.integers(1, 6))
    rows, state = _train(plan, before, None, steps)
    consumed = state["consumed"]
    docs = sorted(_docs_at(plan, stores, data.draw(st.integers(consumed, HORIZON - 1))))[:1]
    new = plan.excise(consumed, docs=docs)
    more, state = _train(new, after, state, data.draw(st.integers(1, 6)))
    positions = [r[0] for r in rows + more]
    assert sorted(positions) == list(range(state["consumed"]))  # none lost, none repeated
    tape = new.tape().resolve(np.arange(state["consumed"]))
    want = list(zip(range(state["consumed"]), tape.source.tolist(), tape.sample.tolist(),
                    strict=True))  # fmt: skip
    assert sorted(rows + more) == want
    # a checkpoint past the first position the excision changes is refused, naming it
    first = new.excisions[-1].first
    late = DataState.start(plan)
    while late.consumed <= first:
        late = late.commit(BatchConfig(1, 7))
    with pytest.raises(ResumeRefused, match=f"leaves out position {first:,}"):
        late.resume_on(new)


def test_nothing_to_excise_is_one_line(base):
    """From the last position, a document its sample does not hold leaves nothing out."""
    plan, stores = base
    there = _docs_at(plan, stores, HORIZON - 1)
    other = next(("web", d) for d in range(stores["web"].n_docs) if ("web", d) not in there)
    with pytest.raises(PlanError, match="nothing to leave out"):
        plan.excise(HORIZON - 1, docs=[other])
    with pytest.raises(PlanError, match="nothing to leave out"):
        plan.excise(0)


def test_a_crafted_or_damaged_excision_in_plan_json_is_one_line(base, tmp_path):
    """PLAN.json's excisions are checked before they are believed: positions against their
    count and hash, ascending; 'first' not below 'from_consumed'; per-source counts that add
    up; no position left out twice; the index hash recomputed (an edited one is refused)."""
    plan, stores = base
    docs = sorted(_docs_at(plan, stores, HORIZON // 2))[:1]
    new = plan.excise(HORIZON // 4, docs=docs)
    path = tmp_path / "PLAN.json"
    new.save(path)
    good = json.loads(path.read_text())

    def edited(change) -> str:
        data = json.loads(json.dumps(good))
        change(data["excisions"][0], data)
        path.write_text(json.dumps(data))
        with pytest.raises(PlanError) as exc:
            load_plan(path)
        message = str(exc.value)
        assert "\n" not in message and "Traceback" not in message
        return message

    def count(e, _):
        e["count"] += 1

    def sha(e, _):
        e["sha256"] = "sha256:" + "0" * 64

    def first(e, _):
        e["first"] = e["from_consumed"] - 1

    def removed(e, _):
        e["removed"] = {k: v + 1 for k, v in e["removed"].items()}

    def text(e, _):
        e["positions"] = "not base64!"

    def twice(_, data):
        data["excisions"].append(dict(data["excisions"][0], from_consumed=HORIZON // 3))

    def hashed(_, data):
        data["index_hash"] = plan.index_hash

    assert "do not hold" in edited(count)
    assert "sha256" in edited(sha)
    assert "from_consumed" in edited(first)
    assert "removed" in edited(removed)
    assert "readable" in edited(text)
    assert "same position" in edited(twice)
    assert "index" in edited(hashed).lower()
    path.write_text(json.dumps(good))
    assert load_plan(path) == new


def test_an_excision_belongs_to_the_blend_and_horizon_it_was_made_on(base):
    """Its positions are the blend's: a plan whose phases (or seed) changed around an excision
    refuses it rather than leave out the wrong samples; positions past the horizon, which no
    run of the plan trains, are refused."""
    plan, stores = base
    docs = sorted(_docs_at(plan, stores, HORIZON // 2))[:1]
    new = plan.excise(HORIZON // 4, docs=docs)
    phase = PlanPhase(HORIZON // 3, (1.0, 1.0, 0.0), (1, 1, 0), 2)
    with pytest.raises(PlanError, match="excision 1 was made on the plan"):
        dataclasses.replace(new, phases=(phase,))
    with pytest.raises(PlanError, match="excision 1 was made on the plan"):
        dataclasses.replace(new, seed=plan.seed + 1)
    assert dataclasses.replace(new, horizon_samples=HORIZON).index_hash == new.index_hash
    with pytest.raises(OutOfRangeError, match="past the horizon"):
        plan.excise(0, positions=[HORIZON])
    with pytest.raises(OutOfRangeError, match="past the horizon"):
        plan.excise(0, positions=[2**63 - 1])

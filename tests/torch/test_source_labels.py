"""Every row of every batch carries its source (``to_torch(...)["source"]``, and through
``TapeDataset``/``collate`` with or without DataLoader workers), for a loss per source.

The expected label of a row is what ``replay`` rebuilds for that step, offline, from the plan
and the step's shape (``tokentape.replay``: its batch's ``source``, rows in rank order), and
the row's window must be the replayed window. Checked over many steps and shapes
(hypothesis), across a resume on another dp size, and across a plan change (a phase appended
at ``consumed``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import small_shard_stores  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import tokentape  # noqa: E402
from tokentape._src.plan.plan import PlanPhase, resolve_plan  # noqa: E402
from tokentape._src.plan.spec import load_plan_spec  # noqa: E402
from tokentape.torch import TapeBatchSampler, TapeDataset, collate, to_torch  # noqa: E402

pytestmark = pytest.mark.torch
PROPERTY = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    root = tmp_path_factory.mktemp("labels")
    small_shard_stores(root)
    return resolve_plan(load_plan_spec(root / "mix.toml"))


def _replayed(plan, step: int, rank: int, **shape):
    """{position: (source, window)} of rank ``rank``'s rows of ``step``, rebuilt by replay
    (``shape``: the run's step log, or its constant batch shape)."""
    r = tokentape.replay(plan, step, **shape)
    rows = r.rows(rank)
    return {int(p): (int(s), w) for p, s, w in zip(r.batch.positions[rows], r.batch.source[rows],
                                                    r.batch.tokens[rows], strict=True)}  # fmt: skip


def _check_loader(plan, config, state, steps, log):
    """Every rank's micro-batches for ``steps`` steps from ``state`` (rank 0 writing the step
    log ``log``): each row's label and window as replay rebuilds them from the log."""
    loaders = [tokentape.Loader(plan, r, config, prefetch=1, step_log=log if r == 0 else None)
               for r in range(config.dp_size)]  # fmt: skip
    try:
        for lo in loaders:
            if state is not None:
                lo.load_state_dict(state)
        for _ in range(steps):
            got = [lo.step() for lo in loaders]
            for lo in loaders:
                lo.commit()  # the step is logged: replay reads its shape there
            for rank, s in enumerate(got):
                want = _replayed(plan, s.step, rank, step_log=log)
                rows = [(p, int(k), w) for m in s.micro_batches
                        for p, k, w in zip(m.positions.tolist(),
                                           to_torch(m, pin=False)["source"].tolist(), m.tokens,
                                           strict=True)]  # fmt: skip
                assert sorted(p for p, _, _ in rows) == sorted(want)
                for p, k, w in rows:
                    assert k == want[p][0] and np.array_equal(w, want[p][1])
        return loaders[0].state_dict()
    finally:
        for lo in loaders:
            lo.close()


shapes = st.builds(tokentape.BatchConfig, st.integers(1, 3), st.integers(1, 3), st.integers(1, 2))


@PROPERTY
@given(shapes, shapes, st.integers(1, 4), st.integers(1, 4))
def test_labels_are_the_replayed_sources_across_a_resume_on_another_dp(plan, tmp_path, a, b,
                                                                      n, m):  # fmt: skip
    log = tmp_path / f"steps-{a}-{b}-{n}-{m}.jsonl"
    log.unlink(missing_ok=True)
    state = _check_loader(plan, a, None, n, log)
    _check_loader(plan, b, state, m, log)


def test_labels_across_a_plan_change(plan, tmp_path):
    """A phase appended at consumed: the resumed steps' labels follow the new mixture, as
    replay of the new plan gives them."""
    config = tokentape.BatchConfig(2, 2, 1)
    log = tmp_path / "steps.jsonl"
    state = _check_loader(plan, config, None, 3, log)
    consumed = state["consumed"]
    phase = PlanPhase(consumed, (0.0, 1.0, 1.0), (0, 1, 1), 2)
    changed = dataclasses.replace(plan, phases=(phase,))
    _check_loader(changed, config, state, 4, log)
    labels = changed.tape().resolve(np.arange(consumed, consumed + 8)).source
    assert 0 not in labels.tolist()  # the first source has weight 0 from consumed on


@pytest.mark.subprocess
@pytest.mark.parametrize("workers", [0, 2])
def test_labels_through_the_dataset_with_and_without_workers(plan, workers):
    config, rank, steps = tokentape.BatchConfig(2, 3, 2), 1, 3
    sampler = TapeBatchSampler(rank, config, 0, steps)
    loader = DataLoader(TapeDataset(plan), batch_sampler=sampler, collate_fn=collate,
                        num_workers=workers)  # fmt: skip
    got = [b["source"].numpy() for b in loader]
    assert len(got) == steps * config.accum
    shape = {"dp": config.dp_size, "micro": config.micro, "accum": config.accum}
    for step in range(steps):
        want = _replayed(plan, step, rank, **shape)
        mine = np.concatenate(got[step * config.accum : (step + 1) * config.accum])
        assert mine.tolist() == [want[p][0] for p in sorted(want)]

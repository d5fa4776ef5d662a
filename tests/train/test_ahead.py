"""Resolving coming steps in chunks gives, step by step, exactly what resolving each step alone
gives: for every rank, across batch-shape changes (dp size, micro, accum), in any order the
steps are asked for, at any chunk size, on a plain tape and on one in phases."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.tape.resolve import Tape
from tokentape._src.train.ahead import ResolveAhead, StepShape
from tokentape._src.train.partition import BatchConfig, positions_for

TAPES = [
    Tape.build(["web", "code", "math"], [50, 7, 3], [6, 3, 1], seed=3),
    Tape.build_phased(["web", "code", "math"], [50, 7, 3], [0, 41], [[6, 3, 1], [1, 1, 2]], 5),
]
CONFIGS = st.builds(BatchConfig, st.integers(1, 4), st.integers(1, 5), st.integers(1, 3))


def same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(TAPES),
    st.lists(st.tuples(CONFIGS, st.integers(1, 6)), min_size=1, max_size=4),
    st.integers(1, 64),
    st.integers(0, 10**6),
    st.randoms(use_true_random=False),
)
def test_every_step_equals_resolving_it_alone(tape, phases, chunk, consumed, rng):
    ahead = ResolveAhead(tape, chunk=chunk)
    asked = []
    for config, steps in phases:  # the run's batch shape changes; consumed carries on
        for _ in range(steps):
            for rank in range(config.dp_size):
                asked.append((consumed, config, rank))
            asked.append((consumed, config, None))  # the whole step (the step log's hash)
            consumed += config.global_batch
    window = sorted(asked[:8], key=lambda _: rng.random()) + asked[8:]  # prefetch reorders
    for consumed, config, rank in window:
        if rank is None:
            b = config.global_batch
            got = ahead.resolved(consumed, StepShape(b, 0, b))
            want = tape.resolve(np.arange(consumed, consumed + b))
        else:
            shape = StepShape(config.global_batch, rank * config.per_rank, config.per_rank)
            got = ahead.resolved(consumed, shape)
            want = tape.resolve(positions_for(consumed, rank, config).ravel())
        assert same((got.source, got.epoch, got.sample), (want.source, want.epoch, want.sample))


def test_a_small_step_is_resolved_once_per_chunk():
    """Steps of 4 positions: the first chunk covers 4 steps (a start stays quick), each next
    one twice as many, up to the 256 steps of 1,024 positions."""
    calls = []

    class Counting(Tape):
        def resolve(self, positions):
            calls.append(len(positions))
            return super().resolve(positions)

    base = TAPES[0]
    tape = Counting(base.names, base.n_samples, base.seed, base.blend)
    ahead = ResolveAhead(tape, chunk=1024)
    for step in range(300):  # rank 1 of 2, micro 4
        ahead.resolved(step * 8, StepShape(8, 4, 4))
    assert calls == [16, 32, 64, 128, 256, 512, 1024]  # 4 + 8 + ... + 256 steps cover 300

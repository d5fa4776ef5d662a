"""Schedule (position → step, rank, micro-batch) and step-log reading."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import record
from hypothesis import given
from hypothesis import strategies as st

from tokentape._src.train.partition import BatchConfig, positions_for
from tokentape._src.train.schedule import Schedule
from tokentape._src.train.state import DataState
from tokentape._src.train.steplog import read_step_log, schedule_of
from tokentape.errors import TokentapeError

configs = st.builds(
    BatchConfig,
    st.integers(1, 5),
    st.integers(1, 4),
    st.integers(1, 3),
)


@given(st.lists(st.tuples(configs, st.integers(1, 4)), min_size=1, max_size=5))
def test_place_inverts_positions_for(runs: list[tuple[BatchConfig, int]]) -> None:
    """Walk a run whose shape changes; every position read lands where the schedule says."""
    state = DataState("h", {})
    expected = []  # (position, step, rank, micro_step, row)
    for config, steps in runs:
        for _ in range(steps):
            for rank in range(config.dp_size):
                rows = positions_for(state.consumed, rank, config)
                for m, row in np.ndindex(rows.shape):
                    expected.append((int(rows[m, row]), state.step, rank, m, row))
            state = state.commit(config)
    schedule = Schedule(state.history, steps=state.step)
    got = schedule.place(np.array([e[0] for e in expected]))
    table = np.stack([got.step, got.dp_rank, got.micro_step, got.row], axis=1)
    assert table.tolist() == [list(e[1:]) for e in expected]
    assert schedule.end == state.consumed
    beyond = schedule.place(np.array([state.consumed, state.consumed + 7]))
    assert beyond.step.tolist() == [-1, -1]
    for step in range(state.step):
        assert schedule.start(step) == state.consumed_before(step)


def test_uniform_schedule_is_open_ended() -> None:
    s = Schedule.uniform(BatchConfig(4, 2, 2))
    got = s.place(np.array([0, 15, 16, 10**12]))
    assert got.step.tolist() == [0, 0, 1, 10**12 // 16]
    assert got.dp_rank.tolist() == [0, 3, 0, (10**12 % 16) // 4]
    with pytest.raises(TokentapeError, match="outside"):
        s.start(-1)


def test_inconsistent_history_is_refused() -> None:
    good = DataState("h", {}).commit(BatchConfig(2, 2)).commit(BatchConfig(1, 2))
    bad = (good.history[0], good.history[1].__class__(1, 5, 1, 2, 1))
    with pytest.raises(TokentapeError, match="consumed"):
        Schedule(bad)


def _line(step: int, consumed: int, dp: int) -> str:
    return json.dumps(record(step, consumed, dp)) + "\n"


def test_redone_steps_supersede_earlier_lines(tmp_path) -> None:
    """Steps 2, 3 were logged, the run died, resumed from step 2's checkpoint with dp 1."""
    log = tmp_path / "steps.jsonl"
    log.write_text(
        _line(0, 0, 2)
        + _line(1, 4, 2)
        + _line(2, 8, 2)
        + _line(3, 12, 2)
        # resumed at step 2 (consumed 8) with dp 1:
        + _line(2, 8, 1)
        + _line(3, 10, 1)
    )
    records = read_step_log(log)
    assert [(r.step, r.consumed, r.dp) for r in records] == [
        (0, 0, 2),
        (1, 4, 2),
        (2, 8, 1),
        (3, 10, 1),
    ]
    assert records[2].tokens_hash == "t2-1-2-1"
    schedule = schedule_of(records)
    assert schedule.end == 12
    assert schedule.place(np.array([9, 11, 12])).step.tolist() == [2, 3, -1]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("{not json\n", r"steps.jsonl:1: not a JSON line"),
        ('{"step": 0}\n', r"steps.jsonl:1: field 'consumed'"),
        (_line(1, 0, 2), "does not start at step 0"),
        (_line(0, 0, 2) + _line(2, 8, 2), "steps missing"),
        (_line(0, 0, 2) + _line(1, 5, 2), "expected 4"),
    ],
)
def test_bad_logs_are_refused_naming_the_line(tmp_path, text: str, message: str) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text(text)
    with pytest.raises(TokentapeError, match=message):
        read_step_log(log)


def test_missing_log(tmp_path) -> None:
    with pytest.raises(TokentapeError, match="cannot read the step log"):
        read_step_log(tmp_path / "nope.jsonl")

"""Rank checks in real gloo processes, and the verifier's own ability to catch violations."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from test_batch import small_plan_json

from tokentape.cli import main
from tokentape.train.smoke import RankReport, verify


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    path = small_plan_json(root)
    return path


def test_smoke_in_real_processes(plan_json, capsys):
    assert main(["smoke", str(plan_json), "--dp", "2", "--tp", "2", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "OK: dp=2 tp=2, 2 steps, 0 problems" in out
    rows = [line.split("\t") for line in out.splitlines() if line[:1].isdigit()]
    assert len(rows) == 2 * 4  # steps x ranks
    for step in ("0", "1"):
        mine = {r[2]: r for r in rows if r[0] == step}
        assert mine["0"][5:] == mine["1"][5:]  # tp peers of dp rank 0: same positions and hash
        assert mine["2"][5:] == mine["3"][5:]
        assert mine["0"][5] != mine["2"][5]


def rep(rank: int, dp: int, positions: list[int], h: str = "a") -> RankReport:
    return RankReport(rank, dp, 0, 0, tuple(positions), h)


def test_verify_catches_each_violation():
    good = [rep(0, 0, [0, 1]), rep(1, 0, [0, 1]), rep(2, 1, [2, 3]), rep(3, 1, [2, 3])]
    assert verify(good, tp_size=2, global_batch=4) == []
    tp_differs = [*good[:3], rep(3, 1, [2, 3], h="b")]
    assert any("tensor-parallel peers [2, 3]" in p for p in verify(tp_differs, 2, 4))
    overlap = [rep(0, 0, [0, 1]), rep(1, 0, [0, 1]), rep(2, 1, [1, 2]), rep(3, 1, [1, 2])]
    problems = verify(overlap, 2, 4)
    assert any("position 1 read by dp ranks 0 and 1" in p for p in problems)
    assert any("not [0, 4)" in p for p in problems)
    assert any("expected 2" in p for p in verify(good[:3], 2, 4))  # a missing peer

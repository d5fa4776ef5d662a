"""The demo's simulated training: passes on the real loader, and fails on a broken partition."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import small_shard_stores

import tokentape._src.train.loader as loader_module
from tokentape._src.demo.audit import worst_step
from tokentape._src.demo.train import (
    Phase,
    loss_line,
    read_losses,
    simulate_training,
    stand_in_losses,
)
from tokentape._src.plan.plan import resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.train.batch import Batch
from tokentape._src.train.partition import BatchConfig, positions_for

PHASES = [
    Phase(BatchConfig(3, 2, 2), until_step=8, crash=True),
    Phase(BatchConfig(2, 3, 2), until_step=14, crash=False),
]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo_train")
    small_shard_stores(root)
    return resolve_plan(load_plan_spec(root / "mix.toml"))


def test_simulated_training_proves_the_contract(plan, tmp_path, capsys):
    assert simulate_training(plan, tmp_path, PHASES).ok
    out = capsys.readouterr().out
    assert "FAILED" not in out
    assert "every position in [0, 168) applied exactly once" in out  # 14 steps of 12
    assert "3 redone after a crash" in out  # checkpoint at step 5, crashed after step 7


def test_a_partition_that_overlaps_ranks_is_caught(plan, tmp_path, capsys, monkeypatch):
    def overlapping(consumed: int, dp_rank: int, config: BatchConfig) -> np.ndarray:
        return positions_for(consumed, 0, config)  # every rank reads rank 0's positions

    monkeypatch.setattr(loader_module, "positions_for", overlapping)
    assert not simulate_training(plan, tmp_path, PHASES).ok
    out = capsys.readouterr().out
    assert "[FAILED] every step: ranks disjoint" in out
    assert "[FAILED] every position in [0, 168) applied exactly once" in out


def test_the_stand_in_loss_rises_with_repetitive_windows():
    rng = np.random.default_rng(0)
    varied = rng.integers(0, 5000, size=(8, 257))
    line = np.tile(np.arange(12), 22)[:257]  # one short "log line" over and over
    burst = varied.copy()
    burst[:3] = line  # 3 of 8: a burst
    rise = stand_in_losses(burst, 10) - stand_in_losses(varied, 10)
    assert rise.tolist() == pytest.approx([8, 8, 8, 0, 0, 0, 0, 0])
    wide = rng.integers(0, 5000, size=(16, 257))
    wide[:2] = line  # 2 of 16: not more than 1 in 8
    rise = stand_in_losses(wide, 10) - stand_in_losses(rng.integers(0, 5000, (16, 257)), 10)
    assert rise.tolist() == pytest.approx([2, 2] + [0] * 14)


def test_a_loss_line_gives_each_sources_rows_mean_and_tokens():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 5000, size=(6, 17))
    tokens[[1, 4]] = 7  # two repetitive rows, of sources 0 and 2
    source = np.array([0, 0, 2, 0, 2, 2])
    zeros = np.zeros(6, dtype=np.int64)
    whole = Batch(np.arange(40, 46), source, zeros, zeros, tokens)
    line = loss_line(whole, 3, ["a", "b", "c"], 16)
    rows = stand_in_losses(tokens, 3)
    assert line["step"] == 3 and line["consumed"] == 40
    assert line["tokens_by_source"] == {"a": 3 * 16, "c": 3 * 16}  # no row of "b"
    assert line["loss_by_source"]["a"] == pytest.approx(rows[[0, 1, 3]].mean(), abs=1e-4)
    assert line["loss_by_source"]["c"] == pytest.approx(rows[[2, 4, 5]].mean(), abs=1e-4)
    by_rows = sum(line["loss_by_source"][n] * 3 for n in ("a", "c")) / 6
    assert line["loss"] == pytest.approx(by_rows, abs=1e-4)


def test_the_worst_step_is_the_largest_jump_and_redone_steps_replace_losses(tmp_path):
    log = tmp_path / "loss.jsonl"
    # Steps 0-5 logged, a crash, resumed from step 2 and redone up to step 4 only: the
    # losses of the lost steps 3 (the 9.0) and 5 (the 8.0) were never applied.
    lines = [(0, 3.0), (1, 2.9), (2, 2.8), (3, 9.0), (4, 2.6), (5, 8.0), (2, 2.7), (3, 2.6)]
    lines += [(4, 3.5)]
    log.write_text("".join(f'{{"step": {s}, "loss": {v}}}\n' for s, v in lines))
    losses = read_losses(log, ["web", "code", "math"])
    assert losses == {0: 3.0, 1: 2.9, 2: 2.7, 3: 2.6, 4: 3.5}
    assert worst_step(losses) == (4, 2.6, 3.5)

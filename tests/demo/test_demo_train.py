"""The demo's simulated training: passes on the real loader, and fails on a broken partition."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import small_shard_stores

import tokentape._src.train.loader as loader_module
from tokentape._src.demo.audit import worst_step
from tokentape._src.demo.train import Phase, read_losses, simulate_training, stand_in_loss
from tokentape._src.plan.plan import resolve_plan
from tokentape._src.plan.spec import load_plan_spec
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
    burst[:3] = line
    assert stand_in_loss(burst, 10) - stand_in_loss(varied, 10) == pytest.approx(2 * 3 / 8)


def test_the_worst_step_is_the_largest_jump_and_redone_steps_replace_losses(tmp_path):
    log = tmp_path / "loss.jsonl"
    # Steps 0-5 logged, a crash, resumed from step 2 and redone up to step 4 only: the
    # losses of the lost steps 3 (the 9.0) and 5 (the 8.0) were never applied.
    lines = [(0, 3.0), (1, 2.9), (2, 2.8), (3, 9.0), (4, 2.6), (5, 8.0), (2, 2.7), (3, 2.6)]
    lines += [(4, 3.5)]
    log.write_text("".join(f'{{"step": {s}, "loss": {v}}}\n' for s, v in lines))
    losses = read_losses(log)
    assert losses == {0: 3.0, 1: 2.9, 2: 2.7, 3: 2.6, 4: 3.5}
    assert worst_step(losses) == (4, 2.6, 3.5)

"""The demo's simulated training: passes on the real loader, and fails on a broken partition."""

from __future__ import annotations

import numpy as np
import pytest
from test_batch import small_shard_stores

import tokentape.train.loader as loader_module
from tokentape.demo_train import Phase, simulate_training
from tokentape.tape.plan import load_plan_spec, resolve_plan
from tokentape.train.partition import BatchConfig, positions_for

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
    assert simulate_training(plan, tmp_path, PHASES)
    out = capsys.readouterr().out
    assert "FAILED" not in out
    assert "every position in [0, 168) applied exactly once" in out  # 14 steps of 12
    assert "3 redone after a crash" in out  # checkpoint at step 5, crashed after step 7


def test_a_partition_that_overlaps_ranks_is_caught(plan, tmp_path, capsys, monkeypatch):
    def overlapping(consumed: int, dp_rank: int, config: BatchConfig) -> np.ndarray:
        return positions_for(consumed, 0, config)  # every rank reads rank 0's positions

    monkeypatch.setattr(loader_module, "positions_for", overlapping)
    assert not simulate_training(plan, tmp_path, PHASES)
    out = capsys.readouterr().out
    assert "[FAILED] every step: ranks disjoint" in out
    assert "[FAILED] every position in [0, 168) applied exactly once" in out

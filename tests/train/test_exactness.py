"""Exact resumption in real processes: a simulated trainer is SIGKILLed at random moments and
restarted with another dp size / micro / accum each time; over the whole run every position in
[0, total) is applied exactly once. ``TOKENTAPE_KILLS`` sets how many kills (default 20)."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import small_plan_json, wait_for

# Every test here runs trainers (or the soak tool) as processes for seconds.
pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

TRAINER = Path(__file__).parents[1] / "tools" / "sim_trainer.py"


def _consumed(ckpt: Path) -> int:
    """The checkpoint's ``consumed`` (0 before the first); it is replaced atomically."""
    return json.loads(ckpt.read_text())["data"]["consumed"] if ckpt.exists() else 0


SHAPES = [(4, 2, 1), (3, 1, 2), (6, 1, 1), (1, 4, 2), (2, 3, 1), (5, 1, 1)]


def test_sigkill_and_elastic_restarts_apply_every_position_exactly_once(tmp_path):
    plan_path = small_plan_json(tmp_path)
    ckpt = tmp_path / "ckpt.json"
    kills_wanted = int(os.environ.get("TOKENTAPE_KILLS", "20"))
    total = 200_000  # far more than the kills leave time for, so the run is cut repeatedly
    rng = random.Random(1234)
    kills = restarts = 0
    progress = []  # consumed at each restart
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    while True:
        dp, micro, accum = SHAPES[restarts % len(SHAPES)]
        restarts += 1
        consumed = _consumed(ckpt)
        progress.append(consumed)
        last = kills >= kills_wanted
        limit = consumed + 600 if last else total
        args = [str(plan_path), str(ckpt), str(limit), str(dp), str(micro), str(accum)]
        proc = subprocess.Popen([sys.executable, str(TRAINER), *args], env=env)
        if last:
            assert proc.wait(timeout=300) == 0
            break
        # Killed mid-run whatever the machine's load: once this run has saved 1-5 steps past
        # where it resumed (observed in the checkpoint), then 0-20 ms later, mid-step.
        past = consumed + rng.randint(1, 5) * dp * micro * accum
        wait_for(
            lambda past=past: _consumed(ckpt) >= past,
            f"the trainer saving consumed >= {past}",
            alive=lambda proc=proc: proc.poll() is None,  # ending on its own is a failure
        )
        time.sleep(rng.uniform(0.0, 0.02))
        proc.send_signal(signal.SIGKILL)
        kills += 1
        proc.wait()
    state = json.loads(ckpt.read_text())
    applied = np.array(state["applied"])
    assert np.array_equal(np.sort(applied), np.arange(limit))  # nothing lost, nothing repeated
    # The kills landed mid-run (the run advanced between restarts) and shapes changed.
    assert all(b > a for a, b in itertools.pairwise(progress))
    assert len(state["data"]["history"]) > 1


SOAK = Path(__file__).parents[1] / "tools" / "soak.py"


def _soak(*args: str) -> tuple[int, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, json.loads(proc.stdout)


def test_soak_command_short_campaign():
    """``make soak`` in miniature: the training loop (random dp/micro/accum/prefetch, step log)
    and ``tokenize --workers 2`` killed a few times; nothing lost or repeated, stores identical."""
    rc, s = _soak("--train-kills", "5", "--tokenize-kills", "3", "--seed", "7")
    train, tok = s["train"], s["tokenize"]
    assert rc == 0 and s["ok"], s
    assert train["kills"] == 5 and train["lost"] == 0 and train["duplicated"] == 0
    assert train["positions_checked"] > 0 and train["log_hash_mismatches"] == 0
    assert train["log_steps_checked"] == train["steps_committed"] > 0
    assert tok["kills"] == 3 and tok["crash_point_kills"] >= 1
    assert tok["stores_compared"] >= 1 and tok["identical"] == tok["stores_compared"]


def test_soak_catches_a_trainer_that_saves_before_applying(tmp_path):
    """The soak is not blind: a trainer that commits and checkpoints a step before recording it
    as applied loses the last step at every kill, and the soak says so and exits 1."""
    source = TRAINER.read_text()
    save = (
        "        for lo in loaders:\n"
        '            lo.commit()  # after "optimizer.step()"\n'
        '        state = {"applied": applied, "data": loaders[0].state_dict()}\n'
        "        write_atomic(ckpt, json.dumps(state).encode())\n"
    )
    apply = "        for s in steps:\n"
    assert source.count(save) == 1 and source.count(apply) == 1
    buggy = tmp_path / "buggy_trainer.py"
    buggy.write_text(source.replace(save, "").replace(apply, save + apply))
    rc, s = _soak("--train-kills", "4", "--tokenize-kills", "0", "--trainer", str(buggy))
    assert rc == 1 and not s["ok"]
    assert s["train"]["lost"] > 0

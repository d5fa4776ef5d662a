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
from test_batch import small_plan_json

TRAINER = Path(__file__).parent / "tools" / "sim_trainer.py"
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
        consumed = json.loads(ckpt.read_text())["data"]["consumed"] if ckpt.exists() else 0
        progress.append(consumed)
        last = kills >= kills_wanted
        limit = consumed + 600 if last else total
        args = [str(plan_path), str(ckpt), str(limit), str(dp), str(micro), str(accum)]
        proc = subprocess.Popen([sys.executable, str(TRAINER), *args], env=env)
        if last:
            assert proc.wait(timeout=300) == 0
            break
        time.sleep(rng.uniform(0.6, 1.6))  # after start-up, at a random moment mid-run
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    state = json.loads(ckpt.read_text())
    applied = np.array(state["applied"])
    assert np.array_equal(np.sort(applied), np.arange(limit))  # nothing lost, nothing repeated
    # The kills landed mid-run (the run advanced between most restarts) and shapes changed.
    assert sum(b > a for a, b in itertools.pairwise(progress)) >= kills_wanted // 2
    assert len(state["data"]["history"]) > 1

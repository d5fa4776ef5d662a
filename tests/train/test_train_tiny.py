"""examples/train_tiny.py under torchrun: 2 ranks, SIGKILL, resume with 1 rank; the step log
continues at the checkpoint's consumed and every step's tokens are the plan's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import kill_tree, small_plan_json

import tokentape
from tokentape._src.plan.load import load_plan
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import step_tokens_hash
from tokentape._src.train.steplog import read_step_log

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_tiny.py"
GLOBAL_BATCH = 8


def _example():
    spec = importlib.util.spec_from_file_location("train_tiny", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torchrun(plan: Path, out: Path, nproc: int, steps: int) -> subprocess.Popen:
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    args += [f"--nproc_per_node={nproc}", str(EXAMPLE), str(plan), "--out", str(out)]
    args += ["--steps", str(steps), "--global-batch", str(GLOBAL_BATCH), "--micro", "2"]
    args += ["--save-every", "3", "--doc-mask", "--check-ranks", "--width", "32"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        args, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _checkpoint_data(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return json.loads(z["header.json"].tobytes())["data"]


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    path = small_plan_json(root)
    return path


@pytest.mark.slow
@pytest.mark.subprocess
def test_kill_two_ranks_and_resume_with_one(plan_path, tmp_path):
    run = tmp_path / "run"
    proc = _torchrun(plan_path, run, nproc=2, steps=400)
    deadline = time.monotonic() + 240
    # Let it commit a few steps past a checkpoint, then kill the whole job (launcher + ranks).
    while len(_lines(run / "steps.jsonl")) < 5 or not (run / "checkpoint.npz").exists():
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.monotonic() < deadline, "the 2-rank run made no progress"
        time.sleep(0.05)
    kill_tree(proc.pid)
    proc.wait()
    logged_before = _lines(run / "steps.jsonl")
    saved = _checkpoint_data(run / "checkpoint.npz")
    assert {r["dp"] for r in logged_before} == {2}
    assert saved["step"] > 0 and saved["consumed"] == saved["step"] * GLOBAL_BATCH

    steps = len(logged_before) + 4
    resumed = _torchrun(plan_path, run, nproc=1, steps=steps)
    output = resumed.communicate(timeout=240)[0].decode()
    assert resumed.returncode == 0, output
    assert f"resumed at step {saved['step']}: consumed {saved['consumed']}, dp 1" in output

    raw = _lines(run / "steps.jsonl")
    first_after = raw[len(logged_before)]
    assert (first_after["step"], first_after["consumed"]) == (saved["step"], saved["consumed"])
    assert (first_after["dp"], first_after["accum"]) == (1, 4)

    records = read_step_log(run / "steps.jsonl")  # checks steps and consumed are contiguous
    assert [r.step for r in records] == list(range(steps))
    assert [r.consumed for r in records] == [s * GLOBAL_BATCH for s in range(steps)]
    assert [r.dp for r in records] == [2] * saved["step"] + [1] * (steps - saved["step"])
    plan = load_plan(plan_path)
    batcher = Batcher(plan)
    for r in records:  # what each step trained on is the plan's positions, recomputed here
        expected = batcher.batch(np.arange(r.consumed, r.consumed + GLOBAL_BATCH))
        assert r.tokens_hash == step_tokens_hash(expected, plan)
    losses = _lines(run / "loss.jsonl")
    assert all(np.isfinite(x["loss"]) for x in losses)
    assert losses[-1]["step"] == steps - 1
    names = [s.name for s in plan.sources]
    for x in losses:  # every line, the redone steps too: each names its own consumed
        # each step's rows by source, from the plan (independent of the trainer's labels)
        drawn = batcher.batch(np.arange(x["consumed"], x["consumed"] + GLOBAL_BATCH)).source
        rows = {names[d]: int(c) for d, c in zip(*np.unique(drawn, return_counts=True),
                                                 strict=True)}  # fmt: skip
        assert x["tokens_by_source"] == {n: c * plan.seq_len for n, c in rows.items()}
        mean = sum(x["loss_by_source"][n] * c for n, c in rows.items()) / GLOBAL_BATCH
        assert mean == pytest.approx(x["loss"], rel=1e-3)  # the overall loss, regathered
    # the run directory reports as it stands (the example saved its plan beside the logs): the
    # tokens the trainer logged per source, over the steps applied, are the plan's own counts
    data = tokentape.report(run, run / "plan.json", loss_log=run / "loss.jsonl")
    assert data["run"]["steps"] == steps and data["loss"]["logged_steps"] == steps
    assert data["run"]["resumes"] == (1 if len(logged_before) > saved["step"] else 0)
    planned = {t["source"]: t["tokens"] for t in data["mixture"]["totals"] if t["tokens"]}
    assert data["loss"]["tokens_by_source"] == planned


def test_checkpoint_round_trip_restores_model_and_optimizer(tmp_path):
    tiny = _example()
    torch.manual_seed(1)
    model = tiny.TinyGPT(vocab=50, seq_len=8, width=16, layers=1, heads=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inputs = torch.randint(0, 50, (2, 8))
    model(inputs, None).sum().backward()
    opt.step()
    tiny.save_checkpoint(tmp_path / "c.npz", model, opt, {"consumed": 16})
    torch.manual_seed(2)
    other = tiny.TinyGPT(vocab=50, seq_len=8, width=16, layers=1, heads=2)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    assert tiny.load_checkpoint(tmp_path / "c.npz", other, other_opt) == {"consumed": 16}
    for k, v in model.state_dict().items():
        assert torch.equal(v, other.state_dict()[k]), k
    a, b = opt.state_dict(), other_opt.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for index, slots in a["state"].items():
        for name, value in slots.items():
            assert torch.equal(value, b["state"][index][name]), (index, name)
    # The restored optimizer takes the same next step as the original.
    for m, o in ((model, opt), (other, other_opt)):
        o.zero_grad()
        m(inputs, None).sum().backward()
        o.step()
    for k, v in model.state_dict().items():
        assert torch.equal(v, other.state_dict()[k]), k

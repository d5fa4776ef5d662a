"""The soak's training campaign: SIGKILL ``sim_trainer.py`` at random moments, restart it with a
random shape (dp, micro, accum) and prefetch each time, then check what it applied and logged."""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sim_trainer import expand_runs
from soak_procs import Child, Outcome, child_env

from tokentape._src.plan.load import load_plan
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import hash_dtype, step_tokens_hash
from tokentape._src.train.steplog import read_step_log
from tokentape.errors import TokentapeError

TRAINER = Path(__file__).parent / "sim_trainer.py"
NO_END = 2**40  # the total of a run that is to be killed: it never finishes by itself


@dataclass
class TrainReport:
    kills: int = 0
    restarts: int = 0
    kills_without_progress: int = 0  # killed before its first checkpoint (start-up, mostly)
    shapes: set[tuple[int, int, int]] = field(default_factory=set)
    prefetch: set[int] = field(default_factory=set)
    steps_committed: int = 0  # effective steps in the final checkpoint
    log_lines: int = 0  # step-log lines written (a step redone after a kill is logged again)
    shape_changes: int = 0  # batch-shape changes recorded in the data state's history
    positions_checked: int = 0
    lost: int = 0
    duplicated: int = 0
    log_steps_checked: int = 0
    log_hash_mismatches: int = 0
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["shapes"] = len(self.shapes)
        d["prefetch"] = sorted(self.prefetch)
        return d


STARTUP_SHARE = 0.15  # kills timed from the start: during imports and plan loading, mostly


def _signature(path: Path) -> tuple[int, int] | None:
    """Changes whenever the checkpoint is replaced (a rename gives it a new inode)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def kill_run(child: Child, ckpt: Path, rng: random.Random) -> Outcome:
    """SIGKILL the trainer: a share of the time 0-0.5 s after its start (start-up); otherwise
    0-0.8 s after its first checkpoint, whatever the machine's load, so mid-run."""
    if rng.random() < STARTUP_SHARE:
        return child.run(kill_after=rng.uniform(0.0, 0.5))
    before = _signature(ckpt)
    deadline = time.monotonic() + 120
    while _signature(ckpt) == before and child.proc.poll() is None:
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)
    return child.run(kill_after=rng.uniform(0.0, 0.8))


def random_shape(rng: random.Random) -> tuple[int, int, int, int]:
    return rng.randint(1, 6), rng.randint(1, 4), rng.randint(1, 3), rng.randint(0, 3)


def _consumed(ckpt: Path) -> int:
    return json.loads(ckpt.read_text())["data"]["consumed"] if ckpt.exists() else 0


def run_campaign(
    root: Path,
    plan_path: Path,
    kills: int,
    rng: random.Random,
    progress: Any,
    trainer: Path = TRAINER,
) -> TrainReport:
    rep = TrainReport()
    ckpt, log, out = root / "ckpt.json", root / "steps.jsonl", root / "trainer.out"
    env = child_env()
    started = time.monotonic()

    def start(total: int, shape: tuple[int, int, int, int]) -> Child:
        dp, micro, accum, prefetch = shape
        rep.shapes.add((dp, micro, accum))
        rep.prefetch.add(prefetch)
        rep.restarts += 1
        args = [str(plan_path), str(ckpt), str(total), str(dp), str(micro), str(accum)]
        opts = ["--prefetch", str(prefetch), "--log", str(log), "--runs"]
        return Child([sys.executable, str(trainer), *args, *opts], out, env)

    while rep.kills < kills:
        before = _consumed(ckpt)
        child = start(NO_END, random_shape(rng))
        result = kill_run(child, ckpt, rng)
        if result.strays:
            rep.problems.append(f"trainer: {result.strays} processes survived the kill")
        if not result.killed:
            rep.problems.append(f"trainer exited by itself ({result.returncode}): {child.tail()}")
            if len(rep.problems) > 5:
                return rep
            continue
        rep.kills += 1
        rep.kills_without_progress += _consumed(ckpt) == before
        if rep.kills % 25 == 0 or rep.kills == kills:
            progress(
                f"train: {rep.kills}/{kills} kills, consumed {_consumed(ckpt):,}, "
                f"{time.monotonic() - started:.0f} s"
            )
    # The last run: from the last checkpoint, a few more steps, to completion.
    shape = random_shape(rng)
    total = _consumed(ckpt) + 5 * shape[0] * shape[1] * shape[2]  # whole steps: no cut
    result = start(total, shape).run(kill_after=None)
    if result.killed or result.returncode != 0:
        rep.problems.append(f"the final trainer run exited {result.returncode}")
    check(rep, plan_path, ckpt, log, total)
    return rep


def check(rep: TrainReport, plan_path: Path, ckpt: Path, log: Path, total: int) -> None:
    """Every position in [0, total) applied exactly once; the step log contiguous, ending where
    the checkpoint does, each step's tokens hash equal to the hash recomputed from the plan."""
    state = json.loads(ckpt.read_text())
    data = state["data"]
    rep.steps_committed = data["step"]
    rep.shape_changes = len(data["history"]) - 1
    if data["consumed"] != total:
        rep.problems.append(f"the checkpoint ends at {data['consumed']}, expected {total}")
    applied = expand_runs(state["applied"])
    rep.positions_checked = total
    outside = int(np.count_nonzero((applied < 0) | (applied >= total)))
    counts = np.bincount(applied[(applied >= 0) & (applied < total)], minlength=total)
    rep.lost = int(np.count_nonzero(counts == 0))
    rep.duplicated = int(np.sum(counts[counts > 1] - 1)) + outside
    rep.log_lines = log.read_bytes().count(b"\n")
    try:
        records = read_step_log(log)
    except TokentapeError as exc:
        rep.problems.append(f"step log unreadable: {exc}")
        return
    if len(records) != data["step"]:
        rep.problems.append(f"step log has {len(records)} steps, the checkpoint {data['step']}")
    plan = load_plan(plan_path)
    batcher = Batcher(plan, hash_dtype(plan))
    expected_consumed = 0
    for i, r in enumerate(records):
        if r.step != i or r.consumed != expected_consumed:
            rep.problems.append(f"step log: step {r.step} at consumed {r.consumed} out of order")
            return
        expected_consumed += r.global_batch
        whole = batcher.batch(np.arange(r.consumed, r.consumed + r.global_batch))
        rep.log_hash_mismatches += step_tokens_hash(whole, plan) != r.tokens_hash
        rep.log_steps_checked += 1
    if expected_consumed != data["consumed"]:
        rep.problems.append(
            f"step log ends at consumed {expected_consumed}, the checkpoint at {data['consumed']}"
        )

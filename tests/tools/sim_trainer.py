"""A simulated multi-rank trainer for the kill tests: ``python sim_trainer.py PLAN CKPT TOTAL DP
MICRO ACCUM [--prefetch N] [--log STEPS.jsonl] [--runs]``.

Every "rank" of the data-parallel group runs in this one process with its own Loader. Each step
"applies" the positions all ranks read (the stand-in for a model update) and then saves one
checkpoint — applied positions and the data state together, atomically — as a real trainer saves
model, optimizer and data state in one file. Killed at any moment, a restart resumes from the
last checkpoint, possibly with another shape.

``--log`` has rank 0's loader write the step log; ``--runs`` records the applied positions as
runs ``[start, stop)`` in the order applied (merged when one follows on from the last), which
keeps the checkpoint small over a long campaign and loses nothing: a repeat or a gap shows as a
run that does not follow on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tokentape._src.plan.load import load_plan
from tokentape._src.store.atomic import write_atomic
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig


def add_runs(runs: list[list[int]], positions: np.ndarray) -> None:
    """Append ``positions`` (in order) to ``runs`` of consecutive positions."""
    if positions.size == 0:
        return
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    for part in np.split(positions, breaks):
        start, stop = int(part[0]), int(part[-1]) + 1
        if runs and runs[-1][1] == start:
            runs[-1][1] = stop
        else:
            runs.append([start, stop])


def expand_runs(runs: list[list[int]]) -> np.ndarray:
    """Every position of ``runs``, in the order applied."""
    if not runs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs])


def main(
    plan_path: str,
    ckpt: str,
    total: int,
    dp: int,
    micro: int,
    accum: int,
    prefetch: int = 1,
    log: str | None = None,
    runs: bool = False,
) -> int:
    plan = load_plan(plan_path)
    config = BatchConfig(dp, micro, accum)
    checkpoint = json.loads(Path(ckpt).read_text()) if Path(ckpt).exists() else None
    loaders = [
        Loader(plan, r, config, prefetch=prefetch, step_log=log if r == 0 else None)
        for r in range(dp)
    ]
    applied: list = []
    if checkpoint is not None:
        applied = checkpoint["applied"]
        for lo in loaders:
            lo.load_state_dict(checkpoint["data"])
    while loaders[0].state.consumed < total:
        steps = [lo.step() for lo in loaders]
        for s in steps:
            for micro_batch in s.micro_batches:
                keep = micro_batch.positions[micro_batch.positions < total]  # the last step
                if runs:
                    add_runs(applied, keep)
                else:
                    applied += keep.tolist()
                assert micro_batch.tokens.shape[0] == micro_batch.positions.size
        for lo in loaders:
            lo.commit()  # after "optimizer.step()"
        state = {"applied": applied, "data": loaders[0].state_dict()}
        write_atomic(ckpt, json.dumps(state).encode())
    for lo in loaders:
        lo.close()
    flat = expand_runs(applied) if runs else np.asarray(applied)
    return 0 if np.array_equal(np.sort(flat), np.arange(len(flat))) else 3


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sim_trainer.py")
    p.add_argument("plan")
    p.add_argument("ckpt")
    for name in ("total", "dp", "micro", "accum"):
        p.add_argument(name, type=int)
    p.add_argument("--prefetch", type=int, default=1)
    p.add_argument("--log", default=None, help="the step log rank 0 writes")
    p.add_argument("--runs", action="store_true", help="record applied positions as runs")
    return p.parse_args(argv)


if __name__ == "__main__":
    a = parse(sys.argv[1:])
    sys.exit(main(a.plan, a.ckpt, a.total, a.dp, a.micro, a.accum, a.prefetch, a.log, a.runs))

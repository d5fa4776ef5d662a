"""A simulated multi-rank trainer for the exactness test: ``python sim_trainer.py PLAN CKPT
TOTAL DP MICRO ACCUM``.

Every "rank" of the data-parallel group runs in this one process with its own Loader. Each step
"applies" the positions all ranks read (the stand-in for a model update) and then saves one
checkpoint — applied positions and the data state together, atomically — as a real trainer saves
model, optimizer and data state in one file. Killed at any moment, a restart resumes from the
last checkpoint, possibly with another shape.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from tokentape.store.atomic import write_atomic
from tokentape.tape.plan import load_plan
from tokentape.train.loader import Loader
from tokentape.train.partition import BatchConfig


def main(plan_path: str, ckpt: str, total: int, dp: int, micro: int, accum: int) -> int:
    plan = load_plan(plan_path)
    config = BatchConfig(dp, micro, accum)
    checkpoint = json.loads(Path(ckpt).read_text()) if Path(ckpt).exists() else None
    loaders = [Loader(plan, r, config, prefetch=1) for r in range(dp)]
    applied: list[int] = []
    if checkpoint is not None:
        applied = checkpoint["applied"]
        for lo in loaders:
            lo.load_state_dict(checkpoint["data"])
    while loaders[0].state.consumed < total:
        steps = [lo.step() for lo in loaders]
        for s in steps:
            for micro_batch in s.micro_batches:
                keep = micro_batch.positions[micro_batch.positions < total]  # the last step
                applied += keep.tolist()
                assert micro_batch.tokens.shape[0] == micro_batch.positions.size
        for lo in loaders:
            lo.commit()  # after "optimizer.step()"
        state = {"applied": applied, "data": loaders[0].state_dict()}
        write_atomic(ckpt, json.dumps(state).encode())
    for lo in loaders:
        lo.close()
    return 0 if np.array_equal(np.sort(applied), np.arange(len(applied))) else 3


if __name__ == "__main__":
    plan_path, ckpt, *numbers = sys.argv[1:]
    sys.exit(main(plan_path, ckpt, *(int(n) for n in numbers)))

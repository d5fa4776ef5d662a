"""tokentape's side of peers_bench.py, run with the project's python (see common.py).

Horizon: the plan's ``total_samples`` (sources repeat as needed). Workers: ``Loader`` with
``prefetch`` 0 / 2 (a thread), and ``TapeDataset`` + ``TapeBatchSampler`` in a torch
``DataLoader`` with 0 / 2 worker processes. Resume: ``Loader.state_dict()`` (``consumed``) at
any ``BatchConfig``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import common
import numpy as np
from torch.utils.data import DataLoader

from tokentape._src.plan.plan import Plan, resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.torch.data import TapeBatchSampler, TapeDataset, collate
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState


def plan_for(root: str, horizon: int) -> Plan:
    """The plan over the corpus's stores (written by peers_bench.py) at ``horizon`` samples."""
    toml = Path(root, "tokentape", f"plan-{horizon}.toml")
    lines = [f"seq_len = {common.SEQ_LEN}", f"seed = {common.SEED}"]
    lines += [f"total_samples = {horizon}", ""]
    for d, w in enumerate((60, 30, 10)):
        lines += ["[[source]]", f'name = "s{d}"', f'path = "s{d}"', f"weight = {w}"]
        lines += ["max_repeats = 1e9", ""]
    toml.write_text("\n".join(lines))
    return resolve_plan(load_plan_spec(toml))


def loader_ids(
    plan: Plan, rank: int, world: int, state: dict | None, prefetch: int
) -> tuple[Loader, Iterator[np.ndarray]]:
    loader = Loader(
        plan,
        rank,
        BatchConfig(world, common.BATCH),
        state=DataState.from_dict(state) if state else None,
        prefetch=prefetch,
    )

    def batches() -> Iterator[np.ndarray]:
        while True:
            step = loader.step()
            ids = common.identity(step.micro_batches[0].tokens)
            loader.commit()
            yield ids

    return loader, batches()


def torch_ids(plan: Plan, workers: int, steps: int) -> Iterator[np.ndarray]:
    sampler = TapeBatchSampler(0, BatchConfig(1, common.BATCH), 0, steps)
    dl = DataLoader(
        TapeDataset(plan), batch_sampler=sampler, collate_fn=collate, num_workers=workers
    )
    for batch in dl:
        yield common.identity(batch["inputs"].numpy())


def main() -> None:
    a = common.args()
    root, what = a["root"], a["measure"]
    if what == "startup":
        rss0 = common.reset_peak()
        clock = common.Clock()
        plan = plan_for(root, a["horizon"])
        loader, it = loader_ids(plan, 0, 1, None, 0)
        next(it)
        common.reply(seconds=clock(), rss_base=rss0, rss_peak=common.rss_mib())
        loader.close()
    elif what == "throughput":
        plan = plan_for(root, a["horizon"])
        if a["path"] == "loader":
            loader, it = loader_ids(plan, 0, 1, None, a["workers"])
            common.reply(**common.throughput(it, a["batches"]))
            loader.close()
        else:
            it = torch_ids(plan, a["workers"], a["batches"] + 1)
            common.reply(**common.throughput(it, a["batches"]))
    elif what == "resume":
        plan = plan_for(root, a["horizon"])
        common.reply(result={str(to): resume(plan, a["before"], a["after"], to) for to in a["to"]})
    elif what == "roundtrip":
        plan = plan_for(root, a["horizon"])
        loader, it = loader_ids(plan, 0, 1, None, 0)
        for _ in range(a["before"]):
            next(it)
        saved = json.loads(json.dumps(loader.state_dict()))
        want = [next(it) for _ in range(a["after"])]
        loader.close()
        loader, it = loader_ids(plan, 0, 1, saved, 0)
        got = [next(it) for _ in range(a["after"])]
        loader.close()
        same = all(np.array_equal(x, y) for x, y in zip(want, got, strict=True))
        common.reply(result="yes (exact)" if same else "no: the batches differ")


def rank_batches(plan: Plan, world: int, steps: int, state: dict | None) -> list[np.ndarray]:
    out = []
    for rank in range(world):
        loader, it = loader_ids(plan, rank, world, state, 0)
        out += [next(it) for _ in range(steps)]
        loader.close()
    return out


def resume(plan: Plan, before: int, after: int, to: int) -> str:
    """2 ranks for ``before`` steps, saved; ``to`` ranks for ``after`` samples (all ranks)."""
    total = 2 * before * common.BATCH + after
    reference = rank_batches(plan, 2, total // (2 * common.BATCH), None)
    loader, it = loader_ids(plan, 0, 2, None, 0)
    for _ in range(before):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    first = rank_batches(plan, 2, before, None)
    then = rank_batches(plan, to, after // (to * common.BATCH), state)
    return common.compare(reference, first + then)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    common.say(f"tokentape child: {time.perf_counter() - start:.1f} s")

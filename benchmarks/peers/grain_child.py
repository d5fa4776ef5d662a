"""Grain's side of peers_bench.py, run in the peers' venv (see common.py).

Each source is a random-access ``Windows`` source, ``MapDataset.source(..).shuffle(seed)``
repeated enough epochs for the horizon, mixed with ``MapDataset.mix`` (60/30/10), cut at the
horizon (``[:horizon]``: the mixture is lazy, nothing is built per sample) and batched by 64.
0 workers: ``batched[i]``; 2 workers: ``to_iter_dataset().mp_prefetch(num_workers=2)``.
Ranks: ``mix[rank::world]``; a resume at another world size is user code, slicing the global
mixture at the samples consumed (``mix[consumed:][rank::world]``): Grain's own iterator state
(``get_state``) is per rank, a ``next_index`` into that rank's slice.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import common
import grain
import numpy as np


def mixture(root: str, horizon: int) -> Any:
    parts = []
    for d, w in enumerate(common.WEIGHTS):
        src = grain.MapDataset.source(common.Windows(root, d))
        reps = math.ceil(horizon * w / len(src)) + 1
        parts.append(src.shuffle(seed=common.SEED + d).repeat(reps))
    return grain.MapDataset.mix(parts, list(common.WEIGHTS))[:horizon]


def by_index(batched: Any) -> Iterator[np.ndarray]:
    for i in range(len(batched)):
        yield common.identity(batched[i])


def main() -> None:
    a = common.args()
    root, what = a["root"], a["measure"]
    if what == "startup":
        rss0 = common.reset_peak()
        clock = common.Clock()
        next(by_index(mixture(root, a["horizon"]).batch(common.BATCH)))
        common.reply(seconds=clock(), rss_base=rss0, rss_peak=common.rss_mib())
    elif what == "throughput":
        batched = mixture(root, a["horizon"]).batch(common.BATCH)
        if a["workers"] == 0:
            common.reply(**common.throughput(by_index(batched), a["batches"]))
        else:
            opts = grain.MultiprocessingOptions(num_workers=a["workers"])
            ds = batched.to_iter_dataset().mp_prefetch(opts)
            common.reply(**common.throughput((common.identity(b) for b in ds), a["batches"]))
    elif what == "resume":
        mix = mixture(root, a["horizon"])
        common.reply(result={str(to): resume(mix, a["before"], a["after"], to) for to in a["to"]})
    elif what == "roundtrip":
        ds = mixture(root, a["horizon"]).batch(common.BATCH).to_iter_dataset()
        it = iter(ds)
        for _ in range(a["before"]):
            next(it)
        saved = json.loads(json.dumps(it.get_state()))
        want = [common.identity(next(it)) for _ in range(a["after"])]
        it = iter(ds)
        it.set_state(saved)
        got = [common.identity(next(it)) for _ in range(a["after"])]
        same = all(np.array_equal(x, y) for x, y in zip(want, got, strict=True))
        common.reply(result="yes (exact)" if same else "no: the batches differ")


def rank_batches(mix: Any, world: int, steps: int, offset: int) -> list[np.ndarray]:
    out = []
    for rank in range(world):
        batched = mix[offset:][rank::world].batch(common.BATCH)
        out += [common.identity(batched[i]) for i in range(steps)]
    return out


def resume(mix: Any, before: int, after: int, to: int) -> str:
    total = 2 * before * common.BATCH + after
    reference = rank_batches(mix, 2, total // (2 * common.BATCH), 0)
    first = rank_batches(mix, 2, before, 0)
    then = rank_batches(mix, to, after // (to * common.BATCH), 2 * before * common.BATCH)
    return common.compare(reference, first + then)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    common.say(f"grain child: {time.perf_counter() - start:.1f} s")

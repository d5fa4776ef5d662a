"""LitData's side of peers_bench.py, run in the peers' venv (see common.py).

Written once with ``litdata.optimize`` (one optimized dataset per source, each sample the
uint16 window as a numpy array), read by a ``CombinedStreamingDataset`` of three
``StreamingDataset(shuffle=True)`` with weights 0.6 / 0.3 / 0.1 (``iterate_over_all=False``)
in a ``StreamingDataLoader``. LitData has no horizon: an epoch ends when a source runs out
(about 10,000 samples here), so a horizon is the corpus. Ranks: processes joined by
``torch.distributed`` (gloo); a state is ``StreamingDataLoader.state_dict()``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import common
import litdata
import numpy as np
from torch import distributed as dist


def _sample(item: list[Any]) -> np.ndarray:
    root, d, k = item
    return common.Windows(root, d)[k]


def write(root: str) -> float:
    clock = common.Clock()
    for d in range(3):
        out = Path(root, "litdata", f"s{d}")
        if (out / "index.json").exists():
            continue
        n = len(common.Windows(root, d))
        litdata.optimize(
            fn=_sample,
            inputs=[[root, d, k] for k in range(n)],
            output_dir=str(out),
            chunk_bytes="64MB",
            num_workers=1,
            reorder_files=False,
            verbose=False,
        )
    return clock()


def loader(root: str, workers: int) -> litdata.StreamingDataLoader:
    parts = [
        litdata.StreamingDataset(
            str(Path(root, "litdata", f"s{d}")), shuffle=True, seed=common.SEED
        )
        for d in range(3)
    ]
    combined = litdata.CombinedStreamingDataset(
        parts, seed=common.SEED, weights=list(common.WEIGHTS), iterate_over_all=False
    )
    return litdata.StreamingDataLoader(combined, batch_size=common.BATCH, num_workers=workers)


def batches(dl: litdata.StreamingDataLoader, limit: int | None = None) -> Iterator[np.ndarray]:
    """Batches epoch after epoch (an epoch ends when a source runs out)."""
    while True:
        for b in dl:
            yield common.identity(b.numpy())
        if limit is not None:
            return


def main() -> None:
    a: dict[str, Any] = common.args()
    root, what = a["root"], a["measure"]
    if common.rank_env()[1] > 1:
        dist.init_process_group("gloo")
    if what == "write":
        common.reply(seconds=write(root))
    elif what == "startup":
        rss0 = common.reset_peak()
        clock = common.Clock()
        next(batches(loader(root, 0)))
        common.reply(seconds=clock(), rss_base=rss0, rss_peak=common.rss_mib())
    elif what == "throughput":
        common.reply(**common.throughput(batches(loader(root, a["workers"])), a["batches"]))
    elif what == "order":
        common.record_order(batches(loader(root, 0)), a["horizon"], a["budget"], a["out"])
    elif what == "run":
        run(root, a)
    elif not common.ranks_and_roundtrip(__file__, a):
        raise SystemExit(f"unknown measure {what!r}")


def run(root: str, a: dict[str, Any]) -> None:
    """One rank: ``steps`` batches, from ``state`` if given; the state at ``save_at``."""
    dl = loader(root, 0)
    if a.get("state"):
        dl.load_state_dict(a["state"])
    ids, state = [], None
    it = batches(dl, limit=1)
    for step in range(a["steps"]):
        ids.append(next(it))
        if a.get("save_at") == step + 1:
            state = json.loads(json.dumps(dl.state_dict()))
    common.reply(ids=np.concatenate(ids).tolist(), state=state)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    common.say(f"litdata child: {time.perf_counter() - start:.1f} s")

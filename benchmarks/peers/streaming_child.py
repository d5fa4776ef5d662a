"""MosaicML Streaming's side of peers_bench.py, run in the peers' venv (see common.py).

Written once with ``MDSWriter`` (one MDS dataset per source, a ``ndarray:uint16:2049`` column),
read by a ``StreamingDataset`` of three ``Stream``s with proportions 0.6 / 0.3 / 0.1,
``epoch_size`` = the horizon (Streaming up- or down-samples each stream to its share of it),
``shuffle=True`` (py1e, seed 1234), ``batch_size=64``, in a torch ``DataLoader``. Ranks are
processes with ``RANK``/``WORLD_SIZE``/``LOCAL_*`` set (one node); a state is
``dataset.state_dict(samples seen by all ranks, from_beginning=True)``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import common
import numpy as np
from streaming import MDSWriter, Stream, StreamingDataset
from streaming.base.util import clean_stale_shared_memory
from torch import distributed as dist
from torch.utils.data import DataLoader


def write(root: str) -> float:
    clock = common.Clock()
    for d in range(3):
        out = Path(root, "streaming", f"s{d}")
        if (out / "index.json").exists():
            continue
        src = common.Windows(root, d)
        columns = {"tokens": f"ndarray:uint16:{common.SEQ_LEN + 1}"}
        with MDSWriter(out=str(out), columns=columns, size_limit="64mb") as w:
            for k in range(len(src)):
                w.write({"tokens": src[k]})
    return clock()


def dataset(root: str, horizon: int) -> StreamingDataset:
    streams = [
        Stream(local=str(Path(root, "streaming", f"s{d}")), proportion=w)
        for d, w in enumerate(common.WEIGHTS)
    ]
    return StreamingDataset(
        streams=streams,
        epoch_size=horizon,
        shuffle=True,
        shuffle_seed=common.SEED,
        batch_size=common.BATCH,
    )


def batches(ds: StreamingDataset, workers: int) -> Iterator[np.ndarray]:
    for b in DataLoader(ds, batch_size=common.BATCH, num_workers=workers):
        yield common.identity(b["tokens"].numpy())


def main() -> None:
    a: dict[str, Any] = common.args()
    root, what = a["root"], a["measure"]
    if common.rank_env()[1] == 1:
        clean_stale_shared_memory()
    else:
        dist.init_process_group("gloo")
    if what == "write":
        common.reply(seconds=write(root))
    elif what == "startup":
        rss0 = common.reset_peak()
        clock = common.Clock()
        next(batches(dataset(root, a["horizon"]), 0))
        common.reply(seconds=clock(), rss_base=rss0, rss_peak=common.rss_mib())
    elif what == "throughput":
        it = batches(dataset(root, a["horizon"]), a["workers"])
        common.reply(**common.throughput(it, a["batches"]))
    elif what == "order":
        common.record_order(
            batches(dataset(root, a["horizon"]), 0), a["horizon"], a["budget"], a["out"]
        )
    elif what == "run":
        run(root, a)
    elif not common.ranks_and_roundtrip(__file__, a):
        raise SystemExit(f"unknown measure {what!r}")


def run(root: str, a: dict[str, Any]) -> None:
    """One rank: ``steps`` batches, from ``state`` if given; the state at ``save_at``."""
    _, world = common.rank_env()
    ds = dataset(root, a["horizon"])
    if a.get("state"):
        ds.load_state_dict(a["state"])
    ids, state = [], None
    it = batches(ds, 0)
    for step in range(a["steps"]):
        ids.append(next(it))
        if a.get("save_at") == step + 1:
            state = json.loads(json.dumps(ds.state_dict((step + 1) * world * common.BATCH, True)))
    common.reply(ids=np.concatenate(ids).tolist(), state=state)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    common.say(f"streaming child: {time.perf_counter() - start:.1f} s")

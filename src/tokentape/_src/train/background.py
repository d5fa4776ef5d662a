"""Staging a plan's bucket stores on a thread of its own while the loader streams.

``BackgroundStage(plan, cache_dir)`` waits until ``start()`` (the loader calls it once its
first step's reads are under way, so that they go before the stage's), then runs
``stage_plan`` (one downloader per node and store, the node's other ranks waiting for it, every
block verified: ``stage.stage``) and keeps its result: the staged plan, or the error it raised.
The loader switches its reads to the staged copies between steps once the result is there;
until then its streaming sources read the blocks the stage has landed from local disk
(``stage.landed``), and the stage fetches first the blocks the coming steps read first
(``first_use``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping

import numpy as np

from tokentape._src.objects.client import basename
from tokentape._src.objects.ranged import RangedFiles
from tokentape._src.plan.plan import Plan
from tokentape._src.stage.fetch import FirstUse
from tokentape._src.stage.stage import stage_sources
from tokentape._src.store.reader import window_bytes
from tokentape._src.train.batch import Batcher

FIRST_USE_POSITIONS = 1 << 16
"""Positions (from where the loader starts) whose blocks a background stage fetches first."""


class BackgroundStage:
    """One plan's stage, run on a daemon thread once started."""

    def __init__(
        self,
        plan: Plan,
        cache_dir: str | os.PathLike[str],
        first_use: Callable[[], Mapping[str, FirstUse]] | None = None,
    ) -> None:
        """``first_use``: run on the stage's thread before it begins, the blocks to fetch
        first, per source path (``stage_sources``)."""
        self._plan, self._cache_dir, self._first_use = plan, cache_dir, first_use
        self._go = threading.Event()
        self._done = threading.Event()
        self._cancelled = False
        self.result: Plan | None = None
        """The staged plan (same index hash, its bucket sources read from ``cache_dir``)."""
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tokentape-stage", daemon=True)
        self._thread.start()

    def start(self) -> None:
        """Let the stage begin (idempotent)."""
        self._go.set()

    def cancel(self) -> None:
        """A stage not begun never begins; one under way runs on (it is safe to interrupt at
        any point: the next stage resumes from what it verified)."""
        self._cancelled = True
        self._go.set()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the stage has ended (or ``timeout`` seconds); whether it has."""
        return self._done.wait(timeout)

    def _run(self) -> None:
        self._go.wait()
        try:
            if not self._cancelled:
                order = None if self._first_use is None else self._first_use()
                self.result = stage_sources(self._plan, self._cache_dir, first_use=order)[0]
        except BaseException as exc:  # handed to the loader, raised from its step()
            self.error = exc
        finally:
            self._done.set()


def first_use(batcher: Batcher, start: int, count: int) -> dict[str, FirstUse]:
    """The blocks positions ``[start, start + count)`` read from each of ``batcher``'s
    sources in object storage (by path), each with the offset of the position that reads it
    first: a window's first and last block in its (first) token file."""
    r = batcher.tape.resolve_range(start, count)
    out: dict[str, FirstUse] = {}
    for d, source in enumerate(batcher.sources):
        files, rows = source.files, np.flatnonzero(r.source == d)
        if not isinstance(files, RangedFiles) or not rows.size:
            continue
        index, lo, hi = window_bytes(source, r.sample[rows], batcher.plan.seq_len)
        sizes = [files.blocks(i) for i in range(len(files.pieces))]
        block = np.array([1 if b is None else b.block_bytes for b in sizes], dtype=np.int64)
        first, last = lo // block[index], (np.maximum(hi, lo + 1) - 1) // block[index]
        # Each (file, block) once, at its smallest rank: sorted by rank, the first of each.
        width = int(max(first.max(), last.max())) + 1
        keys = np.concatenate([index * width + first, index * width + last])
        ranks = np.concatenate([rows, rows])
        order = np.argsort(ranks, kind="stable")
        unique, at = np.unique(keys[order], return_index=True)
        names = [basename(p.url) for p in files.pieces]
        per: dict[str, dict[int, int]] = {}
        for key, rank in zip(unique.tolist(), ranks[order][at].tolist(), strict=True):
            i, block_index = divmod(key, width)
            per.setdefault(names[i], {})[block_index] = rank
        out[batcher.plan.sources[d].path] = per
    return out


__all__ = ["FIRST_USE_POSITIONS", "BackgroundStage", "first_use"]

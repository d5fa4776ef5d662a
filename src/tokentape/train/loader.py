"""The loader a training rank uses: the next step's micro-batches, prefetched, and ``commit``.

Its whole runtime state is ``consumed`` (samples applied), inside a ``DataState``. ``step()``
returns the micro-batches of the step that starts at ``consumed`` for this data-parallel rank;
it does not move anything. ``commit()`` — after ``optimizer.step()`` — is the only thing that
advances ``consumed``. Because future positions are known, a background thread prepares the
next ``prefetch`` steps; a change of batch shape drops them (they are never trained on).

numpy out of the box; torch tensors come with the ``torch`` extra (see ``tokentape.train.torch``,
to come).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from tokentape.tape.plan import Plan
from tokentape.train.batch import Batch, Batcher
from tokentape.train.partition import BatchConfig, positions_for
from tokentape.train.state import DataState


@dataclass(frozen=True)
class Step:
    """One optimizer step of one data-parallel rank: ``accum`` micro-batches."""

    step: int
    consumed: int  # samples applied before this step
    config: BatchConfig
    micro_batches: tuple[Batch, ...]


@dataclass(frozen=True)
class _Prepared:
    """A step made ahead by the prefetch thread: this rank's micro-batches, and the whole
    step's tokens hash when this loader writes the step log."""

    micro_batches: tuple[Batch, ...]
    tokens_hash: str | None


def hash_dtype(plan: Plan) -> np.dtype:
    """The dtype token ids are hashed in: uint32 when a store is uint32 or a vocabulary has
    more than 65,536 ids (a Megatron source may be int32 or int64), else uint16."""
    wide = any(s.dtype == "uint32" or s.vocab_size > 2**16 for s in plan.sources)
    return np.dtype("<u4") if wide else np.dtype("<u2")


def step_tokens_hash(batch: Batch, plan: Plan) -> str:
    """The step log's tokens hash: sha256 over the positions (int64 little-endian), then the
    token windows as ``hash_dtype(plan)``, row by row. Hashed through the buffer protocol: no
    copy when the batch already has that dtype."""
    h = hashlib.sha256(np.ascontiguousarray(batch.positions, dtype="<i8"))
    h.update(np.ascontiguousarray(batch.tokens, dtype=hash_dtype(plan)))
    return h.hexdigest()


class Loader:
    """Steps for data-parallel rank ``dp_rank`` of a plan, from ``state`` on."""

    def __init__(
        self,
        plan: Plan,
        dp_rank: int,
        config: BatchConfig,
        state: DataState | None = None,
        prefetch: int = 2,
        step_log: str | os.PathLike[str] | None = None,
        dtype: np.dtype | type = np.int64,
        segments: bool = False,
    ) -> None:
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        self.batcher = Batcher(plan, dtype, segments)
        # The step log hashes the whole step; assembled in the stores' own width it is cheaper.
        self._log_batcher = Batcher(plan, hash_dtype(plan)) if step_log is not None else None
        self.plan = plan
        self.dp_rank = dp_rank
        self.config = config
        self.state = state if state is not None else DataState.start(plan)
        self.state.check_plan(plan)
        self.prefetch = prefetch
        self.step_log = Path(step_log) if step_log is not None else None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokentape-prefetch")
        self._ahead: dict[tuple[int, BatchConfig], Future[_Prepared]] = {}
        positions_for(0, dp_rank, config)  # validates dp_rank against the config

    # --- the training loop's three calls ------------------------------------------------

    def step(self) -> Step:
        """The micro-batches of the step starting at ``consumed`` (prefetching those after)."""
        consumed = self.state.consumed
        self._schedule(consumed)
        prepared = self._ahead[(consumed, self.config)].result()
        return Step(self.state.step, consumed, self.config, prepared.micro_batches)

    def commit(self) -> None:
        """The optimizer applied the current step: advance ``consumed`` by the global batch."""
        before = self.state
        future = self._ahead.pop((before.consumed, self.config), None)
        self.state = before.commit(self.config)
        if self.step_log is not None:
            # The step's hash was made by the prefetch thread with its batches (or, for a step
            # committed without step(), here).
            prepared = future.result() if future is not None else None
            tokens_hash = prepared.tokens_hash if prepared is not None else None
            self._log(before, tokens_hash or self._step_hash(before.consumed, self.config))

    def set_config(self, config: BatchConfig) -> None:
        """Change dp size / micro / accum at the next step boundary; drops prefetched work."""
        positions_for(0, self.dp_rank, config)
        if config != self.config:
            for future in self._ahead.values():
                future.cancel()
            self._ahead.clear()
            self.config = config

    # --- checkpointing --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return self.state.to_dict()

    def load_state_dict(self, data: dict[str, Any]) -> None:
        state = DataState.from_dict(data)
        state.check_plan(self.plan)
        for future in self._ahead.values():
            future.cancel()
        self._ahead.clear()
        self.state = state

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------

    def _schedule(self, consumed: int) -> None:
        b = self.config.global_batch
        for i in range(self.prefetch + 1):
            key = (consumed + i * b, self.config)
            if key not in self._ahead:
                self._ahead[key] = self._pool.submit(self._build, *key)
        for key in [k for k in self._ahead if k[0] < consumed]:
            del self._ahead[key]

    def _build(self, consumed: int, config: BatchConfig) -> _Prepared:
        rows = positions_for(consumed, self.dp_rank, config)
        whole = self.batcher.batch(rows.ravel())
        m = config.micro
        micro = tuple(_slice(whole, i * m, (i + 1) * m) for i in range(config.accum))
        logged = self._step_hash(consumed, config) if self.step_log is not None else None
        return _Prepared(micro, logged)

    def _step_hash(self, consumed: int, config: BatchConfig) -> str:
        """The tokens hash of the whole step (every rank's positions), for the step log."""
        b = config.global_batch
        assert self._log_batcher is not None
        whole = self._log_batcher.batch(np.arange(consumed, consumed + b))
        return step_tokens_hash(whole, self.plan)

    def _log(self, before: DataState, tokens_hash: str) -> None:
        """One JSON line for the committed step, covering every rank's positions."""
        b = self.config.global_batch
        record = {
            "step": before.step,
            "consumed": before.consumed,
            "global_batch": b,
            "dp": self.config.dp_size,
            "micro": self.config.micro,
            "accum": self.config.accum,
            "index_hash": self.plan.index_hash,
            "tokens_hash": tokens_hash,
            "time": round(time.time(), 3),
        }
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.step_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write of one line: appended whole
        finally:
            os.close(fd)


def _slice(batch: Batch, lo: int, hi: int) -> Batch:
    """Rows [lo, hi) of every per-row array of ``batch``."""
    return Batch(*(None if a is None else a[lo:hi] for a in _fields_of(batch)))


def _fields_of(batch: Batch) -> tuple[np.ndarray | None, ...]:
    return tuple(getattr(batch, f.name) for f in fields(batch))

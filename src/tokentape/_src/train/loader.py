"""The loader a training rank uses: the next step's micro-batches, prefetched, and ``commit``.

Its whole runtime state is ``consumed`` (samples applied), inside a ``DataState``. ``step()``
returns the micro-batches of the step that starts at ``consumed`` for this data-parallel rank;
it does not move anything. ``commit()`` — after ``optimizer.step()`` — is the only thing that
advances ``consumed``. Because future positions are known, a background thread prepares the
next ``prefetch`` steps; a change of batch shape drops them (they are never trained on).

``commit()`` commits exactly the step ``step()`` handed out — with that step's shape, even if
``set_config()`` was called in between (the new shape starts with the next step). A commit with
no step outstanding is refused. numpy arrays out of the box; ``tokentape._src.torch.data``
turns them into (pinned) torch tensors.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.objects.client import is_url
from tokentape._src.objects.ranged import FetchConfig, FetchStats, RangedFiles
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.open import TOKENTAPE
from tokentape._src.plan.plan import Plan
from tokentape._src.stage.landed import LandedBlocks
from tokentape._src.stage.stage import stage_plan
from tokentape._src.store.reader import TokenStream, total_stats
from tokentape._src.tape.resolve import Resolved
from tokentape._src.train.ahead import ResolveAhead, StepShape
from tokentape._src.train.background import FIRST_USE_POSITIONS, BackgroundStage, first_use
from tokentape._src.train.batch import Batch, Batcher, DocOrigin
from tokentape._src.train.logwriter import StepLogWriter
from tokentape._src.train.partition import BatchConfig, positions_for
from tokentape._src.train.state import DataState
from tokentape._src.util.checks import check_flag, check_path, shown
from tokentape.errors import ArgumentError, PlanError, TokentapeError

STAGE_MODES = ("background", "first")
"""How a ``Loader`` with a ``cache_dir`` stages a plan's bucket stores."""


@dataclass(frozen=True)
class Step:
    """One optimizer step of one data-parallel rank: ``accum`` micro-batches.

    Attributes:
        step: The step's number: the steps committed before it.
        consumed: Samples applied before this step (by all ranks together).
        config: The step's shape; ``commit()`` commits the step with it.
        micro_batches: This rank's ``config.accum`` micro-batches of ``config.micro`` samples
            each, in the order to train on them.
    """

    step: int
    consumed: int  # samples applied before this step
    config: BatchConfig
    micro_batches: tuple[Batch, ...]


@dataclass(frozen=True)
class _Ahead:
    """A step prepared ahead by the prefetch thread: this rank's micro-batches and, when this
    loader writes the step log, the whole step's tokens hash (a separate job, so ``step()``
    never waits for it)."""

    batches: Future[tuple[Batch, ...]]
    tokens_hash: Future[str] | None

    def cancel(self) -> None:
        self.batches.cancel()
        if self.tokens_hash is not None:
            self.tokens_hash.cancel()


@dataclass(frozen=True)
class _Outstanding:
    """The step ``step()`` handed out and ``commit()`` will commit."""

    state: DataState
    config: BatchConfig
    ahead: _Ahead


def hash_dtype(plan: Plan) -> np.dtype:
    """The dtype token ids are hashed in: uint32 when a store is uint32 or a vocabulary has
    more than 65,536 ids (a Megatron source may be int32 or int64), else uint16."""
    wide = any(s.dtype == "uint32" or s.vocab_size > 2**16 for s in plan.sources)
    return np.dtype("<u4") if wide else np.dtype("<u2")


def step_tokens_hash(batch: Batch, plan: Plan) -> str:
    """The step log's tokens hash: sha256 over the positions (int64 little-endian), then the
    token windows as ``hash_dtype(plan)``, row by row. Hashed through the buffer protocol: no
    copy when the batch already has that dtype."""
    h = hashlib.sha256(np.ascontiguousarray(batch.positions, dtype="<i8").data)
    h.update(np.ascontiguousarray(batch.tokens, dtype=hash_dtype(plan)).data)
    return h.hexdigest()


class Loader:
    """Steps for data-parallel rank ``dp_rank`` of a plan, from ``state`` on.

    The training loop calls ``step()`` for the micro-batches of the next step, trains on them,
    then ``commit()`` after ``optimizer.step()``; ``state_dict()`` is saved with the model and
    ``load_state_dict()`` resumes from it. A background thread prepares the next ``prefetch``
    steps. Use it as a context manager, or call ``close()``.

    Args:
        plan: The plan to read, or the path of its ``PLAN.json``.
        dp_rank: This process's data-parallel rank, in ``[0, config.dp_size)``; tensor- and
            pipeline-parallel peers of a rank pass the same rank and get the same batches.
        config: The shape of the steps, until ``set_config()`` changes it.
        state: The data state to start from (``DataState.from_dict(saved)``); None: the start
            of the plan.
        prefetch: Steps prepared ahead of the one being trained on (0: none).
        step_log: A JSON-lines file to append one line to per committed step (step,
            ``consumed``, shape, index hash and the whole step's tokens hash), made durable by
            ``state_dict()``; its directory must exist. None (the default): no log. Usually
            given on one rank only.
        dtype: The integer dtype of the token windows (int64 by default); it must hold every
            id of the plan's vocabularies.
        segments: Also compute each token's document segment id and in-document position
            (``Batch.segment_ids``, ``Batch.doc_positions``, ``Batch.cu_seqlens``).
        cache_dir: For a plan whose stores are in object storage (``s3://...``): stage them
            to this node-local directory (``tokentape stage``: verified block by block, one
            downloader per node and store while the other ranks wait) and read the staged
            copies like local stores; see ``stage``. None (the default): such stores are
            streamed.
        stage: With ``cache_dir``: ``"background"`` (the default) streams the first steps
            while the stores are staged on a thread of this loader's, begun once the first
            step's reads are under way, and reads the staged copies from the first step
            scheduled after the stage ends (the batches are the same either way; ``staged``
            says which it reads);
            meanwhile it reads the blocks the stage has landed from local disk, and the stage
            fetches first the blocks the coming steps read first;
            ``"first"`` stages before the constructor returns, as ``tokentape stage`` does.
        fetch: How stores in object storage are streamed without ``cache_dir``: ranged GETs in
            flight and MiB cached per store (default ``FetchConfig()``). The next
            ``prefetch`` steps' windows are fetched as soon as the steps are scheduled, so
            choose ``prefetch`` so that those fetches take no longer than that many training
            steps: about ``ceil(latency * ceil(windows per rank / concurrency) / step time)
            + 1`` (docs/object-storage.md).

    Raises:
        ArgumentError: An argument of the wrong type or value: ``prefetch``, ``state``,
            ``dp_rank`` outside ``config``, ``config`` not a ``BatchConfig``, a ``dtype`` that
            cannot hold the ids, or a ``step_log`` in a missing directory or that is not a
            regular file.
        StoreChanged: A source's store no longer has the content hash the plan recorded.
        StoreError: A source's store (or Megatron prefix) is missing or damaged, or not the
            one planned.
        ResumeRefused: ``state`` was saved on a plan that changes a sample below its
            ``consumed`` (see ``DataState.resume_on``).
        PlanError: ``step_log`` last holds steps of a plan neither this one nor one ``state``
            changed from (without ``state``: raised by the first ``step()`` unless
            ``load_state_dict`` brings such a state first), or ``plan`` is the path of a
            ``PLAN.json`` that cannot be read as one.
        ObjectStorageError: Object storage kept failing (opening a store in a bucket, or
            staging it); a read that keeps failing while streaming is raised from ``step()``.
    """

    def __init__(
        self,
        plan: Plan | str | os.PathLike[str],
        dp_rank: int,
        config: BatchConfig,
        state: DataState | None = None,
        prefetch: int = 2,
        step_log: str | os.PathLike[str] | None = None,
        dtype: np.dtype | type = np.int64,
        segments: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        fetch: FetchConfig | None = None,
        stage: str = "background",
    ) -> None:
        if isinstance(plan, str | os.PathLike):
            plan = load_plan(plan)
        elif not isinstance(plan, Plan):
            raise ArgumentError(f"plan must be a Plan or the path of a PLAN.json, got {plan!r}")
        if fetch is not None and not isinstance(fetch, FetchConfig):
            raise ArgumentError(f"fetch must be a FetchConfig, got {fetch!r}")
        if cache_dir is not None:
            check_path("cache_dir", cache_dir)
        if stage not in STAGE_MODES:
            raise ArgumentError(
                f"stage must be one of {', '.join(STAGE_MODES)}, got {shown(stage)}"
            )
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ArgumentError(f"prefetch must be an integer >= 0, got {prefetch!r}")
        if state is not None and not isinstance(state, DataState):
            raise ArgumentError(
                "state must be a DataState (DataState.from_dict(saved)), got "
                + type(state).__name__
            )
        if step_log is not None:
            check_path("step_log", step_log)
        check_flag("segments", segments)
        _check_dtype(dtype)
        positions_for(0, dp_rank, config)  # validates dp_rank against the config
        background = cache_dir is not None and stage == "background"
        background = background and any(is_url(s.path) for s in plan.sources)
        if cache_dir is not None and not background:  # every argument checked: stage
            plan = stage_plan(plan, cache_dir)
        self._stage: BackgroundStage | None = None
        self._dtype, self._segments = dtype, segments
        self._retired: list[TokenStream] = []  # the bucket's, until a switch to staged copies
        self.batcher = Batcher(plan, dtype, segments, fetch=fetch)
        # The step log hashes the whole step in the stores' own width (cheaper); same stores.
        self._log_batcher = (
            Batcher(plan, hash_dtype(plan), sources=self.batcher.sources)
            if step_log is not None
            else None
        )
        self.plan = plan
        self.dp_rank = dp_rank
        self.config = config
        """The shape of the next step ``step()`` hands out."""
        self.state = (state if state is not None else DataState.start(plan)).resume_on(plan)
        self.prefetch = prefetch
        self.step_log = Path(step_log) if step_log is not None else None
        self._writer = StepLogWriter(step_log) if step_log is not None else None
        self._log_checked = False
        try:
            self._check_log(self.state)
        except PlanError:
            if state is not None:
                raise
            # The log may end under a plan a state loaded next (load_state_dict) changed from:
            # checked again then, or at the first step.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokentape-prefetch")
        self._resolve = ResolveAhead(self.batcher.tape)  # coming steps' index math, in chunks
        self._ahead: dict[tuple[int, BatchConfig], _Ahead] = {}
        self._outstanding: _Outstanding | None = None
        self._closed = False
        self.waits: deque[float] = deque(maxlen=10_000)
        """Seconds the last ``step()`` calls blocked waiting for their batches: the trainer's
        data stalls (near 0 when prefetch keeps ahead)."""
        if background:  # last: a constructor that raised leaves no thread behind
            assert cache_dir is not None
            self._read_landed(cache_dir)
            batcher, start = self.batcher, self.state.consumed
            count = FIRST_USE_POSITIONS
            self._stage = BackgroundStage(plan, cache_dir, lambda: first_use(batcher, start, count))

    @property
    def fetch_stats(self) -> FetchStats:
        """Requests and bytes the loader's reads fetched from object storage so far (zeros
        for local stores; a stage's downloads are not counted), and the bytes they read from
        blocks a stage under way had landed instead (``staged_bytes``)."""
        return total_stats([*self._retired, *self.batcher.sources])

    @property
    def staged(self) -> bool:
        """Whether steps scheduled now read staged copies (or local stores): False while a
        background stage (``stage="background"``) is under way."""
        return self._stage is None

    # --- the training loop's three calls ------------------------------------------------

    def step(self) -> Step:
        """The micro-batches of the step starting at ``consumed`` (prefetching those after).

        Calling it again before ``commit()`` returns the same step.

        Returns:
            This rank's step: its number, ``consumed`` before it, its shape and its
            micro-batches.

        Raises:
            TokentapeError: The loader is closed.
            PlanError: The step log last holds steps of another plan (see the constructor).
            StoreError: A store's document index turned out damaged when first read (with
                ``segments``). Any error building the step carries a note naming the step, and
                a retry builds the step afresh.
        """
        if self._closed:
            raise TokentapeError("the loader is closed")
        self._check_log(self.state)
        self._switch_when_staged()
        if self._outstanding is not None:
            out = self._outstanding
            return Step(out.state.step, out.state.consumed, out.config, out.ahead.batches.result())
        state, config = self.state, self.config
        key = (state.consumed, config)
        early = self._ahead.get(key)
        if early is not None and _failed(early.batches):
            self._ahead.pop(key)  # built ahead and failed (a store briefly down): build afresh
        self._schedule(state.consumed)
        if self._stage is not None:  # once the first step's reads are under way: they go first
            self._stage.start()
        ahead = self._ahead[key]
        started = time.perf_counter()
        try:
            batches = ahead.batches.result()
        except BaseException as exc:  # let a retry build it afresh (a transient read error)
            self._ahead.pop(key, None)
            exc.add_note(
                f"tokentape: building step {state.step} (consumed {state.consumed}) for dp rank "
                f"{self.dp_rank}"
            )
            raise
        self.waits.append(time.perf_counter() - started)
        self._outstanding = _Outstanding(state, config, ahead)
        return Step(state.step, state.consumed, config, batches)

    def commit(self) -> None:
        """The optimizer applied the step ``step()`` handed out: log it, then advance.

        The step is appended to the step log (when this loader writes one), then ``consumed``
        advances by that step's global batch, with that step's shape even if ``set_config()``
        was called since ``step()``.

        Raises:
            TokentapeError: No step is outstanding (``step()`` was not called since the last
                commit), or ``load_state_dict()`` replaced the state since ``step()``.
            OSError: The step log could not be written (nothing is committed then).
        """
        out = self._outstanding
        if out is None:
            raise TokentapeError(
                "commit() without an outstanding step: call step() and train on it first"
            )
        if out.state is not self.state:
            raise TokentapeError("commit(): the state changed since step() (load_state_dict)")
        if self._writer is not None:
            assert out.ahead.tokens_hash is not None
            try:
                tokens_hash = out.ahead.tokens_hash.result()
            except Exception:  # the background hash job failed: once more, here (or raise)
                tokens_hash = self._step_hash(out.state.consumed, out.config)
            self._writer.append(self._record(out, tokens_hash))
        self.state = out.state.commit(out.config)
        self._outstanding = None
        self._ahead.pop((out.state.consumed, out.config), None)

    def set_config(self, config: BatchConfig) -> None:
        """Change dp size / micro / accum from the next step on.

        Prefetched work of the old shape is dropped (a step already handed out is still
        committed with its own shape).

        Args:
            config: The shape of the steps from the next one on.

        Raises:
            ArgumentError: ``config`` is not a ``BatchConfig``, or this loader's ``dp_rank`` is
                not below its ``dp_size``.
        """
        positions_for(0, self.dp_rank, config)
        if config != self.config:
            handed_out = self._outstanding.ahead if self._outstanding else None
            for key in [k for k, a in self._ahead.items() if a is not handed_out]:
                self._ahead.pop(key).cancel()
            self.config = config

    def origins(self, batch: Batch) -> list[list[DocOrigin]]:
        """The documents each row of a micro-batch holds, and where each came from.

        For the step at a loss spike, say: which records of which input files (and the user's
        ids for them) the rows were made of. Read from the stores' provenance when asked, never
        while building steps.

        Args:
            batch: A micro-batch this loader handed out (``step.micro_batches[i]``), or any
                ``Batch`` of this loader's plan.

        Returns:
            One list per row, in row order, of the documents its window (its ``seq_len + 1``
            tokens) overlaps, in the order their tokens come: each a ``DocOrigin`` (the
            source's name, the document's id in it, and its ``Origin``, or None where the store
            records no provenance).

        Raises:
            TokentapeError: The loader is closed.
            ArgumentError: ``batch`` is not a ``Batch``, or a row's source, pass or sample is
                not what this loader's plan puts at its position (a batch of another plan).
            StoreError: A store's provenance files turned out damaged when read.
        """
        if self._closed:
            raise TokentapeError("the loader is closed")
        return self.batcher.origins(batch)

    # --- checkpointing --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The data state to save with the model; the step log is made durable up to it.

        Returns:
            ``DataState.to_dict()`` of the state after the last committed step: JSON-friendly
            data for ``load_state_dict()``.
        """
        if self._writer is not None:
            self._writer.sync()
        return self.state.to_dict()

    def load_state_dict(self, data: dict[str, Any]) -> None:
        """Continue from a saved state (any batch shape); an outstanding step is abandoned.

        Args:
            data: What ``state_dict()`` returned (e.g. read back from a checkpoint's JSON).

        Raises:
            InputError: ``data`` is not a valid data state (see ``DataState.from_dict``).
            ResumeRefused: The state was saved on a plan that differs from this loader's
                below its ``consumed`` (see ``DataState.resume_on``); the loader keeps its
                current state.
            PlanError: The step log last holds steps of a plan neither this one nor one the
                state changed from; the loader keeps its current state.
        """
        state = DataState.from_dict(data).resume_on(self.plan)
        self._log_checked = False
        self._check_log(state)
        for ahead in self._ahead.values():
            ahead.cancel()
        self._ahead.clear()
        self._outstanding = None
        self.state = state

    def _check_log(self, state: DataState) -> None:
        """Refuse a step log whose last step ran under another plan than this one or one the
        run changed from (``state.plan_changes``): appending would make it unreadable."""
        if self._writer is None or self._log_checked:
            return
        earlier = {c.old_index_hash for c in state.plan_changes}
        self._writer.check_plan(self.plan.index_hash, earlier, state.step)
        self._log_checked = True

    def close(self) -> None:
        """Stop the prefetch thread (work not started is dropped) and the sources' fetch
        threads, letting go of their cached ranges. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._stage is not None:
                self._stage.cancel()
            self._pool.shutdown(wait=False, cancel_futures=True)
            _close_sources(self.batcher)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------

    def _read_landed(self, cache_dir: str | os.PathLike[str]) -> None:
        """Let each streamed store read the blocks this node's stage has landed from local
        disk (``stage.landed``; a tokentape store's: a Megatron prefix's stage records no
        block hashes to check them by)."""
        for planned, source in zip(self.plan.sources, self.batcher.sources, strict=True):
            if planned.format == TOKENTAPE and isinstance(source.files, RangedFiles):
                source.files.use_local(LandedBlocks(cache_dir, planned.path))

    def _switch_when_staged(self) -> None:
        """Once a background stage has ended: read the staged copies from the next step
        scheduled on (the steps scheduled before read the bucket, whose sources are closed
        after them), or raise the stage's error (then the loader goes on streaming)."""
        stage = self._stage
        if stage is None or not stage.finished:
            return
        self._stage = None
        if stage.error is not None:
            stage.error.add_note(
                "tokentape: staging in the background failed; this loader goes on streaming"
            )
            raise stage.error
        assert stage.result is not None
        old = self.batcher
        self.batcher = Batcher(stage.result, self._dtype, self._segments)
        if self._log_batcher is not None:
            hashing = hash_dtype(stage.result)
            self._log_batcher = Batcher(stage.result, hashing, sources=self.batcher.sources)
        self.plan = stage.result
        self._retired = list(old.sources)  # still counted: earlier steps may go on reading
        self._pool.submit(_close_sources, old)  # after the steps already scheduled on them

    def _schedule(self, consumed: int) -> None:
        b = self.config.global_batch
        for i in range(self.prefetch + 1):
            key = (consumed + i * b, self.config)
            if key not in self._ahead:
                resolved = None
                if self.batcher.fetches_ahead:  # object storage: start this step's reads now
                    rows = positions_for(key[0], self.dp_rank, key[1]).ravel()
                    resolved = self.batcher.prefetch(rows)  # resolved once: the build reuses it
                batches = self._pool.submit(self._build, *key, resolved, self.batcher)
                hashed = (
                    self._pool.submit(self._step_hash, *key, self._log_batcher)
                    if self._writer
                    else None
                )
                self._ahead[key] = _Ahead(batches, hashed)
        for key in [k for k in self._ahead if k[0] < consumed]:
            self._ahead.pop(key).cancel()

    def _build(
        self,
        consumed: int,
        config: BatchConfig,
        resolved: Resolved | None,
        batcher: Batcher,
    ) -> tuple[Batch, ...]:
        """This rank's micro-batches at ``consumed``, read by ``batcher`` (the one the step
        was scheduled with)."""
        rows = positions_for(consumed, self.dp_rank, config)
        if resolved is None:
            shape = StepShape(config.global_batch, self.dp_rank * config.per_rank, config.per_rank)
            resolved = self._resolve.resolved(consumed, shape)
        whole = batcher.batch(rows.ravel(), resolved)
        m = config.micro
        return tuple(_slice(whole, i * m, (i + 1) * m) for i in range(config.accum))

    def _step_hash(self, consumed: int, config: BatchConfig, batcher: Batcher | None = None) -> str:
        """The tokens hash of the whole step (every rank's positions), for the step log."""
        b = config.global_batch
        batcher = batcher or self._log_batcher
        assert batcher is not None
        resolved = self._resolve.resolved(consumed, StepShape(b, 0, b))
        whole = batcher.batch(np.arange(consumed, consumed + b), resolved)
        return step_tokens_hash(whole, self.plan)

    def _record(self, out: _Outstanding, tokens_hash: str) -> dict[str, Any]:
        """The step log's line for a committed step, covering every rank's positions."""
        c = out.config
        return {
            "step": out.state.step,
            "consumed": out.state.consumed,
            "global_batch": c.global_batch,
            "dp": c.dp_size,
            "micro": c.micro,
            "accum": c.accum,
            "index_hash": self.plan.index_hash,
            "tokens_hash": tokens_hash,
            "time": round(time.time(), 3),
        }


def _check_dtype(dtype: object) -> None:
    """A numpy dtype or what names one (``np.int32``, ``"int32"``)."""
    if not isinstance(dtype, np.dtype | type | str):
        raise ArgumentError(f"dtype must be a numpy integer dtype, got {shown(dtype)}")
    try:
        np.dtype(dtype)
    except TypeError:
        raise ArgumentError(f"dtype must be a numpy integer dtype, got {shown(dtype)}") from None


def _close_sources(batcher: Batcher) -> None:
    """Let go of what a batcher's sources hold beyond their memory maps."""
    for source in batcher.sources:
        source.close()


def _failed(future: Future[Any]) -> bool:
    """A job that ended in an error (not one cancelled or still running)."""
    return future.done() and not future.cancelled() and future.exception() is not None


def _slice(batch: Batch, lo: int, hi: int) -> Batch:
    """Rows [lo, hi) of every per-row array of ``batch`` (an absent one stays absent)."""
    arrays = ((f.name, getattr(batch, f.name)) for f in fields(batch))
    return replace(batch, **{name: a[lo:hi] for name, a in arrays if a is not None})


__all__ = ["Loader", "Step", "hash_dtype", "step_tokens_hash"]

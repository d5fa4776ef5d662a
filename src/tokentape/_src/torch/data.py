"""torch integration (the ``torch`` extra): tensors, samplers and a map-style Dataset.

The native ``Loader`` is the fast path. The classes below let a stock
``torch.utils.data.DataLoader`` (worker processes, ``pin_memory``) drive the same positions.
The fast pattern: ``TapeBatchSampler`` hands out one micro-batch's positions at a time (a
``MicroBatch`` list), ``TapeDataset.__getitems__`` reads them with one ``Batcher.batch`` call
(their resolution taken from the rank's coming steps, resolved ahead in one tape call) and
``collate`` hands the stacked tensors on without copying them. ``TapeSampler`` (one position at
a time, with ``batch_size=micro``) gives the same batches, slower: torch's own batch sampler
hands plain lists (resolved alone) and ``default_collate`` stacks the samples again.

Both samplers implement torchdata's ``Stateful`` protocol (``state_dict`` /
``load_state_dict``, JSON-friendly), so ``StatefulDataLoader`` resumes them exactly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, default_collate, get_worker_info

from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.tape.resolve import Resolved
from tokentape._src.train.ahead import ResolveAhead, StepShape
from tokentape._src.train.batch import Batch, Batcher
from tokentape._src.train.partition import BatchConfig, positions_for
from tokentape._src.util.checks import as_index, check_flag, shown
from tokentape.errors import ArgumentError, OutOfRangeError


def to_torch(batch: Batch, pin: bool | None = None) -> dict[str, torch.Tensor]:
    """A batch's arrays as torch tensors, pinned for fast host-to-device copies if asked.

    ``inputs``, ``targets``, ``positions`` and each row's ``source`` (for a loss per source),
    and the segment ids and in-document positions of the inputs when the batch has them.

    Args:
        batch: A batch (a micro-batch of ``Loader.step()``).
        pin: Pin the tensors' memory; None (the default): pin when CUDA is available.

    Returns:
        A dict of ``inputs`` and ``targets`` (``(n, seq_len)``), ``positions`` and ``source``
        (``(n,)``; ``source`` indexes ``plan.sources``) and,
        when present, ``segment_ids`` and ``doc_positions`` (``(n, seq_len)``), contiguous.
        Unpinned, they are views of one block of memory: ``torch.save`` of one of them writes
        the whole block (``.clone()`` it first).
    """
    if not isinstance(batch, Batch):
        raise ArgumentError(
            f"batch must be a micro-batch (a Batch: step.micro_batches[i]), got "
            f"{type(batch).__name__}"
        )
    if pin is not None:
        check_flag("pin", pin)
    pin = torch.cuda.is_available() if pin is None else pin
    tensors = _tensors(batch, shared=False)
    return {k: t.pin_memory() for k, t in tensors.items()} if pin else tensors


def _tensors(batch: Batch, shared: bool) -> dict[str, torch.Tensor]:
    """``to_torch``'s contiguous tensors, unpinned, views of one block of memory allocated by
    torch; ``shared``: of shared memory (a DataLoader worker's, so that handing them to the
    main process copies nothing more and passes one file descriptor).

    One block, not one numpy array per key: fresh ~1 MiB arrays freed at every batch made the
    allocator give their pages back and fault them in again (hundreds of faults a batch),
    which cost more than the copies.
    """
    arrays = {
        "inputs": batch.inputs,
        "targets": batch.targets,
        "positions": batch.positions,
        "source": batch.source,
    }
    if batch.segment_ids is not None and batch.doc_positions is not None:
        arrays["segment_ids"] = batch.segment_ids[:, :-1]
        arrays["doc_positions"] = batch.doc_positions[:, :-1]
    dtypes = {k: torch.from_numpy(a[:0]).dtype for k, a in arrays.items()}
    ends = np.cumsum([-(-a.nbytes // 8) * 8 for a in arrays.values()]).tolist()
    if shared:
        # the same private allocator torch's default_collate uses for a worker's batches (torch
        # leaves that private method unannotated)
        storage = torch.UntypedStorage._new_shared(ends[-1])  # type: ignore[no-untyped-call]
        block = torch.empty(0, dtype=torch.uint8).set_(storage)
    else:
        block = torch.empty(ends[-1], dtype=torch.uint8)
    starts = [0, *ends[:-1]]
    out = {
        k: block[lo : lo + a.nbytes].view(dtypes[k]).view(a.shape)
        for (k, a), lo in zip(arrays.items(), starts, strict=True)
    }
    for key, array in arrays.items():
        out[key].numpy()[...] = array
    return out


_STATE_KEYS = ("dp_rank", "dp_size", "micro", "accum", "consumed", "steps", "yielded")


class _RankPositions:
    """What both samplers share: a rank's positions for ``steps`` steps from ``consumed``, and
    how many of them the current pass handed out (their torchdata ``Stateful`` state)."""

    def __init__(self, dp_rank: int, config: BatchConfig, consumed: int, steps: int) -> None:
        positions_for(consumed, dp_rank, config)  # validates the arguments
        if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 0:
            raise ArgumentError(f"steps must be an integer >= 0, got {steps!r}")
        consumed, steps = int(consumed), int(steps)  # numpy integers would overflow below
        if consumed + steps * config.global_batch > MAX_POSITION:
            raise OutOfRangeError(
                f"{steps} steps of {config.global_batch} samples from consumed {consumed} go "
                "beyond position 2**62"
            )
        self.dp_rank, self.config = int(dp_rank), config
        self.consumed, self.steps = consumed, steps
        self.yielded = 0
        """Samples of this rank handed out by the current pass (``iter()``) so far."""
        self._resume_at: int | None = None

    def _first(self, step: int) -> int:
        """The position of this rank's first sample in ``step`` (0-based, from ``consumed``)."""
        c = self.config
        return self.consumed + step * c.global_batch + self.dp_rank * c.per_rank

    def _start_pass(self) -> int:
        """Where a new pass starts: 0, or the sample a loaded state stopped at."""
        start = self._resume_at or 0
        self._resume_at = None
        self.yielded = start
        return start

    def state_dict(self) -> dict[str, int]:
        """The sampler's state (torchdata's ``Stateful``): JSON-friendly ints.

        Returns:
            The rank and shape it was built with (``dp_rank``, ``dp_size``, ``micro``,
            ``accum``, ``consumed``, ``steps``) and ``yielded``: the samples of this rank the
            current pass handed out.
        """
        c = self.config
        return {
            "dp_rank": self.dp_rank,
            "dp_size": c.dp_size,
            "micro": c.micro,
            "accum": c.accum,
            "consumed": self.consumed,
            "steps": self.steps,
            "yielded": self.yielded,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass (``iter()``) continue where ``state``'s pass stopped.

        ``steps`` may differ (a run made longer or shorter); the rank, the shape and
        ``consumed`` may not: to go on with another shape, build a sampler from the
        ``consumed`` of your last applied step instead.

        Args:
            state: What ``state_dict()`` returned (read back from JSON, too).

        Raises:
            ArgumentError: ``state`` is not a sampler state, is one of another rank, shape or
                ``consumed``, or lies beyond this sampler's samples.
        """
        if not isinstance(state, dict) or set(state) != set(_STATE_KEYS):
            raise ArgumentError(
                f"sampler state: expected an object of {', '.join(_STATE_KEYS)}, got {shown(state)}"
            )
        for key in _STATE_KEYS:
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ArgumentError(
                    f"sampler state: '{key}' must be an integer >= 0, got {shown(value)}"
                )
        mine = self.state_dict()
        differ = [
            f"{key} {state[key]} (this sampler: {mine[key]})"
            for key in _STATE_KEYS[:5]
            if state[key] != mine[key]
        ]
        if differ:
            raise ArgumentError(
                f"sampler state of another rank or shape: {', '.join(differ)}; to change "
                "them, build the sampler from the consumed of the last step applied"
            )
        yielded = state["yielded"]
        if yielded > self.steps * self.config.per_rank or yielded % self._unit:
            raise ArgumentError(
                f"sampler state: yielded {yielded} is not a place in this sampler's "
                f"{self.steps} steps of {self.config.per_rank} samples"
                + (f" in micro-batches of {self._unit}" if self._unit > 1 else "")
            )
        self._resume_at = yielded

    @property
    def _unit(self) -> int:
        """Samples handed out at a time."""
        return 1


class TapeSampler(_RankPositions, Sampler[int]):
    """Positions of data-parallel rank ``dp_rank``, step after step from ``consumed``.

    With ``batch_size=config.micro``, a ``DataLoader`` over a ``TapeDataset`` yields the
    native loader's micro-batches: ``config.accum`` of them per step. ``TapeBatchSampler``
    gives the same batches faster (with ``collate``; see the module's docstring).

    A torchdata ``Stateful``: ``state_dict()`` / ``load_state_dict()`` (see
    ``TapeBatchSampler``), so that ``StatefulDataLoader`` resumes it exactly.

    Args:
        dp_rank: This process's data-parallel rank, in ``[0, config.dp_size)``.
        config: The shape of every step.
        consumed: Samples applied before the first step (a resumed ``DataState``'s
            ``consumed``; 0 at the start).
        steps: Steps to yield the positions of (``len()`` is ``steps · micro · accum``).

    Raises:
        ArgumentError: ``config`` is not a ``BatchConfig``, ``dp_rank`` is not a rank of it,
            or ``consumed`` or ``steps`` is not a non-negative integer.
        OutOfRangeError: The steps would end beyond position 2**62.
    """

    def __iter__(self) -> Iterator[int]:
        return self._positions(self._start_pass())

    def _positions(self, start: int) -> Iterator[int]:
        per = self.config.per_rank
        for step in range(start // per, self.steps):
            first = self._first(step)
            skip = start - step * per if step == start // per else 0
            for position in range(first + skip, first + per):
                self.yielded += 1
                yield position

    def __len__(self) -> int:
        return self.steps * self.config.per_rank


AHEAD = 1 << 14
"""At most this many positions of a rank's coming steps are resolved in one call by
``TapeDataset`` (``train.ahead.ResolveAhead``: its chunks start at a few steps and double)."""


class MicroBatch(list[int]):
    """A micro-batch's positions (a list), and where its rank's coming steps lie.

    ``TapeBatchSampler`` yields these: ``TapeDataset.__getitems__`` resolves the positions of
    many coming steps at once from them (one tape call spread over many micro-batches),
    which gives the same samples as resolving each micro-batch alone.

    Attributes:
        first: The rank's first position in this micro-batch's step.
        stride: Positions from one step to the next (the global batch).
        width: The rank's positions in a step (``micro · accum``).
    """

    def __init__(self, positions: range, first: int, stride: int, width: int) -> None:
        super().__init__(positions)
        self.first, self.stride, self.width = first, stride, width


class TapeBatchSampler(_RankPositions, Sampler[list[int]]):
    """A rank's micro-batches: the positions of one micro-batch at a time, as a list.

    ``DataLoader(TapeDataset(plan), batch_sampler=TapeBatchSampler(...), collate_fn=collate)``
    yields the native loader's micro-batches, ``config.accum`` per step, each read by one
    ``TapeDataset.__getitems__`` call (in one worker, with workers).

    A torchdata ``Stateful``: ``state_dict()`` is JSON-friendly (the rank, shape,
    ``consumed``, ``steps`` and the samples handed out so far); ``load_state_dict()`` makes the
    next pass continue where that state's pass stopped, and refuses a state of another rank,
    shape or ``consumed``. ``torchdata.stateful_dataloader.StatefulDataLoader`` saves and
    restores it with the loader, so that a resumed run reads exactly the micro-batches the
    uninterrupted run would have.

    Args:
        dp_rank: This process's data-parallel rank, in ``[0, config.dp_size)``.
        config: The shape of every step.
        consumed: Samples applied before the first step (a resumed ``DataState``'s
            ``consumed``; 0 at the start).
        steps: Steps to yield the micro-batches of (``len()`` is ``steps · accum``).

    Raises:
        ArgumentError: ``config`` is not a ``BatchConfig``, ``dp_rank`` is not a rank of it,
            or ``consumed`` or ``steps`` is not a non-negative integer.
        OutOfRangeError: The steps would end beyond position 2**62.
    """

    def __iter__(self) -> Iterator[MicroBatch]:
        return self._micro_batches(self._start_pass())

    def _micro_batches(self, start: int) -> Iterator[MicroBatch]:
        micro, per, stride = self.config.micro, self.config.per_rank, self.config.global_batch
        for step in range(start // per, self.steps):
            first = self._first(step)
            skip = start - step * per if step == start // per else 0
            for lo in range(first + skip, first + per, micro):
                self.yielded += micro
                yield MicroBatch(range(lo, lo + micro), first, stride, per)

    def __len__(self) -> int:
        return self.steps * self.config.accum

    @property
    def _unit(self) -> int:
        return self.config.micro


class TapeSamples(Sequence[dict[str, torch.Tensor]]):
    """What ``TapeDataset.__getitems__`` returns: samples held as one dict of stacked tensors.

    ``collate`` returns ``tensors`` as they are; torch's ``default_collate`` sees a sequence of
    per-sample dicts (views of those tensors) and stacks them again, to the same values.

    Attributes:
        tensors: The dict of ``to_torch`` for the samples (unpinned).
    """

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors["positions"])

    @overload
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, torch.Tensor]]: ...
    def __getitem__(
        self, i: int | slice
    ) -> dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        i = as_index("i", i)
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} of {len(self)}")
        return {k: v[i] for k, v in self.tensors.items()}


def collate(samples: Sequence[Any]) -> Any:
    """A ``DataLoader`` ``collate_fn`` for ``TapeDataset``: its batches without a copy.

    Args:
        samples: What the dataset gave for one batch: a ``TapeSamples`` (from
            ``__getitems__``), or anything ``default_collate`` takes.

    Returns:
        For a ``TapeSamples``, its dict of stacked tensors as it is (what ``to_torch`` gives for
        the batch, unpinned); otherwise ``default_collate(samples)``.
    """
    if isinstance(samples, TapeSamples):
        return samples.tensors
    if isinstance(samples, str | bytes) or not isinstance(samples, Sequence):
        raise ArgumentError(
            f"samples must be a batch of samples (a TapeSamples or a list), got {shown(samples)}"
        )
    return default_collate(list(samples))


class TapeDataset(Dataset[dict[str, torch.Tensor]]):
    """Map-style: position → that sample's tensors. Opens the stores lazily in each process.

    ``dataset[position]`` is the dict of ``to_torch`` for that one sample (unpinned, without
    the batch dimension). ``dataset.__getitems__(positions)`` (what a ``DataLoader`` with a
    batch sampler calls) reads a whole batch in one ``Batcher.batch`` call; with ``collate``
    as the ``collate_fn`` the loader's batch is ``to_torch`` of that batch, unpinned (in a
    worker process its tensors are made in shared memory, so that handing them to the main
    process copies nothing more). The stores are opened at the first item in each process (so
    the dataset pickles to DataLoader workers without them), which raises ``StoreError`` or
    ``StoreChanged`` for a store missing, damaged or changed since the plan was made.

    Args:
        plan: The plan whose samples to read.
        segments: Also give each sample's ``segment_ids`` and ``doc_positions``.
    """

    def __init__(self, plan: Plan | str | os.PathLike[str], segments: bool = False) -> None:
        if isinstance(plan, str | os.PathLike):
            plan = load_plan(plan)
        elif not isinstance(plan, Plan):
            raise ArgumentError(f"plan must be a Plan or the path of a PLAN.json, got {plan!r}")
        self.plan = plan
        self.segments = check_flag("segments", segments)
        self._batcher: Batcher | None = None
        self._ahead: ResolveAhead | None = None

    def _batch(self, positions: Sequence[int]) -> Batch:
        given = np.asarray(positions)
        if given.size and given.dtype.kind not in "iu":
            raise ArgumentError(f"positions must be integers, got {shown(positions)}")
        p = given.astype(np.int64, copy=False)
        if self._batcher is None:
            self._batcher = Batcher(self.plan, np.int64, self.segments)
            self._ahead = ResolveAhead(self._batcher.tape, AHEAD)
        resolved = None
        if isinstance(positions, MicroBatch) and p.size:  # resolved with the coming steps
            assert self._ahead is not None
            rows = p - positions.first
            if int(rows.min()) >= 0 and int(rows.max()) < positions.width:  # in its step
                shape = StepShape(positions.stride, 0, positions.width)
                step = self._ahead.resolved(positions.first, shape)
                resolved = Resolved(step.source[rows], step.epoch[rows], step.sample[rows])
        return self._batcher.batch(p, resolved)

    def __getitem__(self, position: int) -> dict[str, torch.Tensor]:
        """The sample at ``position`` (``to_torch`` of it, without the batch dimension).

        Args:
            position: A tape position (an integer).

        Returns:
            The sample's tensors.

        Raises:
            ArgumentError: ``position`` is not an integer.
            OutOfRangeError: ``position`` is not in ``[0, 2**62)``.
        """
        one = _tensors(self._batch([as_index("position", position)]), shared=False)
        return {k: v[0] for k, v in one.items()}

    def __getitems__(self, positions: Sequence[int]) -> TapeSamples:
        """The samples at ``positions``, read in one call (``to_torch`` of their batch).

        Args:
            positions: Tape positions (a batch sampler's list).

        Returns:
            The samples as one dict of stacked tensors (``collate`` hands it on as it is).

        Raises:
            ArgumentError: ``positions`` is not a sequence of integers.
        """
        if isinstance(positions, str | bytes) or not isinstance(positions, Sequence | np.ndarray):
            raise ArgumentError(f"positions must be a list of positions, got {shown(positions)}")
        return TapeSamples(_tensors(self._batch(positions), shared=get_worker_info() is not None))

    def __getstate__(self) -> dict[str, object]:
        return {"plan": self.plan, "segments": self.segments, "_batcher": None, "_ahead": None}


__all__ = [
    "AHEAD",
    "MicroBatch",
    "TapeBatchSampler",
    "TapeDataset",
    "TapeSampler",
    "TapeSamples",
    "collate",
    "to_torch",
]

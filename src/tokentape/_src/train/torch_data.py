"""torch integration (the ``torch`` extra): tensors, and a Sampler + map-style Dataset pair.

The native ``Loader`` is the fast path. The pair below lets a stock
``torch.utils.data.DataLoader`` (worker processes, ``pin_memory``) drive the same positions:
``TapeSampler`` yields a data-parallel rank's positions step by step from ``consumed``, and
``TapeDataset[position]`` is that position's sample. With ``batch_size=micro`` the DataLoader's
batches are the native loader's micro-batches.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.train.batch import Batch, Batcher
from tokentape._src.train.partition import BatchConfig, positions_for
from tokentape.errors import ArgumentError, OutOfRangeError


def to_torch(batch: Batch, pin: bool | None = None) -> dict[str, torch.Tensor]:
    """A batch's arrays as torch tensors, pinned for fast host-to-device copies if asked.

    ``inputs``, ``targets`` and ``positions``, and the segment ids and in-document positions of
    the inputs when the batch has them.

    Args:
        batch: A batch (a micro-batch of ``Loader.step()``).
        pin: Pin the tensors' memory; None (the default): pin when CUDA is available.

    Returns:
        A dict of ``inputs`` and ``targets`` (``(n, seq_len)``), ``positions`` (``(n,)``) and,
        when present, ``segment_ids`` and ``doc_positions`` (``(n, seq_len)``).
    """
    if not isinstance(batch, Batch):
        raise ArgumentError(
            f"to_torch takes a micro-batch (a Batch: step.micro_batches[i]), got "
            f"{type(batch).__name__}"
        )
    pin = torch.cuda.is_available() if pin is None else pin
    arrays = {
        "inputs": batch.inputs,
        "targets": batch.targets,
        "positions": batch.positions,
    }
    if batch.segment_ids is not None and batch.doc_positions is not None:
        arrays["segment_ids"] = batch.segment_ids[:, :-1]
        arrays["doc_positions"] = batch.doc_positions[:, :-1]
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
    return {k: t.pin_memory() for k, t in tensors.items()} if pin else tensors


class TapeSampler(Sampler[int]):
    """Positions of data-parallel rank ``dp_rank``, step after step from ``consumed``.

    With ``batch_size=config.micro``, a ``DataLoader`` over a ``TapeDataset`` yields the
    native loader's micro-batches: ``config.accum`` of them per step.

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
        self.dp_rank, self.config, self.consumed, self.steps = dp_rank, config, consumed, steps

    def __iter__(self) -> Iterator[int]:
        for i in range(self.steps):
            start = self.consumed + i * self.config.global_batch
            yield from positions_for(start, self.dp_rank, self.config).ravel().tolist()

    def __len__(self) -> int:
        return self.steps * self.config.per_rank


class TapeDataset(Dataset[dict[str, torch.Tensor]]):
    """Map-style: position → that sample's tensors. Opens the stores lazily in each process.

    ``dataset[position]`` is the dict of ``to_torch`` for that one sample (unpinned, without
    the batch dimension). The stores are opened at the first item in each process (so the
    dataset pickles to DataLoader workers without them), which raises ``StoreError`` or
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
        self.segments = segments
        self._batcher: Batcher | None = None

    def __getitem__(self, position: int) -> dict[str, torch.Tensor]:
        if self._batcher is None:
            self._batcher = Batcher(self.plan, np.int64, self.segments)
        one = to_torch(self._batcher.batch(np.array([position])), pin=False)
        return {k: v[0] for k, v in one.items()}

    def __getstate__(self) -> dict[str, object]:
        return {"plan": self.plan, "segments": self.segments, "_batcher": None}

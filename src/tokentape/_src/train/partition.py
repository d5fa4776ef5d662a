"""Data-parallel partition of an optimizer step's positions.

A step applies the global batch B = dp_size · micro · accum. Data-parallel rank r reads the
contiguous positions [consumed + r·micro·accum, consumed + (r+1)·micro·accum), as ``accum``
micro-batches of ``micro``. Only the data-parallel rank matters: tensor- and pipeline-parallel
peers of a rank call this with the same arguments and get the same positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokentape._src.tape.blend import MAX_POSITION
from tokentape.errors import ArgumentError, OutOfRangeError


@dataclass(frozen=True)
class BatchConfig:
    """The shape of one optimizer step.

    A step applies the global batch ``dp_size · micro · accum`` samples: each data-parallel
    rank reads ``accum`` micro-batches of ``micro`` samples.

    Attributes:
        dp_size: Data-parallel ranks.
        micro: Samples per micro-batch on one rank.
        accum: Micro-batches per optimizer step (gradient accumulation); 1 by default.

    Raises:
        ArgumentError: A field is not a positive integer, or the global batch exceeds 2**62
            samples.
    """

    dp_size: int
    micro: int
    accum: int = 1

    def __post_init__(self) -> None:
        for name in ("dp_size", "micro", "accum"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(
                    f"BatchConfig: {name} must be a positive integer, got {value!r}"
                )
        if self.global_batch > MAX_POSITION:
            raise ArgumentError(
                f"BatchConfig: a global batch of dp_size·micro·accum = {self.global_batch} "
                "samples exceeds 2**62"
            )

    @property
    def global_batch(self) -> int:
        """Samples applied by one optimizer step: dp_size · micro · accum."""
        return self.dp_size * self.micro * self.accum

    @property
    def per_rank(self) -> int:
        return self.micro * self.accum


def positions_for(consumed: int, dp_rank: int, config: BatchConfig) -> np.ndarray:
    """The positions data-parallel rank ``dp_rank`` reads in the step after ``consumed``
    samples: an int64 array of shape (accum, micro), one row per micro-batch."""
    if not isinstance(config, BatchConfig):
        raise ArgumentError(f"config must be a BatchConfig, got {type(config).__name__}")
    if isinstance(consumed, bool) or not isinstance(consumed, int | np.integer) or consumed < 0:
        raise ArgumentError(f"consumed must be a non-negative integer, got {consumed!r}")
    if isinstance(dp_rank, bool) or not isinstance(dp_rank, int | np.integer):
        raise ArgumentError(f"dp_rank must be an integer, got {dp_rank!r}")
    if not 0 <= dp_rank < config.dp_size:
        # ArgumentError (a ValueError), as before: callers catch ValueError for a bad rank
        raise ArgumentError(f"dp_rank must be in [0, {config.dp_size}), got {dp_rank}")
    if int(consumed) + config.global_batch > MAX_POSITION:
        raise OutOfRangeError(
            f"consumed {int(consumed)}: the step of {config.global_batch} samples after it ends "
            "beyond position 2**62"
        )
    start = int(consumed) + int(dp_rank) * config.per_rank
    flat = np.arange(start, start + config.per_rank, dtype=np.int64)
    return flat.reshape(config.accum, config.micro)


__all__ = ["BatchConfig", "positions_for"]

"""PyTorch integration: tensors, samplers, a dataset, and a rank check.

``to_torch``, ``TapeSampler``, ``TapeBatchSampler``, ``TapeDataset`` (with ``collate`` for a
``DataLoader``'s batches); ``check_step`` has every rank check, in one collective, that it read
its own slice of the step.

Importing this module imports ``torch`` (the ``tokentape[torch]`` extra); ``import tokentape``
alone never does.
"""

from tokentape._src.torch.data import (
    TapeBatchSampler,
    TapeDataset,
    TapeSampler,
    TapeSamples,
    collate,
    to_torch,
)
from tokentape._src.torch.smoke import check_step

__all__ = [
    "TapeBatchSampler",
    "TapeDataset",
    "TapeSampler",
    "TapeSamples",
    "check_step",
    "collate",
    "to_torch",
]

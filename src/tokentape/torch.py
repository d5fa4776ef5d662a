"""PyTorch integration: tensors, a sampler, a dataset, and a rank check.

``to_torch``, ``TapeSampler``, ``TapeDataset``; ``check_step`` has every rank check, in one
collective, that it read its own slice of the step.

Importing this module imports ``torch`` (the ``tokentape[torch]`` extra); ``import tokentape``
alone never does.
"""

from tokentape._src.train.smoke import check_step
from tokentape._src.train.torch_data import TapeDataset, TapeSampler, to_torch

__all__ = ["TapeDataset", "TapeSampler", "check_step", "to_torch"]

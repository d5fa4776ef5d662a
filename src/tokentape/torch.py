"""PyTorch integration: ``to_torch``, ``TapeSampler``, ``TapeDataset``.

Importing this module imports ``torch`` (the ``tokentape[torch]`` extra); ``import tokentape``
alone never does.
"""

from tokentape._src.train.torch_data import TapeDataset, TapeSampler, to_torch

__all__ = ["TapeDataset", "TapeSampler", "to_torch"]

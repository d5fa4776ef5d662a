"""megatron-core's blend, rebuilt where a run never saved it (no ``--data-cache-path``).

The rule (``helpers.cpp: build_blending_indices``), for sample ``t = 0, 1, ...`` of a blend of
``size`` samples over datasets with weights ``w``: the error of dataset ``i`` is
``w[i] * max(t, 1) - drawn[i]`` (IEEE doubles); the sample goes to the dataset of the largest
error, the lowest index on a tie, and is that dataset's ``drawn[i]``-th sample.

The sizes, as ``BlendedMegatronDatasetBuilder`` sets them for a blend with weights and a
requested number of samples ``T``: the weights are normalised (``w / sum(w)`` in float64) and
``BlendedDataset`` normalises them once more before the rule runs. From megatron-core 0.11 the
blend has ``sum(ceil(T * w[i]))`` samples and each dataset was built with ``ceil(ceil(T * w[i])
* (1 + surplus))`` (``mid_level_dataset_surplus``, 0.005 by default); up to 0.10 each dataset
had ``ceil(T * w[i] * 1.005)`` and the blend their sum. The rule being the same, the two agree
on every sample they both have.
"""

from __future__ import annotations

import math

import numpy as np

try:
    from tokentape._src.megatron import _cgreedy
except ImportError:  # not built (no C compiler at install): the Python loop, same results
    _cgreedy = None  # type: ignore[assignment]

KERNEL_ABI = 1
"""The compiled module's interface version this code calls (``ABI`` in ``_cgreedy.c``)."""


def compiled() -> bool:
    """Whether the compiled rule is there (and of this code's interface)."""
    return getattr(_cgreedy, "ABI", None) == KERNEL_ABI


def normalize(weights: list[float]) -> list[float]:
    """megatron-core's ``normalize``: each weight over their float64 sum."""
    w = np.asarray(weights, dtype=np.float64)
    return (w / np.sum(w)).tolist()  # type: ignore[no-any-return]


def blend_sizes(
    weights: list[float], samples: int, surplus: float = 0.005, before_0_11: bool = False
) -> tuple[int, list[int]]:
    """For a blend of ``weights`` asked for ``samples``: the blend's size and the number of
    samples each dataset was built with, by megatron-core 0.11 and later, or (``before_0_11``)
    by 0.4-0.10: each dataset ``ceil(samples * w * 1.005)``, the blend their sum."""
    w = normalize(weights)
    if before_0_11:
        built = [math.ceil(samples * x * 1.005) for x in w]
        return sum(built), built
    targets = [math.ceil(samples * x) for x in w]
    built = [math.ceil(math.ceil(samples * x) * (1 + surplus)) for x in w]
    return sum(targets), built


def blending_indices(
    weights: list[float], size: int, use_compiled: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """``(dataset_index, dataset_sample_index)`` of a blend of ``size`` samples with the
    (already normalised) ``weights``, by megatron-core's greedy rule (compiled when built;
    ``use_compiled=False``: the Python loop, about 1 µs a sample for three datasets)."""
    which = np.empty(size, dtype=np.int16)
    nth = np.empty(size, dtype=np.int64)
    w = [float(x) for x in weights]
    if use_compiled and compiled():
        _cgreedy.blend(np.asarray(w, dtype=np.float64).tobytes(), size, which, nth)
        return which, nth
    drawn = [0] * len(w)
    order = range(1, len(w))
    for t in range(size):
        scale = max(float(t), 1.0)
        best, best_error = 0, w[0] * scale - float(drawn[0])
        for i in order:
            error = w[i] * scale - float(drawn[i])
            if error > best_error:
                best, best_error = i, error
        which[t] = best
        nth[t] = drawn[best]
        drawn[best] += 1
    return which, nth

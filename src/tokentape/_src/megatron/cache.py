"""A Megatron-LM run's data cache (``--data-cache-path``), found and checked.

megatron-core saves, for each dataset it builds, a description (the JSON of the dataset's
identifying settings) and the index arrays, all named by the md5 of the description text::

    <md5>-GPTDataset-<split>-description.txt       dataset_path, num_samples, seed, ...
    <md5>-GPTDataset-<split>-document_index.npy    the split's sequences, shuffled, per epoch
    <md5>-GPTDataset-<split>-sample_index.npy      (position, offset) where each sample starts
    <md5>-GPTDataset-<split>-shuffle_index.npy     the order the samples are read in
    <md5>-BlendedDataset-<split>-description.txt   the children's descriptions, weights, size
    <md5>-BlendedDataset-<split>-dataset_index.npy          per sample: which child
    <md5>-BlendedDataset-<split>-dataset_sample_index.npy   ... and which of its samples

A blend's description holds each child's description, so the child's file names follow from it
(the md5 of the child's description text, as megatron-core writes it). Without
``--data-cache-path`` a run saves each prefix's arrays under ``PREFIX/cache/GPTDataset_indices``
and never saves the blend's (``greedy`` rebuilds them).

Everything here is read with ``allow_pickle=False`` and refused in one line naming the file when
it is not what megatron-core writes: a name whose md5 is not its content's, a description that
is not the JSON of a dataset, an array of another dtype or shape.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.util.files import read_regular
from tokentape.errors import StoreError

SPLITS = ("train", "valid", "test")
NPY_MAGIC = b"\x93NUMPY"
NAME = re.compile(
    r"^([0-9a-f]{32})-(GPTDataset|BlendedDataset)(?:-(train|valid|test))?-description\.txt$"
)
"""megatron-core 0.7 and later name the split; 0.4-0.6 did not (it is in the description)."""
MAX_DESCRIPTION_BYTES = 16 << 20
"""A description is a few hundred bytes per child; anything near this is not one."""
DEFAULT_DIR = Path("cache") / "GPTDataset_indices"
"""Where a run without ``--data-cache-path`` saves a prefix's arrays, under ``PREFIX/``."""

GPT_ARRAYS: dict[str, tuple[tuple[str, ...], int]] = {
    "document_index": (("int32", "int64"), 1),
    "sample_index": (("int32", "int64"), 2),
    "shuffle_index": (("uint32", "int32", "int64"), 1),
}
"""Each GPTDataset array: the dtypes megatron-core writes it in, and its number of axes."""
BLEND_ARRAYS: dict[str, tuple[tuple[str, ...], int]] = {
    "dataset_index": (("int16", "uint8", "int32", "int64"), 1),
    "dataset_sample_index": (("int64", "int32", "uint32"), 1),
}


@dataclass(frozen=True)
class Description:
    """One ``*-description.txt``: its file, md5, class, split and parsed settings."""

    path: Path
    md5: str
    kind: str  # "GPTDataset" | "BlendedDataset"
    split: str
    settings: dict[str, Any]
    named_split: bool = True  # the file names hold the split (megatron-core 0.7 and later)

    def array_path(self, name: str) -> Path:
        split = f"-{self.split}" if self.named_split else ""
        return self.path.with_name(f"{self.md5}-{self.kind}{split}-{name}.npy")


def description_text(settings: dict[str, Any]) -> str:
    """The text megatron-core writes for a dataset's settings (its md5 names the files)."""
    return json.dumps(settings, indent=4)


def read_description(path: Path) -> Description:
    """The description at ``path``, checked: its name's md5 is its bytes' md5, and it is the
    JSON of a dataset of the class and split the name says."""
    match = NAME.match(path.name)
    if match is None:
        raise StoreError(f"{path}: not a megatron-core description file name")
    md5, kind, named = match.groups()
    data = read_cache_file(path, MAX_DESCRIPTION_BYTES + 1)
    if len(data) > MAX_DESCRIPTION_BYTES:
        raise StoreError(f"{path}: over {MAX_DESCRIPTION_BYTES} bytes; not a description")
    digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
    if digest != md5:
        raise StoreError(
            f"{path}: its content's md5 is {digest}, not the {md5} of its name: edited or renamed"
        )
    try:
        settings = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, nesting, huge numbers
        raise StoreError(f"{path}: not JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(settings, dict) or settings.get("class") != kind:
        raise StoreError(f"{path}: not the description of a {kind} (its 'class' differs)")
    split = named or _split_of(path, kind, settings)
    _check_settings(path, kind, split, settings)
    return Description(path, md5, kind, split, settings, named is not None)


def read_cache_file(path: Path, limit: int) -> bytes:
    """Up to ``limit`` bytes of the cache's regular file at ``path`` (a FIFO or device is
    refused without blocking on it; a link is followed, as the user may have made it)."""
    try:
        return read_regular(path, limit)
    except FileNotFoundError:
        raise StoreError(f"{path}: no such file") from None
    except OSError as exc:
        raise StoreError(f"{path}: {exc.strerror or 'cannot read'}") from None


def _split_of(path: Path, kind: str, settings: dict[str, Any]) -> str:
    """The split of a description whose file name does not say it (megatron-core 0.4-0.6)."""
    child = settings
    if kind == "BlendedDataset":
        children = settings.get("datasets")
        child = children[0] if isinstance(children, list) and children else {}
    split = child.get("index_split") if isinstance(child, dict) else None
    if split not in SPLITS:
        raise StoreError(f"{path}: field 'index_split': expected one of {', '.join(SPLITS)}")
    return str(split)


def _check_settings(path: Path, kind: str, split: str, settings: dict[str, Any]) -> None:
    if kind == "BlendedDataset":
        children = settings.get("datasets")
        if not isinstance(children, list) or not children:
            raise StoreError(f"{path}: field 'datasets': expected a list of descriptions")
        for child in children:
            if not isinstance(child, dict) or child.get("class") != "GPTDataset":
                raise StoreError(f"{path}: field 'datasets': a child is not a GPTDataset")
            _check_settings(path, "GPTDataset", split, child)
        weights = settings.get("weights")
        if not isinstance(weights, list) or len(weights) != len(children):
            raise StoreError(f"{path}: field 'weights': expected one number per dataset")
        if not all(_number(w) and 0 < w < math.inf for w in weights):
            raise StoreError(f"{path}: field 'weights': expected positive finite numbers")
        size = settings.get("size")
        if size is not None and not (_integer(size) and size >= 0):
            raise StoreError(f"{path}: field 'size': expected a count or null")
        return
    if "dataset_path" not in settings and "path_prefix" in settings:  # megatron-core 0.4
        settings["dataset_path"] = settings["path_prefix"]
    expected = {
        "dataset_path": str,
        "index_split": str,
        "random_seed": int,
        "sequence_length": int,
    }
    for field, kind_of in expected.items():
        value = settings.get(field)
        if not isinstance(value, kind_of) or isinstance(value, bool):
            raise StoreError(f"{path}: field {field!r}: expected {kind_of.__name__}")
    if settings["index_split"] != split:
        raise StoreError(
            f"{path}: field 'index_split' is {settings['index_split']!r}, its name says {split!r}"
        )
    if settings["sequence_length"] < 1:
        raise StoreError(f"{path}: field 'sequence_length': expected a positive length")
    samples = settings.get("num_samples")
    if samples is not None and not (_integer(samples) and samples >= 0):
        raise StoreError(f"{path}: field 'num_samples': expected a count or null")
    split_range(path, settings, 1)  # checks split_matrix


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def split_range(path: Path, settings: dict[str, Any], n_sequences: int) -> tuple[int, int]:
    """The sequences ``[begin, end)`` of ``n_sequences`` a GPTDataset's split covers, by
    megatron-core's rule (``round(bound * n)``); all of them without a split matrix (a blend
    per split)."""
    matrix = settings.get("split_matrix")
    if matrix is None:
        return 0, n_sequences
    index = SPLITS.index(settings["index_split"]) if settings["index_split"] in SPLITS else -1
    bounds = matrix[index] if isinstance(matrix, list) and len(matrix) == 3 else "bad"
    if not (
        isinstance(bounds, list)
        and len(bounds) == 2
        and all(_number(b) and 0 <= b <= 1 for b in bounds)
        and bounds[0] <= bounds[1]
    ):
        raise StoreError(
            f"{path}: field 'split_matrix': expected three [begin, end] fractions "
            f"(the {settings['index_split']} split's is {bounds!r})"
        )
    return round(bounds[0] * float(n_sequences)), round(bounds[1] * float(n_sequences))


def descriptions(directory: Path) -> list[Description]:
    """Every description in ``directory`` (a missing directory: none), checked."""
    try:
        names = sorted(p.name for p in directory.iterdir())
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise StoreError(f"{directory}: not a directory (a megatron-core data cache)") from None
    except OSError as exc:
        raise StoreError(f"{directory}: cannot list ({exc.strerror})") from None
    return [read_description(directory / name) for name in names if NAME.match(name)]


def load_array(path: Path, kinds: tuple[str, ...], ndim: int, length: int | None = None) -> Any:
    """The ``.npy`` at ``path`` memory-mapped read-only (never unpickled), checked to have one
    of the dtypes ``kinds`` and ``ndim`` axes (the second of 2, length 2), and ``length``
    entries along the first when given."""
    try:
        head = read_cache_file(path, len(NPY_MAGIC))
    except StoreError as exc:
        if "no such file" in str(exc):
            raise StoreError(f"{path}: missing (the cache holds the description, not it)") from None
        raise
    if head != NPY_MAGIC:
        raise StoreError(f"{path}: not a .npy file (it does not start with numpy's magic)")
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # numpy's overflow warning on a lying header
            array = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        pickled = "allow_pickle" in str(exc) or "Python objects" in str(exc)
        what = "a pickled object array (never loaded)" if pickled else f"unreadable ({exc})"
        raise StoreError(f"{path}: not an array megatron-core writes: {what}") from None
    except (OSError, EOFError, OverflowError, MemoryError) as exc:
        raise StoreError(f"{path}: cannot read as .npy ({type(exc).__name__}: {exc})") from None
    if not isinstance(array, np.ndarray):
        raise StoreError(f"{path}: not a single array")
    if array.dtype.name not in kinds or array.dtype.byteorder not in "=|<":
        raise StoreError(f"{path}: dtype {array.dtype.str}, expected one of {', '.join(kinds)}")
    if array.ndim != ndim or (ndim == 2 and array.shape[1] != 2):
        raise StoreError(
            f"{path}: shape {array.shape}, expected {'(n, 2)' if ndim == 2 else '(n,)'}"
        )
    if length is not None and array.shape[0] != length:
        raise StoreError(f"{path}: {array.shape[0]} entries, expected {length}")
    return array

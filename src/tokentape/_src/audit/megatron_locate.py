"""Every sample of a Megatron-LM run's horizon a document lands in, through an inverted map.

For each dataset of the run the map holds, built once from its cache arrays (and checked while
built: the shuffle is a permutation, every sequence of the split appears once per epoch, the
sample starts never go back, the blend draws each dataset's samples in order):

- ``doc_order``: the positions of the document index, grouped by the sequence they hold (8
  bytes per position; every sequence appears once per epoch, so sequence ``begin + k`` holds
  entries ``k * epochs`` to ``(k + 1) * epochs``);
- ``starts``: the position each sample starts at (8 bytes per sample);
- ``inverse_shuffle``: where each unshuffled sample is read (8 bytes per sample);
- ``global``: the run's global sample of each of its samples the blend draws (8 bytes each).

A document at position ``p`` is read by the unshuffled samples whose span of positions holds
``p`` (a contiguous range), minus those that read none of its tokens; then each goes through
the inverse shuffle and the blend to its global sample. Saved under ``--map-dir`` (one folder
per dataset, named by a hash of its cache description, its prefix's files and the extra-token
flag; each array's sha256 in a manifest written last), the map is read back on the next call
and checked against the cache in linear time (a map that does not match is built again):
nothing is written anywhere else, and no link is followed there.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokentape._src.megatron.cache import BLEND_ARRAYS, GPT_ARRAYS
from tokentape._src.megatron.run import GptSamples, MegatronRun
from tokentape._src.store.atomic import write_atomic
from tokentape._src.util.files import read_regular
from tokentape._src.util.text import fmt_int
from tokentape.errors import OutputError, StoreError

MAP_FORMAT = "tokentape.megatron-map/2"
ARRAYS = ("doc_order", "starts", "inverse_shuffle", "global")


@dataclass(frozen=True)
class DatasetMap:
    doc_order: np.ndarray
    starts: np.ndarray
    inverse_shuffle: np.ndarray
    global_: np.ndarray  # empty for a single-dataset run (the global sample is the sample)


@dataclass(frozen=True)
class Landing:
    """One sample a document lands in."""

    g: int | None  # the run's global sample; None: a surplus sample the blend never draws
    sample: int  # the dataset's sample
    occurrence: int  # which appearance of the document in the document index (its pass)
    tokens: int  # its tokens read into the sample


def _file_key(path: Path) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def map_key(run: MegatronRun, d: int) -> str:
    """The folder name of dataset ``d``'s map: a hash of what it is built from (the
    descriptions, the arrays' and the ``.idx``'s sizes and times, the extra-token flag)."""
    ds = run.datasets[d]
    files = [ds.description.array_path(name) for name in GPT_ARRAYS]
    if run.description is not None and run.dataset_index is not None:
        files += [run.description.array_path(name) for name in BLEND_ARRAYS]
    parts = [
        MAP_FORMAT,
        ds.description.md5,
        run.description.md5 if run.description else "rebuilt",
        str(len(run)),
        str(ds.extra),
        _file_key(Path(f"{ds.prefix.prefix}.idx")),
        *(_file_key(f) for f in files),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def build_map(run: MegatronRun, d: int) -> DatasetMap:
    """Dataset ``d``'s map, from its arrays, checking them whole."""
    ds = run.datasets[d]
    doc_index = np.asarray(ds.document_index, dtype=np.int64)
    docs = ds.end - ds.begin
    counts = np.bincount(doc_index - ds.begin, minlength=docs)
    if counts.size != docs or np.any(counts != ds.epochs):
        bad = int(np.flatnonzero(counts != ds.epochs)[0]) + ds.begin
        raise StoreError(
            f"{ds.description.array_path('document_index')}: sequence {bad} appears "
            f"{int(counts[bad - ds.begin])} times, not once per epoch ({ds.epochs})"
        )
    order = np.argsort(doc_index, kind="stable").astype(np.int64)
    starts = np.ascontiguousarray(ds.sample_index[:, 0], dtype=np.int64)
    if np.any(np.diff(starts) < 0) or starts[0] < 0 or starts[-1] >= len(doc_index):
        raise StoreError(
            f"{ds.description.array_path('sample_index')}: the samples' start positions go "
            f"back, or leave 0..{len(doc_index) - 1}"
        )
    shuffle = np.asarray(ds.shuffle_index, dtype=np.int64)
    inverse = np.full(ds.n_samples, -1, dtype=np.int64)
    if shuffle.size and (shuffle.min() < 0 or shuffle.max() >= ds.n_samples):
        raise StoreError(f"{ds.description.array_path('shuffle_index')}: an entry out of range")
    inverse[shuffle] = np.arange(ds.n_samples, dtype=np.int64)
    if np.any(inverse < 0):
        raise StoreError(
            f"{ds.description.array_path('shuffle_index')}: not a permutation (sample "
            f"{int(np.flatnonzero(inverse < 0)[0])} is never read)"
        )
    if run.dataset_index is None:
        global_ = np.zeros(0, dtype=np.int64)
    else:
        global_ = np.flatnonzero(np.asarray(run.dataset_index) == d).astype(np.int64)
        nth = np.asarray(run.dataset_sample_index)[global_]
        if np.any(nth != np.arange(global_.size)):
            where = run.description.path if run.description else "the rebuilt blend"
            raise StoreError(
                f"{where}: dataset {d}'s samples are not drawn in order (not megatron-core's blend)"
            )
        if global_.size > ds.n_samples:
            raise StoreError(
                f"{where if run.description else 'the blend'}: draws {fmt_int(global_.size)} "
                f"samples of dataset {d}, which has {fmt_int(ds.n_samples)}"
            )
    return DatasetMap(order, starts, inverse, global_)


def matches(run: MegatronRun, d: int, m: DatasetMap) -> bool:
    """Whether ``m`` is dataset ``d``'s map, checked against the cache in linear time (a map
    read back is never trusted on its name or its manifest alone)."""
    ds = run.datasets[d]
    n_pos, n = len(ds.document_index), ds.n_samples
    order = m.doc_order
    if order.size != n_pos or (n_pos and (order.min() < 0 or order.max() >= n_pos)):
        return False
    if np.any(np.bincount(order, minlength=n_pos) != 1):
        return False
    expected = np.repeat(np.arange(ds.begin, ds.end, dtype=np.int64), ds.epochs)
    if not np.array_equal(np.asarray(ds.document_index)[order], expected):
        return False
    if not np.array_equal(m.starts, np.asarray(ds.sample_index[:, 0], dtype=np.int64)):
        return False
    inverse = m.inverse_shuffle
    if inverse.size != n or (n and (inverse.min() < 0 or inverse.max() >= n)):
        return False
    if not np.array_equal(np.asarray(ds.shuffle_index)[inverse], np.arange(n)):
        return False
    if run.dataset_index is None:
        return m.global_.size == 0
    g = m.global_
    which = np.asarray(run.dataset_index)
    if g.size != np.count_nonzero(which == d) or g.size > n:
        return False
    if g.size and (g.min() < 0 or g.max() >= len(run)):
        return False
    nth = np.asarray(run.dataset_sample_index)
    return bool(np.all(which[g] == d) and np.array_equal(nth[g], np.arange(g.size)))


def _load_saved(folder: Path) -> DatasetMap | None:
    """The map saved in ``folder``, or None when absent, incomplete, or not as saved."""
    try:
        manifest = json.loads(read_regular(folder / "manifest.json", follow_links=False))
        if not isinstance(manifest, dict) or manifest.get("format") != MAP_FORMAT:
            return None
        arrays = []
        for name in ARRAYS:
            data = read_regular(folder / f"{name}.npy", follow_links=False)
            if hashlib.sha256(data).hexdigest() != manifest["sha256"][name]:
                return None
            array = np.load(io.BytesIO(data), allow_pickle=False)
            if array.dtype != np.int64 or array.ndim != 1:
                return None
            arrays.append(array)
        return DatasetMap(*arrays)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save(folder: Path, m: DatasetMap) -> None:
    try:
        os.mkdir(folder)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            raise OutputError(f"{folder}: exists and is not a folder; remove it") from None
    hashes = {}
    for name, array in zip(
        ARRAYS, (m.doc_order, m.starts, m.inverse_shuffle, m.global_), strict=True
    ):
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        data = buffer.getvalue()
        hashes[name] = hashlib.sha256(data).hexdigest()
        write_atomic(folder / f"{name}.npy", data)
    manifest = {"format": MAP_FORMAT, "sha256": hashes}
    write_atomic(folder / "manifest.json", json.dumps(manifest, indent=1).encode())


def dataset_map(run: MegatronRun, d: int, map_dir: Path | None) -> tuple[DatasetMap, bool]:
    """Dataset ``d``'s map (and whether it was built now): read from ``map_dir`` when saved
    there, else built (and saved when ``map_dir`` is given)."""
    if map_dir is not None:
        if not map_dir.is_dir():
            raise OutputError(f"{map_dir}: no such folder (--map-dir: where the map is kept)")
        folder = map_dir / map_key(run, d)
        saved = _load_saved(folder)
        if saved is not None and matches(run, d, saved):
            return saved, False
    built = build_map(run, d)
    if map_dir is not None:
        _save(map_dir / map_key(run, d), built)
    return built, True


def landings(run: MegatronRun, d: int, doc: int, m: DatasetMap) -> list[Landing]:
    """Every sample of dataset ``d`` that reads tokens of its sequence ``doc``."""
    ds: GptSamples = run.datasets[d]
    if not ds.begin <= doc < ds.end:
        return []
    lengths = ds.prefix.index.sequence_lengths
    length = int(lengths[doc])
    k = doc - ds.begin
    positions = np.sort(m.doc_order[k * ds.epochs : (k + 1) * ds.epochs])
    out = []
    for occurrence, p in enumerate(positions.tolist()):
        # unshuffled samples u with starts[u] <= p <= starts[u + 1]
        first = int(np.searchsorted(m.starts[1:], p, side="left"))
        last = int(np.searchsorted(m.starts[:-1], p, side="right")) - 1
        for u in range(first, last + 1):
            (b, b_off), (e, e_off) = ds.sample_index[u], ds.sample_index[u + 1]
            start = int(b_off) if int(b) == p else 0
            stop = int(e_off) + ds.extra if int(e) == p else length
            if stop <= start:
                continue
            j = int(m.inverse_shuffle[u])
            if run.dataset_index is None:
                g: int | None = j if j < len(run) else None
            else:
                g = int(m.global_[j]) if j < m.global_.size else None
            out.append(Landing(g, j, occurrence, stop - start))
    out.sort(key=lambda h: (h.g is None, h.g if h.g is not None else h.sample))
    return out

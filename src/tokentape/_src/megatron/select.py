"""Which of a data cache's datasets are the run's: matched to the prefixes the user gives.

A cache directory may hold several runs (other seeds, lengths, sample counts, splits). The run
is the BlendedDataset of the split whose children are the prefixes given, in order (a dataset
path matches a prefix by its full path, or by its file name when the data moved); a single
prefix without a blend is its GPTDataset. Several candidates are refused, listed, unless
``cache_id`` (an md5 prefix) picks one. Without a blend description (the run had no
``--data-cache-path``), the blend is rebuilt from the weights and the requested sample count.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokentape._src.megatron.cache import (
    BLEND_ARRAYS,
    DEFAULT_DIR,
    SPLITS,
    Description,
    description_text,
    descriptions,
    load_array,
)
from tokentape._src.megatron.greedy import blend_sizes, blending_indices, normalize
from tokentape._src.megatron.run import GptSamples, MegatronRun, PrefixData
from tokentape._src.util.text import fmt_int
from tokentape.errors import ArgumentError, StoreError


@dataclass(frozen=True)
class RunQuery:
    """What identifies the run: where its cache is, its prefixes (in blend order), its split."""

    cache_dirs: tuple[Path, ...]
    prefixes: tuple[Path, ...]
    split: str = "train"
    extra_token: bool = True
    cache_id: str | None = None
    weights: tuple[float, ...] | None = None  # only to rebuild a blend that was never saved
    samples: int | None = None  # ... and the samples the run asked for (train iters x batch)
    surplus: float = 0.005

    def search_dirs(self) -> list[Path]:
        """The cache directories, then each prefix's default one."""
        extra = [Path(str(p) + os.sep) / DEFAULT_DIR for p in self.prefixes]
        return list(self.cache_dirs) + [d for d in extra if d not in self.cache_dirs]


def _matches(described: object, prefix: Path) -> int:
    """2: the same path; 1: the same file name (the data moved); 0: another prefix."""
    if not isinstance(described, str):
        return 0
    if described == str(prefix) or os.path.abspath(described) == os.path.abspath(prefix):
        return 2
    return 1 if Path(described).name == prefix.name else 0


def _score(settings: list[dict[str, object]], prefixes: Sequence[Path]) -> int:
    if len(settings) != len(prefixes):
        return 0
    scores = [_matches(s.get("dataset_path"), p) for s, p in zip(settings, prefixes, strict=True)]
    return min(scores)


def _summary(d: Description) -> str:
    s = d.settings
    child = s["datasets"][0] if d.kind == "BlendedDataset" else s
    size = s.get("size") if d.kind == "BlendedDataset" else s.get("num_samples")
    return (
        f"{d.md5} (seed {child['random_seed']}, sequence length {child['sequence_length']}, "
        f"{'?' if size is None else fmt_int(size)} samples)"
    )


def _pick(found: list[Description], query: RunQuery, what: str) -> Description | None:
    if query.cache_id is not None:
        found = [d for d in found if d.md5.startswith(query.cache_id)]
    if not found:
        return None
    if len({d.md5 for d in found}) > 1:
        listed = "; ".join(_summary(d) for d in found)
        raise StoreError(
            f"{found[0].path.parent}: {len(found)} {what} of these prefixes' {query.split} split: "
            f"{listed}; choose one with --cache-id"
        )
    return found[0]


def _best(found: list[tuple[int, Description]]) -> list[Description]:
    top = max((score for score, _ in found), default=0)
    return [d for score, d in found if score == top and score > 0]


def open_run(query: RunQuery) -> MegatronRun:
    """The run ``query`` identifies, its arrays loaded and checked (see the module doc)."""
    if query.split not in SPLITS:
        raise ArgumentError(f"split {query.split!r}: expected one of {', '.join(SPLITS)}")
    if not query.prefixes:
        raise ArgumentError("no --prefix: give the run's data prefixes, in its blend's order")
    dirs = query.search_dirs()
    found = [d for directory in dirs for d in descriptions(directory) if d.split == query.split]
    if not any(directory.is_dir() for directory in query.cache_dirs):
        raise StoreError(f"{query.cache_dirs[0]}: no such directory (the run's data cache)")
    blends = _best(
        [
            (_score(d.settings["datasets"], query.prefixes), d)
            for d in found
            if d.kind == "BlendedDataset"
        ]
    )
    prefixes = [PrefixData(p) for p in query.prefixes]
    blend = _pick(blends, query, "blends")
    if blend is not None:
        children = [_child(found, c, blend) for c in blend.settings["datasets"]]
        datasets = [
            GptSamples(c, p, query.extra_token) for c, p in zip(children, prefixes, strict=True)
        ]
        size = blend.settings.get("size")
        which = load_array(blend.array_path("dataset_index"), *BLEND_ARRAYS["dataset_index"])
        length = len(which) if size is None else size
        if len(which) != length:
            raise StoreError(
                f"{blend.array_path('dataset_index')}: {fmt_int(len(which))} entries, its "
                f"description says {fmt_int(length)}"
            )
        nth = load_array(
            blend.array_path("dataset_sample_index"), *BLEND_ARRAYS["dataset_sample_index"], length
        )
        return MegatronRun(datasets, blend, which, nth, False, query.extra_token)
    if len(query.prefixes) == 1 and query.weights is None:
        singles = _best(
            [(_score([d.settings], query.prefixes), d) for d in found if d.kind == "GPTDataset"]
        )
        single = _pick(singles, query, "datasets")
        if single is None:
            raise StoreError(_nothing(query, dirs))
        _not_a_child(found, single, query)
        dataset = GptSamples(single, prefixes[0], query.extra_token)
        return MegatronRun([dataset], single, None, None, False, query.extra_token)
    return _rebuilt(query, found, prefixes, dirs)


def _not_a_child(found: list[Description], single: Description, query: RunQuery) -> None:
    """Refuse a dataset that is one of a blend's (unless ``--cache-id`` chose it): the run read
    it through the blend, in another order."""
    if query.cache_id is not None:
        return
    for blend in found:
        if blend.kind != "BlendedDataset":
            continue
        if any(single.settings == child for child in blend.settings["datasets"]):
            raise StoreError(
                f"{single.path}: one of blend {blend.md5}'s datasets, which its run read through "
                f"the blend: give all its prefixes, in order ({_flags(blend)}), or --cache-id "
                f"{single.md5[:8]} for this dataset alone"
            )


def _names(blend: Description) -> list[str]:
    """The file names of a blend's prefixes, in its order."""
    return [Path(str(c.get("dataset_path"))).name for c in blend.settings.get("datasets", [])]


def _flags(blend: Description) -> str:
    return " ".join(f"--prefix {name}" for name in _names(blend))


def _built_with(
    found: list[Description], query: RunQuery, prefix: PrefixData, samples: int
) -> list[Description]:
    """The GPTDatasets of ``prefix`` built with ``samples`` samples."""
    return [
        d
        for d in found
        if d.kind == "GPTDataset"
        and _matches(d.settings["dataset_path"], prefix.prefix)
        and d.settings.get("num_samples") == samples
        and (query.cache_id is None or d.md5.startswith(query.cache_id))
    ]


def _nothing(query: RunQuery, dirs: list[Path]) -> str:
    names = ", ".join(p.name for p in query.prefixes)
    where = ", ".join(str(d) for d in dirs)
    return f"{query.cache_dirs[0]}: no {query.split} dataset of the prefixes {names} in {where}" + (
        f" with an md5 starting {query.cache_id}" if query.cache_id else ""
    )


def _child(
    found: list[Description], settings: dict[str, object], blend: Description
) -> Description:
    """The GPTDataset description the blend's child ``settings`` names (by the md5 of its text,
    or, when the text differs, by equal settings)."""
    md5 = hashlib.md5(description_text(settings).encode("utf-8"), usedforsecurity=False).hexdigest()
    for d in found:
        if d.kind == "GPTDataset" and (d.md5 == md5 or d.settings == settings):
            return d
    raise StoreError(
        f"{blend.path}: its dataset {settings.get('dataset_path')} ({md5}) has no arrays in the "
        "cache: the blend's datasets were saved elsewhere, or deleted"
    )


def _rebuilt(
    query: RunQuery, found: list[Description], prefixes: list[PrefixData], dirs: list[Path]
) -> MegatronRun:
    """The blend of a run that never saved it: rebuilt from its weights and sample count."""
    if query.weights is None or query.samples is None:
        given = {p.name for p in query.prefixes}
        for d in found:
            if d.kind == "BlendedDataset" and given & set(_names(d)):
                raise StoreError(
                    f"{d.path}: the cache's {query.split} blend {d.md5} is of "
                    f"{', '.join(_names(d))}, not of the prefixes given: give all its "
                    f"prefixes, in order ({_flags(d)})"
                )
        raise StoreError(
            _nothing(query, dirs).replace(" dataset ", " blend ", 1)
            + ": a run without --data-cache-path never saves its blend; give --weights and "
            "--samples (what the run was launched with) to rebuild it"
        )
    if len(query.weights) != len(query.prefixes):
        raise ArgumentError(
            f"--weights: {len(query.weights)} weights for {len(query.prefixes)} prefixes"
        )
    if not all(w > 0 for w in query.weights):
        raise ArgumentError("--weights: expected positive weights")
    tried = []
    for before_0_11 in (False, True):
        _, built = blend_sizes(list(query.weights), query.samples, query.surplus, before_0_11)
        options = [
            _built_with(found, query, prefix, want)
            for prefix, want in zip(prefixes, built, strict=True)
        ]
        tried.append(built)
        if all(len(o) == 1 for o in options):
            break
    else:
        counts = " or ".join("/".join(fmt_int(n) for n in b) for b in tried)
        raise StoreError(
            f"{query.cache_dirs[0]}: no {query.split} datasets of {counts} samples for "
            f"{', '.join(p.prefix.name for p in prefixes)} (the weights' shares of --samples, "
            f"with megatron-core's surplus) in {', '.join(str(d) for d in dirs)}, one each"
        )
    datasets = [
        GptSamples(o[0], p, query.extra_token) for o, p in zip(options, prefixes, strict=True)
    ]
    # megatron-core builds a few more than the samples asked for (how many depends on its
    # version); no iteration reads past them, and the rule gives the same samples either way
    which, nth = blending_indices(normalize(normalize(list(query.weights))), query.samples)
    return MegatronRun(datasets, None, which, nth, True, query.extra_token)

"""Side by side with Megatron-LM: index build, random access and mixture accuracy, same data.

The data: ``--tokens`` tokens (default 10**8; ``--tokens 1e9`` for the larger run) in five
synthetic sources of different sizes and document lengths (random ids of a 50,257-id vocabulary,
uint16, every document ending with the EOD id 50256 as ``preprocess_data.py --append-eod``
writes it). Each source is written once, from the same numpy arrays, twice: as a Megatron prefix
(``.bin`` + ``.idx``) with megatron-core's own ``IndexedDatasetBuilder`` (one ``add_document``
per document, as ``preprocess_data.py`` does), and as a tokentape store with ``ShardWriter``.
The benchmark checks that the two hold the same token stream. tokentape reads the Megatron
prefixes in place (plan sources with ``format = "megatron"``) when it supports that, and its
own stores otherwise (``--source`` chooses; ``tokentape_source_lines`` is the one place that
decides); when it reads in place, its build from its own stores is measured as well. With
``--corpora`` the sources are instead the built-in corpora (``tokentape corpora``) tokenized by
``tokentape tokenize`` (bytes tokenizer) and exported to Megatron prefixes document by
document. Everything is cached under ``bench-out/megatron/`` and reused.

Both sides get the same seq_len (4096: a sample is 4097 tokens, windows at stride 4096), seed,
blend weights (60/15/10/10/5 %) and horizon. Measured in one run:

1. **Index build time and peak memory** for horizons of 10**6, 10**7 and 10**8 samples.
   Megatron-LM: ``BlendedMegatronDatasetBuilder(GPTDataset, [horizon, 0, 0], ...).build()``,
   as a training job calls it, on CPU without ``torch.distributed``: five ``GPTDataset``s
   (document, sample and shuffle indices: numpy shuffles and the compiled ``build_sample_idx``)
   and the ``BlendedDataset`` (compiled ``build_blending_indices``). Its GPT index cache
   (``<prefix>/cache/GPTDataset_indices``, where it writes when ``path_to_cache`` is None) is
   deleted before every build, so every build is a cold build; the time it spends writing that
   cache is reported separately. tokentape: ``resolve_plan(load_plan_spec(toml)).tape()``, what
   a training job builds at start-up. Every measurement runs in a fresh process; the rounds are
   interleaved (Megatron, tokentape at each horizon, then the reverse order) and the best time
   is kept. **Peak memory** is the process's resident-set high-water mark during the build, from
   the kernel: after the imports the benchmark resets it (``echo 5 > /proc/self/clear_refs``),
   notes the current RSS, builds, and reports ``VmHWM`` minus that RSS (numpy buffers, the
   compiled helpers' own allocations and touched pages of the mapped ``.idx`` files all count;
   tracemalloc would miss the C++ allocations). Where that reset is not available it falls back
   to ``ru_maxrss`` minus the RSS after the imports. A thread samples the anonymous and the
   file-backed parts (``RssAnon``, ``RssFile``) every 2 ms. Megatron horizons above
   ``--megatron-max-horizon`` are **extrapolated** linearly from the largest measured one and
   marked so.
2. **Random-access sample throughput**, on the indices built at ``--access-horizon`` (10**6),
   stores page-cached, same positions for both: one sample (Megatron's
   ``BlendedDataset.__getitem__`` against ``Batcher.batch`` of one position, and tokentape's
   torch ``TapeDataset.__getitem__``), and a batch of 1024 samples of 4097 tokens, at random
   positions and at 1024 consecutive positions (a training step): Megatron's ``__getitem__`` in
   a loop, with and without torch's ``default_collate`` (what its DataLoader adds), against one
   ``Batcher.batch`` call (int64 tokens, shape (1024, 4097)). Megatron returns ``tokens`` and
   ``labels`` of 4096 each, cut from the same 4097-token window. Best of ``--access-rounds``
   rounds (5), after a warm-up round.
3. **Mixture accuracy**: over the whole horizon, the largest deviation of any prefix's
   per-source count from its target n·w_d, for Megatron from its blending index
   (``BlendedDataset.dataset_index``), for tokentape from the tape's blend; the same code reads
   both. tokentape's targets are its exact rational weights W_d/D (by default, algorithm
   version 2, the stated weights exactly: D = 20 for these); its deviation from the decimal
   weights is shown too, and the same for the weights rounded over 2^16
   (``weight_denominator = 65536``, version 1's default), which drift from them.

Checks (light): the Megatron prefixes and the tokentape stores hold the same tokens; Megatron's
samples have the expected shapes and equal the window its own indices describe; tokentape's
batch rows equal the store windows of the samples the tape resolved.

Ratios are what matter: the machine is noisy and nothing here asserts an absolute time.

    python benchmarks/megatron_bench.py [--tokens 1e8] [--rounds 2] [--corpora] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.store.atomic import write_atomic
from tokentape._src.store.format import MANIFEST_NAME, Manifest, content_hash
from tokentape._src.store.writer import ShardWriter

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench-out" / "megatron"
SEED = 1234
SEQ_LEN = 4096
VOCAB = 50257
EOD = 50256
SHARD_TOKENS = 2**27  # 256 MiB of uint16 per shard, the tokenizer's default
# (name, share of the tokens, mean document length in tokens, blend weight in percent)
SYNTHETIC = (
    ("web", 0.45, 700, 60),
    ("code", 0.25, 1200, 15),
    ("books", 0.15, 60_000, 10),
    ("academic", 0.10, 12_000, 10),
    ("math", 0.05, 2_000, 5),
)
CORPORA_WEIGHTS = {"prose": 60, "code": 30, "notes": 10}
HORIZONS = (10**6, 10**7, 10**8)
CHUNK = 2**22  # tokens generated at a time; positions per chunk in the deviation scan
DATA_VERSION = 1
MB = 1e6


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pow10(n: int) -> str:
    exponent = len(str(n)) - 1
    return f"10^{exponent}" if n == 10**exponent else f"{n:,}"


# --- the data: the same documents as Megatron prefixes and as tokentape stores -------------


@dataclass(frozen=True)
class Data:
    """What ``data.json`` records about one prepared data set (written last: its marker)."""

    kind: str
    names: tuple[str, ...]
    weights: tuple[int, ...]  # percent
    n_tokens: tuple[int, ...]
    n_docs: tuple[int, ...]
    vocab_size: int
    eod_id: int
    version: int = DATA_VERSION

    @classmethod
    def load(cls, root: Path) -> Data | None:
        try:
            raw = json.loads((root / "data.json").read_text())
        except (OSError, ValueError):
            return None
        if raw.get("version") != DATA_VERSION:
            return None
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})

    def save(self, root: Path) -> None:
        write_atomic(root / "data.json", json.dumps(asdict(self), indent=2).encode())

    @property
    def shares(self) -> np.ndarray:
        w = np.asarray(self.weights, dtype=np.float64)
        return w / w.sum()


def megatron_prefix(root: Path, name: str) -> Path:
    return root / "megatron" / name


def store_dir(root: Path, name: str) -> Path:
    return root / "tokentape" / name


def _synthetic_manifest(shards: list, vocab: int, eod: int) -> Manifest:
    tokenizer = {
        "kind": "synthetic",
        "spec": "megatron_bench",
        "vocab_size": vocab,
        "eod_id": eod,
        "eod_token": None,
        "fingerprint": f"synthetic:megatron_bench:{vocab}:{eod}",
        "file": None,
    }
    return Manifest(
        dtype="uint16",
        vocab_size=vocab,
        eod_id=eod,
        tokenizer=tokenizer,
        shards=tuple(shards),
        n_tokens=sum(s.n_tokens for s in shards),
        n_docs=sum(s.n_docs for s in shards),
        content_hash=content_hash(shards, "uint16"),
        filters={},
        inputs={"generator": "benchmarks/megatron_bench.py"},
        job="megatron_bench",
        created_by="benchmarks/megatron_bench.py",
    )


class PairWriter:
    """Writes the same documents to a Megatron prefix and to a tokentape store."""

    def __init__(self, root: Path, name: str, vocab: int, eod: int) -> None:
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        self.prefix = megatron_prefix(root, name)
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        self.builder = IndexedDatasetBuilder(f"{self.prefix}.bin", dtype=np.uint16)
        self.store = store_dir(root, name)
        self.store.mkdir(parents=True, exist_ok=True)
        self.writer = ShardWriter(self.store, "uint16", SHARD_TOKENS)
        self.vocab, self.eod = vocab, eod

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """``tokens``: documents back to back, each ending with EOD; ``lengths``: their sizes."""
        ends = np.cumsum(lengths)
        for a, b in zip((ends - lengths).tolist(), ends.tolist(), strict=True):
            # preprocess_data.py without sentence splitting: one sequence per document.
            self.builder.add_document(tokens[a:b], [b - a])
        self.writer.add(tokens, lengths)

    def finish(self) -> tuple[int, int]:
        self.builder.finalize(f"{self.prefix}.idx")
        manifest = _synthetic_manifest(self.writer.finish(), self.vocab, self.eod)
        write_atomic(self.store / MANIFEST_NAME, manifest.to_json().encode())
        return manifest.n_tokens, manifest.n_docs


def _doc_lengths(rng: np.random.Generator, mean: int, want: int) -> np.ndarray:
    """Log-normal document lengths (sigma 1, at least 2 tokens) adding up to at least ``want``."""
    sigma = 1.0
    mu = np.log(mean) - sigma**2 / 2
    parts, total = [], 0
    while total < want:
        draw = np.maximum(2, rng.lognormal(mu, sigma, want // mean + 16).astype(np.int64))
        ends = np.cumsum(draw) + total
        keep = int(np.searchsorted(ends, want, side="left")) + 1
        parts.append(draw[:keep])
        total = int(ends[min(keep, len(ends)) - 1])
    return np.concatenate(parts)


def generate_synthetic(root: Path, total_tokens: int) -> Data:
    names, n_tokens, n_docs = [], [], []
    for i, (name, share, mean_len, _) in enumerate(SYNTHETIC):
        rng = np.random.default_rng([SEED, i])
        pair = PairWriter(root, name, VOCAB, EOD)
        target, written = int(total_tokens * share), 0
        while written < target:
            lengths = _doc_lengths(rng, mean_len, min(CHUNK, target - written))
            tokens = rng.integers(0, EOD, int(lengths.sum()), dtype=np.uint16)
            tokens[np.cumsum(lengths) - 1] = EOD
            pair.add(tokens, lengths)
            written += len(tokens)
        t, d = pair.finish()
        names.append(name)
        n_tokens.append(t)
        n_docs.append(d)
    weights = tuple(s[3] for s in SYNTHETIC)
    return Data("synthetic", tuple(names), weights, tuple(n_tokens), tuple(n_docs), VOCAB, EOD)


def generate_corpora(root: Path) -> Data:
    """The built-in corpora, tokenized by tokentape (bytes), exported to Megatron per document."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from tokentape._src.corpora import write_builtin_corpora
    from tokentape._src.store.reader import Source
    from tokentape._src.tokenize.driver import tokenize
    from tokentape._src.tokenize.job import TokenizeConfig

    dirs = write_builtin_corpora(root / "corpora")
    names, n_tokens, n_docs = [], [], []
    vocab = eod = 0
    for name in CORPORA_WEIGHTS:
        out = store_dir(root, name)
        config = TokenizeConfig(inputs=(str(dirs[name]),), out=str(out), tokenizer="bytes")
        tokenize(config)
        src = Source(out)
        vocab, eod = src.manifest.vocab_size, src.eod_id
        prefix = megatron_prefix(root, name)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
        for i in range(src.n_docs):
            a, b = src.doc_span(i)  # the document with its EOD
            builder.add_document(src.tokens(a, b), [b - a])
        builder.finalize(f"{prefix}.idx")
        names.append(name)
        n_tokens.append(src.n_tokens)
        n_docs.append(src.n_docs)
    weights = tuple(CORPORA_WEIGHTS.values())
    return Data("corpora", tuple(names), weights, tuple(n_tokens), tuple(n_docs), vocab, eod)


def ensure_data(root: Path, corpora: bool, total_tokens: int) -> tuple[Data, float | None]:
    """The data set under ``root``, generated on first use; (data, seconds spent generating)."""
    found = Data.load(root)
    if found is not None:
        return found, None
    note(f"writing the data set to {root} (once) ...")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    started = time.perf_counter()
    data = generate_corpora(root) if corpora else generate_synthetic(root, total_tokens)
    data.save(root)
    return data, time.perf_counter() - started


# --- tokentape's side: where its tokens come from is decided here, and only here ------------


def in_place_available() -> bool:
    """Whether this tokentape reads Megatron prefixes in place (a plan source with
    ``format = "megatron"``)."""
    try:
        from tokentape._src.plan import plan
    except ImportError:
        return False
    keys = getattr(plan, "_SOURCE_KEYS", set())
    return "format" in keys


def tokentape_source_lines(root: Path, data: Data, name: str, in_place: bool) -> list[str]:
    """The plan-file lines that point tokentape at one source's tokens: the Megatron prefix
    itself (in-place reading; its .idx records no vocabulary, so the plan gives it), or the
    tokentape store written from the same arrays."""
    if in_place:
        return [
            f'path = "{megatron_prefix(root, name).relative_to(root)}"',
            'format = "megatron"',
            f"vocab_size = {data.vocab_size}",
            f"eod_id = {data.eod_id}",
        ]
    return [f'path = "{store_dir(root, name).relative_to(root)}"']


def plan_file(root: Path, horizon: int, in_place: bool) -> Path:
    return root / f"plan-{horizon}{'-in-place' if in_place else ''}.toml"


def write_plan(root: Path, data: Data, horizon: int, in_place: bool, denominator: int = 0) -> Path:
    lines = [f"seq_len = {SEQ_LEN}", f"seed = {SEED}", f"total_samples = {horizon}"]
    if denominator:
        lines.append(f"weight_denominator = {denominator}")
    for name, weight in zip(data.names, data.weights, strict=True):
        lines += [
            "",
            "[[source]]",
            f'name = "{name}"',
            *tokentape_source_lines(root, data, name, in_place),
        ]
        lines += [f"weight = {weight}", "max_repeats = 1e12"]
    path = plan_file(root, horizon, in_place)
    path.write_text("\n".join(lines) + "\n")
    return path


# --- Megatron-LM's side ---------------------------------------------------------------------


def import_megatron() -> dict[str, Any]:
    """megatron-core's dataset classes, quietly (its import warns about missing Apex/TE)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    logging.getLogger("megatron").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"megatron\..*")
    return {
        "version": megatron.core.__version__,
        "Builder": BlendedMegatronDatasetBuilder,
        "GPTDataset": GPTDataset,
        "GPTDatasetConfig": GPTDatasetConfig,
    }


class MinimalTokenizer:
    """What GPTDataset reads from its tokenizer: the vocabulary size and the EOD/pad ids."""

    def __init__(self, vocab_size: int, eod: int) -> None:
        self.vocab_size = vocab_size
        self.eod = eod
        self.pad = -1  # Megatron's own "no pad token" value
        # Part of every dataset's cache key (MegatronDataset.unique_description).
        self.unique_identifiers = {"class": "MinimalTokenizer", "vocab_size": vocab_size}


def clear_megatron_cache(root: Path, data: Data) -> None:
    """Delete the GPT index cache Megatron writes next to each prefix (path_to_cache=None).

    ``path_to_cache`` cannot point elsewhere here: with it set, ``BlendedDataset`` calls
    ``torch.distributed.get_rank()`` on a cache miss, which fails without a process group.
    """
    for name in data.names:
        shutil.rmtree(megatron_prefix(root, name), ignore_errors=True)


def build_megatron(mg: dict[str, Any], root: Path, data: Data, horizon: int) -> Any:
    config = mg["GPTDatasetConfig"](
        random_seed=SEED,
        sequence_length=SEQ_LEN,
        blend=([str(megatron_prefix(root, n)) for n in data.names], list(data.weights)),
        split="1,0,0",
        tokenizer=MinimalTokenizer(data.vocab_size, data.eod_id),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        path_to_cache=None,
    )
    builder = mg["Builder"](mg["GPTDataset"], [horizon, 0, 0], lambda: True, config)
    return builder.build()[0]


def megatron_window(blended: Any, p: int) -> tuple[int, np.ndarray]:
    """Sample ``p`` of the blend as its own indices describe it: (source, its 4097 tokens)."""
    d = int(blended.dataset_index[p])
    gpt = blended.datasets[d]
    i = int(gpt.shuffle_index[int(blended.dataset_sample_index[p])])
    (first, offset), (last, _) = gpt.sample_index[i], gpt.sample_index[i + 1]
    docs = [gpt.dataset.get(int(gpt.document_index[x])) for x in range(int(first), int(last) + 1)]
    return d, np.concatenate(docs)[int(offset) : int(offset) + SEQ_LEN + 1]


# --- measuring ------------------------------------------------------------------------------


def _status_kb(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(m.group(1)) if m else None


class PeakMemory:
    """Peak resident memory of this process from now until ``stop``, above its level now.

    The total is the kernel's own high-water mark (``VmHWM``, reset here), so no peak is
    missed. Its two parts are sampled every ``interval`` seconds by a thread: anonymous memory
    (``RssAnon``: numpy buffers, the C++ helpers' arrays) and file-backed pages (``RssFile``:
    mapped data and index files, shared with the page cache and reclaimable).
    """

    def __init__(self, interval: float = 0.002) -> None:
        gc.collect()
        self.method = "VmHWM after reset"
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets the RSS high-water mark
            self.base = _status_kb("VmRSS")
            if self.base is None or _status_kb("VmHWM") is None:
                raise OSError("no /proc/self/status")
        except OSError:
            self.method = "ru_maxrss"
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.parts = {"RssAnon": 0, "RssFile": 0}
        self.part_base = {k: _status_kb(k) or 0 for k in self.parts}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_done, args=(interval,))
        self._thread.start()

    def _sample(self) -> None:
        for key in self.parts:
            self.parts[key] = max(self.parts[key], (_status_kb(key) or 0) - self.part_base[key])

    def _sample_until_done(self, interval: float) -> None:
        while not self._done.wait(interval):
            self._sample()

    def stop(self) -> dict[str, Any]:
        """Peak bytes: total (``peak``), anonymous and file-backed parts (sampled)."""
        self._done.set()
        self._thread.join()
        self._sample()
        if self.method == "ru_maxrss":
            now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        else:
            now = _status_kb("VmHWM") or 0
        return {
            "peak": max(0.0, float(now - self.base) * 1024),
            "peak_anon": float(self.parts["RssAnon"]) * 1024,
            "peak_file": float(self.parts["RssFile"]) * 1024,
            "memory_method": self.method,
        }


def deviation_scan(
    sources: Callable[[int, int], np.ndarray], horizon: int, targets: Sequence[Sequence[float]]
) -> list[tuple[float, int]]:
    """For each target share vector w: the max over prefixes n <= horizon and sources d of
    |count_d(n) - n * w_d|, and the first n where it occurs; ``sources(a, b)`` gives the source
    of positions [a, b)."""
    n_sources = len(targets[0])
    counts = np.zeros(n_sources, dtype=np.int64)
    worst = [(0.0, 0)] * len(targets)
    for a in range(0, horizon, CHUNK):
        b = min(horizon, a + CHUNK)
        src = np.asarray(sources(a, b))
        n = np.arange(a + 1, b + 1, dtype=np.float64)
        for d in range(n_sources):
            c = np.cumsum(src == d) + counts[d]
            for t, w in enumerate(targets):
                dev = np.abs(c - n * w[d])
                i = int(np.argmax(dev))
                if dev[i] > worst[t][0]:
                    worst[t] = (float(dev[i]), a + i + 1)
            counts[d] = c[-1]
    return worst


def child_megatron(root: Path, data: Data, horizon: int, deviation: bool) -> dict[str, Any]:
    mg = import_megatron()
    clear_megatron_cache(root, data)
    saving = [0.0]
    save = np.save

    def timed_save(*args: Any, **kwargs: Any) -> None:  # to report the cache writes apart
        t0 = time.perf_counter()
        save(*args, **kwargs)
        saving[0] += time.perf_counter() - t0

    np.save = timed_save
    peak = PeakMemory()
    wall, cpu = time.perf_counter(), time.process_time()
    blended = build_megatron(mg, root, data, horizon)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    memory = peak.stop()
    out: dict[str, Any] = {
        "wall": wall,
        "cpu": cpu,
        **memory,
        "cache_write_s": saving[0],
        "size": len(blended),
    }
    kept = blended.dataset_index.nbytes + blended.dataset_sample_index.nbytes
    out["epochs"], out["document_index_entries"] = [], 0
    for d, gpt in enumerate(blended.datasets):
        kept += gpt.document_index.nbytes + gpt.sample_index.nbytes + gpt.shuffle_index.nbytes
        out["epochs"].append(len(gpt.document_index) // data.n_docs[d])
        out["document_index_entries"] += len(gpt.document_index)
    out["index_bytes"] = kept
    np.save = save
    t0 = time.perf_counter()  # a second start: the GPT indices now load from its cache
    build_megatron(mg, root, data, horizon)
    out["warm_wall"] = time.perf_counter() - t0
    if deviation:
        out["deviation"], out["deviation_at"] = deviation_scan(
            lambda a, b: blended.dataset_index[a:b], horizon, [data.shares]
        )[0]
    return out


def child_tokentape(
    root: Path, data: Data, horizon: int, deviation: bool, in_place: bool
) -> dict[str, Any]:
    from tokentape._src.plan.plan import resolve_plan
    from tokentape._src.plan.spec import load_plan_spec
    from tokentape._src.tape.blend import DEFAULT_DENOMINATOR, Blend, rational_weights

    plan_path = plan_file(root, horizon, in_place)
    peak = PeakMemory()
    wall, cpu = time.perf_counter(), time.process_time()
    plan = resolve_plan(load_plan_spec(plan_path))
    tape = plan.tape()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    memory = peak.stop()
    out: dict[str, Any] = {
        "wall": wall,
        "cpu": cpu,
        **memory,
        "denominator": plan.denominator,
        "weight_units": [s.weight_units for s in plan.sources],
    }
    if deviation:
        effective = np.asarray(out["weight_units"], dtype=np.float64) / plan.denominator
        (out["deviation_effective"], out["deviation_at"]), requested = deviation_scan(
            lambda a, b: tape.blend.source_and_draw(np.arange(a, b, dtype=np.int64))[0],
            horizon,
            [effective, data.shares],
        )
        out["deviation_requested"] = requested[0]
        weights, names = list(data.weights), list(data.names)
        rounded = Blend.build(rational_weights(weights, names, DEFAULT_DENOMINATOR))
        out["deviation_rounded"] = deviation_scan(
            lambda a, b: rounded.source_and_draw(np.arange(a, b, dtype=np.int64))[0],
            horizon,
            [data.shares],
        )[0][0]
    return out


def run_child(
    side: str, root: Path, horizon: int, deviation: bool, in_place: bool
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", side, "--data", str(root), "--horizon"]
    cmd += [str(horizon)] + (["--deviation"] if deviation else [])
    cmd += ["--in-place"] if in_place else []
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{side} at {horizon:,} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- 1 + 3: build and mixture ---------------------------------------------------------------


def bench_build(
    root: Path, horizons: Sequence[int], rounds: int, megatron_max: int, in_place: bool
) -> dict[tuple[str, int], dict[str, Any]]:
    """Best (fastest) run per (side, horizon) over interleaved rounds, each a fresh process.

    Peak memory: the smallest over the rounds. The mixture deviation comes from round 0. When
    tokentape reads the Megatron prefixes in place, its build from its own stores is measured
    too (side "tokentape-store").
    """
    best: dict[tuple[str, int], dict[str, Any]] = {}
    sides = ["megatron", "tokentape"] + (["tokentape-store"] if in_place else [])
    for r in range(rounds):
        order = list(horizons) if r % 2 == 0 else list(reversed(horizons))
        for h in order:
            for side in sides if r % 2 == 0 else reversed(sides):
                if side == "megatron" and h > megatron_max:
                    continue
                note(f"round {r + 1}/{rounds}: {side} build at {h:,} samples ...")
                child = "megatron" if side == "megatron" else "tokentape"
                deviation = r == 0 and side != "tokentape-store"
                got = run_child(child, root, h, deviation, in_place and side == "tokentape")
                key = (side, h)
                if key not in best:
                    best[key] = got
                    continue
                kept = best[key]
                if got["peak"] < kept["peak"]:  # memory: the run with the smallest peak
                    for k in ("peak", "peak_anon", "peak_file"):
                        kept[k] = got[k]
                if got["wall"] < kept["wall"]:
                    for k in ("wall", "cpu", "cache_write_s", "warm_wall"):
                        if k in got:
                            kept[k] = got[k]
    return best


# --- 2: random access -----------------------------------------------------------------------


def page_in(paths: Sequence[Path]) -> None:
    """Read every file once so that both sides read from the page cache."""
    for path in paths:
        with path.open("rb") as f:
            while f.read(2**24):
                pass


def bench_access(
    root: Path, data: Data, horizon: int, batch: int, singles: int, rounds: int, in_place: bool
) -> tuple[dict[str, float], dict[str, Any]]:
    """Seconds per sample / per batch (best of rounds), and the checks' results."""
    import torch
    from torch.utils.data import default_collate

    from tokentape._src.plan.plan import resolve_plan
    from tokentape._src.plan.spec import load_plan_spec
    from tokentape._src.torch.data import TapeDataset
    from tokentape._src.train.batch import Batcher

    mg = import_megatron()
    clear_megatron_cache(root, data)
    blended = build_megatron(mg, root, data, horizon)
    plan = resolve_plan(load_plan_spec(write_plan(root, data, horizon, in_place)))
    batcher = Batcher(plan, np.int64)
    tape_dataset = TapeDataset(plan)
    files = [Path(f"{megatron_prefix(root, n)}.bin") for n in data.names]
    if not in_place:
        files += sorted(p for n in data.names for p in store_dir(root, n).glob("*.bin"))
    page_in(files)

    rng = np.random.default_rng(SEED)
    best: dict[str, float] = {}

    def keep(key: str, seconds: float) -> None:
        best[key] = min(best.get(key, float("inf")), seconds)

    def clock(fn: Callable[[], object]) -> tuple[float, object]:
        t0 = time.perf_counter()
        result = fn()
        return time.perf_counter() - t0, result

    for r in range(-1, rounds):  # round -1 warms up (imports, caches) and is not kept
        single = rng.integers(0, horizon, singles).tolist()
        random_batch = np.sort(rng.integers(0, horizon, batch))
        start = int(rng.integers(0, horizon - batch))
        consecutive = np.arange(start, start + batch, dtype=np.int64)
        steps: list[tuple[str, Callable[[], object]]] = [
            ("mg single", lambda s=single: [blended[p] for p in s]),
            ("tt single", lambda s=single: [batcher.batch(np.array([p])) for p in s]),
            ("tt dataset single", lambda s=single: [tape_dataset[p] for p in s]),
        ]
        for label, positions in (("random", random_batch), ("consecutive", consecutive)):
            steps.append((f"mg {label}", lambda ps=positions: [blended[p] for p in ps.tolist()]))
            steps.append((f"tt {label}", lambda ps=positions: batcher.batch(ps)))
        if r % 2:
            steps.reverse()
        for key, fn in steps:
            gc.collect()
            seconds, result = clock(fn)
            if key.startswith("mg ") and "single" not in key:
                assert isinstance(result, list)
                seconds_collate, _ = clock(lambda items=result: default_collate(items))
                if r >= 0:
                    keep(f"{key} + collate", seconds + seconds_collate)
            if r >= 0:
                keep(key, seconds / singles if "single" in key else seconds)

    # --- checks ---
    checks: dict[str, Any] = {}
    probe = rng.integers(0, horizon, 8).tolist()
    for p in probe:
        item = blended[p]
        assert item["tokens"].shape == (SEQ_LEN,) and item["labels"].shape == (SEQ_LEN,)
        assert item["tokens"].dtype == torch.int64
        assert torch.equal(item["tokens"][1:], item["labels"][:-1])
        d, window = megatron_window(blended, p)
        assert int(item["dataset_id"]) == d
        assert np.array_equal(np.concatenate([item["tokens"].numpy(), item["labels"][-1:]]), window)
    checks["megatron_sample"] = (
        f"tokens and labels of {SEQ_LEN} (int64), one 4097-token window; {len(probe)} samples "
        "equal the window their document/sample/shuffle indices describe"
    )
    got = batcher.batch(consecutive)
    assert got.tokens.shape == (batch, SEQ_LEN + 1) and got.tokens.dtype == np.int64
    rows = rng.choice(batch, 16, replace=False)
    for row in rows.tolist():
        src = batcher.sources[int(got.source[row])]
        assert np.array_equal(got.tokens[row], src.window(int(got.sample[row]), SEQ_LEN))
    one = tape_dataset[int(consecutive[0])]
    assert one["inputs"].shape == (SEQ_LEN,) and one["targets"].shape == (SEQ_LEN,)
    checks["tokentape_batch"] = (
        f"({batch}, {SEQ_LEN + 1}) int64; {len(rows)} rows equal their store windows"
    )
    return best, checks


def check_same_tokens(root: Path, data: Data, in_place: bool) -> str:
    """The Megatron prefixes and the tokentape stores hold the same token stream."""
    from tokentape._src.store.reader import Source

    for name, n_tokens in zip(data.names, data.n_tokens, strict=True):
        bin_tokens = np.memmap(f"{megatron_prefix(root, name)}.bin", dtype=np.uint16, mode="r")
        src = Source(store_dir(root, name))
        assert len(bin_tokens) == src.n_tokens == n_tokens, name
        for a in range(0, n_tokens, 2**24):
            b = min(n_tokens, a + 2**24)
            assert np.array_equal(bin_tokens[a:b], src.tokens(a, b)), f"{name} [{a}, {b})"
    same = "Megatron .bin == the tokentape stores written with them, token for token"
    return same + ("; tokentape reads the .bin in place" if in_place else "")


# --- output ---------------------------------------------------------------------------------


@dataclass
class Row:
    measure: str
    at: str
    unit: str
    tokentape: float | None
    megatron: float | None
    ratio: float | None  # how many times better tokentape is
    basis: str = "measured"


def _num(x: float | None, unit: str = "") -> str:
    if x is None:
        return "—"
    if unit == "samples" and abs(x) < 10:  # prefix deviations: is it below one sample?
        return f"{x:.5f}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def render(rows: list[Row]) -> str:
    head = ["measure", "horizon / batch", "unit", "tokentape", "Megatron-LM", "ratio", "basis"]
    body = [
        [
            r.measure,
            r.at,
            r.unit,
            _num(r.tokentape, r.unit),
            _num(r.megatron, r.unit),
            "—" if r.ratio is None else f"{_num(r.ratio)}x",
            r.basis,
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(head), rule, *(line(b) for b in body)])


def build_rows(
    built: dict[tuple[str, int], dict[str, Any]],
    horizons: Sequence[int],
    rounds: int,
    first_open: dict[str, Any] | None,
) -> list[Row]:
    rows: list[Row] = []
    if first_open is not None:
        rows.append(
            Row(
                "tokentape: first open of the Megatron prefixes",
                "any",
                "s",
                first_open["wall"],
                None,
                None,
                "once per data set: hashes every .bin/.idx, cached beside the prefix",
            )
        )
        rows.append(
            Row("  its peak memory", "any", "MB", first_open["peak"] / MB, None, None, "one run")
        )
    measured = [h for h in horizons if ("megatron", h) in built]
    largest = max(measured) if measured else None

    def megatron(h: int, key: str) -> tuple[float | None, str]:
        if ("megatron", h) in built:
            return built["megatron", h][key], f"best of {rounds}, fresh process each"
        if largest is None:
            return None, "not measured"
        return built["megatron", largest][key] * h / largest, (
            f"EXTRAPOLATED linearly from {_pow10(largest)}"
        )

    for h in horizons:
        at = _pow10(h)
        tt, mg = built["tokentape", h], built.get(("megatron", h))
        store = built.get(("tokentape-store", h))
        mg_wall, basis = megatron(h, "wall")
        rows.append(
            Row("build time", at, "s", tt["wall"], mg_wall, _ratio(mg_wall, tt["wall"]), basis)
        )
        if store is not None:
            rows.append(
                Row(
                    "  tokentape from its own stores",
                    at,
                    "s",
                    store["wall"],
                    mg_wall,
                    _ratio(mg_wall, store["wall"]),
                    "the same tokens written with ShardWriter",
                )
            )
        if mg is not None:
            rows.append(
                Row(
                    "  Megatron: of which writing its index cache",
                    at,
                    "s",
                    None,
                    mg["cache_write_s"],
                    None,
                    "np.save time inside the build",
                )
            )
            rows.append(
                Row(
                    "  Megatron: second start (GPT index cache hit)",
                    at,
                    "s",
                    tt["wall"],
                    mg["warm_wall"],
                    _ratio(mg["warm_wall"], tt["wall"]),
                    "one run; BlendedDataset rebuilt (not cached without torch.distributed)",
                )
            )
        mg_peak, basis = megatron(h, "peak")
        mg_peak = None if mg_peak is None else mg_peak / MB
        rows.append(
            Row(
                "build peak memory (RSS)",
                at,
                "MB",
                tt["peak"] / MB,
                mg_peak,
                _ratio(mg_peak, tt["peak"] / MB),
                "kernel high-water mark; " + basis.replace("best", "smallest"),
            )
        )
        mg_anon, _ = megatron(h, "peak_anon")
        mg_anon = None if mg_anon is None else mg_anon / MB
        mg_file = "—" if mg is None else f"{mg['peak_file'] / MB:,.0f}"
        rows.append(
            Row(
                "  of it anonymous memory",
                at,
                "MB",
                tt["peak_anon"] / MB,
                mg_anon,
                _ratio(mg_anon, tt["peak_anon"] / MB),
                f"sampled every 2 ms; file-backed pages (mapped files): tokentape "
                f"{tt['peak_file'] / MB:,.0f}, Megatron {mg_file}",
            )
        )
        if store is not None:
            rows.append(
                Row(
                    "  tokentape from its own stores (RSS)",
                    at,
                    "MB",
                    store["peak"] / MB,
                    mg_peak,
                    _ratio(mg_peak, store["peak"] / MB),
                    f"anonymous {store['peak_anon'] / MB:,.1f}, "
                    f"file-backed {store['peak_file'] / MB:,.0f}",
                )
            )
        if mg is not None:
            rows.append(
                Row(
                    "  Megatron: index arrays kept",
                    at,
                    "MB",
                    None,
                    mg["index_bytes"] / MB,
                    None,
                    f"{mg['index_bytes'] / h:.1f} B/sample; document index "
                    f"{mg['document_index_entries']:,} entries",
                )
            )
    lo, hi = min(horizons), max(horizons)
    if lo != hi:
        for key, what in (("wall", "time"), ("peak", "peak memory")):
            tt_growth = built["tokentape", hi][key] / max(built["tokentape", lo][key], 1e-9)
            mg_lo, _ = megatron(lo, key)
            mg_hi, basis = megatron(hi, key)
            mg_growth = None if mg_lo is None or mg_hi is None else mg_hi / max(mg_lo, 1e-9)
            rows.append(
                Row(
                    f"build {what} growth {_pow10(hi)} / {_pow10(lo)}",
                    "",
                    "x",
                    tt_growth,
                    mg_growth,
                    None,
                    "flat is 1" + ("" if ("megatron", hi) in built else f"; Megatron {basis}"),
                )
            )
    for h in horizons:
        tt = built["tokentape", h]
        if "deviation_effective" not in tt:
            continue
        at = _pow10(h)
        mg = built.get(("megatron", h), {})
        mg_dev = mg.get("deviation")
        where = f"worst at n = {tt['deviation_at']:,}" + (
            f" (Megatron n = {mg['deviation_at']:,})" if mg_dev is not None else ""
        )
        rows.append(
            Row(
                "mixture: max prefix deviation",
                at,
                "samples",
                tt["deviation_effective"],
                mg_dev,
                _ratio(mg_dev, tt["deviation_effective"]),
                f"all n <= {at}; target n x w_d (tokentape W_d/{tt['denominator']}, Megatron "
                f"its float weights); {where}",
            )
        )
        rows.append(
            Row(
                "  tokentape vs the decimal weights",
                at,
                "samples",
                tt["deviation_requested"],
                mg_dev,
                _ratio(mg_dev, tt["deviation_requested"]),
                f"W_d/{tt['denominator']}: the stated weights, exactly (no knob)",
            )
        )
        rows.append(
            Row(
                "  tokentape, weight_denominator = 65536",
                at,
                "samples",
                tt["deviation_rounded"],
                mg_dev,
                _ratio(mg_dev, tt["deviation_rounded"]),
                "rounded over 2^16 (version 1's default): drifts from the decimal weights",
            )
        )
    return rows


def _ratio(megatron: float | None, tokentape: float | None) -> float | None:
    if megatron is None or tokentape is None or tokentape <= 0:
        return None
    return megatron / tokentape


def access_rows(best: dict[str, float], batch: int, horizon: int, rounds: int) -> list[Row]:
    us, ms = 1e6, 1e3
    basis = f"best of {rounds}; indices at horizon {_pow10(horizon)}"
    rows = [
        Row(
            "one sample, random position",
            "1",
            "us",
            best["tt single"] * us,
            best["mg single"] * us,
            _ratio(best["mg single"], best["tt single"]),
            f"Batcher.batch([p]) vs BlendedDataset[p]; {basis}",
        ),
        Row(
            "  tokentape TapeDataset[p] (torch tensors)",
            "1",
            "us",
            best["tt dataset single"] * us,
            best["mg single"] * us,
            _ratio(best["mg single"], best["tt dataset single"]),
            basis,
        ),
    ]
    for label in ("random", "consecutive"):
        tt, mg, mgc = best[f"tt {label}"], best[f"mg {label}"], best[f"mg {label} + collate"]
        at = f"{batch} x {SEQ_LEN + 1}, {label}"
        rows.append(
            Row(
                "batch",
                at,
                "ms",
                tt * ms,
                mg * ms,
                _ratio(mg, tt),
                f"Batcher.batch vs a loop of BlendedDataset[p]; {basis}",
            )
        )
        rows.append(
            Row(
                "  Megatron + default_collate",
                at,
                "ms",
                tt * ms,
                mgc * ms,
                _ratio(mgc, tt),
                "what its DataLoader adds: stacks tokens, labels, loss_mask, position_ids",
            )
        )
        rows.append(
            Row(
                "  throughput",
                at,
                "M tok/s",
                batch * (SEQ_LEN + 1) / tt / 1e6,
                batch * (SEQ_LEN + 1) / mg / 1e6,
                _ratio(mg, tt),
                "Megatron without collate",
            )
        )
    return rows


def versions(mg_version: str) -> dict[str, str]:
    import torch

    import tokentape

    return {
        "megatron-core": mg_version,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "tokentape": getattr(tokentape, "__version__", "?"),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=float, default=1e8, help="synthetic tokens, all sources")
    p.add_argument("--corpora", action="store_true", help="the built-in corpora instead")
    p.add_argument("--horizons", default="1e6,1e7,1e8", help="comma-separated sample counts")
    p.add_argument("--rounds", type=int, default=2, help="build rounds (fresh processes)")
    p.add_argument(
        "--megatron-max-horizon",
        type=float,
        default=1e8,
        help="larger Megatron horizons are extrapolated, not built",
    )
    p.add_argument("--access-horizon", type=float, default=1e6)
    p.add_argument("--access-rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--singles", type=int, default=1000, help="single samples timed per round")
    p.add_argument(
        "--source",
        choices=("auto", "store", "megatron"),
        default="auto",
        help="tokentape reads its own stores or the Megatron prefixes in place (auto: in place "
        "when this tokentape supports it)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", choices=("megatron", "tokentape"), help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--horizon", type=int, help=argparse.SUPPRESS)
    p.add_argument("--deviation", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--in-place", action="store_true", help=argparse.SUPPRESS)
    args, unknown = p.parse_known_args(argv)
    if unknown:  # run.py passes the same extra arguments to every benchmark
        note(f"megatron_bench: ignoring arguments meant for other benchmarks: {' '.join(unknown)}")
    return args


def child_main(args: argparse.Namespace) -> int:
    data = Data.load(args.data)
    assert data is not None, f"no data set at {args.data}"
    if args.child == "megatron":
        out = child_megatron(args.data, data, args.horizon, args.deviation)
    else:
        out = child_tokentape(args.data, data, args.horizon, args.deviation, args.in_place)
    print(json.dumps(out))
    return 0


def data_table(data: Data, built: dict[tuple[str, int], dict[str, Any]], top: int) -> str:
    lines = [
        "| source | weight | tokens | documents | mean doc | samples (4097 tok) | "
        f"Megatron epochs at {_pow10(top)} |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    epochs = built.get(("megatron", top), {}).get("epochs")
    for d, name in enumerate(data.names):
        n_tok, n_doc = data.n_tokens[d], data.n_docs[d]
        lines.append(
            f"| {name} | {data.weights[d]}% | {n_tok:,} | {n_doc:,} | {n_tok / n_doc:,.0f} | "
            f"{(n_tok - 1) // SEQ_LEN:,} | {epochs[d] if epochs else '—'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    try:
        mg_version = import_megatron()["version"]
    except ImportError as exc:
        note(
            f"megatron_bench: megatron-core is not installed ({exc}); skipped. "
            "Install the 'megatron' extra: pip install -e '.[megatron]'"
        )
        return 0
    started = time.perf_counter()
    horizons = sorted(int(float(h)) for h in args.horizons.split(","))
    access_horizon = int(args.access_horizon)
    megatron_max = int(args.megatron_max_horizon)
    name = "corpora" if args.corpora else f"synthetic-{args.tokens:.0e}".replace("+0", "")
    root = args.out / name
    data, generated = ensure_data(root, args.corpora, int(args.tokens))
    in_place = {"store": False, "megatron": True}.get(args.source, in_place_available())
    for h in {*horizons, access_horizon}:
        for mode in {in_place, False}:  # the stores' plan too: measured beside in-place reading
            write_plan(root, data, h, mode)
    same = check_same_tokens(root, data, in_place)
    first_open = None
    if in_place:  # the first open hashes each prefix once and caches it beside the prefix
        for sidecar in (root / "megatron").glob("*.tokentape.json"):
            sidecar.unlink()
        note("tokentape: first open of the Megatron prefixes (hashing them once) ...")
        first_open = run_child("tokentape", root, horizons[0], False, in_place)
    built = bench_build(root, horizons, args.rounds, megatron_max, in_place)
    note(f"random access at horizon {access_horizon:,} ...")
    best, checks = bench_access(
        root, data, access_horizon, args.batch, args.singles, args.access_rounds, in_place
    )
    checks["same_tokens"] = same
    rows = build_rows(built, horizons, args.rounds, first_open) + access_rows(
        best, args.batch, access_horizon, args.access_rounds
    )
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "versions": versions(mg_version),
        "data": asdict(data),
        "data_generated_s": generated,
        "tokentape_reads": "Megatron prefixes in place" if in_place else "its own stores",
        "seed": SEED,
        "seq_len": SEQ_LEN,
        "memory_method": built["tokentape", horizons[0]]["memory_method"],
        "checks": checks,
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        print(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2))
        return 0
    v = meta["versions"]
    print(
        f"tokentape vs Megatron-LM, {meta['date']}, {meta['cpus']} cpus, seed {SEED}, "
        f"seq_len {SEQ_LEN}; megatron-core {v['megatron-core']}, torch {v['torch']}, "
        f"numpy {v['numpy']}, python {v['python']}\n"
    )
    gen = f", generated in {generated:.0f} s" if generated else " (cached)"
    print(f"data: {data.kind} under {root}{gen}; tokentape reads {meta['tokentape_reads']}\n")
    print(
        data_table(
            data,
            built,
            max(h for h in horizons if h <= megatron_max)
            if any(h <= megatron_max for h in horizons)
            else horizons[0],
        )
        + "\n"
    )
    print(render(rows) + "\n")
    print("Ratio: how many times better tokentape is (faster, smaller, closer to target).")
    print(
        f"Peak memory: resident-set high-water mark above the resident set after the imports "
        f"({meta['memory_method']}), smallest over the rounds."
    )
    for key, value in checks.items():
        print(f"- check {key}: {value}")
    print(f"- whole run {meta['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

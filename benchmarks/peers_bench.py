"""Peers side by side (issue 15, item 3): tokentape, Grain, MosaicML Streaming and LitData.

    python benchmarks/peers_bench.py [--quick] [--json] [--peers-venv PATH] [--grain-budget S]

The peers pull their own torch and numpy (Streaming 0.13 pins numpy < 2.2), so they never run
in the project's environment: ``bench-out/peers-venv`` (``--peers-venv``) is created with
``python -m venv`` and ``pip install`` of ``PEERS_PINS`` when missing (the ``peers`` extra of
``pyproject.toml``: never install it into the project's environment; the one benchmark that
downloads); a peer that cannot install is skipped with a note. Each system runs in child
processes (``benchmarks/peers/<system>_child.py``; tokentape's with this python), one per
measure, bounded in time; progress goes to stderr.

**The same tokens everywhere.** A synthetic corpus of three sources of 6,000 / 3,000 / 1,000
samples (60/30/10) of ``seq_len + 1 = 2049`` uint16 ids, sample k of source d carrying (d, k)
in its tokens 1..4, so that every batch read is checked by identity: tokentape's stores (one
document per source; sample k is the window ``[k L, k L + L + 1)``), one MDS dataset per source
(``MDSWriter``), one LitData dataset per source (``optimize``), and Grain reading the same
windows through a random-access source. Measured, per system (one column each):

- **mixture**: the largest deviation of any prefix from the stated shares (below).
- **start-up**: seconds from after the imports to the first batch of 64, in a fresh process,
  and the peak resident memory added over the imports, at horizons 10^5 / 10^6 / 10^7. A
  horizon is what the run is configured for: tokentape, the plan's ``total_samples``; Grain,
  the mixture cut at that length (sources repeated as needed); Streaming, ``epoch_size``;
  LitData has no such setting (an epoch ends when a source runs out), so its three cells are
  the same configuration.
- **throughput**: samples/s at batch 64 after the first batch, 0 and 2 workers (0 workers: the
  better of two runs in fresh processes, the first of which may read a cold page cache; tokentape:
  ``Loader`` with prefetch 0 / 2, and in brackets ``TapeDataset`` + ``TapeBatchSampler`` in a
  torch ``DataLoader`` with 0 / 2 worker processes; Grain: ``batched[i]`` / ``mp_prefetch``;
  Streaming and LitData: their loaders' ``num_workers``); and how random the order is: the
  median over batches of the span (max - min) of the 60 % source's sample indices in a batch.
- **resume 2 -> 2, 3, 1 ranks**: 2 ranks read 5 steps of 64 each and rank 0's state is saved
  (as JSON); then 2, 3 or 1 ranks resume from it for 768 samples in all; the samples read are
  compared as a multiset with an uninterrupted 2-rank run of the same length: "exact", or how
  many were lost, repeated or extra, or "refused" with the system's message. Ranks are
  separate processes (Streaming: ``RANK``/``WORLD_SIZE`` and gloo; LitData: gloo).
- **determinism**: the identities of two 0-worker runs in fresh processes, and of a 2-worker
  run, compared.
- **state JSON round trip**: the state after 5 batches, through JSON into a fresh process:
  are the next 3 batches those of the uninterrupted run?

Figures, not assertions: the machine is shared and noisy; ratios in the same run matter.

**Mixture deviation.** For each system, the sequence of sources of the first N elements, and
the largest deviation over every prefix n <= N of any source's count from n * w_d with
w = 0.6 / 0.3 / 0.1 exactly. The arithmetic is exact integer arithmetic:
|10 * count_d(n) - n * W_d| / 10 with W = 6 / 3 / 1. "n at worst" is the first prefix where
the largest deviation occurs. Streaming and LitData: the sources of the samples their 0-worker
loaders read (LitData: epoch after epoch), cut at ``--grain-budget`` seconds.

- **Grain** (``grain.MapDataset.mix``): one ``MapDataset.range(N)`` per source, each element
  mapped to ``(source, index)``, mixed with weights ``[60, 30, 10]``, read by index
  (``mix[i]``, the fastest public path: iterating is slower) for i < N. The mixture's length is
  ``min(len_d / w_d)`` (Grain never repeats an element), about 1.67 N here, so no source runs
  out. The child also checks that each source's indices come in order 0, 1, 2, ... (no element
  skipped or repeated). Grain runs in its own virtual environment, never the project's
  ``.venv`` (it pulls its own numpy): ``bench-out/peers-venv`` by default, created with
  ``python -m venv`` and ``pip install grain==<pin>`` when missing (this is the one benchmark
  that downloads). If that fails, Grain is skipped with a line saying why. The child script
  runs with that venv's python and writes the source sequence as an int8 ``.npy`` under
  ``bench-out/peers/``. Horizons 10^5, 10^6, 10^7 and 10^8, read in one pass; a horizon is
  skipped, with a note, when the time to reach it, projected from the last one reached,
  exceeds ``--grain-budget`` seconds (180).
- **tokentape**: the blend of ``exact_weights([60, 30, 10])`` (6/3/1 over a period of 10, the
  default since algorithm version 2) and of ``rational_weights(..., 65536)`` (39,322 / 19,661
  / 6,553 over 2^16, version 1's default), sources from ``Blend.source_and_draw`` in chunks.

Seconds: the time to produce the sequence of sources (Grain: building the datasets and
reading the elements; tokentape: building the blend and resolving the positions), not the
deviation scan. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokentape import __version__ as tokentape_version
from tokentape._src.store.atomic import write_atomic
from tokentape._src.store.format import MANIFEST_NAME, Manifest, content_hash
from tokentape._src.store.tokenizers import load_tokenizer, tokenizer_manifest
from tokentape._src.store.writer import ShardWriter
from tokentape._src.tape.blend import Blend, exact_weights, rational_weights

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out" / "peers"
WEIGHTS = (60, 30, 10)
NAMES = ("a", "b", "c")
STATED = (6, 3, 1)  # the stated shares 0.6 / 0.3 / 0.1 exactly, over STATED_PERIOD
STATED_PERIOD = 10
HORIZONS = (10**5, 10**6, 10**7, 10**8)
QUICK = (10**5, 10**6)
CHUNK = 2**22
GRAIN_PIN = "grain==0.2.18"

GRAIN_CHILD = r"""
import json, os, sys, time
from importlib.metadata import version
import numpy as np
import grain

out, budget = sys.argv[1], float(sys.argv[2])
horizons = sorted(int(h) for h in sys.argv[3].split(","))
weights = [int(w) for w in sys.argv[4].split(",")]
top, chunk = horizons[-1], 1 << 16
busy = 0.0
start = time.perf_counter()
parts = [grain.MapDataset.range(top).map(lambda x, d=d: (d, x)) for d in range(len(weights))]
mix = grain.MapDataset.mix(parts, weights)
busy += time.perf_counter() - start
src = np.empty(top, dtype=np.int8)
drawn = np.zeros(len(weights), dtype=np.int64)
reached, marks, skipped, bad = 0, [], [], None
for h in horizons:
    if reached and busy * h / reached > budget:
        skipped.append({"horizon": h, "projected_s": busy * h / reached})
        continue
    while reached < h:
        b = min(h, reached + chunk)
        start = time.perf_counter()
        pairs = np.array([mix[i] for i in range(reached, b)], dtype=np.int64)
        src[reached:b] = pairs[:, 0]
        busy += time.perf_counter() - start
        for d in range(len(weights)):
            got = pairs[pairs[:, 0] == d, 1]
            want = np.arange(drawn[d], drawn[d] + len(got))
            if bad is None and not np.array_equal(got, want):
                bad = f"source {d}: indices out of order near element {reached}"
            drawn[d] += len(got)
        reached = b
    marks.append({"horizon": h, "seconds": busy})
tmp = out + ".tmp.npy"
np.save(tmp, src[:reached])
os.replace(tmp, out)
print(json.dumps({
    "version": version("grain"), "length": len(mix), "source_lengths": [len(p) for p in parts],
    "marks": marks, "skipped": skipped, "order_error": bad,
}))
"""


def prefix_deviation(
    chunks: Iterator[np.ndarray], horizons: Sequence[int]
) -> list[tuple[float, int]]:
    """For each horizon N: the max over prefixes n <= N and sources d of |count_d(n) - n w_d|
    (w = STATED / STATED_PERIOD, exact integers) and the first n where it occurs. ``chunks``
    yields the sources of consecutive positions from 0, split at every horizon."""
    counts = np.zeros(len(STATED), dtype=np.int64)
    worst, at, done, out = 0, 0, 0, []
    marks = iter(sorted(horizons))
    mark = next(marks)
    for src in chunks:
        n = np.arange(done + 1, done + len(src) + 1, dtype=np.int64)
        for d, w in enumerate(STATED):
            c = np.cumsum(src == d, dtype=np.int64) + counts[d]
            dev = np.abs(STATED_PERIOD * c - n * w)
            i = int(np.argmax(dev))
            if dev[i] > worst:
                worst, at = int(dev[i]), done + i + 1
            counts[d] = c[-1]
        done += len(src)
        if done == mark:
            out.append((worst / STATED_PERIOD, at))
            mark = next(marks, -1)
    return out


def split(horizons: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Ranges [a, b) of at most CHUNK positions covering [0, max(horizons)), cut at each."""
    a = 0
    for h in sorted(horizons):
        while a < h:
            b = min(h, a + CHUNK)
            yield a, b
            a = b


def tokentape_rows(label: str, units: Sequence[int], horizons: Sequence[int]) -> list[dict]:
    """Rows for one blend: the sequence from ``source_and_draw`` in chunks, timed."""
    timer = {"s": 0.0}
    marks: dict[int, float] = {}

    def chunks() -> Iterator[np.ndarray]:
        start = time.perf_counter()
        blend = Blend.build(units)
        timer["s"] += time.perf_counter() - start
        for a, b in split(horizons):
            start = time.perf_counter()
            src = blend.source_and_draw(np.arange(a, b, dtype=np.int64))[0]
            timer["s"] += time.perf_counter() - start
            if b in horizons:
                marks[b] = timer["s"]
            yield src

    devs = prefix_deviation(chunks(), horizons)
    weights = "/".join(f"{u:,}" for u in units) + f" over {sum(units):,}"
    return [
        _row("tokentape", tokentape_version, f"{label} {weights}", h, dev, at, marks[h])
        for h, (dev, at) in zip(sorted(horizons), devs, strict=True)
    ]


def _row(
    system: str, version: str, weights: str, n: int, dev: float, at: int, seconds: float
) -> dict[str, Any]:
    return {
        "system": system,
        "version": version,
        "weights": weights,
        "N": n,
        "max_prefix_deviation": dev,
        "n_at_worst": at,
        "seconds": seconds,
    }


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [x for x in (proc.stderr + proc.stdout).splitlines() if x.strip()]
    return lines[-1].strip() if lines else f"exit {proc.returncode}"


def ensure_grain(venv: Path) -> tuple[Path | None, str]:
    """The peers venv's python with ``GRAIN_PIN`` installed (created if missing), or None and
    why not. The second value says what was done."""
    python = venv / "bin" / "python"
    start = time.perf_counter()
    try:
        if not python.exists():
            made = _run([sys.executable, "-m", "venv", str(venv)], 300)
            if made.returncode != 0:
                return None, f"python -m venv {venv} failed: {_last_line(made)}"
        pin = GRAIN_PIN.split("==")[1]
        probe = "from importlib.metadata import version; print(version('grain'))"
        have = _run([str(python), "-c", probe], 60)
        if have.returncode == 0 and have.stdout.strip() == pin:
            return python, f"{GRAIN_PIN} already in {venv}"
        cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        got = _run([*cmd, GRAIN_PIN], 900)
        if got.returncode != 0:
            return None, f"pip install {GRAIN_PIN} into {venv} failed: {_last_line(got)}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"setting up {venv} failed: {exc}"
    return python, f"installed {GRAIN_PIN} into {venv} in {time.perf_counter() - start:.0f} s"


def grain_rows(
    python: Path, horizons: Sequence[int], budget: float
) -> tuple[list[dict], list[str]]:
    """Rows for Grain's ``MapDataset.mix`` (run by ``python``), and notes."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "grain-mix-sources.npy"
    args = [str(path), str(budget), ",".join(map(str, horizons)), ",".join(map(str, WEIGHTS))]
    try:
        proc = _run([str(python), "-c", GRAIN_CHILD, *args], 3600)
    except subprocess.TimeoutExpired:
        return [], ["grain: skipped (the child ran over an hour)"]
    if proc.returncode != 0:
        return [], [f"grain: skipped (its run failed: {_last_line(proc)})"]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    notes = [
        f"grain {info['version']}: sources of {info['source_lengths'][0]:,} elements each, "
        f"mixture length {info['length']:,} (no source runs out)"
    ]
    if info["order_error"]:
        notes.append(f"grain: {info['order_error']}")
    for s in info["skipped"]:
        notes.append(
            f"grain: N = {s['horizon']:,} not run: reading it would take about "
            f"{s['projected_s']:.0f} s (projected), over --grain-budget {budget:.0f} s"
        )
    src = np.load(path, allow_pickle=False)
    diff = first_difference(src, Blend.build(exact_weights(WEIGHTS, NAMES)[0]))
    notes.append(
        f"grain: its sequence of sources equals tokentape's exact blend over all {len(src):,}"
        if diff is None
        else f"grain: its sequence of sources first differs from tokentape's at position {diff:,}"
    )
    ran = [m["horizon"] for m in info["marks"]]
    devs = prefix_deviation((src[a:b] for a, b in split(ran)), ran) if ran else []
    rows = [
        _row(
            "grain",
            info["version"],
            "MapDataset.mix [60, 30, 10]",
            m["horizon"],
            d,
            at,
            m["seconds"],
        )
        for m, (d, at) in zip(info["marks"], devs, strict=True)
    ]
    return rows, notes


def first_difference(src: np.ndarray, blend: Blend) -> int | None:
    """The first position where ``src`` and the blend's sources differ, or None."""
    for a, b in split([len(src)]):
        ours = blend.source_and_draw(np.arange(a, b, dtype=np.int64))[0]
        off = np.flatnonzero(ours != src[a:b])
        if len(off):
            return a + int(off[0])
    return None


def table(rows: list[dict]) -> str:
    head = f"{'system':<10} {'version':<8} {'weights':<42} {'N':>12} {'max dev':>8} "
    head += f"{'n at worst':>12} {'seconds':>8}"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['system']:<10} {r['version']:<8} {r['weights']:<42} {r['N']:>12,} "
            f"{r['max_prefix_deviation']:>8.1f} {r['n_at_worst']:>12,} {r['seconds']:>8.2f}"
        )
    return "\n".join(lines)


# --- the shared corpus and tokentape's stores -----------------------------------------------

SEQ_LEN = 2048
CORPUS = (6000, 3000, 1000)  # samples per source, 60/30/10
CHILDREN = ROOT / "benchmarks" / "peers"


def build_corpus(out: Path, sizes: Sequence[int]) -> None:
    """``out/corpus/src<d>.npy``: source d's uint16 stream of ``sizes[d] * L + 1`` random byte
    ids, window k carrying (d, k) in its tokens 1..4 (benchmarks/peers/common.py); and
    tokentape's store of each stream (one document, then EOD) under ``out/tokentape/s<d>``."""
    meta = out / "corpus" / "meta.json"
    want = {"sizes": list(sizes), "seq_len": SEQ_LEN}
    if meta.exists() and json.loads(meta.read_text()) == want:
        return
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer("bytes")
    for d, n in enumerate(sizes):
        stream = np.random.default_rng(d).integers(0, 256, n * SEQ_LEN + 1, dtype=np.uint16)
        k = np.arange(n)
        stream[k * SEQ_LEN + 1] = d
        for i, shift in enumerate((16, 8, 0)):
            stream[k * SEQ_LEN + 2 + i] = (k >> shift) & 0xFF
        tmp = out / "corpus" / f"src{d}.tmp.npy"
        np.save(tmp, stream)
        tmp.replace(out / "corpus" / f"src{d}.npy")
        write_store(out / "tokentape" / f"s{d}", stream, tok)
        _say(f"corpus: source {d}, {n:,} samples of {SEQ_LEN + 1} tokens")
    meta.write_text(json.dumps(want))


def write_store(directory: Path, stream: np.ndarray, tok: Any) -> None:
    """A tokentape store of one document, ``stream`` then EOD (replaced if present)."""
    if directory.exists():
        for f in directory.iterdir():
            f.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(directory, "uint16", 1 << 26)
    writer.add(np.append(stream, tok.eod_id), np.array([len(stream) + 1]))
    shards = writer.finish()
    stored = tok.stored_file()
    if stored is not None:
        write_atomic(directory / stored[0], stored[1])
    manifest = Manifest(
        dtype="uint16",
        vocab_size=tok.vocab_size,
        eod_id=tok.eod_id,
        tokenizer=tokenizer_manifest(tok),
        shards=tuple(shards),
        n_tokens=sum(s.n_tokens for s in shards),
        n_docs=sum(s.n_docs for s in shards),
        content_hash=content_hash(shards, "uint16"),
        filters={},
        inputs={},
        job="peers_bench",
        created_by="peers_bench",
    )
    write_atomic(directory / MANIFEST_NAME, manifest.to_json().encode())


def _say(message: str) -> None:
    print(f"[peers_bench] {message}", file=sys.stderr, flush=True)


# --- the peers side by side ----------------------------------------------------------------

PEERS_PINS = tuple(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "peers"
    ]
)
"""The ``peers`` extra of pyproject.toml: what this benchmark installs into its own venv."""
MODULES = {"grain": "grain", "streaming": "mosaicml-streaming", "litdata": "litdata"}
SYSTEMS = ("tokentape", "grain", "streaming", "litdata")
START_HORIZONS = (10**5, 10**6, 10**7)
RESUME_TO = [2, 3, 1]
RESUME_BEFORE, RESUME_AFTER = 5, 768  # steps of 2 x 64 before; samples after (all ranks)


HORIZON_NOTES = [
    "horizon: tokentape, the plan's total_samples; grain, the mixture cut at it (sources "
    "repeated); streaming, epoch_size (the epoch's sample order is built at the first batch); "
    "litdata has none (an epoch ends when a source runs out: ~10,000 samples here), so its "
    "three start-up cells are one configuration",
    "2 workers: tokentape Loader(prefetch=2) (a thread; in brackets TapeDataset in a torch "
    "DataLoader, 2 processes); grain mp_prefetch(num_workers=2); streaming and litdata "
    "num_workers=2. Throughput after the first batch; the machine's cores are shared",
    "peak RSS: the process's peak resident memory from after the imports (peak reset there, "
    "Linux VmHWM) to the first batch, minus the resident memory after the imports (0 workers); "
    "start-up: every file under bench-out/peers is dropped from the page cache before each "
    "system's first start-up run (then read from disk, alike for all)",
    "mixture: grain and tokentape, the source sequence over every prefix to 10^5 / 10^6 "
    "(first table); streaming and litdata, the sources of the samples their loaders read",
]


def ensure_peers(venv: Path) -> tuple[Path | None, dict[str, str]]:
    """The peers venv's python with ``PEERS_PINS`` (installed when missing: one pip call, then
    one per pin if that fails), and per peer its version or why it is skipped."""
    python, how = ensure_grain(venv)
    if python is None:
        return None, {name: f"skipped ({how})" for name in MODULES}
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if any(_version(python, dist) != pin.split("==")[1] for pin, dist in _pins()):
        _say(f"installing {' '.join(PEERS_PINS[1:])} into {venv} (a few minutes)")
        try:
            if _run([*pip, *PEERS_PINS], 1800).returncode != 0:
                for pin in PEERS_PINS[1:]:
                    _run([*pip, pin], 1800)
        except subprocess.TimeoutExpired:
            pass
    got = {}
    for name, dist in MODULES.items():
        pin = next(p for p in PEERS_PINS if p.startswith(dist + "=="))
        have = _version(python, dist)
        got[name] = have if have else f"skipped (pip install {pin} failed)"
    return python, got


def _pins() -> list[tuple[str, str]]:
    return [(pin, pin.split("==")[0]) for pin in PEERS_PINS]


def _version(python: Path, dist: str) -> str | None:
    probe = f"from importlib.metadata import version; print(version({dist!r}))"
    try:
        got = _run([str(python), "-c", probe], 120)
    except subprocess.TimeoutExpired:
        return None
    return got.stdout.strip() if got.returncode == 0 else None


class Child:
    """One system's child script (benchmarks/peers/<system>_child.py) and its python."""

    def __init__(self, system: str, python: Path, root: Path) -> None:
        self.system, self.python, self.root = system, python, root
        self.script = CHILDREN / f"{system}_child.py"

    def __call__(self, measure: str, timeout: float = 180, **fields: Any) -> dict[str, Any]:
        """The child's reply, or ``{"error": line}``."""
        args = json.dumps(dict(fields, root=str(self.root), measure=measure))
        _say(f"{self.system}: {measure} {json.dumps(fields)}")
        try:
            proc = _run([str(self.python), "-W", "ignore", str(self.script), args], timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"over {timeout:.0f} s"}
        if proc.returncode != 0:
            return {"error": _last_line(proc)}
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def evict(root: Path) -> None:
    """Every file under ``root`` written back and dropped from the page cache, so that each
    system's start-up reads its files the same way, from disk. (Pages just written, or read
    sequentially, sit in the cache in larger blocks, and a process touching them maps more:
    the start-up memory row would measure how the files came into the cache.)"""
    if not hasattr(os, "posix_fadvise"):
        return
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def measure_system(child: Child, quick: bool, budget: float) -> dict[str, Any]:
    """Every measure of one system (a dict of cells; errors as text)."""
    out: dict[str, Any] = {}
    if child.system in ("streaming", "litdata"):
        out["write"] = child("write")
    evict(child.root)  # start-up from a cold page cache, alike for every system
    out["startup"] = {h: child("startup", horizon=h) for h in START_HORIZONS}
    batches = 60 if quick else 300
    horizon = 10**6
    paths = ["loader", "torch"] if child.system == "tokentape" else [""]
    tp: dict[str, Any] = {}
    for path in paths:
        for workers in (0, 2):
            tp[f"{path}{workers}"] = child(
                "throughput", horizon=horizon, workers=workers, batches=batches, path=path
            )
        tp[f"{path}0again"] = child(
            "throughput", horizon=horizon, workers=0, batches=batches, path=path
        )
    out["throughput"] = tp
    if child.system in ("streaming", "litdata"):
        for n in (10**5,) if quick else (10**5, 10**6):
            path = OUT / f"{child.system}-sources-{n}.npy"
            got = child("order", budget + 120, horizon=n, budget=budget, out=str(path))
            if "error" not in got:
                src = np.load(path, allow_pickle=False)
                dev, at = prefix_deviation(iter([src]), [len(src)])[0]
                got.update(max_dev=dev, at=at)
            out[f"order{n}"] = got
    fields = {"horizon": horizon, "before": RESUME_BEFORE, "after": RESUME_AFTER}
    out["resume"] = child("resume", timeout=600, to=RESUME_TO, **fields)
    out["roundtrip"] = child("roundtrip", horizon=horizon, before=5, after=3)
    return out


def determinism(tp: dict[str, Any], path: str) -> tuple[str, str]:
    """(across restarts, across 0 / 2 workers) from the identities of the throughput runs."""
    runs = [tp.get(f"{path}0"), tp.get(f"{path}0again"), tp.get(f"{path}2")]
    if any(r is None or "error" in r for r in runs):
        return "n/a", "n/a"
    a, b, c = (np.asarray(r["ids"], dtype=np.int64) for r in runs)
    restart = "same order" if np.array_equal(a, b) else "differs"
    n = min(len(a), len(c))
    if np.array_equal(a[:n], c[:n]):
        workers = "same order"
    else:
        key = lambda z: sorted(map(tuple, z.tolist()))  # noqa: E731
        workers = "same samples, other order" if key(a[:n]) == key(c[:n]) else "differs"
    return restart, workers


def _better(tp: dict[str, Any], path: str, workers: int) -> dict[str, Any]:
    """The throughput run to show: with 0 workers the faster of the two fresh-process runs
    (the first may read a cold page cache: every system gets the same second chance)."""
    runs = [tp[f"{path}{workers}"]]
    if workers == 0 and f"{path}0again" in tp:
        runs.append(tp[f"{path}0again"])
    ok = [r for r in runs if "error" not in r]
    return max(ok, key=lambda r: r["samples_per_s"]) if ok else runs[0]


def cells(system: str, m: dict[str, Any], devs: dict[str, str]) -> dict[str, str]:
    """One column of the side-by-side table."""
    col: dict[str, str] = {}
    col["mixture: max prefix deviation"] = devs.get(system, "n/a")
    for h, r in m["startup"].items():
        label = f"10^{len(str(h)) - 1}"
        col[f"start-up to 1st batch @{label} (s)"] = _err(r) or f"{r['seconds']:.2f}"
        col[f"peak RSS over imports @{label} (MiB)"] = (
            _err(r) or f"{r['rss_peak'] - r['rss_base']:.0f}"
        )
    tp = m["throughput"]
    first = "loader" if system == "tokentape" else ""
    for w in (0, 2):
        r = _better(tp, first, w)
        cell = _err(r) or f"{r['samples_per_s']:,.0f}"
        if system == "tokentape":
            t = _better(tp, "torch", w)
            cell += " (torch " + (_err(t) or f"{t['samples_per_s']:,.0f}") + ")"
        col[f"samples/s, batch 64, {w} workers"] = cell
    r = tp[f"{first}0"]
    col["batch span (median, samples)"] = _err(r) or f"{r['span']:,.0f}"
    res = m["resume"]
    for to in RESUME_TO:
        col[f"resume 2 -> {to} ranks"] = _err(res) or res["result"][str(to)]
    restart, workers = determinism(tp, first)
    col["same order across restarts"] = restart
    col["same order, 0 vs 2 workers"] = workers
    rt = m["roundtrip"]
    col["state JSON round trip resumes"] = _err(rt) or rt["result"]
    return col


def _err(r: dict[str, Any]) -> str | None:
    return f"error: {r['error'][:60]}" if "error" in r else None


CELL = 34  # a longer cell is cut, its whole text in a numbered note under the table


def side_by_side(columns: dict[str, dict[str, str]], notes: list[str]) -> str:
    """The table (rows = measures, columns = systems); cut cells' texts go to ``notes``."""
    names = list(columns)
    rows = list(next(iter(columns.values())))
    columns = {n: dict(c) for n, c in columns.items()}
    for n, c in columns.items():
        for r in rows:
            if len(c.get(r, "")) > CELL:
                notes.append(f"[{len(notes) + 1}] {n}, {r}: {c[r]}")
                c[r] = c[r][: CELL - 6].rstrip() + f" [{len(notes)}]"
    width = [max(len(n), *(len(c.get(r, "")) for r in rows)) for n, c in columns.items()]
    left = max(len(r) for r in rows)
    lines = [
        f"{'measure':<{left}} | "
        + " | ".join(f"{n:<{w}}" for n, w in zip(names, width, strict=True))
    ]
    lines.append("-" * len(lines[0]))
    for r in rows:
        vals = [f"{columns[n].get(r, ''):<{w}}" for n, w in zip(names, width, strict=True)]
        lines.append(f"{r:<{left}} | " + " | ".join(vals))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches, smaller horizons")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--peers-venv",
        type=Path,
        default=ROOT / "bench-out" / "peers-venv",
        help="the virtual environment the peers run in (default: bench-out/peers-venv)",
    )
    parser.add_argument(
        "--grain-budget",
        type=float,
        default=180.0,
        help="seconds a peer may take to reach a mixture horizon before it is cut (default 180)",
    )
    args = parser.parse_args(argv)
    horizons = QUICK if args.quick else HORIZONS
    notes: list[str] = []
    rows: list[dict] = []
    started = time.perf_counter()
    OUT.mkdir(parents=True, exist_ok=True)
    build_corpus(OUT, CORPUS)
    python, versions = ensure_peers(args.peers_venv.absolute())
    versions["tokentape"] = tokentape_version
    if python and not versions["grain"].startswith("skipped"):
        got, more = grain_rows(python, horizons, args.grain_budget)
        rows += got
        notes += more
    rows += tokentape_rows("exact", exact_weights(WEIGHTS, NAMES)[0], horizons)
    rows += tokentape_rows("2^16", rational_weights(WEIGHTS, NAMES, 65536), horizons)
    devs = {
        system: ", ".join(
            f"{r['max_prefix_deviation']:.1f} @{r['N']:.0e}"
            for r in rows
            if r["system"] == system and not r["weights"].startswith("2^16")
        )
        for system in ("tokentape", "grain")
    }
    measured: dict[str, dict[str, Any]] = {}
    for system in SYSTEMS:
        if versions[system].startswith("skipped"):
            notes.append(f"{system}: {versions[system]}")
            continue
        py = Path(sys.executable) if system == "tokentape" else python
        assert py is not None
        measured[system] = measure_system(Child(system, py, OUT), args.quick, args.grain_budget)
        for key, r in measured[system].items():
            if key.startswith("order"):
                if "error" in r:
                    notes.append(f"{system}: mixture order failed: {r['error']}")
                    continue
                devs[system] = (devs.get(system, "") + ", " if system in devs else "") + (
                    f"{r['max_dev']:.1f} @{r['samples']:.0e}"
                )
                if r["samples"] < int(key[5:]):
                    notes.append(
                        f"{system}: mixture read {r['samples']:,} of {int(key[5:]):,} samples "
                        f"in the {args.grain_budget:.0f} s budget"
                    )
    columns = {f"{s} {versions[s]}": cells(s, m, devs) for s, m in measured.items()}
    notes += HORIZON_NOTES
    if args.json:
        print(
            json.dumps(
                {
                    "mixture_rows": rows,
                    "table": columns,
                    "raw": _strip_ids(measured),
                    "versions": versions,
                    "notes": notes,
                },
                indent=2,
            )
        )
    else:
        print("Mixture 60/30/10: largest deviation of any prefix n <= N from n * (0.6, 0.3, 0.1)")
        print(table(rows))
        print()
        print("Side by side (same tokens; 3 sources 60/30/10, seq_len 2048, batch 64 x 2049):")
        cut: list[str] = []
        print(side_by_side(columns, cut))
        print("\n".join(cut + notes))
    _say(f"done in {time.perf_counter() - started:.0f} s")
    return 0


def _strip_ids(measured: dict[str, Any]) -> Any:
    """The measures without the identity lists (kept out of --json)."""
    if isinstance(measured, dict):
        return {k: _strip_ids(v) for k, v in measured.items() if k != "ids"}
    return measured


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

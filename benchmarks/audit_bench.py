"""The audit tools at scale: replay one step of B = 1024, L = 4096 from a store of 10**9 tokens.

Builds (once, cached under ``bench-out/audit/``) two synthetic token stores written directly with
``ShardWriter``, not through a tokenizer: ``web`` with ``--tokens`` uint16 tokens (default 10**9,
shards of 256 MiB) and ``code`` with a tenth of that. Documents have lognormal lengths (mean about
1,500 tokens, median about 490, the longest a few 100k), each followed by the end-of-document id.
Token ids are lowercase ASCII letters and spaces, and the manifest records the ``bytes`` tokenizer
(vocabulary 257, EOD 256). That makes the store a valid tokentape store that ``open_source`` and
``tokentape verify`` accept, and ``preview()`` can decode its text. The plan is ``web`` : ``code``
= 3 : 1, ``seq_len`` 4096, a horizon of 10**8 samples (97,656 whole steps of 1024),
``max_repeats`` 1e9. It is resolved and written as ``plan.json`` on every run, as
``tokentape plan --out`` would.

Measured side by side in one run, rounds interleaved, median of ``--reps`` (library) or
``--cli-reps`` (subprocesses):

1. **replay, library**: ``Batcher(plan)`` (tape build, opening both stores) + ``replay()`` of one
   step (uniform schedule, global batch 1024) at steps 0, 10**4, 97,655 (the last whole step of the
   horizon) and 10**7 (beyond the horizon: the tape has no end). Then ``top_documents()`` and
   ``preview()`` of the top 10. Once per step first on a *cold* store: every shard and index
   file is evicted from the page cache with ``posix_fadvise(DONTNEED)`` just before, and the
   bytes the process made the kernel read from disk are taken from ``/proc/self/io``. The cold
   replay is done twice: as the library does it, and with ``madvise(MADV_RANDOM)`` on the
   shards' memory maps (reaching into ``Source._shards``), which turns off the kernel's
   read-around on page faults (the device's ``read_ahead_kb`` is printed). After that the stores
   are read once (page-cached) and the warm rounds run.
2. **replay, command in-process**: ``tokentape._src.program.main(["replay", PLAN, "--step", N,
   "--global-batch", "1024"])`` with stdout captured. This is the command's own work without
   interpreter start-up.
3. **replay, CLI**: the same command as a subprocess (the ``tokentape`` console script), text
   and ``--json``: wall time including Python start-up and imports. Measured in the same rounds:
   the bare interpreter (``python -c pass``), ``python -c "import tokentape._src.audit.replay"`` and
   ``python -c "import tokentape._src.program"`` (what the console script imports).
4. **locate**: ``locate()`` up to the horizon with a uniform schedule (B = 1024) of three
   documents: a short ``web`` document (300-600 tokens, 1-2 samples), the longest ``web``
   document and the longest ``code`` document (many samples times many passes). The tape cache
   is cleared before each call, so the call includes opening the store and building the tape.
   The same documents go through ``tokentape locate PLAN SOURCE DOC --global-batch 1024`` as a
   subprocess, text (50 rows printed) and ``--json`` (every row).

Checks: the CLI's ``--json`` tokens hash equals the library's for each step. Each located
position resolves back to a sample of the document's source that overlaps the document.

Ratios are what matter: the machine is noisy and nothing here asserts an absolute time. The aim
(from the issue) is replaying a step in "well under a second". Each row shows its time / 1 s.

    python benchmarks/audit_bench.py [--tokens 1e9] [--reps 5] [--cli-reps 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import io
import json
import mmap
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.audit.locate import locate
from tokentape._src.audit.replay import preview, replay, top_documents
from tokentape._src.audit.runs import tape_of
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan, check_budgets, resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.program import main as cli_main
from tokentape._src.store.atomic import write_atomic
from tokentape._src.store.format import MANIFEST_NAME, Manifest, content_hash, read_manifest
from tokentape._src.store.reader import Source
from tokentape._src.store.tokenizers import ByteTokenizer, tokenizer_manifest
from tokentape._src.store.writer import ShardWriter
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import hash_dtype
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.schedule import Schedule
from tokentape._src.util.version import __version__

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench-out" / "audit"

SEQ_LEN = 4096
BATCH = 1024
HORIZON = 10**8
SEED = 1234
TOP = 10
PREVIEW = 80
TARGET_S = 1.0

# The synthetic stores. Changing any of these makes a new cache key (the manifest records them).
GENERATOR = {
    "version": 1,
    "dtype": "uint16",
    "shard_mib": 256,
    "chunk_tokens": 2**25,
    "length": "lognormal",
    "mu": 6.19,  # mean exp(mu + sigma^2 / 2) ~ 1,500 tokens, median exp(mu) ~ 490
    "sigma": 1.5,
    "max_doc_tokens": 2_000_000,
    "alphabet": "abcdefghijklmnopqrstuvwxyz" + " " * 6,  # 32 symbols: bytes & 31 picks one
}
SOURCES = (("web", 3, 1.0, 1), ("code", 1, 0.1, 2))  # name, weight, share of --tokens, seed


# --- the synthetic stores -------------------------------------------------------------------


def doc_lengths(rng: np.random.Generator, total: int) -> np.ndarray:
    """Document lengths (each with its EOD token) summing to exactly ``total``."""
    mean = np.exp(GENERATOR["mu"] + GENERATOR["sigma"] ** 2 / 2)
    parts: list[np.ndarray] = []
    have = 0
    while have < total:
        n = int((total - have) / mean * 1.2) + 64
        draw = rng.lognormal(GENERATOR["mu"], GENERATOR["sigma"], n)
        lengths = np.minimum(draw.astype(np.int64), GENERATOR["max_doc_tokens"] - 1) + 1
        parts.append(np.maximum(lengths, 2))
        have += int(parts[-1].sum())
    lengths = np.concatenate(parts)
    ends = np.cumsum(lengths)
    last = int(np.searchsorted(ends, total))  # the first document reaching the total
    lengths = lengths[: last + 1].copy()
    lengths[last] = total - (int(ends[last - 1]) if last else 0)  # cut to fit: >= 1
    return lengths


def write_store(directory: Path, n_tokens: int, seed: int) -> dict[str, Any]:
    """Write a store of ``n_tokens`` synthetic tokens (reused when its manifest matches)."""
    params = {"generator": GENERATOR, "n_tokens": n_tokens, "seed": seed}
    if (directory / MANIFEST_NAME).exists():
        manifest = read_manifest(directory)
        if manifest.extra.get("synthetic") == params:
            return {"cached": True, "seconds": 0.0}
        shutil.rmtree(directory)
    started = time.perf_counter()
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    tok = ByteTokenizer()
    alphabet = np.frombuffer(GENERATOR["alphabet"].encode(), dtype=np.uint8).astype(np.uint16)
    shard_tokens = GENERATOR["shard_mib"] * 2**20 // 2
    writer = ShardWriter(partial, GENERATOR["dtype"], shard_tokens)
    written = 0
    while written < n_tokens:
        want = min(GENERATOR["chunk_tokens"], n_tokens - written)
        lengths = doc_lengths(rng, want)
        tokens = alphabet[np.frombuffer(rng.bytes(want), dtype=np.uint8) & 31]
        tokens[np.cumsum(lengths) - 1] = tok.eod_id
        writer.add(tokens, lengths)
        written += want
    shards = writer.finish()
    manifest = Manifest(
        dtype=GENERATOR["dtype"],
        vocab_size=tok.vocab_size,
        eod_id=tok.eod_id,
        tokenizer=tokenizer_manifest(tok),
        shards=tuple(shards),
        n_tokens=sum(s.n_tokens for s in shards),
        n_docs=sum(s.n_docs for s in shards),
        content_hash=content_hash(shards, GENERATOR["dtype"]),
        filters={},
        inputs={"synthetic": "benchmarks/audit_bench.py"},
        job="sha256:" + hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest(),
        created_by=f"tokentape {__version__} (benchmarks/audit_bench.py)",
        extra={"synthetic": params},
    )
    write_atomic(partial / MANIFEST_NAME, manifest.to_json().encode())
    os.replace(partial, directory)
    return {"cached": False, "seconds": time.perf_counter() - started}


def build(out: Path, tokens: int) -> tuple[Path, Path, dict[str, dict[str, Any]]]:
    """The stores (cached), the plan TOML and the resolved ``plan.json``."""
    root = out / f"t{tokens}"
    root.mkdir(parents=True, exist_ok=True)
    built = {}
    for name, _, share, seed in SOURCES:
        n = max(int(tokens * share), 2 * SEQ_LEN + 2)
        print(f"store {name}: {n:,} tokens ...", end=" ", flush=True)
        built[name] = write_store(root / name, n, seed)
        info = built[name]
        print("cached" if info["cached"] else f"written in {info['seconds']:.1f} s", flush=True)
    lines = [f"seq_len = {SEQ_LEN}", f"seed = {SEED}", f"total_samples = {HORIZON}", ""]
    for name, weight, _, _ in SOURCES:
        lines += ["[[source]]", f'name = "{name}"', f'path = "{name}"', f"weight = {weight}"]
        lines += ["max_repeats = 1e9", ""]
    toml = root / "plan.toml"
    toml.write_text("\n".join(lines))
    plan = resolve_plan(load_plan_spec(toml), str(toml))
    check_budgets(plan, str(toml))
    plan_json = root / "plan.json"
    write_atomic(plan_json, plan.to_json().encode())
    return toml, plan_json, built


def store_files(plan: Plan) -> list[Path]:
    files = []
    for s in plan.sources:
        files += sorted(Path(s.path).glob("part-*"))
    return files


def read_ahead_kb(path: Path) -> str:
    """The read-ahead of the block device holding ``path`` (Linux sysfs), or "?"."""
    dev = os.stat(path).st_dev
    queue = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for candidate in (queue / "queue", queue / ".." / "queue"):
        try:
            return (candidate / "read_ahead_kb").read_text().strip()
        except OSError:
            continue
    return "?"


def evict(files: list[Path]) -> None:
    """Drop these files' pages from the page cache (clean pages, files nobody has mapped)."""
    gc.collect()  # memory maps of earlier Batchers
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def page_in(files: list[Path]) -> tuple[int, float]:
    """Read every file once; returns (bytes, seconds)."""
    started = time.perf_counter()
    total = 0
    buf = bytearray(64 * 2**20)
    for path in files:
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total, time.perf_counter() - started


# --- measuring ------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return float(np.median(np.asarray(values)))


def fmt_s(x: float) -> str:
    return f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.2f} s"


def run_cli(argv: list[str]) -> tuple[float, str]:
    """Wall time of a subprocess and its stdout."""
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr}")
    return seconds, done.stdout


def in_process(argv: list[str]) -> tuple[float, str]:
    buf = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        rc = cli_main(argv)
    seconds = time.perf_counter() - started
    if rc != 0:
        raise RuntimeError(f"tokentape {' '.join(argv)}: exit {rc}")
    return seconds, buf.getvalue()


def tokentape_cmd() -> list[str]:
    script = Path(sys.executable).parent / "tokentape"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tokentape"]


def disk_read_bytes() -> int | None:
    """Bytes this process has caused to be read from storage (Linux), page faults included."""
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return None
    return int(dict(line.split(": ") for line in text.splitlines())["read_bytes"])


def advise_random(batcher: Batcher) -> None:
    """``madvise(MADV_RANDOM)`` on every shard's memory map: no read-around on a page fault."""
    for src in batcher.sources:
        for shard in src._shards:
            shard._mmap.madvise(mmap.MADV_RANDOM)


def replay_once(plan: Plan, step: int, schedule: Schedule, advise: bool = False) -> dict[str, Any]:
    read0 = disk_read_bytes()
    t0 = time.perf_counter()
    batcher = Batcher(plan, hash_dtype(plan))
    if advise:
        advise_random(batcher)
    t1 = time.perf_counter()
    r = replay(plan, step, schedule, batcher)
    t2 = time.perf_counter()
    hits = top_documents(r, batcher)
    texts = [preview(batcher, h.source, h.doc, PREVIEW) for h in hits[:TOP]]
    t3 = time.perf_counter()
    read1 = disk_read_bytes()
    assert len(texts) == min(TOP, len(hits)) and all(texts)
    return {
        "batcher": t1 - t0,
        "replay": t2 - t1,
        "top": t3 - t2,
        "total": t3 - t0,
        "hash": r.tokens_hash,
        "docs": len(hits),
        "preview": texts[0],
        "read": None if read0 is None or read1 is None else read1 - read0,
    }


def pick_docs(plan: Plan) -> list[tuple[str, int, str]]:
    """(source, doc, label): a short web document, the longest web and code documents."""
    picked = []
    for name in ("web", "code"):
        src = Source(next(s.path for s in plan.sources if s.name == name))
        lengths = np.diff(np.append(src.doc_starts, src.n_tokens))
        if name == "web":
            short = int(np.flatnonzero((lengths >= 300) & (lengths <= 600))[0])
            picked.append((name, short, f"short ({int(lengths[short]):,} tokens)"))
        longest = int(np.argmax(lengths))
        picked.append((name, longest, f"longest ({int(lengths[longest]):,} tokens)"))
    return picked


def check_located(plan: Plan, found: Any) -> None:
    """Every located position resolves to a sample of the source overlapping the document."""
    pick = found.position[:: max(1, found.position.size // 200)]
    r = tape_of(plan).resolve(pick)
    assert np.all(r.source == found.source_index)
    start, end = found.span
    lo = r.sample * plan.seq_len
    assert np.all((lo < end) & (start <= lo + plan.seq_len))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=float, default=1e9, help="tokens of the web store")
    ap.add_argument("--reps", type=int, default=5, help="rounds of the library calls (median)")
    ap.add_argument("--cli-reps", type=int, default=3, help="rounds of the subprocesses")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args, unknown = ap.parse_known_args(argv)
    if unknown:
        print(f"note: ignoring arguments meant for other benchmarks: {' '.join(unknown)}")
    started = time.perf_counter()
    tokens = int(args.tokens)

    _, plan_json, built = build(args.out, tokens)
    plan = load_plan(plan_json)  # what the commands read
    schedule = Schedule.uniform(BatchConfig(1, BATCH, 1))
    stores = {s.name: Source(s.path) for s in plan.sources}
    for s in plan.sources:
        src = stores[s.name]
        lengths = np.diff(np.append(src.doc_starts, src.n_tokens))
        print(
            f"{s.name}: {src.n_tokens:,} tokens, {src.n_docs:,} documents, "
            f"{len(src.manifest.shards)} shards; doc tokens mean {lengths.mean():,.0f}, "
            f"median {np.median(lengths):,.0f}, p99 {np.percentile(lengths, 99):,.0f}, "
            f"max {lengths.max():,}, {int((lengths >= 100_000).sum())} of 100k+; "
            f"{s.n_samples:,} samples, {s.passes:,.1f} passes over the horizon"
        )
    del stores
    last_step = HORIZON // BATCH - 1  # the last step whose positions all lie in the horizon
    steps = [0, 10**4, last_step, 10**7]
    files = store_files(plan)
    print(
        f"plan: seq_len {SEQ_LEN}, horizon {HORIZON:,} samples ({last_step + 1:,} steps of "
        f"{BATCH}); cpus {os.cpu_count()}; Python {platform.python_version()}, "
        f"numpy {np.__version__}; read_ahead_kb of the stores' device: {read_ahead_kb(files[0])}"
    )

    # --- 1: library replay, cold then warm -----------------------------------------------------
    cold: dict[tuple[int, bool], dict[str, Any]] = {}
    can_advise = hasattr(mmap, "MADV_RANDOM")
    for step in steps:
        for advise in (False, True) if can_advise else (False,):
            evict(files)
            cold[(step, advise)] = replay_once(plan, step, schedule, advise)
    gc.collect()
    evict(files)
    n_bytes, page_s = page_in(files)
    print(
        f"page-in after eviction: {n_bytes / 1e9:.2f} GB in {page_s:.1f} s "
        f"({n_bytes / page_s / 1e9:.2f} GB/s: the cold reads came from there)"
    )
    warm: dict[int, list[dict[str, Any]]] = {s: [] for s in steps}
    inproc: dict[int, list[float]] = {s: [] for s in steps}
    for _ in range(args.reps):
        for step in steps:
            warm[step].append(replay_once(plan, step, schedule))
            argv = ["replay", str(plan_json), "--step", str(step), "--global-batch", str(BATCH)]
            inproc[step].append(in_process(argv)[0])
    hashes = {s: warm[s][0]["hash"] for s in steps}
    assert all(r["hash"] == hashes[s] for s in steps for r in warm[s])
    assert all(c["hash"] == hashes[s] for (s, _), c in cold.items())

    # --- 2: locate, library --------------------------------------------------------------------
    docs = pick_docs(plan)
    loc: dict[tuple[str, int], list[float]] = {(n, d): [] for n, d, _ in docs}
    counts: dict[tuple[str, int], tuple[int, int, int]] = {}
    for _ in range(args.reps):
        for name, doc, _ in docs:
            tape_of.cache_clear()
            t0 = time.perf_counter()
            found = locate(plan, name, doc, schedule)
            loc[(name, doc)].append(time.perf_counter() - t0)
            check_located(plan, found)
            n_samples = len(found.samples)
            counts[(name, doc)] = (n_samples, int(found.position.size), len(set(found.epoch)))

    # --- 3: subprocesses, interleaved ----------------------------------------------------------
    cmd = tokentape_cmd()
    bare = {
        "python -c pass": [sys.executable, "-c", "pass"],
        'python -c "import tokentape._src.audit.replay"': [
            sys.executable,
            "-c",
            "import tokentape._src.audit.replay",
        ],
        'python -c "import tokentape._src.program"': [
            sys.executable,
            "-c",
            "import tokentape._src.program",
        ],
    }
    startup: dict[str, list[float]] = {k: [] for k in bare}
    cli: dict[tuple[int, bool], list[float]] = {(s, j): [] for s in steps for j in (False, True)}
    cli_out: dict[tuple[int, bool], int] = {}
    lcli: dict[tuple[str, int, bool], list[float]] = {
        (n, d, j): [] for n, d, _ in docs for j in (False, True)
    }
    lcli_out: dict[tuple[str, int, bool], int] = {}
    for _ in range(args.cli_reps):
        for label, argv in bare.items():
            startup[label].append(run_cli(argv)[0])
        for step in steps:
            for as_json in (False, True):
                argv = [*cmd, "replay", str(plan_json), "--step", str(step)]
                argv += ["--global-batch", str(BATCH)] + (["--json"] if as_json else [])
                seconds, out = run_cli(argv)
                cli[(step, as_json)].append(seconds)
                cli_out[(step, as_json)] = len(out.encode())
                if as_json:
                    assert json.loads(out)["tokens_hash"] == hashes[step]
                else:
                    assert hashes[step] in out
        for name, doc, _ in docs:
            for as_json in (False, True):
                argv = [*cmd, "locate", str(plan_json), name, str(doc)]
                argv += ["--global-batch", str(BATCH)] + (["--json"] if as_json else [])
                seconds, out = run_cli(argv)
                lcli[(name, doc, as_json)].append(seconds)
                lcli_out[(name, doc, as_json)] = len(out.encode())
                if as_json:
                    assert json.loads(out)["count"] == counts[(name, doc)][1]

    # --- the table -----------------------------------------------------------------------------
    imp_cli = median(startup['python -c "import tokentape._src.program"'])
    rows: list[tuple[str, str, str, str, str]] = []
    for label, values in startup.items():
        rows.append(("start-up", f"`{label}`", fmt_s(median(values)), str(len(values)), ""))

    def aim(seconds: float) -> str:
        return f"{seconds / TARGET_S:.2f} of 1 s: " + ("PASS" if seconds < TARGET_S else "MISS")

    for (step, advise), c in cold.items():
        where = " (beyond the horizon)" if step > last_step else ""
        how = ", maps MADV_RANDOM" if advise else ""
        read = "" if c["read"] is None else f"; {c['read'] / 2**20:,.0f} MiB read from disk"
        rows.append(
            (
                f"replay, library, cold store{how}, step {step:,}{where}",
                f"Batcher {fmt_s(c['batcher'])} + replay {fmt_s(c['replay'])}; "
                f"top_documents + {TOP} previews {fmt_s(c['top'])}{read}",
                fmt_s(c["total"]),
                "1",
                aim(c["total"]),
            )
        )
    for step in steps:
        where = " (beyond the horizon)" if step > last_step else ""
        w = warm[step]
        b, r, t = (median([x[k] for x in w]) for k in ("batcher", "replay", "top"))
        total = median([x["total"] for x in w])
        rows.append(
            (
                f"replay, library, step {step:,}{where}",
                f"Batcher {fmt_s(b)} + replay {fmt_s(r)}; top_documents + {TOP} previews "
                f"{fmt_s(t)}; {w[0]['docs']:,} documents",
                fmt_s(total),
                str(len(w)),
                aim(total),
            )
        )
    for step in steps:
        seconds = median(inproc[step])
        rows.append(
            (
                f"replay, command in-process, step {step:,}",
                "`tokentape._src.program.main([...])`, stdout captured: no interpreter start-up",
                fmt_s(seconds),
                str(len(inproc[step])),
                aim(seconds),
            )
        )
    for step in steps:
        for as_json in (False, True):
            seconds = median(cli[(step, as_json)])
            flag = " --json" if as_json else ""
            rows.append(
                (
                    f"replay, CLI{flag}, step {step:,}",
                    f"`tokentape replay PLAN --step {step} --global-batch {BATCH}{flag}`: "
                    f"{cli_out[(step, as_json)] / 1e3:,.0f} kB out; "
                    f"{seconds / imp_cli:.2f}x `import tokentape._src.program`, "
                    f"{fmt_s(seconds - imp_cli)} above it",
                    fmt_s(seconds),
                    str(len(cli[(step, as_json)])),
                    aim(seconds),
                )
            )
    for name, doc, label in docs:
        n_samples, n_pos, n_passes = counts[(name, doc)]
        seconds = median(loc[(name, doc)])
        rows.append(
            (
                f"locate, library, {name} {label}",
                f"doc {doc:,}: {n_samples:,} samples, {n_pos:,} positions in {n_passes:,} passes",
                fmt_s(seconds),
                str(len(loc[(name, doc)])),
                f"{seconds / TARGET_S:.2f} of 1 s",
            )
        )
    for name, doc, label in docs:
        for as_json in (False, True):
            seconds = median(lcli[(name, doc, as_json)])
            flag = " --json" if as_json else ""
            rows.append(
                (
                    f"locate, CLI{flag}, {name} {label}",
                    f"`tokentape locate PLAN {name} {doc} --global-batch {BATCH}{flag}`: "
                    f"{lcli_out[(name, doc, as_json)] / 1e3:,.0f} kB out; "
                    f"{seconds / imp_cli:.2f}x `import tokentape._src.program`",
                    fmt_s(seconds),
                    str(len(lcli[(name, doc, as_json)])),
                    f"{seconds / TARGET_S:.2f} of 1 s",
                )
            )

    print(f"\npreview of step 0's top document: {warm[0][0]['preview']!r}")
    generated = [f"{k} {v['seconds']:.0f} s" for k, v in built.items() if not v["cached"]]
    print(
        f"stores: {'written this run: ' + ', '.join(generated) if generated else 'cached'}; "
        f"benchmark {time.perf_counter() - started:.0f} s in all\n"
    )
    print("| measure | detail | median | runs | vs aim |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()

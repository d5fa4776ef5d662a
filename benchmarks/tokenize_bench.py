"""Tokenization throughput: ``tokentape tokenize`` against the bare tokenizer, and its scaling.

For each tokenizer (a byte-level BPE trained here with Hugging Face ``tokenizers``, and GPT-2
through ``tiktoken``) the same documents are measured four ways, each in a fresh process,
interleaved round by round (the order reversed every other round) so that the machine's noise
hits all four alike:

- **bare**: the documents already in memory, encoded by the library's own ``encode_batch``
  (256 documents a call) on one thread: ``TOKENIZERS_PARALLELISM=false`` and
  ``RAYON_NUM_THREADS=1`` for Hugging Face, ``encode_ordinary_batch(num_threads=1)`` for
  tiktoken. Only the encoding is timed; cpu/wall and a loop of single ``encode`` calls check
  that it ran on one thread.
- **bare, 2 processes**: the same in two processes started together, each on half of the
  documents (balanced by bytes): the scaling this machine allows at that moment.
- **tokentape, 1 worker**: ``tokenize(...)`` end to end from the jsonl files (planning,
  loading the tokenizer, reading, JSON parsing, tokenizing, writing the unit files,
  assembling the shards, the manifest); the interpreter's start and imports are not timed.
- **tokentape, 2 workers**: the same with ``workers=2`` (pool start-up included).

``--layout`` chooses what tokentape reads: the jsonl files (default), or the same documents as
one big ``.jsonl.zst`` file (``zst``) or one big parquet file of a single row group
(``parquet``): there, the speed-up of 2 workers comes from cutting the one file into units.

Throughput is MB (10**6 bytes) of UTF-8 document text per second; each figure is the best of
``--rounds`` rounds. Ratios are what matter: absolute figures depend on the machine.

    python benchmarks/tokenize_bench.py [--mb 24] [--rounds 3] [--layout jsonl|zst|parquet]
        [--huge-mb 200] [--json] [--out DIR]

``--huge-mb`` adds one huge document (``hugedoc_bench.py``): peak RSS and time of ``tokentape
tokenize`` on a document of that size as one jsonl line, and of encoding it in pieces and (up
to 40 MB) whole, tokens checked against each other.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hugedoc_bench  # noqa: E402  (this folder's, found through the line above)

DEFAULT_GPT2 = REPO.parent / "shared" / "tokenizers" / "gpt2.tiktoken"
DEFAULT_OUT = REPO / "bench-out" / "tokenize"

AIM_RATIO = 0.85  # tokentape on 1 worker, as a fraction of the bare tokenizer
AIM_SPEEDUP = 1.7  # tokentape on 2 workers over 1 worker, on many files
AIM_SPEEDUP_ONE_FILE = 1.8  # the same on one big .jsonl.zst or parquet file (issue 14)
EOD = "<|endoftext|>"
BARE_BATCH = 256  # documents per encode_batch call (tokentape's worker uses the same)
MB = 1e6

SINGLE_THREAD_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- corpus -------------------------------------------------------------------------------


def _builtin_texts(work: Path) -> list[str] | None:
    """Documents of tokentape's built-in corpora, or None when the writer is not available."""
    try:
        from tokentape._src.corpora import write_builtin_corpora
    except ImportError:
        return None
    from tokentape._src.tokenize.inputs import expand_inputs, plan_units, read_documents

    sources = write_builtin_corpora(work / "builtin")
    files = expand_inputs([str(d) for d in sources.values()])
    texts: list[str] = []
    for unit in plan_units(files, 2**40):
        for part in unit.parts:
            texts.extend(read_documents(part, "text"))
    return texts


def _stdlib_texts() -> list[str]:
    """Python's documentation topics and the standard library's ``.py`` files, one per doc."""
    from pydoc_data.topics import topics

    texts = [f"{name}\n\n{body}" for name, body in sorted(topics.items())]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    return texts


def source_texts(work: Path) -> tuple[str, list[str]]:
    texts = _builtin_texts(work)
    if texts:
        return "tokentape._src.corpora (built-in corpora)", texts
    return "pydoc_data topics + stdlib .py files", _stdlib_texts()


@dataclass(frozen=True)
class Corpus:
    files: list[str]
    source: str
    n_docs: int
    text_bytes: int
    file_bytes: int


def build_corpus(work: Path, mb: float, n_files: int) -> Corpus:
    """About ``mb`` MB of document text as ``n_files`` jsonl files (reused when present)."""
    stamp_path = work / "corpus.json"
    key = {"mb": mb, "n_files": n_files, "version": 1}
    if stamp_path.exists():
        stamp = json.loads(stamp_path.read_text())
        if stamp.get("key") == key and all(Path(f).exists() for f in stamp["corpus"]["files"]):
            return Corpus(**stamp["corpus"])
    shutil.rmtree(work / "corpus", ignore_errors=True)
    (work / "corpus").mkdir(parents=True)
    source, texts = source_texts(work)
    texts = [t for t in texts if t.strip()]
    random.Random(0).shuffle(texts)  # mix prose and code in every file
    target = int(mb * MB)
    per_file = target / n_files
    files, n_docs, text_bytes, file_bytes = [], 0, 0, 0
    i = 0
    for k in range(n_files):
        path = work / "corpus" / f"part-{k:02d}.jsonl"
        written = 0
        with open(path, "w", encoding="utf-8") as f:
            while written < per_file and text_bytes < target:
                text = texts[i % len(texts)]
                i += 1
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                f.write(line)
                written += len(text.encode("utf-8"))
                text_bytes += len(text.encode("utf-8"))
                file_bytes += len(line.encode("utf-8"))
                n_docs += 1
        files.append(str(path))
    corpus = Corpus(files, source, n_docs, text_bytes, file_bytes)
    stamp_path.write_text(json.dumps({"key": key, "corpus": asdict(corpus)}))
    return corpus


def one_big_file(work: Path, corpus: Corpus, layout: str) -> list[str]:
    """The corpus's documents, in order, as one ``.jsonl.zst`` or one parquet file of a single
    row group (reused when present)."""
    if layout == "jsonl":
        return corpus.files
    path = work / "corpus" / ("big.jsonl.zst" if layout == "zst" else "big.parquet")
    if not path.exists():
        tmp = path.with_suffix(path.suffix + ".tmp")
        if layout == "zst":
            import zstandard

            data = b"".join(Path(f).read_bytes() for f in corpus.files)
            tmp.write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            texts = read_texts(corpus.files)
            pq.write_table(pa.table({"text": texts}), tmp, row_group_size=len(texts))
        tmp.replace(path)
    return [str(path)]


def read_texts(files: list[str]) -> list[str]:
    texts = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f)
    return texts


# --- tokenizers ---------------------------------------------------------------------------


def train_hf(work: Path, corpus: Corpus, vocab_size: int, train_mb: float) -> Path:
    """A byte-level BPE (``<|endoftext|>`` its one special token) trained on the corpus."""
    from tokentape._src.demo.run import train_bpe

    path = work / f"bpe-{vocab_size}.json"
    stamp = work / f"bpe-{vocab_size}.key"
    key = json.dumps({"corpus": corpus.files, "bytes": corpus.text_bytes, "train_mb": train_mb})
    if path.exists() and stamp.exists() and stamp.read_text() == key:
        return path

    def sample() -> Iterator[str]:
        budget = train_mb * MB
        for text in read_texts(corpus.files):
            if budget <= 0:
                return
            budget -= len(text)
            yield text

    train_bpe(sample(), vocab_size, path)
    stamp.write_text(key)
    return path


# --- bare baseline (runs in a fresh subprocess) -------------------------------------------


def _threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def _best_time(fn: Callable[[], object], repeats: int = 2) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _shard(texts: list[str], k: int, n: int) -> list[str]:
    """Shard ``k`` of ``n``: each document goes to the shard with the fewest bytes so far."""
    loads, mine = [0] * n, []
    for text in texts:
        j = loads.index(min(loads))
        loads[j] += len(text)
        if j == k:
            mine.append(text)
    return mine


def bare_child(spec: str, files: list[str], shard: str, check: bool) -> dict:
    """Time the bare ``encode_batch`` over the documents of ``files`` (already in memory).

    ``shard`` ``K/N`` keeps the K-th of N byte-balanced shares of the documents. The timing
    starts when a line arrives on stdin, so that N children can start together.

    With ``check``, also time ``encode_batch`` against a loop of single-document ``encode`` on
    every tenth document (equal speed means the batch call used one thread), and for Hugging
    Face ``encode_batch_fast`` (ids without offsets) against ``encode_batch``.
    """
    k, n = (int(x) for x in shard.split("/"))
    texts = _shard(read_texts(files), k, n)
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    kind, _, path = spec.partition(":")
    fast: Callable[[list[str]], int] | None = None
    if kind == "hf":
        import tokenizers

        hf = tokenizers.Tokenizer.from_file(path)
        hf.encode_special_tokens = True  # as tokentape: special-token text stays plain text

        def encode_batch(batch: list[str]) -> int:
            return sum(len(e.ids) for e in hf.encode_batch(batch, add_special_tokens=False))

        def encode_loop(batch: list[str]) -> int:
            return sum(len(hf.encode(t, add_special_tokens=False).ids) for t in batch)

        def encode_fast(batch: list[str]) -> int:
            return sum(len(e.ids) for e in hf.encode_batch_fast(batch, add_special_tokens=False))

        fast = encode_fast
    else:
        from tokentape._src.store.tokenizers import load_tokenizer

        enc = load_tokenizer(spec).encoding  # a plain tiktoken.Encoding, GPT-2 split pattern

        def encode_batch(batch: list[str]) -> int:
            return sum(map(len, enc.encode_ordinary_batch(batch, num_threads=1)))

        def encode_loop(batch: list[str]) -> int:
            return sum(len(enc.encode_ordinary(t)) for t in batch)

    def in_batches(fn: Callable[[list[str]], int], docs: list[str]) -> int:
        return sum(fn(docs[i : i + BARE_BATCH]) for i in range(0, len(docs), BARE_BATCH))

    encode_batch(texts[:8])  # warm up (thread pool, first-call costs)
    print("ready", flush=True)
    sys.stdin.readline()
    start, cpu0 = time.monotonic(), time.process_time()
    n_tokens = in_batches(encode_batch, texts)
    end, cpu = time.monotonic(), time.process_time() - cpu0
    result = {
        "start": start,
        "end": end,
        "seconds": end - start,
        "cpu_seconds": cpu,
        "cpu_per_wall": cpu / (end - start),
        "threads": _threads(),
        "n_tokens": n_tokens,
        "n_docs": len(texts),
        "text_bytes": text_bytes,
    }
    if check:
        sample = texts[::10]
        batch_s = _best_time(lambda: in_batches(encode_batch, sample))
        result["batch_vs_loop"] = _best_time(lambda: in_batches(encode_loop, sample)) / batch_s
        if fast is not None:
            result["fast_vs_batch"] = batch_s / _best_time(lambda: in_batches(fast, sample))
    return result


def measure_bare(spec: str, files: list[str], procs: int, check: bool) -> dict:
    """Bare ``encode_batch`` in ``procs`` fresh single-threaded processes started together."""
    env = {**os.environ, **SINGLE_THREAD_ENV}
    children = []
    for k in range(procs):
        cmd = [sys.executable, __file__, "--bare-child", spec, "--shard", f"{k}/{procs}"]
        cmd += ["--check"] if check else []
        children.append(
            subprocess.Popen(
                [*cmd, "--child-files", *files],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for child in children:  # all loaded and warm ...
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"bare {spec} failed:\n{child.communicate()[1]}")
        for child in children:  # ... then go, all together
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        results = []
        for child in children:
            out, err = child.communicate()
            if child.returncode != 0:
                raise RuntimeError(f"bare {spec} failed:\n{err}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    merged = dict(results[0])
    merged["seconds"] = max(r["end"] for r in results) - min(r["start"] for r in results)
    for key in ("cpu_seconds", "n_tokens", "n_docs", "text_bytes"):
        merged[key] = sum(r[key] for r in results)
    return merged


# --- tokentape ----------------------------------------------------------------------------


def tokentape_child(spec: str, files: list[str], workers: int, store: str, unit_mb: float) -> dict:
    """``tokenize(...)`` end to end from the files, with the CPU time it used (workers too)."""
    from tokentape._src.tokenize.driver import tokenize
    from tokentape._src.tokenize.job import TokenizeConfig

    config = TokenizeConfig(
        inputs=tuple(files), out=store, tokenizer=spec, workers=workers, unit_mb=unit_mb
    )
    t0, cpu0 = time.perf_counter(), time.process_time()
    summary = tokenize(config)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the pool's workers, reaped by now
    return {
        "seconds": seconds,
        "cpu_seconds": cpu + kids.ru_utime + kids.ru_stime,
        "n_tokens": summary.n_tokens,
        "n_docs": summary.n_docs,
        "text_bytes": summary.text_bytes,
        "units": summary.units,
        "content_hash": summary.content_hash,
    }


def measure_tokentape(spec: str, files: list[str], workers: int, out: Path, unit_mb: float) -> dict:
    """``tokentape_child`` in a fresh process, as a ``tokentape tokenize`` command would run.

    Only the ``tokenize(...)`` call is timed: not the interpreter's start or its imports.
    """
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, __file__, "--tokentape-child", spec, "--workers", str(workers)]
    cmd += ["--unit-mb", str(unit_mb), "--store", str(out), "--child-files", *files]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"tokentape {spec} with {workers} workers failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the benchmark ------------------------------------------------------------------------

MEASURES = ("bare", "bare2", "w1", "w2")


@dataclass
class Row:
    """One tokenizer's figures (each throughput is the best of the rounds)."""

    tokenizer: str
    text_mb: float
    bare_mbs: float
    w1_mbs: float
    ratio: float  # tokentape 1 worker / bare
    w2_mbs: float
    speedup: float  # tokentape 2 workers / 1 worker
    bare2_mbs: float
    bare_speedup: float  # bare in 2 processes / bare in 1: what this machine allows right now
    cpu_ratio: float  # bare CPU seconds / tokentape 1-worker CPU seconds (less noise-prone)
    w2_cores: float  # CPU seconds / wall seconds of the best 2-worker run
    units: int
    bare_cpu_per_wall: float
    bare_threads: int
    batch_vs_loop: float  # encode_batch speed / loop-of-encode speed (about 1 on one thread)
    fast_vs_batch: float | None  # HF encode_batch_fast speed / encode_batch speed
    tokens_match: bool
    same_store: bool
    seconds: dict[str, list[float]]


def bench_tokenizer(
    name: str,
    spec: str,
    corpus: Corpus,
    work: Path,
    rounds: int,
    unit_mb: float,
    inputs: list[str],
) -> Row:
    """Interleave the four measures, reversing their order every other round (tokentape reads
    ``inputs``, the bare tokenizer the corpus's documents)."""
    runs: dict[str, list[dict]] = {m: [] for m in MEASURES}
    for r in range(rounds):
        for what in MEASURES if r % 2 == 0 else MEASURES[::-1]:
            if what.startswith("bare"):
                procs = 2 if what == "bare2" else 1
                res = measure_bare(spec, corpus.files, procs, check=(r == 0 and procs == 1))
            else:
                workers = 2 if what == "w2" else 1
                res = measure_tokentape(spec, inputs, workers, work / "store", unit_mb)
            runs[what].append(res)
            note(f"  {name:<13} round {r + 1}/{rounds}  {what:<5} {res['seconds']:7.2f} s")
    best = {m: min(runs[m], key=lambda res: res["seconds"]) for m in MEASURES}
    bare0, w1, w2 = runs["bare"][0], runs["w1"][0], runs["w2"][0]
    text_mb = bare0["text_bytes"] / MB
    mbs = {m: text_mb / best[m]["seconds"] for m in MEASURES}
    return Row(
        tokenizer=name,
        text_mb=text_mb,
        bare_mbs=mbs["bare"],
        w1_mbs=mbs["w1"],
        ratio=mbs["w1"] / mbs["bare"],
        w2_mbs=mbs["w2"],
        speedup=mbs["w2"] / mbs["w1"],
        bare2_mbs=mbs["bare2"],
        bare_speedup=mbs["bare2"] / mbs["bare"],
        cpu_ratio=min(x["cpu_seconds"] for x in runs["bare"])
        / min(x["cpu_seconds"] for x in runs["w1"]),
        w2_cores=best["w2"]["cpu_seconds"] / best["w2"]["seconds"],
        units=w1["units"],
        bare_cpu_per_wall=bare0["cpu_per_wall"],
        bare_threads=bare0["threads"],
        batch_vs_loop=bare0["batch_vs_loop"],
        fast_vs_batch=bare0.get("fast_vs_batch"),
        tokens_match=(
            bare0["n_tokens"] + bare0["n_docs"] == w1["n_tokens"]
            and w1["text_bytes"] == bare0["text_bytes"]
            and runs["bare2"][0]["n_tokens"] == bare0["n_tokens"]
        ),
        same_store=w1["content_hash"] == w2["content_hash"],
        seconds={m: [round(x["seconds"], 3) for x in runs[m]] for m in MEASURES},
    )


def _mark(value: float, aim: float) -> str:
    return "PASS" if value >= aim else "MISS"


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def render(rows: list[Row], aim_speedup: float = AIM_SPEEDUP) -> str:
    """The figures as a Markdown table, then the checks behind them."""
    header = ["tokenizer", "text MB", "bare MB/s", "tokentape 1w MB/s", "ratio 1w/bare"]
    header += ["tokentape 2w MB/s", "speed-up 2w/1w", "bare 2 procs speed-up", "of ceiling"]
    body = [
        [
            r.tokenizer,
            f"{r.text_mb:.1f}",
            f"{r.bare_mbs:.2f}",
            f"{r.w1_mbs:.2f}",
            f"{r.ratio:.2f} {_mark(r.ratio, AIM_RATIO)}",
            f"{r.w2_mbs:.2f}",
            f"{r.speedup:.2f}x {_mark(r.speedup, aim_speedup)}",
            f"{r.bare_speedup:.2f}x",
            f"{r.speedup / r.bare_speedup:.2f}",
        ]
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |"
        for line in [header, ["-" * w for w in widths], *body]
    ]
    lines.append(f"\naims: ratio 1w/bare >= {AIM_RATIO}, speed-up 2w/1w >= {aim_speedup}x")
    lines.append(
        "'bare 2 procs speed-up': the bare tokenizer in 2 processes on byte-balanced halves, "
        "the ceiling this machine gave in this run; 'of ceiling': the 2-worker speed-up over it"
    )
    for r in rows:
        fast = "" if r.fast_vs_batch is None else f", encode_batch_fast {r.fast_vs_batch:.2f}x"
        lines.append(
            f"- {r.tokenizer}: ratio by CPU time {r.cpu_ratio:.2f}; {r.units} units; best "
            f"2-worker run kept {r.w2_cores:.2f} cores busy. Bare on one thread: cpu/wall "
            f"{r.bare_cpu_per_wall:.2f}, {r.bare_threads} threads, encode_batch "
            f"{r.batch_vs_loop:.2f}x a loop of encode{fast}. Tokens = bare + 1 EOD per doc: "
            f"{_yes(r.tokens_match)}; 1w and 2w stores identical: {_yes(r.same_store)}."
        )
    return "\n".join(lines)


def huge_documents(specs: list[tuple[str, str]], mbs: str) -> list[dict]:
    """``hugedoc_bench``'s rows for each tokenizer and document size in ``mbs``."""
    sizes = [float(x) for x in mbs.split(",") if x.strip()]
    if not sizes:
        return []
    note(f"one huge document of {mbs} MB, each tokenizer, in fresh processes")
    return hugedoc_bench.measure(specs, sizes, hugedoc_bench.WHOLE_MAX_MB)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=24.0, help="MB of document text")
    p.add_argument("--n-files", type=int, default=8, help="jsonl files to spread it over")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; best is kept")
    p.add_argument("--unit-mb", type=float, default=1.0, help="tokentape --unit-mb")
    p.add_argument("--vocab", type=int, default=16384, help="vocabulary of the trained BPE")
    p.add_argument("--train-mb", type=float, default=8.0, help="MB of text to train the BPE on")
    p.add_argument("--gpt2", type=Path, default=DEFAULT_GPT2, help="GPT-2 tiktoken ranks file")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="work directory")
    p.add_argument("--only", choices=["hf", "tiktoken"], help="run one tokenizer only")
    p.add_argument(
        "--layout",
        choices=["jsonl", "zst", "parquet"],
        default="jsonl",
        help="what tokentape reads: the jsonl files, or one big .jsonl.zst / parquet file",
    )
    p.add_argument(
        "--huge-mb",
        default="",
        help="also one huge document of these MB (comma-separated, e.g. 200): peak RSS and "
        "time of tokentape tokenize on it, tokens checked (see hugedoc_bench.py)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--bare-child", metavar="SPEC", help=argparse.SUPPRESS)
    p.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)
    p.add_argument("--tokentape-child", metavar="SPEC", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--child-files", nargs="*", dest="files_list", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.bare_child:
        print(json.dumps(bare_child(args.bare_child, args.files_list, args.shard, args.check)))
        return 0
    if args.tokentape_child:
        result = tokentape_child(
            args.tokentape_child, args.files_list, args.workers, args.store, args.unit_mb
        )
        print(json.dumps(result))
        return 0
    started = time.perf_counter()
    work: Path = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    note(f"corpus: about {args.mb:g} MB in {args.n_files} jsonl files under {work}/corpus")
    corpus = build_corpus(work, args.mb, args.n_files)
    note(f"  {corpus.n_docs} documents, {corpus.text_bytes / MB:.1f} MB text ({corpus.source})")
    inputs = one_big_file(work, corpus, args.layout)
    if args.layout != "jsonl":
        size = Path(inputs[0]).stat().st_size / MB
        note(f"  tokentape reads one file: {inputs[0]} ({size:.1f} MB)")

    specs: list[tuple[str, str]] = []
    skipped: list[str] = []
    if args.only in (None, "hf"):
        note(f"training a byte-level BPE ({args.vocab} ids) on {args.train_mb:g} MB of it")
        t0 = time.perf_counter()
        bpe = train_hf(work, corpus, args.vocab, args.train_mb)
        note(f"  {bpe} ({time.perf_counter() - t0:.1f} s)")
        specs.append((f"hf-bpe-{args.vocab // 1024}k", f"hf:{bpe}"))
    if args.only in (None, "tiktoken"):
        if args.gpt2.is_file():
            specs.append(("tiktoken-gpt2", f"tiktoken:{args.gpt2.resolve()}"))
        else:
            skipped.append(f"tiktoken-gpt2: {args.gpt2} not found (pass --gpt2 PATH)")
            note(f"note: {args.gpt2} not found; skipping tiktoken GPT-2 (pass --gpt2 PATH)")

    rows = []
    for name, spec in specs:
        note(f"{name}: {args.rounds} interleaved rounds of {' / '.join(MEASURES)}")
        rows.append(bench_tokenizer(name, spec, corpus, work, args.rounds, args.unit_mb, inputs))
    huge = huge_documents(specs, args.huge_mb)
    aim_speedup = AIM_SPEEDUP if args.layout == "jsonl" else AIM_SPEEDUP_ONE_FILE

    elapsed = time.perf_counter() - started
    if args.json:
        report = {
            "aims": {"ratio": AIM_RATIO, "speedup": aim_speedup},
            "corpus": asdict(corpus),
            "rounds": args.rounds,
            "unit_mb": args.unit_mb,
            "layout": args.layout,
            "seconds": elapsed,
            "rows": [asdict(r) for r in rows],
            "huge_document": huge,
            "skipped": skipped,
        }
        print(json.dumps(report, indent=2))
    else:
        print(
            f"\nTokenization throughput, MB of UTF-8 text per second, best of {args.rounds} "
            f"interleaved rounds ({corpus.n_docs} documents, {corpus.text_bytes / MB:.1f} MB "
            f"in {len(corpus.files)} jsonl files; tokentape reads "
            f"{'them' if args.layout == 'jsonl' else 'one ' + args.layout + ' file of them'}; "
            f"{os.cpu_count()} CPUs)\n"
        )
        print(render(rows, aim_speedup))
        if huge:
            print("\nOne huge document (one jsonl line), each way in a fresh process:\n")
            print(hugedoc_bench.render(huge))
        for line in skipped:
            print(f"- skipped {line}")
        print(f"\n(benchmark took {elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

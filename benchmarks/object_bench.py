"""Object storage through a proxy that adds 0, 10 and 50 ms to every request, side by side.

Starts a real S3-compatible server on loopback (moto, ``tests/objstore.py``) and the tests'
fault-injecting proxy in front of it (``tests/faultproxy.py``, used here only for its
per-request delay: the latency of a real object store). One corpus of jsonl files (the
tokenize benchmark's, ``--mb`` MB of text) is uploaded to ``s3://BUCKET/raw/``, and a token
store built from it locally (``bytes`` tokenizer, ``--shard-mb`` shards) to
``s3://BUCKET/stores/web/``. At each latency, every measurement runs ``--rounds`` times and
reports its best round:

- **tokenize**: ``tokentape.tokenize`` from ``s3://BUCKET/raw/`` against the same files on
  local disk, to a local store, rounds interleaved (order reversed every other round); ratio =
  bucket throughput / local throughput (1.0 = no cost for reading from the bucket), and
  whether the two stores' token files are byte-identical.
- **s3fs get**: the bare baseline for staging: ``s3fs``'s own parallel ``get`` of every
  object of the store to local files (checked against the local store), in MB/s.

Each row also counts the requests the proxy saw (by method) and the MB it sent (bytes
fetched), in its best round's run. More rows (staging, the streamed loader) are functions
added to ``MEASURES``; one that fails reports ``n/a: <error>`` and the others still run.
Ratios are what matter: the proxy and the server share this machine's cores (moto itself
serves about 100-150 MB/s here; the proxy costs little beside it), and nothing here asserts a
time.

    python benchmarks/object_bench.py [--mb 8] [--shard-mb 4] [--latency-ms 0,10,50]
                                      [--rounds 3] [--tokenizer SPEC] [--json] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # objstore (the S3 server), faultproxy
sys.path.insert(0, str(REPO / "benchmarks"))  # tokenize_bench's corpus

import s3fs  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402
from objstore import ACCESS_KEY, SECRET_KEY, Bucket, S3Server, new_bucket, s3_environment  # noqa: E402
from tokenize_bench import build_corpus  # noqa: E402

import tokentape  # noqa: E402

DEFAULT_OUT = REPO / "bench-out" / "object"
DEFAULT_GPT2 = REPO.parent / "shared" / "tokenizers" / "gpt2.tiktoken"
MB = 1e6


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Bench:
    """What every measurement shares: the server, the bucket, the corpus and the store."""

    bucket: Bucket
    work: Path
    corpus_dir: Path
    corpus_url: str
    text_bytes: int
    store_dir: Path
    store_url: str
    tokenizer: str
    rounds: int


@dataclass
class Row:
    """One measurement at one latency (figures: name -> value, printed in order)."""

    measure: str
    latency_ms: float
    figures: dict[str, float | str] = field(default_factory=dict)
    requests: int = 0
    mb_fetched: float = 0.0
    note: str = ""


Measurement = Callable[[Bench, FaultProxy], Row]


def by_method(proxy: FaultProxy) -> str:
    """The requests the proxy saw since its last reset, by method (``GET 13, HEAD 8``)."""
    counts = Counter(method for method, _, _, _ in proxy.stats().log)
    return ", ".join(f"{m} {n}" for m, n in sorted(counts.items()))


def store_files(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` by relative path, the manifest left out (it names the inputs,
    which differ between a bucket and local files)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


# --- measurements ------------------------------------------------------------------------


def tokenize_row(bench: Bench, proxy: FaultProxy) -> Row:
    """``tokentape.tokenize`` from the bucket vs from local files (a fresh store each run)."""
    options = {"endpoint_url": proxy.endpoint}
    best = {"local": float("inf"), "bucket": float("inf")}
    requests, fetched, identical, methods = 0, 0, True, ""
    for r in range(bench.rounds):
        order = ["local", "bucket"] if r % 2 == 0 else ["bucket", "local"]
        outs = {}
        for where in order:
            out = bench.work / f"tok-{where}"
            shutil.rmtree(out, ignore_errors=True)
            source = str(bench.corpus_dir) if where == "local" else bench.corpus_url + "/"
            proxy.reset()
            started = time.perf_counter()
            tokentape.tokenize(
                source,
                out,
                tokenizer=bench.tokenizer,
                storage_options=options if where == "bucket" else None,
            )
            best[where] = min(best[where], time.perf_counter() - started)
            if where == "bucket":
                stats = proxy.stats()
                requests, fetched, methods = stats.requests, stats.bytes_sent, by_method(proxy)
            outs[where] = out
        identical = identical and store_files(outs["local"]) == store_files(outs["bucket"])
    return Row(
        "tokenize (bucket / local)",
        proxy.faults.delay * 1000,
        {
            "local MB/s": bench.text_bytes / MB / best["local"],
            "bucket MB/s": bench.text_bytes / MB / best["bucket"],
            "ratio": best["local"] / best["bucket"],
        },
        requests,
        fetched / MB,
        ("stores identical" if identical else "STORES DIFFER") + f"; {methods}",
    )


def s3fs_get_row(bench: Bench, proxy: FaultProxy) -> Row:
    """The bare baseline for staging: ``s3fs``'s parallel ``get`` of every object of the
    store, checked against the local store."""
    fs = s3fs.S3FileSystem(
        endpoint_url=proxy.endpoint,
        key=ACCESS_KEY,
        secret=SECRET_KEY,
        skip_instance_cache=True,
        use_listings_cache=False,
    )
    prefix = bench.bucket.key(bench.store_url + "/")
    keys = bench.bucket.keys(bench.store_url)
    expected = {k[len(prefix) :]: data for k, data in _local_objects(bench).items()}
    total = sum(len(d) for d in expected.values())
    best, requests, fetched, methods = float("inf"), 0, 0, ""
    fs.info(f"{bench.bucket.name}/{keys[0]}")  # the session and connection set up, not timed
    for _ in range(bench.rounds):
        target = bench.work / "s3fs-get"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        rpaths = [f"{bench.bucket.name}/{k}" for k in keys]
        lpaths = [str(target / k[len(prefix) :]) for k in keys]
        for path in lpaths:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        proxy.reset()
        started = time.perf_counter()
        fs.get(rpaths, lpaths)
        best = min(best, time.perf_counter() - started)
        stats = proxy.stats()
        requests, fetched, methods = stats.requests, stats.bytes_sent, by_method(proxy)
        got = {k[len(prefix) :]: Path(p).read_bytes() for k, p in zip(keys, lpaths, strict=True)}
        if got != expected:
            raise AssertionError("s3fs get: the downloaded store differs from the local one")
    return Row(
        "s3fs get (staging baseline)",
        proxy.faults.delay * 1000,
        {"MB/s": total / MB / best, "objects": len(keys), "store MB": total / MB},
        requests,
        fetched / MB,
        f"parallel fs.get, checked; {methods}",
    )


def _local_objects(bench: Bench) -> dict[str, bytes]:
    prefix = bench.bucket.key(bench.store_url + "/")
    return {
        prefix + p.relative_to(bench.store_dir).as_posix(): p.read_bytes()
        for p in sorted(bench.store_dir.rglob("*"))
        if p.is_file()
    }


MEASURES: dict[str, Measurement] = {
    "tokenize": tokenize_row,
    "s3fs-get": s3fs_get_row,
    # staging (train.stage.stage_store) and the streamed-range loader: add their rows here.
}


def run_measure(name: str, fn: Measurement, bench: Bench, proxy: FaultProxy) -> Row:
    """``fn``'s row, or a row reporting 'n/a: <error>' when it cannot run (yet)."""
    try:
        return fn(bench, proxy)
    except Exception as exc:  # a row that fails is reported, the others still run
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
        return Row(name, proxy.faults.delay * 1000, note=f"n/a: {text}")


# --- set-up --------------------------------------------------------------------------------


def build(args: argparse.Namespace, bucket: Bucket) -> Bench:
    """The corpus (reused between runs), its store, both uploaded to the bucket."""
    work = args.out
    work.mkdir(parents=True, exist_ok=True)
    corpus = build_corpus(work / "corpus-work", args.mb, args.n_files)
    corpus_dir = Path(corpus.files[0]).parent
    store_dir = work / "store"
    shutil.rmtree(store_dir, ignore_errors=True)
    tokentape.tokenize(str(corpus_dir), store_dir, tokenizer="bytes", shard_mb=args.shard_mb)
    corpus_url = bucket.upload_tree(corpus_dir, f"{bucket.url}/raw")
    store_url = bucket.upload_tree(store_dir, f"{bucket.url}/stores/web")
    tokenizer = args.tokenizer
    if tokenizer is None:
        tokenizer = f"tiktoken:{DEFAULT_GPT2}" if DEFAULT_GPT2.is_file() else "bytes"
    return Bench(
        bucket,
        work,
        corpus_dir,
        corpus_url,
        corpus.text_bytes,
        store_dir,
        store_url,
        tokenizer,
        args.rounds,
    )


def fmt(value: float | str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def print_table(rows: list[Row]) -> None:
    print(f"{'measure':30s} {'ms/req':>6s}  {'figures':48s} {'requests':>8s} {'MB fetched':>10s}")
    for row in rows:
        figures = ", ".join(f"{k} {fmt(v)}" for k, v in row.figures.items())
        print(
            f"{row.measure:30s} {row.latency_ms:6.0f}  {figures:48s} {row.requests:8d} "
            f"{row.mb_fetched:10.1f}  {row.note}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=8.0, help="MB of jsonl text (the corpus)")
    ap.add_argument("--n-files", type=int, default=8, help="jsonl files in the corpus")
    ap.add_argument("--shard-mb", type=float, default=4.0, help="shard size of the store")
    ap.add_argument("--latency-ms", default="0,10,50", help="per-request delays, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokenizer", default=None, help="default: GPT-2 (tiktoken) if present")
    ap.add_argument("--only", default=None, help=f"comma-separated, of: {', '.join(MEASURES)}")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    latencies = [float(x) for x in args.latency_ms.split(",") if x.strip()]
    chosen = args.only.split(",") if args.only else list(MEASURES)

    server = S3Server()
    try:
        os.environ.update(s3_environment(server.endpoint))
        bucket = new_bucket(server.endpoint)
        note("building and uploading the corpus and the store ...")
        bench = build(args, bucket)
        note(
            f"corpus {bench.text_bytes / MB:.1f} MB of text in {args.n_files} files; "
            f"store {sum(len(d) for d in _local_objects(bench).values()) / MB:.1f} MB; "
            f"tokenizer {bench.tokenizer}"
        )
        rows = []
        with FaultProxy(server.endpoint) as proxy:
            for latency in latencies:
                proxy.set(delay=latency / 1000)
                for name in chosen:
                    note(f"{name} at {latency:g} ms/request ...")
                    rows.append(run_measure(name, MEASURES[name], bench, proxy))
        print_table(rows)
        if args.json:
            print(json.dumps([asdict(r) for r in rows], indent=1))
    finally:
        server.stop()


if __name__ == "__main__":
    main()

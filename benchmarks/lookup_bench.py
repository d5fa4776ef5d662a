"""Finding a document by the user's handle in a large store: ``--id`` and ``--input --record``.

Builds (once, kept under ``--out``) a store of ``--docs`` documents (default 10^7; small
shards, so that a lookup searches many) with
``tokentape tokenize`` from jsonl files whose records carry an ``id``, so the id keys are the
ones tokenize writes. Then, in this process, after opening the store: ``Source.find_id`` and
``Source.find_record`` for ``--lookups`` handles drawn at random (each checked against the
document it must find), and ``tokentape.find_documents`` through a plan. Prints the median,
99th percentile and worst time of each (aim: a lookup within 50 ms), and the time to open
the store. The first lookup of a process maps each shard's keys: it is reported on its own.

    python benchmarks/lookup_bench.py [--docs 10000000] [--lookups 500] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AIM_MS = 50.0
FILES = 8


def write_corpus(directory: Path, n_docs: int) -> None:
    """``FILES`` jsonl files; document ``i`` is record ``i // FILES + 1`` of file ``i % FILES``
    with id ``d{i:09d}``."""
    directory.mkdir(parents=True, exist_ok=True)
    files = [open(directory / f"part-{k}.jsonl", "w") for k in range(FILES)]  # noqa: SIM115
    try:
        for i in range(n_docs):
            files[i % FILES].write(f'{{"id":"d{i:09d}","text":"t{i % 9973} x"}}\n')
    finally:
        for f in files:
            f.close()


def build(out: Path, n_docs: int, workers: int, shard_mb: float) -> Path:
    """The store of ``n_docs`` documents under ``out`` (made now unless already there)."""
    store = out / f"store-{n_docs}-{shard_mb:g}mb"
    if (store / "manifest.json").is_file():
        return store
    corpus = out / f"corpus-{n_docs}"
    if not corpus.is_dir():
        write_corpus(corpus, n_docs)
    cmd = [sys.executable, "-m", "tokentape", "tokenize", str(corpus), "--out", str(store),
           "--workers", str(workers), "--shard-mb", str(shard_mb), "--json"]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    print(f"built {store} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return store


def timed(calls: list[tuple[object, object]], fn) -> list[float]:
    """Milliseconds of ``fn(handle)`` for each (handle, expected), checked."""
    times = []
    for handle, expected in calls:
        started = time.perf_counter()
        got = fn(handle)
        times.append((time.perf_counter() - started) * 1e3)
        if got != expected:
            raise SystemExit(f"lookup of {handle!r}: {got}, expected {expected}")
    return times


def stats(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
        "max_ms": round(ordered[-1], 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=10_000_000)
    p.add_argument("--lookups", type=int, default=500)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shard-mb", type=float, default=4.0, help="shard size (default 4: ~45 "
                   "shards for 10^7 documents, each searched)")  # fmt: skip
    p.add_argument("--out", type=Path, default=REPO / "bench-out" / "lookup")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    import tokentape

    store = build(args.out, args.docs, args.workers, args.shard_mb)
    started = time.perf_counter()
    src = tokentape.open_source(store)
    open_ms = (time.perf_counter() - started) * 1e3
    if src.n_docs != args.docs:
        raise SystemExit(f"{store}: {src.n_docs} documents, expected {args.docs}")
    rnd = random.Random(7)
    docs = [rnd.randrange(args.docs) for _ in range(args.lookups)]
    paths = {int(Path(r["path"]).stem.split("-")[1]): r["path"] for r in src.inputs()}
    # the store holds the files in name order: file k's documents, then file k + 1's
    before = [sum(len(range(k, args.docs, FILES)) for k in range(f)) for f in range(FILES)]
    store_doc = {i: before[i % FILES] + i // FILES for i in docs}
    first = timed([(f"d{docs[0]:09d}", [store_doc[docs[0]]])], src.find_id)
    by_id = timed([(f"d{i:09d}", [store_doc[i]]) for i in docs], src.find_id)
    by_record = timed(
        [((paths[i % FILES], i // FILES + 1), [store_doc[i]]) for i in docs],
        lambda h: src.find_record(*h),
    )
    absent = timed([(f"absent-{i}", []) for i in range(args.lookups)], src.find_id)
    plan = tokentape.Plan.build({"web": {"path": str(store), "weight": 1}}, seq_len=64,
                                seed=1, total_samples=1000)  # fmt: skip
    via_plan = timed(
        [(f"d{i:09d}", [("web", store_doc[i])]) for i in docs[:50]],
        lambda h: [(f.source, f.doc) for f in tokentape.find_documents(plan, id=h)],
    )
    result = {
        "docs": args.docs, "shards": len(src.manifest.shards), "lookups": args.lookups,
        "open_ms": round(open_ms, 1), "first_find_id_ms": round(first[0], 2),
        "find_id": stats(by_id), "find_id_absent": stats(absent),
        "find_record": stats(by_record), "find_documents_via_plan": stats(via_plan),
        "aim_ms": AIM_MS,
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.docs:,} documents in {result['shards']} shards; open {open_ms:.1f} ms; "
          f"first find_id {first[0]:.2f} ms (maps the keys)")  # fmt: skip
    for name in ("find_id", "find_id_absent", "find_record", "find_documents_via_plan"):
        s = result[name]
        print(f"  {name:24s} median {s['median_ms']:8.3f} ms  p99 {s['p99_ms']:8.3f} ms  "
              f"max {s['max_ms']:8.3f} ms  (aim <= {AIM_MS:.0f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()

"""What recording provenance costs ``tokentape tokenize``: this tree against a baseline tree.

Provenance (where each document came from, ``docs/format.md``) is always recorded, so its
cost is measured against the code before it: commit ``BASELINE`` (the last without it), whose
``src`` is taken from this repository with ``git archive`` (or ``--baseline-src DIR``). The
same jsonl corpus (ids in every record, so ids are read and stored too) is tokenized by
``python -m tokentape tokenize`` in fresh processes, one tree then the other, the order
swapped every round; each figure is the best of ``--rounds``. It prints both throughputs (MB
of document text per second), their ratio (aim: at least 0.97), the same ratio in CPU seconds
(user + system of the run's processes: what the work costs, less what a busy machine's waiting
adds to the wall clock) and the bytes the provenance files add per document.

    python benchmarks/provenance_bench.py [--baseline-src DIR] [--mb 24] [--rounds 3]
        [--tokenizer tiktoken:../shared/tokenizers/gpt2.tiktoken] [--workers 1] [--json]
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TOKENIZER = f"tiktoken:{REPO.parent / 'shared' / 'tokenizers' / 'gpt2.tiktoken'}"
AIM = 0.97
BASELINE = "9aa8097"
"""The last commit before provenance was recorded."""
MB = 1e6


def write_corpus(directory: Path, mb: float, n_files: int, seed: int = 5) -> int:
    """jsonl files of about ``mb`` MB of text, every record with an ``id``; the text bytes."""
    rnd = random.Random(seed)
    words = [
        "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 9)))
        for _ in range(5000)
    ]
    directory.mkdir(parents=True)
    target, total, i = int(mb * MB), 0, 0
    files = [open(directory / f"part-{k:02d}.jsonl", "w") for k in range(n_files)]  # noqa: SIM115
    try:
        while total < target:
            text = " ".join(rnd.choice(words) for _ in range(rnd.randint(50, 800)))
            files[i % n_files].write(json.dumps({"id": f"doc-{i:08d}", "text": text}) + "\n")
            total += len(text)
            i += 1
    finally:
        for f in files:
            f.close()
    return total


def run(src: Path, corpus: Path, out: Path, tokenizer: str, workers: int) -> tuple[float, float]:
    """Seconds of one ``tokentape tokenize`` in a fresh process importing ``src``: wall clock,
    and CPU (user + system, of the process and its helpers)."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-m", "tokentape", "tokenize", str(corpus), "--out", str(out),
           "--tokenizer", tokenizer, "--workers", str(workers), "--json"]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"tokenize with {src} failed:\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


def baseline_src(work: Path) -> Path:
    """``src`` of commit ``BASELINE``, extracted from this repository into ``work``."""
    work.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", BASELINE, "src"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise SystemExit(f"git archive {BASELINE} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
    return work / "src"


def provenance_bytes(store: Path) -> int:
    suffixes = (".rec.npy", ".ids", ".idkeys.npy")
    return sum(p.stat().st_size for p in store.iterdir() if p.name.endswith(suffixes))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline-src", type=Path, help=f"src/ of the baseline (default: {BASELINE})")
    p.add_argument("--mb", type=float, default=24.0, help="MB of document text")
    p.add_argument("--n-files", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    p.add_argument("--out", type=Path, default=REPO / "bench-out" / "provenance")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    for name in ("corpus", "baseline-src"):  # the stores are replaced run by run
        shutil.rmtree(args.out / name, ignore_errors=True)
    text_bytes = write_corpus(args.out / "corpus", args.mb, args.n_files)
    base = args.baseline_src or baseline_src(args.out / "baseline-src")
    if not (base / "tokentape").is_dir():
        raise SystemExit(f"--baseline-src {base}: no tokentape package there")
    trees = {"baseline": base.resolve(), "this tree": REPO / "src"}
    best = {name: float("inf") for name in trees}
    cpu = {name: float("inf") for name in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in order:
            out = args.out / name.replace(" ", "-")
            seconds, used = run(trees[name], args.out / "corpus", out, args.tokenizer,
                                args.workers)  # fmt: skip
            best[name], cpu[name] = min(best[name], seconds), min(cpu[name], used)
            print(f"round {r + 1}: {name:9s} {seconds:7.2f} s, CPU {used:7.2f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
    store = args.out / "this-tree"
    n_docs = json.loads((store / "manifest.json").read_text())["n_docs"]
    added = provenance_bytes(store) + (store / "inputs.json").stat().st_size
    rates = {name: text_bytes / MB / s for name, s in best.items()}
    ratio = rates["this tree"] / rates["baseline"]
    result = {
        "text_mb": round(text_bytes / MB, 2), "workers": args.workers,
        "baseline_mb_s": round(rates["baseline"], 3),
        "this_tree_mb_s": round(rates["this tree"], 3),
        "ratio": round(ratio, 3), "aim": AIM, "n_docs": n_docs,
        "cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},
        "cpu_ratio": round(cpu["baseline"] / cpu["this tree"], 3),
        "provenance_bytes": added, "bytes_per_doc": round(added / n_docs, 2),
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"tokenize {result['text_mb']} MB, {args.workers} worker(s), best of {args.rounds}: "
        f"baseline {result['baseline_mb_s']} MB/s, this tree {result['this_tree_mb_s']} MB/s, "
        f"ratio {result['ratio']} (aim >= {AIM}); CPU seconds baseline "
        f"{result['cpu_seconds']['baseline']}, this tree {result['cpu_seconds']['this tree']}, "
        f"ratio {result['cpu_ratio']}; provenance {added:,} bytes for {n_docs:,} "
        f"documents = {result['bytes_per_doc']} bytes each"
    )


if __name__ == "__main__":
    main()

"""``Plan.excise`` of 1,000 documents on a 2T-token plan whose stores hold 2T tokens.

``excise_bench.py`` measures the worst case: small stores read thousands of times over a
2T-token horizon, so each excised document is drawn ~8,000 times. A run of that size reads its
data a few times; here the stores are the size of the horizon (two sources of 1T tokens, 50/50,
one pass each). Their token files are sparse (zeros, taking no disk: excision reads only the
document index), their document index real (documents of ``--doc-tokens`` tokens), their
manifests written here with placeholder hashes (nothing here verifies them; ``tokentape
verify`` would refuse these stores). Prints the excise time (best of ``--rounds``; aim: at most
1 s), the samples left out and the time to save the plan.

    python benchmarks/excise_scale_bench.py [--doc-tokens 100000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import tokentape  # noqa: E402
from tokentape._src.store.format import Manifest, ShardInfo, content_hash  # noqa: E402
from tokentape._src.store.writer import npy_bytes  # noqa: E402

AIM = 1.0
SOURCE_TOKENS = 10**12
SHARD_TOKENS = 125 * 10**9  # 250 GB sparse files: 8 shards a source
BYTES_TOKENIZER = {
    "kind": "bytes", "spec": "bytes", "vocab_size": 257, "eod_id": 256, "eod_token": None,
    "fingerprint": "sha256:" + hashlib.sha256(b"bytes").hexdigest(), "file": None,
}  # fmt: skip


def fake(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sparse_store(directory: Path, n_tokens: int, doc_tokens: int) -> Path:
    """A store of ``n_tokens`` zero tokens (sparse files) in documents of ``doc_tokens``."""
    if (directory / "manifest.json").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    shards = []
    for i, start in enumerate(range(0, n_tokens, SHARD_TOKENS)):
        size = min(SHARD_TOKENS, n_tokens - start)
        name = f"part-{i:05d}"
        with open(directory / f"{name}.bin", "wb") as f:
            f.truncate(size * 2)  # uint16, sparse
        idx = npy_bytes(np.arange(0, size, doc_tokens, dtype="<i8"))
        (directory / f"{name}.idx.npy").write_bytes(idx)
        shards.append(ShardInfo(name, size, -(-size // doc_tokens), fake(f"{directory}{i}"),
                                hashlib.sha256(idx).hexdigest(), len(idx), 2**42,
                                (fake(f"{directory}{i}b"),)))  # fmt: skip
    manifest = Manifest(
        dtype="uint16", vocab_size=257, eod_id=256, tokenizer=BYTES_TOKENIZER,
        shards=tuple(shards), n_tokens=n_tokens, n_docs=sum(s.n_docs for s in shards),
        content_hash=content_hash(shards, "uint16"), filters={}, inputs={},
        job="sha256:" + fake(str(directory)), created_by="benchmarks/excise_scale_bench.py",
    )  # fmt: skip
    (directory / "manifest.json").write_text(manifest.to_json())
    return directory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--doc-tokens", type=int, default=100_000)
    p.add_argument("--docs", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=REPO / "bench-out" / "excise-scale")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    stores = {name: sparse_store(args.out / f"{name}-{args.doc_tokens}", SOURCE_TOKENS,
                                 args.doc_tokens) for name in ("web", "books")}  # fmt: skip
    plan = tokentape.Plan.build(
        {n: {"path": str(d), "weight": 1, "max_repeats": 2} for n, d in stores.items()},
        seq_len=2048, seed=7, total_tokens="2T",
    )  # fmt: skip
    rnd = np.random.default_rng(3)
    per_store = plan.sources[0].n_tokens // args.doc_tokens
    picks = {n: rnd.choice(per_store, args.docs // 2, replace=False) for n in stores}
    docs = [(n, int(d)) for n in stores for d in picks[n]]
    c = 10**6
    times, new = [], plan
    for _ in range(args.rounds):
        started = time.perf_counter()
        new = plan.excise(c, docs=docs)
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    text = new.to_json()
    save = time.perf_counter() - started
    e = new.excisions[-1]
    result = {
        "horizon_samples": plan.horizon_samples, "passes": {s.name: s.passes for s in plan.sources},
        "docs": len(docs), "doc_tokens": args.doc_tokens, "samples_left_out": e.count,
        "seconds": [round(t, 4) for t in times], "best": round(min(times), 4), "aim": AIM,
        "save_seconds": round(save, 3), "plan_bytes": len(text), "cpus": os.cpu_count(),
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    passes = ", ".join(f"{k} {v:.2f}" for k, v in result["passes"].items())
    print(f"plan: 2T tokens ({plan.horizon_samples:,} samples of 2048), two 1T-token sparse "
          f"stores, passes {passes}")  # fmt: skip
    print(f"excise {len(docs):,} documents of {args.doc_tokens:,} tokens from consumed {c:,}: "
          f"{e.count:,} samples left out; best of {args.rounds} {result['best']:.3f} s "
          f"({', '.join(f'{t:.3f}' for t in times)}); aim <= {AIM:g} s: "
          f"{'PASS' if result['best'] <= AIM else 'MISS'}; saving the plan {save:.3f} s, "
          f"{len(text):,} bytes")  # fmt: skip


if __name__ == "__main__":
    main()

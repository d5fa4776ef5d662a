"""One huge document: peak memory and time of encoding it whole against in pieces.

A document of ``--mb`` MB (the built-in corpora's prose and code, repeated, joined by spaces:
one JSON string, as a log dump or a book arrives) is encoded, each way in a fresh process:

- **whole**: the tokenizer's own encoding of the whole text (``Tokenizer.encode_flat``), what
  tokentape did before issue 14;
- **pieces**: ``tokenize.pieces.encode_documents``, what the worker does now: cut at places
  where the tokenizer's pre-tokenizer splits anyway, about 1 MiB a piece.

for a byte-level BPE trained here with Hugging Face ``tokenizers`` and for GPT-2 through
``tiktoken``. Reported: seconds, peak resident memory of the process (``ru_maxrss``, the text
itself included), and whether the two token sequences are identical (sha256 of the ids).
"whole" is skipped above ``--whole-max-mb`` (default 40): a Hugging Face tokenizer needs about
150 bytes per character for it, more than this machine has at 200 MB.

- **tokenize**: ``tokentape tokenize`` end to end on a ``.jsonl`` file holding the document as
  its one line (reading, parsing, encoding in pieces, writing the store), in a fresh process;
  its tokens are checked against "pieces".

    python benchmarks/hugedoc_bench.py [--mb 40,200] [--whole-max-mb 40] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_GPT2 = REPO.parent / "shared" / "tokenizers" / "gpt2.tiktoken"
OUT = REPO / "bench-out" / "hugedoc"
WHOLE_MAX_MB = 40.0
"""Above this, the whole-document encoding is not run (a Hugging Face tokenizer needs about 150
bytes per character for it)."""


def build_tokenizer() -> Path:
    """A byte-level BPE of 16k ids trained on the built-in corpora (reused when present)."""
    path = OUT / "bpe-16k.json"
    if path.exists():
        return path
    from tokentape._src.corpora import write_builtin_corpora
    from tokentape._src.demo.run import corpus_texts, train_bpe

    sources = write_builtin_corpora(OUT / "corpora")
    OUT.mkdir(parents=True, exist_ok=True)
    return train_bpe(corpus_texts(list(sources.values())), 16384, path)


def document(mb: float) -> str:
    """About ``mb`` MB of text: the built-in corpora's documents, repeated, joined by spaces."""
    from tokentape._src.corpora import write_builtin_corpora
    from tokentape._src.demo.run import corpus_texts

    sources = write_builtin_corpora(OUT / "corpora")
    base = " ".join(corpus_texts(list(sources.values())))
    target = int(mb * 1e6)
    whole, rest = divmod(target, len(base))
    return "".join([base] * whole + [base[:rest]])  # one copy of the text, no slice of it


def child(spec: str, mb: float, how: str) -> dict:
    from tokentape._src.store.tokenizers import load_tokenizer
    from tokentape._src.tokenize.pieces import encode_documents

    if how == "tokenize":  # its own process: the text is not held here
        return tokenize_child(spec, mb)
    tok = load_tokenizer(spec)
    text = document(mb)
    started = time.perf_counter()
    if how == "whole":
        flat, _ = tok.encode_flat([text])
    else:
        flat, _ = encode_documents(tok, [text])
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    digest = hashlib.sha256(flat.astype("<u4").tobytes()).hexdigest()[:16]
    return {"seconds": seconds, "peak_mb": peak_mb, "tokens": int(flat.size), "sha": digest}


def tokenize_child(spec: str, mb: float) -> dict:
    """``tokentape tokenize`` of the document as one jsonl line; its peak RSS and its tokens."""
    import numpy as np

    from tokentape import open_source

    path = OUT / f"one-{mb:g}.jsonl"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"text": document(mb)}) + "\n")
        tmp.replace(path)
    store = OUT / "store"
    cmd = [sys.executable, "-m", "tokentape", "tokenize", str(path), "--out", str(store),
           "--tokenizer", spec, "--overwrite", "--json"]  # fmt: skip
    shutil.rmtree(store, ignore_errors=True)
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip()[-300:])
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    src = open_source(store)
    ids = np.asarray(src.tokens(0, src.n_tokens - 1)).astype("<u4")  # without the final EOD
    digest = hashlib.sha256(ids.tobytes()).hexdigest()[:16]
    return {"seconds": seconds, "peak_mb": peak_mb, "tokens": int(ids.size), "sha": digest}


def run(spec: str, mb: float, how: str) -> dict:
    cmd = [sys.executable, __file__, "--child", spec, "--how", how, "--mb", str(mb)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["killed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", default="40,200", help="document sizes, MB, comma-separated")
    p.add_argument("--whole-max-mb", type=float, default=WHOLE_MAX_MB)
    p.add_argument("--gpt2", type=Path, default=DEFAULT_GPT2)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--how", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, float(args.mb), args.how)))
        return 0
    specs = [("hf-bpe-16k", f"hf:{build_tokenizer()}")]
    if args.gpt2.is_file():
        specs.append(("tiktoken-gpt2", f"tiktoken:{args.gpt2.resolve()}"))
    rows = measure(specs, [float(x) for x in args.mb.split(",")], args.whole_max_mb)
    print(json.dumps(rows, indent=2) if args.json else render(rows))
    return 0


def measure(specs: list[tuple[str, str]], sizes: list[float], whole_max_mb: float) -> list[dict]:
    """For each (name, tokenizer spec) and document size: the ways measured."""
    rows = []
    for name, spec in specs:
        for mb in sizes:
            got = {"pieces": run(spec, mb, "pieces"), "tokenize": run(spec, mb, "tokenize")}
            if mb <= whole_max_mb:
                got["whole"] = run(spec, mb, "whole")
            rows.append({"tokenizer": name, "mb": mb, **got})
            print(f"  {name} {mb:g} MB: {got}", file=sys.stderr, flush=True)
    return rows


def render(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| tokenizer | document MB | way | seconds | peak RSS MB | tokens | same tokens |"]
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        same = "whole" in r and r["whole"].get("sha") == r["pieces"].get("sha")
        for how in ("whole", "pieces", "tokenize"):
            if how not in r:
                continue
            x = r[how]
            if "error" in x:
                lines.append(
                    f"| {r['tokenizer']} | {r['mb']:g} | {how} | failed: {x['error']} | | | |"
                )
                continue
            if how == "tokenize":  # against the pieces (the whole is not run at every size)
                mark = "= pieces: " + ("yes" if x.get("sha") == r["pieces"].get("sha") else "NO")
            else:
                mark = ("yes" if same else "NO") if "whole" in r else "(whole not run)"
            lines.append(f"| {r['tokenizer']} | {r['mb']:g} | {how} | {x['seconds']:.1f} | "
                         f"{x['peak_mb']:.0f} | {x['tokens']:,} | {mark} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

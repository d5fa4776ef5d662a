"""Builders shared by the tests (no test module imports another): small stores, the three-source
plan, tokenize inputs, step-log records and Megatron prefixes written with tokentape's own code.

``tests/`` is on ``sys.path`` (its conftest.py sits there), so every test directory imports this
module as ``helpers``. Golden vectors depend on these builders: change none of them lightly.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import tokentape
from tokentape._src.megatron.format import MegatronWriter, dtype_code, index_bytes
from tokentape._src.plan.plan import Plan, resolve_plan
from tokentape._src.plan.spec import load_plan_spec, parse_plan
from tokentape._src.program import main
from tokentape._src.store.atomic import write_atomic
from tokentape._src.store.format import MANIFEST_NAME, Manifest, content_hash
from tokentape._src.store.tokenizers import Tokenizer, load_tokenizer, tokenizer_manifest
from tokentape._src.store.writer import ShardWriter
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.train.partition import BatchConfig
from tokentape._src.util.progress import Counters

# --- a store written with the shard writer -----------------------------------------------------


def write_store(
    directory: Path,
    docs: list[list[int]],
    shard_tokens: int,
    block_bytes: int = 64,
    tok: Tokenizer | None = None,
) -> Manifest:
    """Write ``docs`` (each followed by the EOD id) with the shard writer, plus the tokenizer's
    copy and a manifest (``tok``: the bytes tokenizer when None)."""
    tok = tok or load_tokenizer("bytes")
    directory.mkdir(parents=True, exist_ok=True)
    dtype = "uint16" if tok.vocab_size <= 2**16 else "uint32"
    writer = ShardWriter(directory, dtype, shard_tokens, block_bytes=block_bytes)
    # Feed in two calls to exercise appends that continue an open shard.
    half = len(docs) // 2
    for chunk in (docs[:half], docs[half:]):
        if chunk:
            flat = np.array([t for d in chunk for t in [*d, tok.eod_id]], dtype=np.int64)
            writer.add(flat, np.array([len(d) + 1 for d in chunk]))
    return finish_store(directory, writer.finish(), dtype, tok)


def finish_store(
    directory: Path,
    shards: list,
    dtype: str,
    tok: Tokenizer,
    job: str = "test",
    created_by: str = "test",
) -> Manifest:
    """Complete a store whose shards the shard writer wrote in ``directory``: the tokenizer's
    copy, then the manifest (last)."""
    stored = tok.stored_file()
    if stored is not None:
        write_atomic(directory / stored[0], stored[1])
    manifest = Manifest(
        dtype=dtype,
        vocab_size=tok.vocab_size,
        eod_id=tok.eod_id,
        tokenizer=tokenizer_manifest(tok),
        shards=tuple(shards),
        n_tokens=sum(s.n_tokens for s in shards),
        n_docs=sum(s.n_docs for s in shards),
        content_hash=content_hash(shards, dtype),
        filters={},
        inputs={},
        job=job,
        created_by=created_by,
    )
    write_atomic(directory / MANIFEST_NAME, manifest.to_json().encode())
    return manifest


class RecordingCounters(Counters):
    """Real shared counters that also keep the input bytes of every report, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.input_reports: list[int] = []

    def add(self, docs=0, tokens=0, text_bytes=0, input_bytes=0) -> None:
        self.input_reports.append(input_bytes)
        super().add(docs=docs, tokens=tokens, text_bytes=text_bytes, input_bytes=input_bytes)


# --- the three-source plan over small stores --------------------------------------------------

SIZES = {"web": 120, "code": 60, "math": 15}  # documents per source


def write_docs(path: Path, name: str, n: int, edit: str = "") -> None:
    lines = [json.dumps({"text": f"{name} document {i} " * (5 + i % 7) + edit}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")


def make_store(root: Path, name: str, n: int, edit: str = "") -> Path:
    data = root / f"{name}.jsonl"
    write_docs(data, name, n, edit)
    out = root / "stores" / name
    tokenize(TokenizeConfig(inputs=(str(data),), out=str(out)))
    return out


PLAN = """\
seq_len = 64
seed = 1234
total_samples = 2000
[[source]]
name = "web"
path = "stores/web"
weight = 60
max_repeats = 8
[[source]]
name = "code"
path = "stores/code"
weight = 30
max_repeats = 6
[[source]]
name = "math"
path = "stores/math"
weight = 10
max_repeats = 40
"""


def plan_of(root: Path, text: str = PLAN):
    return resolve_plan(parse_plan(text, "mix.toml", str(root)), "mix.toml")


def small_shard_stores(root: Path) -> None:
    for name, n in SIZES.items():
        write_docs(root / f"{name}.jsonl", name, n)
        config = TokenizeConfig(
            inputs=(str(root / f"{name}.jsonl"),), out=str(root / "stores" / name), shard_mb=0.001
        )
        tokenize(config)
    (root / "mix.toml").write_text(PLAN)


def small_plan_json(root: Path) -> Path:
    """The small stores and their resolved plan, written to ``root/plan.json``."""
    small_shard_stores(root)
    path = root / "plan.json"
    path.write_text(resolve_plan(load_plan_spec(root / "mix.toml")).to_json())
    return path


# --- tokenize inputs and the command line as a process ------------------------------------------

WORDS = ["alpha", "beta", "γάμμα", "δέλτα", "日本語", "emoji😀", "tab\tbed", "x" * 30, "42", "!?"]


def make_documents(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        lines = [
            " ".join(rng.choices(WORDS, k=rng.randint(1, 12))) for _ in range(rng.randint(1, 8))
        ]
        docs.append("\n".join(lines) + rng.choice(["", "\n", "  "]))
    return docs


def jsonl_corpus(root: Path, n_docs: int, seed: int, n_files: int = 3) -> Path:
    """``make_documents(n_docs, seed)`` split evenly into ``0.jsonl``, ``1.jsonl``, ... in
    ``root``; returns ``root``."""
    docs, per = make_documents(n_docs, seed), n_docs // n_files
    for i in range(n_files):
        part = docs[i * per : (i + 1) * per]
        (root / f"{i}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    return root


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokentape", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def wait_for(
    done: Callable[[], object], what: str, alive: Callable[[], bool] = lambda: True
) -> None:
    """Poll ``done()`` until it is true: the way a test waits for observable progress (a file
    appearing, a checkpoint advancing) instead of sleeping a fixed time. Fails, naming ``what``,
    if ``alive()`` turns false first or nothing happens for 10 minutes (a hang, not a slow
    machine: the bound is far above any busy machine's delay)."""
    deadline = time.monotonic() + 600
    while not done():
        assert alive(), f"ended before {what}"
        assert time.monotonic() < deadline, f"no progress: waited 10 minutes for {what}"
        time.sleep(0.002)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun's workers run in their own
    sessions, so killing the launcher's process group would leave them running)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [c for c, p in parents.items() if p == parent and c not in tree]
        tree.update(children)
        frontier += children
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def one_line_refusal(code: int, out: str, err: str) -> str:
    """The refusal's one line (exit 2, nothing on stdout, no traceback)."""
    assert code == 2, (code, out, err)
    assert out == "", out
    assert err.startswith("tokentape: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def tree_bytes(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


# --- step-log records -------------------------------------------------------------------------

HASH = "sha256:" + "ab" * 32


def record(step: int, consumed: int, dp: int = 2, micro: int = 2, accum: int = 1, **extra) -> dict:
    rec = {
        "step": step,
        "consumed": consumed,
        "global_batch": dp * micro * accum,
        "dp": dp,
        "micro": micro,
        "accum": accum,
        "index_hash": HASH,
        "tokens_hash": f"t{step}-{dp}-{micro}-{accum}",
        "time": 1_700_000_000.5 + step,
    }
    return rec | extra


# --- Megatron prefixes --------------------------------------------------------------------------

Docs = list[list[np.ndarray]]
"""Documents, each a list of sequences (token arrays); a document's last sequence ends in EOD."""


def random_docs(seed: int, n_docs: int, vocab: int, eod: int, max_seqs: int = 3) -> Docs:
    """Documents of 1..max_seqs sequences (some empty) with ids in [0, vocab) minus EOD, each
    document ending with EOD."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        seqs = [rng.integers(0, vocab - 1, rng.integers(0, 12)) for _ in range(rng.integers(1, 4))]
        seqs = seqs[:max_seqs]
        seqs = [np.where(s >= eod, s + 1, s) for s in seqs]  # never EOD inside
        seqs[-1] = np.append(seqs[-1], eod)
        docs.append(seqs)
    return docs


def build(prefix: Path, docs: Docs, dtype: type) -> None:
    """Write ``docs`` as a Megatron prefix with tokentape's own code: ``MegatronWriter`` when
    every document is one sequence, else the ``.bin``'s bytes and the writer's ``.idx`` layout
    (``index_bytes``) over the sequence lengths and document indices. These are the bytes
    megatron-core's builder writes (tests/megatron/test_megatron_interop.py checks it)."""
    name = np.dtype(dtype).name
    if all(len(seqs) == 1 for seqs in docs):
        writer = MegatronWriter(prefix, name)
        if docs:
            tokens = np.concatenate([seqs[0] for seqs in docs]).astype(np.int64)
            writer.add(tokens, np.array([len(seqs[0]) for seqs in docs], dtype=np.int64))
        writer.finish()
        return
    seqs = [np.asarray(s, dtype=np.int64) for d in docs for s in d]
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    entries = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    tokens = np.concatenate([np.zeros(0, dtype=np.int64), *seqs]).astype(np.dtype(dtype))
    Path(f"{prefix}.bin").write_bytes(tokens.tobytes())
    Path(f"{prefix}.idx").write_bytes(b"".join(index_bytes(dtype_code(name), lengths, entries)))


def flat_docs(docs: Docs) -> list[np.ndarray]:
    return [np.concatenate(seqs).astype(np.int64) for seqs in docs]


def stream_of(docs: Docs) -> np.ndarray:
    return np.concatenate(flat_docs(docs))


def starts_of(docs: Docs) -> np.ndarray:
    lengths = [len(d) for d in flat_docs(docs)]
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)


MEGATRON_DTYPES = [
    (np.uint8, 200),
    (np.int8, 100),
    (np.int16, 3000),
    (np.uint16, 60_000),
    (np.int32, 70_000),
    (np.int64, 70_000),
]
"""Every token dtype a Megatron ``.idx`` may name, each with a vocabulary it holds."""


def check_reads_as(src, docs: Docs, dtype: type) -> None:
    """``src`` (a Megatron source) reads exactly ``docs``: counts, dtype, documents, spans, and
    windows of L + 1 tokens at stride L with their segments, across document boundaries."""
    stream, starts = stream_of(docs), starts_of(docs)
    assert (src.n_docs, src.n_tokens) == (len(docs), len(stream))
    assert src.n_sequences == sum(len(seqs) for seqs in docs)
    assert src.manifest.dtype == np.dtype(dtype).name
    assert np.array_equal(src.doc_starts, starts)
    assert np.array_equal(src.tokens(0, src.n_tokens), stream)
    for i, doc in enumerate(flat_docs(docs)):
        assert np.array_equal(src.doc(i), doc[:-1])
        assert src.doc_span(i) == (starts[i], starts[i] + len(doc))
    seq_len = 7
    n = (len(stream) - 1) // seq_len
    assert src.n_samples(seq_len) == n
    out = np.zeros((n, seq_len + 1), dtype=np.int64)
    src.windows_into(np.arange(n), seq_len, out)
    segment, position = np.zeros_like(out), np.zeros_like(out)
    src.segments_into(np.arange(n), seq_len, segment, position)
    for k in range(n):
        at = np.arange(k * seq_len, k * seq_len + seq_len + 1)
        assert np.array_equal(out[k], stream[at])
        assert np.array_equal(src.window(k, seq_len), stream[at])
        doc_of = np.searchsorted(starts, at, side="right") - 1
        assert src.docs_in(k, seq_len) == list(range(doc_of[0], doc_of[-1] + 1))
        assert np.array_equal(segment[k], doc_of - doc_of[0])
        assert np.array_equal(position[k], at - starts[doc_of])


def age(prefix: Path, seconds: float = 60.0) -> None:
    """Date both files back, so their identity may be cached (recent files never are)."""
    for suffix in (".bin", ".idx"):
        path = Path(f"{prefix}{suffix}")
        t = path.stat().st_mtime_ns - int(seconds * 1e9)
        os.utime(path, ns=(t, t))


def cli(capsys, *args: object) -> tuple[int, str, str]:
    """Run the command line in this process: its exit code, stdout and stderr."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# --- a run for the report: three plans, resumes, a phase, an excision, a loss log --------------

REPORT_PHASE = "\n[[phase]]\nstart_samples = 60\nweights = { web = 1, code = 1, math = 2 }\n"
REPORT_SPIKE = 17
"""The step whose loss the report run's loss log lifts by 1.5."""


def _report_steps(plan, config, log, losses, start, until, checkpoint=None) -> dict[int, dict]:
    """Steps ``start``..``until - 1`` on rank 0 (the rank that writes the step log), each with a
    loss line; the data state after every step."""
    states = {}
    names = [src.name for src in plan.sources]
    with tokentape.Loader(plan, 0, config, step_log=log) as loader:
        if checkpoint is not None:
            loader.load_state_dict(checkpoint)
        assert loader.state.step == start
        for step in range(start, until):
            s = loader.step()
            loader.commit()
            states[step + 1] = loader.state_dict()
            by = {n: 2.0 + 0.1 * d + 0.01 * (step % 3) for d, n in enumerate(names)}
            loss = 4.0 - 0.05 * step + (1.5 if step == REPORT_SPIKE else 0.0) + 0.01 * (step % 3)
            line = {"step": step, "consumed": s.consumed, "loss": loss, "loss_by_source": by}
            with open(losses, "a") as f:
                f.write(json.dumps(line) + "\n")
    return states


def report_run(root: Path) -> tuple[Plan, int]:
    """A run under three plans, in ``root`` (``steps.jsonl``, ``loss.jsonl``, ``plan.json``: the
    plan it ended under): steps 0-9 on the small plan (dp 2 x micro 2), a crash losing steps
    7-9, a resume at step 7 on the plan with a phase appended (dp 1 x micro 2 x accum 4) up to
    step 16, then an excision of two documents from step 14's checkpoint, resumed there and
    trained to step 26. Returns the last plan and the excision's ``from_consumed``."""
    small_shard_stores(root)
    first = plan_of(root)
    phased = plan_of(root, PLAN + REPORT_PHASE)
    log, losses = root / "steps.jsonl", root / "loss.jsonl"
    states = _report_steps(first, BatchConfig(2, 2, 1), log, losses, 0, 10)
    states |= _report_steps(phased, BatchConfig(1, 2, 4), log, losses, 7, 16, states[7])
    at = states[14]["consumed"]
    excised = phased.excise(at, docs=[("web", 3), ("math", 2)])
    excised.save(root / "plan.json")
    _report_steps(excised, BatchConfig(1, 2, 4), log, losses, 14, 26, states[14])
    return excised, at

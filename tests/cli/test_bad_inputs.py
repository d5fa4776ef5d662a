"""The bad-input catalogue: every command and the Python API, fed wrong flags and damaged files.

Each case runs on its own copy of one set of fixtures (stores, a plan, a step log, a state,
a Megatron prefix, tokenizer files) and must end cleanly: exit code 2 (1 where the contract is
"problems found") with exactly one line ``tokentape: error: ...`` on stderr and no traceback,
or, through the API, a ``TokentapeError`` (of the named subtype) whose message is one line and
names the argument or file. Either way nothing is written and every existing file is
byte-identical afterwards. See docs/errors.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import PLAN, SIZES, make_store

from tokentape._src.audit.locate import locate
from tokentape._src.audit.runs import log_schedule
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import index_hash, resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.program import main
from tokentape._src.store.reader import Source
from tokentape._src.tape.permutation import Permutation
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig, positions_for
from tokentape._src.train.schedule import Schedule
from tokentape._src.train.state import DataState
from tokentape._src.train.steplog import read_step_log, scan_step_log
from tokentape.errors import ArgumentError, OutOfRangeError, TokentapeError

HUGE = str(10**11)
BEYOND = str(2**63)

# --- fixtures -------------------------------------------------------------------------------


def _tiny_tiktoken(path: Path) -> None:
    """A ranks file of the 256 single bytes (a valid, tiny tiktoken BPE)."""
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    path.write_text("\n".join(lines) + "\n")


def _tiny_hf(path: Path) -> None:
    import tokenizers
    from tokenizers import models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "[UNK]": 1} | {f"w{k}": k + 2 for k in range(50)}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """Built once: three stores, mix.toml, plan.json, a 3-step log, a state, a Megatron prefix,
    tokenizer files and a small text corpus."""
    root = tmp_path_factory.mktemp("bad-inputs")
    for name, n in SIZES.items():
        make_store(root, name, n)
    (root / "mix.toml").write_text(PLAN)
    plan = resolve_plan(load_plan_spec(root / "mix.toml"))
    (root / "plan.json").write_text(plan.to_json())
    with Loader(plan, 0, BatchConfig(2, 2, 1), step_log=root / "steps.jsonl") as loader:
        for _ in range(3):
            loader.step()
            loader.commit()
        (root / "state.json").write_text(json.dumps(loader.state_dict()))
    (root / "mega").mkdir()
    convert = ["convert", "--to", "megatron", str(root / "stores/web"), str(root / "mega/web")]
    assert main(convert) == 0
    (root / "tok").mkdir()
    _tiny_tiktoken(root / "tok/bytes.tiktoken")
    _tiny_hf(root / "tok/tokenizer.json")
    (root / "text").mkdir()
    (root / "text/a.txt").write_text("hello world, a small document\n")
    (root / "text/b.jsonl").write_text('{"text": "w1 w2 w3"}\n{"text": "w4 w5"}\n')
    return root


@pytest.fixture
def work(base, tmp_path) -> Path:
    """A private copy of the fixtures, its plan pointing at its own stores."""
    w = tmp_path / "w"
    shutil.copytree(base, w, symlinks=True)
    plan = json.loads((w / "plan.json").read_text())
    for s in plan["sources"]:
        s["path"] = str(w / "stores" / s["name"])
    (w / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    return w


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory below ``root``: its content hash (``dir`` for a directory)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = "link:" + os.readlink(path)
            else:
                out[rel] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return out


# --- editing the fixtures -----------------------------------------------------------------

Edit = Callable[[Path], None]


def edit_json(rel: str, change: Callable[[Any], Any]) -> Edit:
    """Load ``rel`` as JSON, apply ``change`` (in place, or return a replacement), write back."""

    def apply(w: Path) -> None:
        data = json.loads((w / rel).read_text())
        new = change(data)
        (w / rel).write_text(json.dumps(data if new is None else new))

    return apply


def edit_plan(change: Callable[[dict], Any], rehash: bool = False) -> Edit:
    """Edit plan.json; ``rehash``: recompute its index hash, as a careful forger would."""

    def with_hash(data: dict) -> None:
        change(data)
        if rehash:
            rows = [
                (s["name"], s["weight_units"], s["n_tokens"], s["dtype"], s["content_hash"])
                for s in data["sources"]
            ]
            data["index_hash"] = index_hash(
                data["seq_len"], data["seed"], data["denominator"], rows
            )

    return edit_json("plan.json", with_hash)


def src0(**fields: Any) -> Callable[[dict], None]:
    return lambda d: d["sources"][0].update(fields)


def top(**fields: Any) -> Callable[[dict], None]:
    return lambda d: d.update(fields)


def drop(*path: Any) -> Callable[[Any], None]:
    def apply(d: Any) -> None:
        for key in path[:-1]:
            d = d[key]
        del d[path[-1]]

    return apply


def write(rel: str, data: bytes | str) -> Edit:
    def apply(w: Path) -> None:
        p = w / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)

    return apply


def replace_text(rel: str, old: str, new: str) -> Edit:
    def apply(w: Path) -> None:
        text = (w / rel).read_text()
        assert old in text, (rel, old)
        (w / rel).write_text(text.replace(old, new, 1))

    return apply


def edit_line(n: int, change: Callable[[dict], Any]) -> Edit:
    """Edit line ``n`` of steps.jsonl (a JSON object; ``change`` may return a replacement
    line as a string)."""

    def apply(w: Path) -> None:
        lines = (w / "steps.jsonl").read_text().splitlines()
        data = json.loads(lines[n])
        new = change(data)
        lines[n] = new if isinstance(new, str) else json.dumps(data)
        (w / "steps.jsonl").write_text("\n".join(lines) + "\n")

    return apply


def one_step_of(samples: int) -> Edit:
    """The log's first step made ``samples`` samples (dp 1 x micro ``samples``)."""
    return edit_line(0, lambda d: d.update(dp=1, micro=samples, accum=1, global_batch=samples))


def first_line_only(w: Path) -> None:
    lines = (w / "steps.jsonl").read_text().splitlines(keepends=True)
    (w / "steps.jsonl").write_text(lines[0])


def truncate(rel: str, keep: int) -> Edit:
    def apply(w: Path) -> None:
        p = w / rel
        p.write_bytes(p.read_bytes()[:keep])

    return apply


def remove(rel: str) -> Edit:
    return lambda w: (w / rel).unlink()


def both(*edits: Edit) -> Edit:
    def apply(w: Path) -> None:
        for e in edits:
            e(w)

    return apply


# --- the table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...] = ()
    """A command line; ``{w}`` is the case's copy of the fixtures."""
    edit: Edit | None = None
    code: int = 2
    api: Callable[[Path], Any] | None = None
    """Instead of a command: a library call on the copy, expected to raise ``exc``."""
    exc: type[Exception] = TokentapeError
    names: str = ""
    """A piece of the message: the argument, field or file it names."""


def cli(id: str, *argv: str, edit: Edit | None = None, code: int = 2, names: str = "") -> Case:
    return Case(id, tuple(argv), edit, code, names=names)


def api(
    id: str,
    call: Callable[[Path], Any],
    exc: type[Exception] = TokentapeError,
    names: str = "",
    edit: Edit | None = None,
) -> Case:
    return Case(id, edit=edit, api=call, exc=exc, names=names)


def _save_idx(rel: str, values: list[int]) -> Edit:
    return lambda w: np.save(w / rel, np.array(values, dtype=np.uint64))


P = "{w}/plan.json"
LOG = "{w}/steps.jsonl"
REPLAY = ("replay", P, "--step", "0", "--global-batch", "4")
LOCATE = ("locate", P, "web", "0")
REPLAY_LOG = ("replay", P, "--step", "1", "--log", LOG)
LOCATE_LOG = ("locate", P, "web", "0", "--log", LOG)
PLAN_CMD = ("plan", "{w}/mix.toml", "--out", "{w}/new.json")
INFO = ("info", "{w}/stores/web")
TOKENIZE = ("tokenize", "{w}/text/a.txt", "--out", "{w}/new-store")
MANIFEST = "stores/web/manifest.json"
WEB = 'path = "stores/web"'


def toml(old: str, new: str) -> Edit:
    return replace_text("mix.toml", old, new)


def web_source(extra: str) -> Edit:
    """mix.toml with ``extra`` lines added to the web source."""
    return toml(WEB, WEB + "\n" + extra)


def _plan(w: Path):
    return load_plan(w / "plan.json")


def _state(w: Path) -> dict:
    return json.loads((w / "state.json").read_text())


def _loader(w: Path, **kw: Any) -> Loader:
    return Loader(_plan(w), kw.pop("dp_rank", 0), kw.pop("config", BatchConfig(2, 2, 1)), **kw)


def _resume(w: Path, change: Callable[[dict], Any]) -> None:
    """Load a saved state edited by ``change`` into a fresh loader."""
    data = _state(w)
    new = change(data)
    with _loader(w) as loader:
        loader.load_state_dict(data if new is None else new)


def _state_at(w: Path, consumed: int) -> DataState:
    plan = _plan(w)
    start = DataState.start(plan)
    return DataState(start.index_hash, start.identity, consumed, 1, start.history)


def _steps_at_2_62(w: Path) -> None:
    """A loader whose state sits at the last positions below 2**62: its step is refused."""
    plan = _plan(w)
    start = DataState.start(plan)
    config = BatchConfig(1, 4, 1)
    consumed = 2**62 - 2
    state = DataState.from_dict(
        start.to_dict()
        | {
            "consumed": consumed,
            "step": consumed // 2,
            "history": [{"step": 0, "consumed": 0, "dp_size": 1, "micro": 2, "accum": 1}],
        }
    )
    with Loader(plan, 0, config, state=state, prefetch=0) as loader:
        loader.step()


def _tape(w: Path):
    return _plan(w).tape()


CASES: list[Case] = [
    # --- the command line itself ---------------------------------------------------------
    cli("no-command"),
    cli("unknown-command", "frobnicate"),
    cli("unknown-flag", *REPLAY, "--colour", "red", names="--colour"),
    # --- replay flags ----------------------------------------------------------------------
    cli("replay-global-batch-0", "replay", P, "--step", "0", "--global-batch", "0"),
    cli("replay-global-batch-neg", "replay", P, "--step", "0", "--global-batch", "-4"),
    cli("replay-global-batch-huge", "replay", P, "--step", "0", "--global-batch", HUGE,
        names="memory"),
    cli("replay-global-batch-beyond", "replay", P, "--step", "0", "--global-batch", BEYOND,
        names="--global-batch"),
    cli("replay-global-batch-inf", "replay", P, "--step", "0", "--global-batch", "inf"),
    cli("replay-global-batch-nan", "replay", P, "--step", "0", "--global-batch", "nan"),
    cli("replay-global-batch-float", "replay", P, "--step", "0", "--global-batch", "1.5"),
    cli("replay-step-neg", "replay", P, "--step", "-1", "--global-batch", "4", names="--step"),
    cli("replay-step-huge", "replay", P, "--step", BEYOND, "--global-batch", "4", names="2**62"),
    cli("replay-step-text", "replay", P, "--step", "seven", "--global-batch", "4"),
    cli("replay-no-step", "replay", P, "--global-batch", "4"),
    cli("replay-no-schedule", "replay", P, "--step", "0", names="--log"),
    cli("replay-dp-0", "replay", P, "--step", "0", "--dp", "0", "--micro", "2", names="--dp"),
    cli("replay-micro-neg", "replay", P, "--step", "0", "--dp", "2", "--micro", "-2"),
    cli("replay-accum-0", "replay", P, "--step", "0", "--dp", "2", "--micro", "2", "--accum", "0"),
    cli("replay-dp-alone", "replay", P, "--step", "0", "--dp", "2", names="--micro"),
    cli("replay-two-schedules", *REPLAY, "--dp", "2", "--micro", "2"),
    cli("replay-log-and-batch", *REPLAY, "--log", LOG),
    cli("replay-rank-no-shape", *REPLAY, "--rank", "0", names="--rank"),
    cli("replay-rank-neg", "replay", P, "--step", "0", "--dp", "2", "--micro", "2", "--rank", "-1"),
    cli("replay-rank-too-big", "replay", P, "--step", "0", "--dp", "2", "--micro", "2",
        "--rank", "2", names="--rank"),
    cli("replay-top-neg", *REPLAY, "--top", "-1", names="--top"),
    cli("replay-preview-neg", *REPLAY, "--preview-chars", "-5", names="--preview-chars"),
    cli("replay-shape-huge", "replay", P, "--step", "0", "--dp", HUGE, "--micro", HUGE,
        names="--dp"),
    cli("replay-step-beyond-log", "replay", P, "--step", "3", "--log", LOG, names="step log"),
    cli("replay-log-missing", "replay", P, "--step", "0", "--log", "{w}/nope.jsonl",
        names="nope.jsonl"),
    cli("replay-log-directory", "replay", P, "--step", "0", "--log", "{w}/stores"),
    cli("replay-plan-missing", "replay", "{w}/nope.json", "--step", "0", "--global-batch", "4"),
    cli("replay-plan-is-toml", "replay", "{w}/mix.toml", "--step", "0", "--global-batch", "4"),
    cli("replay-plan-is-directory", "replay", "{w}/stores", "--step", "0", "--global-batch", "4"),
    # --- locate flags ----------------------------------------------------------------------
    cli("locate-doc-neg", "locate", P, "web", "-1", names="document -1"),
    cli("locate-doc-huge", "locate", P, "web", HUGE, names="out of range"),
    cli("locate-doc-text", "locate", P, "web", "first"),
    cli("locate-unknown-source", "locate", P, "books", "0", names="books"),
    cli("locate-limit-neg", *LOCATE, "--limit", "-1", names="--limit"),
    cli("locate-until-neg", *LOCATE, "--global-batch", "4", "--until-step", "-1"),
    cli("locate-until-no-schedule", *LOCATE, "--until-step", "3", names="--until-step"),
    cli("locate-until-beyond", *LOCATE, "--global-batch", "4", "--until-step", BEYOND),
    cli("locate-until-huge-batch", *LOCATE, "--global-batch", str(2**40), "--until-step",
        str(2**20), names="memory"),
    cli("locate-global-batch-0", *LOCATE, "--global-batch", "0"),
    cli("locate-until-beyond-log", *LOCATE_LOG, "--until-step", "9", names="step log"),
    # --- tokenize flags --------------------------------------------------------------------
    cli("tokenize-workers-0", *TOKENIZE, "--workers", "0", names="--workers"),
    cli("tokenize-workers-neg", *TOKENIZE, "--workers", "-2", names="--workers"),
    cli("tokenize-shard-mb-0", *TOKENIZE, "--shard-mb", "0", names="--shard-mb"),
    cli("tokenize-shard-mb-neg", *TOKENIZE, "--shard-mb", "-1", names="--shard-mb"),
    cli("tokenize-shard-mb-inf", *TOKENIZE, "--shard-mb", "inf", names="--shard-mb"),
    cli("tokenize-shard-mb-nan", *TOKENIZE, "--shard-mb", "nan", names="--shard-mb"),
    cli("tokenize-shard-mb-huge", *TOKENIZE, "--shard-mb", "1e300", names="--shard-mb"),
    cli("tokenize-unit-mb-0", *TOKENIZE, "--unit-mb", "0", names="--unit-mb"),
    cli("tokenize-unit-mb-neg", *TOKENIZE, "--unit-mb", "-3", names="--unit-mb"),
    cli("tokenize-unit-mb-inf", *TOKENIZE, "--unit-mb", "inf", names="--unit-mb"),
    cli("tokenize-unit-mb-nan", *TOKENIZE, "--unit-mb", "nan", names="--unit-mb"),
    cli("tokenize-input-missing", "tokenize", "{w}/text/nope.txt", "--out", "{w}/new-store"),
    cli("tokenize-input-empty-dir", "tokenize", "{w}/empty", "--out", "{w}/new-store",
        edit=lambda w: (w / "empty").mkdir()),
    cli("tokenize-tokenizer-missing", *TOKENIZE, "--tokenizer", "{w}/tok/nope.json"),
    cli("tokenize-tiktoken-missing", *TOKENIZE, "--tokenizer", "tiktoken:{w}/tok/nope"),
    cli("tokenize-tokenizer-not-json", *TOKENIZE, "--tokenizer", "{w}/tok/tokenizer.json",
        edit=write("tok/tokenizer.json", "{not json")),
    cli("tokenize-tokenizer-empty", *TOKENIZE, "--tokenizer", "{w}/tok/tokenizer.json",
        edit=write("tok/tokenizer.json", "")),
    cli("tokenize-tokenizer-wrong-json", *TOKENIZE, "--tokenizer", "{w}/tok/tokenizer.json",
        edit=write("tok/tokenizer.json", '{"model": 5}')),
    cli("tokenize-tokenizer-directory", *TOKENIZE, "--tokenizer", "{w}/text",
        names="no tokenizer.json"),
    cli("tokenize-tiktoken-no-prefix", *TOKENIZE, "--tokenizer", "{w}/tok/bytes.tiktoken",
        names="tiktoken:"),
    cli("tokenize-tiktoken-bad-line", *TOKENIZE, "--tokenizer", "tiktoken:{w}/tok/bytes.tiktoken",
        edit=write("tok/bytes.tiktoken", "not base64 at all\n")),
    cli("tokenize-tiktoken-bad-rank", *TOKENIZE, "--tokenizer", "tiktoken:{w}/tok/bytes.tiktoken",
        edit=write("tok/bytes.tiktoken", "YQ== x\n")),
    cli("tokenize-eod-unknown-hf", *TOKENIZE, "--tokenizer", "{w}/tok/tokenizer.json",
        "--eod-token", "<|nope|>"),
    cli("tokenize-eod-unknown-tiktoken", *TOKENIZE, "--tokenizer",
        "tiktoken:{w}/tok/bytes.tiktoken", "--eod-token", "<|nope|>", names="<|nope|>"),
    cli("tokenize-filter-unknown", *TOKENIZE, "--filter", "sparkle"),
    cli("tokenize-filter-min-neg", *TOKENIZE, "--filter", "min-tokens:-1"),
    cli("tokenize-filter-min-text", *TOKENIZE, "--filter", "min-tokens:many"),
    cli("tokenize-filter-ratio", *TOKENIZE, "--filter", "unique-lines:min_ratio=2"),
    cli("tokenize-filter-ratio-nan", *TOKENIZE, "--filter", "unique-lines:min_ratio=nan"),
    cli("tokenize-dtype-bad", *TOKENIZE, "--dtype", "float32"),
    cli("tokenize-executor-bad", *TOKENIZE, "--executor", "slurm"),
    cli("tokenize-out-is-file", "tokenize", "{w}/text/a.txt", "--out", "{w}/text/b.jsonl"),
    cli("tokenize-out-foreign-dir", "tokenize", "{w}/text/a.txt", "--out", "{w}/tok"),
    cli("tokenize-out-other-store", "tokenize", "{w}/text/a.txt", "--out", "{w}/stores/web"),
    cli("tokenize-bad-jsonl", "tokenize", "{w}/text/b.jsonl", "--out", "{w}/new-store",
        edit=write("text/b.jsonl", '{"text": "ok"}\n{"text": 5}\n')),
    cli("tokenize-missing-text-key", "tokenize", "{w}/text/b.jsonl", "--out", "{w}/new-store",
        "--text-key", "body"),
    cli("tokenize-unsupported-input", "tokenize", "{w}/text/x.csv", "--out", "{w}/new-store",
        edit=write("text/x.csv", "a,b\n")),
    # --- info ------------------------------------------------------------------------------
    cli("info-missing", "info", "{w}/nope"),
    cli("info-a-file", "info", "{w}/mix.toml"),
    cli("info-no-manifest", "info", "{w}/text"),
    cli("info-manifest-not-json", *INFO, edit=write(MANIFEST, "{"), names="manifest"),
    cli("info-manifest-list", *INFO, edit=write(MANIFEST, "[]"), names="manifest"),
    cli("info-manifest-empty", *INFO, edit=write(MANIFEST, ""), names="manifest"),
    cli("info-manifest-format", *INFO, edit=edit_json(MANIFEST, top(format="other"))),
    cli("info-manifest-version", *INFO, edit=edit_json(MANIFEST, top(format_version=2))),
    cli("info-manifest-version-text", *INFO, edit=edit_json(MANIFEST, top(format_version="1"))),
    cli("info-manifest-dtype", *INFO, edit=edit_json(MANIFEST, top(dtype="float32")),
        names="float32"),
    cli("info-manifest-vocab-text", *INFO, edit=edit_json(MANIFEST, top(vocab_size="257"))),
    cli("info-manifest-vocab-neg", *INFO, edit=edit_json(MANIFEST, top(vocab_size=-1))),
    cli("info-manifest-eod-beyond", *INFO, edit=edit_json(MANIFEST, top(eod_id=999))),
    cli("info-manifest-shards-dict", *INFO, edit=edit_json(MANIFEST, top(shards={}))),
    cli("info-manifest-shard-not-object", *INFO, edit=edit_json(MANIFEST, top(shards=[5]))),
    cli("info-manifest-no-shard-tokens", *INFO, edit=edit_json(MANIFEST, drop("shards", 0,
        "n_tokens"))),
    cli("info-manifest-shard-tokens-neg", *INFO,
        edit=edit_json(MANIFEST, lambda d: d["shards"][0].update(n_tokens=-5))),
    cli("info-manifest-n-tokens-mismatch", *INFO, edit=edit_json(MANIFEST, top(n_tokens=7))),
    cli("info-manifest-n-docs-text", *INFO, edit=edit_json(MANIFEST, top(n_docs="many"))),
    cli("info-manifest-shard-dotdot", *INFO,
        edit=edit_json(MANIFEST, lambda d: d["shards"][0].update(name="../code/part-00000"))),
    cli("info-manifest-shard-absolute", *INFO,
        edit=edit_json(MANIFEST, lambda d: d["shards"][0].update(name="/etc/passwd"))),
    cli("info-manifest-extra-list", *INFO, edit=edit_json(MANIFEST, top(extra=[]))),
    cli("info-manifest-huge-int", *INFO, edit=replace_text(MANIFEST, '"n_docs": ',
        '"n_docs": ' + "9" * 5000 + ", \"x\": ")),
    cli("info-manifest-deep", *INFO, edit=write(MANIFEST, "[" * 100000 + "]" * 100000)),
    cli("info-manifest-bad-utf8", *INFO, edit=write(MANIFEST, b'{"format": "\xff"}')),
    # --- plan (the TOML file, and the stores it names) -----------------------------------
    cli("plan-missing", "plan", "{w}/nope.toml"),
    cli("plan-a-directory", "plan", "{w}/stores"),
    cli("plan-not-toml", *PLAN_CMD, edit=write("mix.toml", "seq_len = = 3")),
    cli("plan-bad-utf8", *PLAN_CMD, edit=write("mix.toml", b"seq_len = 64\n# \xff\n")),
    cli("plan-seq-len-0", *PLAN_CMD, edit=toml("seq_len = 64", "seq_len = 0"),
        names="seq_len"),
    cli("plan-seq-len-neg", *PLAN_CMD, edit=toml("seq_len = 64", "seq_len = -64")),
    cli("plan-seq-len-text", *PLAN_CMD,
        edit=toml("seq_len = 64", 'seq_len = "64"')),
    cli("plan-seq-len-float", *PLAN_CMD,
        edit=toml("seq_len = 64", "seq_len = 64.5")),
    cli("plan-seq-len-huge", *PLAN_CMD,
        edit=toml("seq_len = 64", "seq_len = 100000000")),
    cli("plan-seq-len-missing", *PLAN_CMD, edit=toml("seq_len = 64", "")),
    cli("plan-seed-neg", *PLAN_CMD, edit=toml("seed = 1234", "seed = -1"),
        names="seed"),
    cli("plan-seed-huge", *PLAN_CMD,
        edit=toml("seed = 1234", "seed = 9223372036854775808"), names="seed"),
    cli("plan-seed-text", *PLAN_CMD, edit=toml("seed = 1234", 'seed = "a"')),
    cli("plan-total-0", *PLAN_CMD,
        edit=toml("total_samples = 2000", "total_samples = 0")),
    cli("plan-total-neg", *PLAN_CMD,
        edit=toml("total_samples = 2000", "total_samples = -5")),
    cli("plan-total-text", *PLAN_CMD,
        edit=toml("total_samples = 2000", 'total_samples = "lots"')),
    cli("plan-total-fraction", *PLAN_CMD,
        edit=toml("total_samples = 2000", 'total_samples = "1.00005K"')),
    cli("plan-total-inf", *PLAN_CMD,
        edit=toml("total_samples = 2000", "total_samples = inf")),
    cli("plan-horizon-beyond", *PLAN_CMD,
        edit=toml("total_samples = 2000", 'total_samples = "5000P"'),
        names="2**62"),
    cli("plan-both-totals", *PLAN_CMD,
        edit=toml("total_samples = 2000", 'total_samples = 2000\n'
                          'total_tokens = "1M"')),
    cli("plan-no-total", *PLAN_CMD, edit=toml("total_samples = 2000", "")),
    cli("plan-denominator-0", *PLAN_CMD,
        edit=toml("seed = 1234", "seed = 1234\nweight_denominator = 0"),
        names="weight_denominator"),
    cli("plan-denominator-huge", *PLAN_CMD,
        edit=toml("seed = 1234", "seed = 1234\nweight_denominator = 2000000000"),
        names="weight_denominator"),
    cli("plan-denominator-text", *PLAN_CMD,
        edit=toml("seed = 1234", 'seed = 1234\nweight_denominator = "x"')),
    cli("plan-denominator-too-small", *PLAN_CMD,
        edit=toml("seed = 1234", "seed = 1234\nweight_denominator = 2"), names="mix.toml"),
    cli("plan-unknown-key", *PLAN_CMD,
        edit=toml("seed = 1234", "seed = 1234\nshuffle = true"),
        names="shuffle"),
    cli("plan-no-sources", *PLAN_CMD, edit=write("mix.toml", "seq_len = 8\nseed = 1\n"
                                             "total_samples = 10\n")),
    cli("plan-source-unknown-key", *PLAN_CMD,
        edit=toml('name = "web"', 'name = "web"\ncolour = "red"'),
        names="colour"),
    cli("plan-source-name-empty", *PLAN_CMD,
        edit=toml('name = "web"', 'name = ""')),
    cli("plan-source-name-dup", *PLAN_CMD,
        edit=toml('name = "code"', 'name = "web"'), names="twice"),
    cli("plan-source-name-number", *PLAN_CMD,
        edit=toml('name = "web"', "name = 5")),
    cli("plan-source-path-missing", *PLAN_CMD,
        edit=toml('path = "stores/web"', 'path = "stores/nope"'),
        names="web"),
    cli("plan-source-path-number", *PLAN_CMD,
        edit=toml('path = "stores/web"', "path = 3")),
    cli("plan-source-path-a-file", *PLAN_CMD,
        edit=toml('path = "stores/web"', 'path = "mix.toml"')),
    cli("plan-weight-0", *PLAN_CMD, edit=toml("weight = 60", "weight = 0")),
    cli("plan-weight-neg", *PLAN_CMD, edit=toml("weight = 60", "weight = -60")),
    cli("plan-weight-inf", *PLAN_CMD, edit=toml("weight = 60", "weight = inf")),
    cli("plan-weight-nan", *PLAN_CMD, edit=toml("weight = 60", "weight = nan")),
    cli("plan-weight-text", *PLAN_CMD, edit=toml("weight = 60", 'weight = "60"')),
    cli("plan-weight-bool", *PLAN_CMD, edit=toml("weight = 60", "weight = true")),
    cli("plan-weight-missing", *PLAN_CMD, edit=toml("weight = 60", "")),
    cli("plan-weight-tiny", *PLAN_CMD, edit=toml("weight = 60", "weight = 1e-300"),
        names="mix.toml"),
    cli("plan-max-repeats-0", *PLAN_CMD,
        edit=toml("max_repeats = 8", "max_repeats = 0")),
    cli("plan-over-budget", *PLAN_CMD,
        edit=toml("max_repeats = 8", "max_repeats = 1"), names="max_repeats"),
    cli("plan-format-bad", *PLAN_CMD,
        edit=web_source('format = "arrow"')),
    cli("plan-vocab-mismatch", *PLAN_CMD,
        edit=web_source('vocab_size = 300'),
        names="vocab_size"),
    cli("plan-eod-mismatch", *PLAN_CMD,
        edit=web_source('eod_id = 0'),
        names="eod_id"),
    cli("plan-eod-text", *PLAN_CMD,
        edit=web_source('eod_id = "x"')),
    cli("plan-tokenizer-on-store", *PLAN_CMD,
        edit=toml('path = "stores/web"',
                          'path = "stores/web"\ntokenizer = "bytes"\nformat = "tokentape"')),
    cli("plan-seq-len-beyond-store", *PLAN_CMD,
        edit=toml("seq_len = 64", "seq_len = 3000"), names="seq_len"),
    cli("plan-store-manifest-broken", *PLAN_CMD, edit=write(MANIFEST, "{"), names="web"),
    cli("plan-store-dtype-mixed", *PLAN_CMD, edit=edit_json(MANIFEST, top(vocab_size=70000))),
    cli("plan-megatron-no-vocab", *PLAN_CMD,
        edit=toml('path = "stores/web"', 'path = "mega/web"'), names="web"),
    cli("plan-megatron-idx-truncated", *PLAN_CMD,
        edit=both(toml('path = "stores/web"',
                               'path = "mega/web"\nvocab_size = 257\neod_id = 256'),
                  truncate("mega/web.idx", 20))),
    cli("plan-megatron-idx-magic", *PLAN_CMD,
        edit=both(toml('path = "stores/web"',
                               'path = "mega/web"\nvocab_size = 257\neod_id = 256'),
                  lambda w: (w / "mega/web.idx").write_bytes(
                      b"NOTMAGIC!" + (w / "mega/web.idx").read_bytes()[9:]))),
    cli("plan-megatron-eod-beyond-vocab", *PLAN_CMD,
        edit=toml('path = "stores/web"',
                          'path = "mega/web"\nvocab_size = 257\neod_id = 300')),
    cli("plan-shard-truncated", *PLAN_CMD, edit=truncate("stores/web/part-00000.bin", 100),
        names="part-00000.bin"),
    cli("plan-shard-missing", *PLAN_CMD, edit=remove("stores/web/part-00000.bin"),
        names="part-00000.bin"),
    cli("plan-shard-idx-missing", *PLAN_CMD, edit=remove("stores/web/part-00000.idx.npy"),
        names="part-00000.idx.npy"),
    cli("plan-content-hash-forged", *PLAN_CMD,
        edit=edit_json(MANIFEST, top(content_hash="sha256:" + "0" * 64)), names="content"),
    cli("plan-out-in-missing-dir", "plan", "{w}/mix.toml", "--out", "{w}/nope/plan.json"),
    cli("plan-out-is-directory", "plan", "{w}/mix.toml", "--out", "{w}/stores"),
    cli("plan-plot-bad-format", "plan", "{w}/mix.toml", "--plot", "{w}/mix.xyz",
        names="--plot"),
    cli("plan-plot-bad-format-with-out", "plan", "{w}/mix.toml", "--out", "{w}/new.json",
        "--plot", "{w}/mix.xyz"),
    cli("plan-plot-missing-dir", "plan", "{w}/mix.toml", "--plot", "{w}/nope/mix.png"),
    # --- PLAN.json, read by locate and replay ----------------------------------------------
    cli("planjson-not-json", *LOCATE, edit=write("plan.json", "{"), names="plan.json"),
    cli("planjson-empty", *LOCATE, edit=write("plan.json", "")),
    cli("planjson-list", *LOCATE, edit=write("plan.json", "[]")),
    cli("planjson-bad-utf8", *LOCATE, edit=write("plan.json", b'{"format": "\xff"}')),
    cli("planjson-deep", *LOCATE, edit=write("plan.json", "[" * 100000 + "]" * 100000)),
    cli("planjson-huge-int", *LOCATE, edit=replace_text("plan.json", '"seed": 1234',
                                                        '"seed": ' + "9" * 5000)),
    cli("planjson-format", *LOCATE, edit=edit_plan(top(format="tokentape.plan2"))),
    cli("planjson-algorithm", *LOCATE, edit=edit_plan(top(algorithm_version=3))),
    cli("planjson-algorithm-text", *LOCATE, edit=edit_plan(top(algorithm_version="1"))),
    cli("planjson-horizon-float", *LOCATE, edit=edit_plan(top(horizon_samples=2000.5)),
        names="horizon_samples"),
    cli("planjson-horizon-float-replay", *REPLAY, edit=edit_plan(top(horizon_samples=2000.5)),
        names="horizon_samples"),
    cli("planjson-horizon-text", *LOCATE, edit=edit_plan(top(horizon_samples="2000")),
        names="horizon_samples"),
    cli("planjson-horizon-neg", *LOCATE, edit=edit_plan(top(horizon_samples=-1))),
    cli("planjson-horizon-beyond", *LOCATE, edit=edit_plan(top(horizon_samples=2**62))),
    cli("planjson-horizon-missing", *LOCATE, edit=edit_plan(drop("horizon_samples"))),
    cli("planjson-seq-len-0", *LOCATE, edit=edit_plan(top(seq_len=0), rehash=True)),
    cli("planjson-seq-len-text", *LOCATE, edit=edit_plan(top(seq_len="64"))),
    cli("planjson-seq-len-changed", *REPLAY, edit=edit_plan(top(seq_len=32), rehash=True)),
    cli("planjson-seed-neg", *LOCATE, edit=edit_plan(top(seed=-1), rehash=True)),
    cli("planjson-seed-beyond", *LOCATE, edit=edit_plan(top(seed=2**64), rehash=True)),
    cli("planjson-denominator-0", *LOCATE, edit=edit_plan(top(denominator=0), rehash=True)),
    cli("planjson-denominator-huge", *LOCATE, edit=edit_plan(top(denominator=2**40), rehash=True)),
    cli("planjson-unknown-key", *LOCATE, edit=edit_plan(top(shuffle=True)), names="shuffle"),
    cli("planjson-sources-empty", *LOCATE, edit=edit_plan(top(sources=[]))),
    cli("planjson-sources-text", *LOCATE, edit=edit_plan(top(sources="web"))),
    cli("planjson-source-list", *LOCATE, edit=edit_plan(lambda d: d["sources"].__setitem__(0, []))),
    cli("planjson-source-unknown-key", *LOCATE, edit=edit_plan(src0(colour="red")),
        names="colour"),
    cli("planjson-source-missing-name", *LOCATE, edit=edit_plan(drop("sources", 0, "name"))),
    cli("planjson-source-missing-n-samples", *LOCATE,
        edit=edit_plan(drop("sources", 0, "n_samples"))),
    cli("planjson-n-tokens-text", *LOCATE, edit=edit_plan(src0(n_tokens="15520"))),
    cli("planjson-n-samples-0", *LOCATE, edit=edit_plan(src0(n_samples=0))),
    cli("planjson-n-samples-wrong", *LOCATE, edit=edit_plan(src0(n_samples=241))),
    cli("planjson-n-tokens-forged", *LOCATE,
        edit=edit_plan(src0(n_tokens=100000, n_samples=99999 // 64), rehash=True),
        names="tokens"),
    cli("planjson-n-tokens-forged-replay", *REPLAY,
        edit=edit_plan(src0(n_tokens=100000, n_samples=99999 // 64), rehash=True)),
    cli("planjson-weight-units-0", *LOCATE, edit=edit_plan(src0(weight_units=0), rehash=True)),
    cli("planjson-weight-units-sum", *LOCATE, edit=edit_plan(src0(weight_units=1), rehash=True),
        names="weight_units"),
    cli("planjson-weight-units-float", *LOCATE, edit=edit_plan(src0(weight_units=1.5))),
    cli("planjson-index-hash-wrong", *LOCATE, edit=edit_plan(top(index_hash="sha256:0")),
        names="index_hash"),
    cli("planjson-index-hash-missing", *LOCATE, edit=edit_plan(drop("index_hash"))),
    cli("planjson-index-hash-number", *LOCATE, edit=edit_plan(top(index_hash=5))),
    cli("planjson-dtype-float", *LOCATE, edit=edit_plan(src0(dtype="float32"), rehash=True),
        names="dtype"),
    cli("planjson-dtype-number", *LOCATE, edit=edit_plan(src0(dtype=2))),
    cli("planjson-vocab-0", *LOCATE, edit=edit_plan(src0(vocab_size=0))),
    cli("planjson-eod-beyond", *LOCATE, edit=edit_plan(src0(eod_id=257)), names="eod_id"),
    cli("planjson-eod-neg", *LOCATE, edit=edit_plan(src0(eod_id=-1))),
    cli("planjson-weight-text", *LOCATE, edit=edit_plan(src0(weight="60"))),
    cli("planjson-weight-neg", *LOCATE, edit=edit_plan(src0(weight=-1.0))),
    cli("planjson-max-repeats-nan", *LOCATE,
        edit=replace_text("plan.json", '"max_repeats": 8.0', '"max_repeats": NaN')),
    cli("planjson-passes-inf", *LOCATE, edit=edit_plan(src0(passes=float("inf"))),
        names="passes"),
    cli("planjson-draws-neg", *LOCATE, edit=edit_plan(src0(draws=-1))),
    cli("planjson-format-bad", *LOCATE, edit=edit_plan(src0(format="arrow"))),
    cli("planjson-format-megatron", *LOCATE, edit=edit_plan(src0(format="megatron"))),
    cli("planjson-format-megatron-replay", *REPLAY, edit=edit_plan(src0(format="megatron"))),
    cli("planjson-tokenizer-on-store", *REPLAY, edit=edit_plan(src0(tokenizer="/nope.json")),
        names="tokenizer"),
    cli("planjson-tokenizer-number", *LOCATE, edit=edit_plan(src0(tokenizer=5))),
    cli("planjson-megatron-malformed", *LOCATE, edit=edit_plan(src0(megatron={"files": 1})),
        names="megatron"),
    cli("planjson-megatron-text", *LOCATE, edit=edit_plan(src0(megatron="x"))),
    cli("planjson-path-missing", *LOCATE, edit=edit_plan(src0(path="/nonexistent/store")),
        names="plan source 'web'"),
    cli("planjson-path-missing-replay", *REPLAY, edit=edit_plan(src0(path="/nonexistent/store")),
        names="plan source 'web'"),
    cli("planjson-path-number", *LOCATE, edit=edit_plan(src0(path=5))),
    cli("planjson-path-other-store", *LOCATE,
        edit=lambda w: edit_plan(src0(path=str(w / "stores/code")))(w), names="content hash"),
    cli("planjson-path-other-store-replay", *REPLAY,
        edit=lambda w: edit_plan(src0(path=str(w / "stores/code")))(w)),
    cli("planjson-names-dup", *LOCATE, edit=edit_plan(src0(name="code"), rehash=True),
        names="twice"),
    cli("planjson-store-manifest-gone", *REPLAY, edit=remove(MANIFEST)),
    # --- verify ------------------------------------------------------------------------------
    cli("verify-blocks-0", "verify", "{w}/stores/web", "--quick", "--blocks", "0"),
    cli("verify-blocks-neg", "verify", "{w}/stores/web", "--quick", "--blocks", "-3"),
    cli("verify-missing", "verify", "{w}/nope", code=2),
    cli("verify-vocab-0", "verify", "{w}/mega/web", "--vocab-size", "0"),
    cli("verify-eod-neg", "verify", "{w}/mega/web", "--vocab-size", "257", "--eod-id", "-1"),
    cli("verify-shard-truncated", "verify", "{w}/stores/web", code=1, names="FAILED",
        edit=truncate("stores/web/part-00000.bin", 100)),
    cli("verify-shard-flipped", "verify", "{w}/stores/web", code=1, names="FAILED",
        edit=lambda w: (w / "stores/web/part-00000.bin").write_bytes(
            b"\x01\x00" + (w / "stores/web/part-00000.bin").read_bytes()[2:])),
    cli("verify-idx-corrupt", "verify", "{w}/stores/web", code=1, names="part-00000.idx.npy",
        edit=_save_idx("stores/web/part-00000.idx.npy", [0, 9, 3])),
    cli("verify-content-hash-forged", "verify", "{w}/stores/web", code=1, names="content",
        edit=edit_json(MANIFEST, top(content_hash="sha256:" + "0" * 64))),
    cli("verify-plan-store-changed", "verify", P, code=1, names="FAILED",
        edit=truncate("stores/code/part-00000.bin", 10)),
    cli("replay-log-tokens-tampered", *REPLAY_LOG, code=1, names="MISMATCH",
        edit=edit_line(1, lambda d: d.update(tokens_hash="0" * 64))),
    cli("verify-plan-broken", "verify", P, edit=write("plan.json", "{")),
    # --- convert -----------------------------------------------------------------------------
    cli("convert-no-direction", "convert", "{w}/stores/web", "{w}/mega/out"),
    cli("convert-missing-source", "convert", "--to", "megatron", "{w}/nope", "{w}/mega/out"),
    cli("convert-dtype-bad", "convert", "--to", "megatron", "{w}/stores/web", "{w}/mega/out",
        "--dtype", "float32"),
    cli("convert-dtype-too-small", "convert", "--to", "megatron", "{w}/stores/web",
        "{w}/mega/out", "--dtype", "uint8"),
    cli("convert-from-no-vocab", "convert", "--from", "megatron", "{w}/mega/web", "{w}/new-store"),
    cli("convert-from-vocab-0", "convert", "--from", "megatron", "{w}/mega/web", "{w}/new-store",
        "--vocab-size", "0", "--eod-id", "0"),
    cli("convert-from-eod-beyond", "convert", "--from", "megatron", "{w}/mega/web",
        "{w}/new-store", "--vocab-size", "257", "--eod-id", "257"),
    cli("convert-from-eod-neg", "convert", "--from", "megatron", "{w}/mega/web",
        "{w}/new-store", "--vocab-size", "257", "--eod-id", "-1"),
    cli("convert-from-shard-mb-0", "convert", "--from", "megatron", "{w}/mega/web",
        "{w}/new-store", "--vocab-size", "257", "--eod-id", "256", "--shard-mb", "0"),
    cli("convert-from-shard-mb-inf", "convert", "--from", "megatron", "{w}/mega/web",
        "{w}/new-store", "--vocab-size", "257", "--eod-id", "256", "--shard-mb", "inf"),
    cli("convert-from-shard-mb-nan", "convert", "--from", "megatron", "{w}/mega/web",
        "{w}/new-store", "--vocab-size", "257", "--eod-id", "256", "--shard-mb", "nan"),
    cli("convert-from-idx-truncated", "convert", "--from", "megatron", "{w}/mega/web",
        "{w}/new-store", "--vocab-size", "257", "--eod-id", "256",
        edit=truncate("mega/web.idx", 40)),
    cli("convert-to-existing", "convert", "--to", "megatron", "{w}/stores/code", "{w}/mega/web"),
    # --- smoke, corpora, demo -----------------------------------------------------------------
    cli("smoke-dp-0", "smoke", P, "--dp", "0", names="--dp"),
    cli("smoke-tp-neg", "smoke", P, "--tp", "-1", names="--tp"),
    cli("smoke-micro-0", "smoke", P, "--micro", "0"),
    cli("smoke-accum-0", "smoke", P, "--accum", "0"),
    cli("smoke-steps-0", "smoke", P, "--steps", "0"),
    cli("smoke-dp-huge", "smoke", P, "--dp", "100000", "--tp", "100000", names="processes"),
    cli("smoke-plan-broken", "smoke", P, "--dp", "1", "--tp", "1", edit=write("plan.json", "{"),
        names="plan.json"),
    cli("smoke-steps-beyond", "smoke", P, "--dp", "1", "--tp", "1", "--micro", "1",
        "--steps", str(2**62 + 1), names="2**62"),
    cli("corpora-out-is-file", "corpora", "--out", "{w}/mix.toml"),
    cli("demo-workers-0", "demo", "--out", "{w}/demo", "--workers", "0", names="--workers"),
    cli("demo-workers-neg", "demo", "--out", "{w}/demo", "--workers", "-1"),
    # --- the step log, read by replay and locate -------------------------------------------
    cli("log-empty", *REPLAY_LOG, edit=write("steps.jsonl", ""), names="empty"),
    cli("log-not-json", *REPLAY_LOG, edit=edit_line(1, lambda d: "{step: 1}"), names=":2"),
    cli("log-list-line", *REPLAY_LOG, edit=edit_line(1, lambda d: "[1, 2]"), names=":2"),
    cli("log-step-missing", *REPLAY_LOG, edit=edit_line(1, drop("step")), names="'step'"),
    cli("log-step-text", *REPLAY_LOG, edit=edit_line(1, lambda d: d.update(step="1")),
        names="'step'"),
    cli("log-step-neg", *REPLAY_LOG, edit=edit_line(1, lambda d: d.update(step=-1))),
    cli("log-step-float", *REPLAY_LOG, edit=edit_line(1, lambda d: d.update(step=1.0))),
    cli("log-dp-0", *REPLAY_LOG, edit=edit_line(1, lambda d: d.update(dp=0)), names="'dp'"),
    cli("log-global-batch-wrong", *REPLAY_LOG, edit=edit_line(1, lambda d: d.update(
        global_batch=5)), names="global_batch"),
    cli("log-consumed-wrong", *REPLAY_LOG, edit=edit_line(1, lambda d: d.update(consumed=5)),
        names="consumed"),
    cli("log-consumed-beyond", *REPLAY_LOG, edit=edit_line(1, lambda d: d.update(
        consumed=2**62)), names="2**62"),
    cli("log-gap", *REPLAY_LOG, edit=edit_line(1, lambda d: d.update(step=5, consumed=20)),
        names="missing"),
    cli("log-not-from-0", *REPLAY_LOG, edit=edit_line(0, lambda d: d.update(step=1, consumed=4))),
    cli("log-time-text", *REPLAY_LOG, edit=edit_line(1, lambda d: d.update(time="noon")),
        names="time"),
    cli("log-time-nan", *REPLAY_LOG, edit=edit_line(1, lambda d: json.dumps(d | {
        "time": float("nan")}))),
    cli("log-index-hash-other", *REPLAY_LOG, edit=lambda w: (w / "steps.jsonl").write_text(
        (w / "steps.jsonl").read_text().replace("sha256:", "sha256:0")), names="index hash"),
    cli("log-index-hash-mixed", *REPLAY_LOG, edit=edit_line(2, lambda d: d.update(
        index_hash="sha256:0")), names="index hash"),
    cli("log-index-hash-number", *REPLAY_LOG, edit=edit_line(1, lambda d: d.update(index_hash=5))),
    cli("log-bad-utf8", *REPLAY_LOG, edit=lambda w: (w / "steps.jsonl").write_bytes(
        b'{"step": "\xff"}\n' + (w / "steps.jsonl").read_bytes())),
    cli("log-deep", *REPLAY_LOG, edit=write("steps.jsonl", "[" * 100000 + "]" * 100000 + "\n")),
    cli("log-huge-int", *REPLAY_LOG, edit=edit_line(1, lambda d: json.dumps(d).replace(
        '"step": 1', '"step": ' + "9" * 5000)), names="Exceeds the limit"),
    cli("log-huge-step-replay", "replay", P, "--step", "0", "--log", LOG, names="memory",
        edit=both(one_step_of(10**11), first_line_only)),
    cli("log-huge-step-locate", *LOCATE_LOG, names="memory",
        edit=both(one_step_of(2**61), first_line_only)),
    cli("log-locate", *LOCATE_LOG, edit=edit_line(1, lambda d: d.update(micro="2")),
        names="micro"),
    cli("log-locate-until-beyond", *LOCATE_LOG, "--until-step", BEYOND),
    # --- the Python API: misuse -------------------------------------------------------------
    api("BatchConfig-dp-0", lambda w: BatchConfig(0, 1), ArgumentError, "dp_size"),
    api("BatchConfig-micro-neg", lambda w: BatchConfig(2, -1), ArgumentError, "micro"),
    api("BatchConfig-accum-0", lambda w: BatchConfig(2, 1, 0), ArgumentError, "accum"),
    api("BatchConfig-float", lambda w: BatchConfig(2.0, 1), ArgumentError, "dp_size"),
    api("BatchConfig-text", lambda w: BatchConfig("2", 1), ArgumentError, "dp_size"),
    api("BatchConfig-bool", lambda w: BatchConfig(True, 1), ArgumentError, "dp_size"),
    api("BatchConfig-huge", lambda w: BatchConfig(2**40, 2**40), ArgumentError, "global batch"),
    api("positions_for-rank-out", lambda w: positions_for(0, 2, BatchConfig(2, 1)),
        ArgumentError, "dp_rank"),
    api("positions_for-rank-neg", lambda w: positions_for(0, -1, BatchConfig(2, 1)),
        ArgumentError, "dp_rank"),
    api("positions_for-consumed-neg", lambda w: positions_for(-1, 0, BatchConfig(2, 1)),
        ArgumentError, "consumed"),
    api("positions_for-beyond", lambda w: positions_for(2**62 - 1, 0, BatchConfig(2, 1)),
        OutOfRangeError, "2**62"),
    api("positions_for-config", lambda w: positions_for(0, 0, (2, 1)), ArgumentError, "config"),
    api("Loader-rank-out", lambda w: _loader(w, dp_rank=2), ArgumentError, "dp_rank"),
    api("Loader-prefetch-neg", lambda w: _loader(w, prefetch=-1), ArgumentError, "prefetch"),
    api("Loader-state-dict", lambda w: _loader(w, state=_state(w)), ArgumentError, "state"),
    api("Loader-at-2-62", _steps_at_2_62, OutOfRangeError, "2**62"),
    api("Loader-set-config-rank", lambda w: _loader(w, dp_rank=1).set_config(BatchConfig(1, 2)),
        ArgumentError, "dp_rank"),
    api("Loader-step-log-directory", lambda w: _loader(w, step_log=w / "stores"), ArgumentError,
        "step_log"),
    api("Loader-step-log-no-directory", lambda w: _loader(w, step_log=w / "nope/steps.jsonl"),
        ArgumentError, "step_log"),
    api("Loader-commit-first", lambda w: _loader(w).commit(), TokentapeError, "commit()"),
    api("tape-resolve-range-2-62", lambda w: _tape(w).resolve(np.arange(2**62 - 2, 2**62 + 2)),
        OutOfRangeError, "2**62"),
    api("tape-resolve-range-at-2-62", lambda w: _tape(w).resolve_range(2**62, 3),
        OutOfRangeError, "2**62"),
    api("tape-resolve-neg", lambda w: _tape(w).resolve([-1, 5]), OutOfRangeError, "2**62"),
    api("tape-resolve-range-neg", lambda w: _tape(w).resolve_range(-5, 3), OutOfRangeError),
    api("tape-position-of-source", lambda w: _tape(w).position_of(-1, 0, 0), OutOfRangeError,
        "source"),
    api("tape-position-of-source-big", lambda w: _tape(w).position_of(3, 0, 0), OutOfRangeError,
        "source"),
    api("tape-position-of-sample", lambda w: _tape(w).position_of(0, 10**6, 0), OutOfRangeError,
        "sample"),
    api("tape-position-of-epoch", lambda w: _tape(w).position_of(0, 0, -1), OutOfRangeError,
        "epoch"),
    api("tape-build-zero-samples", lambda w: type(_tape(w)).build(["a"], [0], [1], 0),
        ArgumentError, "n_samples"),
    api("tape-build-lengths", lambda w: type(_tape(w)).build(["a", "b"], [3], [1], 0),
        ArgumentError, "same length"),
    api("blend-count-neg", lambda w: _tape(w).blend.count(0, -3), OutOfRangeError, "-3"),
    api("permutation-n-0", lambda w: Permutation.for_epoch(0, 1, "a", 0), ArgumentError, "n "),
    api("permutation-index", lambda w: Permutation.for_epoch(10, 1, "a", 0)(10),
        OutOfRangeError, "index 10"),
    api("permutation-epoch-neg", lambda w: Permutation.for_epoch(10, 1, "a", -1), ArgumentError,
        "epoch"),
    api("Batcher-positions-neg", lambda w: Batcher(_plan(w)).batch(np.array([-1])),
        OutOfRangeError, "positions"),
    api("Batcher-dtype-narrow", lambda w: Batcher(_plan(w), np.int8), TokentapeError, "int8"),
    api("Batch-cu-seqlens", lambda w: Batcher(_plan(w)).batch(np.arange(2)).cu_seqlens(0),
        ArgumentError, "segment"),
    api("Schedule-step-neg", lambda w: Schedule.uniform(BatchConfig(1, 2)).start(-1),
        OutOfRangeError, "step -1"),
    api("Batch-cu-seqlens-row", lambda w: Batcher(_plan(w), segments=True)
        .batch(np.arange(2)).cu_seqlens(5), OutOfRangeError, "row 5"),
    api("DataState-commit-beyond", lambda w: _state_at(w, 2**62 - 2).commit(BatchConfig(1, 4)),
        OutOfRangeError, "2**62"),
    api("DataState-consumed-before", lambda w: DataState.from_dict(_state(w)).consumed_before(3),
        OutOfRangeError, "step 3"),
    api("locate-api-doc-out-of-range", lambda w: locate(_plan(w), "web", 10**6), OutOfRangeError,
        "document 1000000"),
    api("locate-api-unknown-source", lambda w: locate(_plan(w), "books", 0), TokentapeError,
        "books"),
    api("load_plan-missing", lambda w: load_plan(w / "nope.json"), TokentapeError, "nope.json"),
    api("load_plan-directory", lambda w: load_plan(w / "stores"), TokentapeError, "stores"),
    api("load_plan-toml", lambda w: load_plan(w / "mix.toml"), TokentapeError, "mix.toml"),
    api("open_source-missing", lambda w: Source(w / "nope"), TokentapeError, "nope"),
    api("open_source-window-neg", lambda w: Source(w / "stores/web").window(-1, 8),
        OutOfRangeError, "-1"),
    api("open_source-doc-neg", lambda w: Source(w / "stores/web").doc(-1), OutOfRangeError,
        "-1"),
    api("open_source-doc-huge", lambda w: Source(w / "stores/web").doc(10**6),
        OutOfRangeError, "1000000"),
    api("open_source-idx-corrupt", lambda w: Source(w / "stores/web").doc(0), TokentapeError,
        "part-00000", edit=_save_idx("stores/web/part-00000.idx.npy", [5, 3, 1])),
    api("log_schedule-hash-newline", lambda w: log_schedule(str(w / "steps.jsonl"), _plan(w)),
        TokentapeError, "later plan", edit=edit_line(2, lambda d: d.update(index_hash="a\nb"))),
    api("read_step_log-missing", lambda w: read_step_log(w / "nope.jsonl"), TokentapeError,
        "nope.jsonl"),
    api("scan_step_log-directory", lambda w: scan_step_log(w / "stores"), TokentapeError,
        "stores"),
    # --- the Python API: a saved state_dict -------------------------------------------------
    api("state-not-dict", lambda w: _resume(w, lambda d: [d]), TokentapeError, "data state"),
    api("state-version", lambda w: _resume(w, lambda d: d.update(version=2)), TokentapeError,
        "version"),
    api("state-version-missing", lambda w: _resume(w, drop("version")), TokentapeError,
        "version"),
    api("state-consumed-neg", lambda w: _resume(w, lambda d: d.update(consumed=-4)),
        TokentapeError, "consumed"),
    api("state-consumed-text", lambda w: _resume(w, lambda d: d.update(consumed="12")),
        TokentapeError, "consumed"),
    api("state-consumed-float", lambda w: _resume(w, lambda d: d.update(consumed=12.0)),
        TokentapeError, "consumed"),
    api("state-consumed-wrong", lambda w: _resume(w, lambda d: d.update(consumed=13)),
        TokentapeError, "consumed"),
    api("state-consumed-2-62", lambda w: _resume(w, lambda d: d.update(consumed=2**62 + 4)),
        TokentapeError, "2**62"),
    api("state-consumed-huge", lambda w: _resume(w, lambda d: d.update(consumed=10**5000)),
        TokentapeError, "consumed"),
    api("state-step-neg", lambda w: _resume(w, lambda d: d.update(step=-1)), TokentapeError,
        "step"),
    api("state-history-text", lambda w: _resume(w, lambda d: d.update(history="x")),
        TokentapeError, "history"),
    api("state-history-entry", lambda w: _resume(w, lambda d: d["history"].__setitem__(0, 5)),
        TokentapeError, "history[0]"),
    api("state-history-dp-0", lambda w: _resume(w, lambda d: d["history"][0].update(dp_size=0)),
        TokentapeError, "dp_size"),
    api("state-history-empty", lambda w: _resume(w, lambda d: d.update(history=[])),
        TokentapeError, "history"),
    api("state-index-hash-number", lambda w: _resume(w, lambda d: d.update(index_hash=5)),
        TokentapeError, "index_hash"),
    api("state-identity-missing", lambda w: _resume(w, drop("identity")), TokentapeError,
        "identity"),
    api("state-identity-text", lambda w: _resume(w, lambda d: d.update(identity="x")),
        TokentapeError, "identity"),
    api("state-identity-disagrees", lambda w: _resume(w, lambda d: d["identity"].update(
        seed=7)), TokentapeError, "identity"),
    api("state-identity-source-type", lambda w: _resume(w, lambda d: d["identity"]["sources"][
        0].update(n_tokens="many")), TokentapeError, "identity"),
    api("state-other-plan", lambda w: _resume(w, lambda d: d.update(
        index_hash="sha256:" + "0" * 64, identity=d["identity"] | {"seed": 7})), TokentapeError,
        "identity"),
    api("state-consumed-at-2-62", lambda w: Loader(_plan(w), 0, BatchConfig(1, 4),
        state=_state_at(w, 2**62 - 2), prefetch=0).step(), OutOfRangeError, "2**62"),
]  # fmt: skip


def _argv(case: Case, w: Path) -> list[str]:
    return [a.replace("{w}", str(w)) for a in case.argv]


def _run_cli(case: Case, w: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(_argv(case, w))
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    return code, captured.out, captured.err


SLOW_CASES = {"corpora-out-is-file", "smoke-plan-broken"}  # each over 2 s


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.slow) if c.id in SLOW_CASES else c for c in CASES],
    ids=[c.id for c in CASES],
)
def test_bad_input_is_one_line_and_changes_nothing(case, work, capsys, monkeypatch):
    if case.edit is not None:
        case.edit(work)
    before = snapshot(work)
    monkeypatch.chdir(work)
    if case.api is not None:
        with pytest.raises(TokentapeError) as info:
            case.api(work)
        assert isinstance(info.value, case.exc), repr(info.value)
        message = str(info.value)
        assert message and "\n" not in message, message
        assert case.names in message, message
    else:
        code, out, err = _run_cli(case, work, capsys)
        lines = err.splitlines()
        assert code == case.code, f"exit {code}; stdout: {out[-600:]!r}; stderr: {err[-600:]!r}"
        assert "Traceback" not in err, err
        if case.code == 1:  # problems found: reported on stdout, one line each
            assert case.names in out, out
            assert "tokentape: error" not in err, err
        else:
            assert len(lines) == 1 and lines[0].startswith("tokentape: error: "), err
            assert case.names in lines[0], lines[0]
    assert snapshot(work) == before


def test_the_catalogue_is_large():
    assert len(CASES) >= 150
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "argv",
    [
        ["replay", P, "--step", "0", "--global-batch", HUGE],
        ["locate", P, "web", "0"],
        ["tokenize", "{w}/text/a.txt", "--out", "{w}/new-store", "--shard-mb", "inf"],
        ["replay", P, "--step", "x"],
    ],
    ids=["replay-huge-batch", "locate-horizon-float", "tokenize-shard-mb-inf", "usage"],
)
def test_the_installed_program_exits_2_with_one_line(argv, work):
    """Through a real process of the installed entry point: exit status, stderr, no files."""
    edit_plan(top(horizon_samples=2000.5))(work)
    before = snapshot(work)
    exe = shutil.which("tokentape", path=str(Path(sys.executable).parent)) or "tokentape"
    args = [a.replace("{w}", str(work)) for a in argv]
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokentape: error: "), proc.stderr
    assert snapshot(work) == before

"""What a tokenization job is, and what its output directory may already hold.

The job's identity is a hash of everything that changes the output bytes: inputs (paths, kinds,
sizes), tokenizer fingerprint, text key, filters, dtype, shard and unit sizes. The worker count
and the executor are not part of it: the output is the same for any number of workers, on a
local process pool or on a Ray cluster.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from tokentape.errors import TokentapeError
from tokentape.store.format import FORMAT_VERSION, MANIFEST_NAME, Manifest, parse_manifest
from tokentape.tokenize.inputs import InputFile

CRASH_ENV = "TOKENTAPE_CRASH_AT"
WORK_DIR = ".tokentape-work"
JOB_FILE = "job.json"
MIN_AUTO_UNIT = 2**20
MAX_AUTO_UNIT = 8 * 2**20
EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class TokenizeConfig:
    """Settings of ``tokentape tokenize``."""

    inputs: tuple[str, ...]
    """Input files, directories or globs, in order."""
    out: str
    """Output store directory."""
    tokenizer: str = "bytes"
    """'bytes', 'tiktoken:PATH' or a Hugging Face tokenizer.json path."""
    eod_token: str | None = None
    """End-of-document token (default: the tokenizer's own)."""
    text_key: str = "text"
    """JSON field / parquet column holding the text."""
    filters: tuple[str, ...] = ()
    """Filter specs, e.g. 'unique-lines', 'min-tokens:16'."""
    workers: int = 1
    """Worker processes (local) or Ray tasks in flight (ray); the output is byte-identical for
    any count."""
    executor: str = "local"
    """'local' (a process pool on this machine) or 'ray' (Ray tasks, e.g. on a cluster)."""
    ray_address: str | None = None
    """Ray cluster to connect to (``ray.init(address=...)``); None: start a private local Ray."""
    dtype: str = "auto"
    """'auto' (uint16 iff the vocabulary has at most 65,536 ids), 'uint16' or 'uint32'."""
    shard_mb: float = 256.0
    """Target shard size in MiB of tokens; shards are cut at document boundaries."""
    unit_mb: float | None = None
    """Input MiB per unit of work (the grain of parallelism and of resumption); None: auto."""
    overwrite: bool = False
    """Replace a store or an unfinished run with other settings in ``out``."""

    def __post_init__(self) -> None:
        if not self.inputs:
            raise TokentapeError("no inputs given; pass files, directories or globs")
        if self.workers < 1:
            raise TokentapeError(f"--workers must be at least 1, got {self.workers}")
        if self.executor not in EXECUTORS:
            raise TokentapeError(f"--executor '{self.executor}': expected local or ray")
        if self.ray_address is not None and self.executor != "ray":
            raise TokentapeError("--ray-address needs --executor ray")
        if self.ray_address == "":
            raise TokentapeError("--ray-address must not be empty")
        if self.dtype not in ("auto", "uint16", "uint32"):
            raise TokentapeError(f"--dtype '{self.dtype}': expected auto, uint16 or uint32")
        if not self.shard_mb > 0:
            raise TokentapeError(f"--shard-mb must be positive, got {self.shard_mb}")
        if self.unit_mb is not None and not self.unit_mb > 0:
            raise TokentapeError(f"--unit-mb must be positive, got {self.unit_mb}")
        if not self.text_key:
            raise TokentapeError("--text-key must not be empty")

    def unit_bytes(self, total_input_bytes: int) -> int:
        """``unit_mb``, or by default a size that depends on the inputs alone (never on the
        worker count): about 1/32 of the input, between 1 and 8 MiB."""
        if self.unit_mb is not None:
            return max(1, int(self.unit_mb * 2**20))
        return min(MAX_AUTO_UNIT, max(MIN_AUTO_UNIT, total_input_bytes // 32))


def canonical_hash(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def job_identity(
    config: TokenizeConfig,
    files: list[InputFile],
    tokenizer_fingerprint: str,
    filters_json: list[dict[str, Any]],
    dtype: str,
    shard_tokens: int,
    unit_bytes: int,
) -> dict[str, Any]:
    """The inputs of the output bytes, JSON-ready."""
    return {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer_fingerprint,
        "text_key": config.text_key,
        "filters": filters_json,
        "dtype": dtype,
        "shard_tokens": shard_tokens,
        "unit_bytes": unit_bytes,
        "inputs": [{"path": f.path, "kind": f.kind, "size": f.size} for f in files],
    }


def crashpoint(name: str) -> None:
    """Test hook: SIGKILL this process at the named point when ``TOKENTAPE_CRASH_AT`` says so."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class OutState(Enum):
    FRESH = "fresh"  # nothing of ours there (the directory may not exist yet)
    RESUME = "resume"  # an unfinished run of this same job
    COMPLETE = "complete"  # a finished store of this same job


_OURS = re.compile(r"(?:part-\d{5,}\.(?:bin|idx\.npy)|manifest\.json|tokenizer\.(?:json|tiktoken))")


def is_store_file(name: str) -> bool:
    """Whether a name in a store directory is one tokentape writes: a shard's two files, the
    manifest, the tokenizer copy, the temporary name of one of those, or the work directory.
    Exact names only: a ``part-00000-x.snappy.parquet`` or ``tokenizer_config.json`` is not
    ours and is never removed."""
    if name == WORK_DIR:
        return True
    if name.startswith(".") and ".tmp-" in name:
        name = name[1 : name.index(".tmp-")]
    return _OURS.fullmatch(name) is not None


def inspect_out(
    out: Path, job_hash: str, resume_key: dict[str, Any], overwrite: bool
) -> tuple[OutState, Manifest | None]:
    """Decide what to do with ``out``; refuse a directory that is not ours or not this job's."""
    if out.exists() and not out.is_dir():
        raise TokentapeError(f"--out '{out}': exists and is not a directory")
    if not out.exists():
        return OutState.FRESH, None
    names = sorted(os.listdir(out))
    foreign = [n for n in names if not is_store_file(n)]
    if foreign:
        raise TokentapeError(
            f"--out '{out}': not empty and not a tokentape store (found '{foreign[0]}'); "
            "choose a new or empty directory"
        )
    manifest_path = out / MANIFEST_NAME
    if manifest_path.exists():
        manifest = parse_manifest(manifest_path.read_text(encoding="utf-8"), str(manifest_path))
        if manifest.job == job_hash:
            return OutState.COMPLETE, manifest
        if not overwrite:
            raise TokentapeError(
                f"--out '{out}': holds a store made from other inputs or settings; "
                "pass --overwrite to replace it"
            )
        clear_out(out)
        return OutState.FRESH, None
    job_path = out / WORK_DIR / JOB_FILE
    if job_path.exists():
        try:
            previous = json.loads(job_path.read_text())
        except json.JSONDecodeError:
            previous = None
        if previous == resume_key:
            return OutState.RESUME, None
        if not overwrite:
            raise TokentapeError(
                f"--out '{out}': holds an unfinished run with other inputs or settings "
                "(or inputs changed since); pass --overwrite to discard it"
            )
    clear_out(out)
    return OutState.FRESH, None


def clear_out(out: Path, keep: tuple[str, ...] = ()) -> None:
    """Remove everything tokentape writes in ``out`` (and nothing else), but for ``keep``."""
    for name in os.listdir(out):
        if is_store_file(name) and name not in keep:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()

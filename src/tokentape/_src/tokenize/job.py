"""What a tokenization job is, and what its output directory may already hold.

The job's identity is a hash of everything that changes the output bytes: inputs (paths, kinds,
sizes), tokenizer fingerprint, text key, filters, dtype, shard and unit sizes. The worker count
and the executor are not part of it: the output is the same for any number of workers, on a
local process pool or on a Ray cluster.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from tokentape._src.objects.client import check_storage_options
from tokentape._src.store.confine import open_inside
from tokentape._src.store.format import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    Manifest,
    manifest_files,
    parse_manifest,
)
from tokentape._src.store.output import (
    JOB_FILE,
    WORK_DIR,
    check_ours,
    clear_out,
    discard_store,
    survey,
)
from tokentape._src.store.rerun import other_job
from tokentape._src.tokenize.inputs import FIRST_BAD, InputFile
from tokentape._src.tokenize.records import ID_KEY_AUTO, check_id_key
from tokentape._src.util.checks import check_count, check_mb, check_path, check_text
from tokentape._src.util.hashing import canonical_hash
from tokentape.errors import ArgumentError, InputError, OutputError, StoreError, TokentapeError

UNITS_PREFIX = "units-"
"""Unit files live in ``WORK_DIR/units-<hash of the resume key>/``: a helper of an earlier,
killed run with other settings (a Ray task that outlives its driver) can only write into its
own job's directory, never among this run's units."""
STAGING_SUFFIX = "tokentape-next"
MIN_AUTO_UNIT = 2**20
MAX_AUTO_UNIT = 8 * 2**20
EXECUTORS = ("local", "ray")


MAX_WORKERS = 65_536
"""The most ``--workers`` (processes, or Ray tasks in flight) one run takes."""


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
    id_key: str = ID_KEY_AUTO
    """The field (dotted for a nested one) holding each record's own id, recorded with the
    document; 'auto': the first of id, doc_id, url in each input's first record; 'none'."""
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
    storage_options: dict[str, Any] = field(default_factory=dict)
    """fsspec options for object URLs among the inputs and ``out`` (e.g. ``endpoint_url``);
    never written to the store or printed."""
    work_dir: str | None = None
    """With an object URL as ``out``: the local directory the store is built in before it is
    uploaded (None: ``~/.cache/tokentape/uploads/<hash of out>``)."""
    on_bad_record: str = "fail"
    """'fail': a bad record (not JSON, a null or non-string text, invalid UTF-8) stops the job;
    'skip': it is counted (per input and reason, in the manifest) and skipped."""
    max_bad_fraction: float = 0.01
    """With 'skip': the job is refused at the end when more than this fraction of the records
    were bad (the counts in the error)."""
    bos: bool | None = None
    """Put a beginning-of-document token before every document: True (``--bos``), False
    (``--no-bos``), or None: as the tokenizer does when called on a text (its
    ``tokenizer_config.json``'s ``add_bos_token``, else its post-processor)."""
    bos_token: str | None = None
    """The beginning-of-document token (``--bos-token``; implies ``bos``)."""

    def __post_init__(self) -> None:
        inputs = self.inputs
        if isinstance(inputs, str | bytes | os.PathLike) or not isinstance(inputs, tuple | list):
            raise ArgumentError(f"inputs: expected a tuple of paths, got {type(inputs).__name__}")
        if not inputs:
            raise ArgumentError("no inputs given; pass files, directories or globs")
        for spec in inputs:
            check_path("input", spec)
        check_path("--out", self.out)
        check_text("--tokenizer", self.tokenizer)
        if self.eod_token is not None:
            check_text("--eod-token", self.eod_token)
        check_text("--text-key", self.text_key)
        check_text("--id-key", self.id_key)
        check_id_key(self.id_key)
        if not isinstance(self.filters, tuple | list) or isinstance(self.filters, str):
            raise ArgumentError(f"filters: expected a tuple of specs, got {self.filters!r}")
        for spec in self.filters:
            check_text("--filter", spec)
        check_count("--workers", self.workers, 1, MAX_WORKERS)
        if self.executor not in EXECUTORS:
            raise ArgumentError(f"--executor {self.executor!r}: expected local or ray")
        if self.ray_address is not None:
            check_text("--ray-address", self.ray_address)
            if self.executor != "ray":
                raise ArgumentError("--ray-address needs --executor ray")
        if self.dtype not in ("auto", "uint16", "uint32"):
            raise ArgumentError(f"--dtype {self.dtype!r}: expected auto, uint16 or uint32")
        check_mb("--shard-mb", self.shard_mb)
        if self.unit_mb is not None:
            check_mb("--unit-mb", self.unit_mb)
        if self.on_bad_record not in ("fail", "skip"):
            raise ArgumentError(f"--on-bad-record {self.on_bad_record!r}: expected fail or skip")
        fraction = self.max_bad_fraction
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not (0 <= fraction <= 1)
        ):
            raise ArgumentError(
                f"--max-bad-fraction {fraction!r}: expected a fraction between 0 and 1"
            )
        if not isinstance(self.overwrite, bool):
            raise ArgumentError(f"overwrite: expected True or False, got {self.overwrite!r}")
        if self.bos is not None and not isinstance(self.bos, bool):
            raise ArgumentError(f"--bos: expected True, False or None, got {self.bos!r}")
        if self.bos_token is not None:
            check_text("--bos-token", self.bos_token)
            if self.bos is False:
                raise ArgumentError("--bos-token names a token to put first; drop --no-bos")
        check_storage_options(self.storage_options, "--storage-options")
        if self.work_dir is not None:
            check_path("--work-dir", self.work_dir)

    def unit_bytes(self, total_input_bytes: int) -> int:
        """``unit_mb``, or by default a size that depends on the inputs alone (never on the
        worker count): about 1/32 of the input, between 1 and 8 MiB."""
        if self.unit_mb is not None:
            return max(1, int(self.unit_mb * 2**20))
        return min(MAX_AUTO_UNIT, max(MIN_AUTO_UNIT, total_input_bytes // 32))


def job_identity(
    config: TokenizeConfig,
    files: list[InputFile],
    tokenizer_fingerprint: str,
    filters_json: list[dict[str, Any]],
    dtype: str,
    shard_tokens: int,
    unit_bytes: int,
    bos_id: int | None = None,
) -> dict[str, Any]:
    """The inputs of the output bytes, JSON-ready (a key that came later is there only when
    it is not its default, so that earlier jobs keep their identity)."""
    return (
        {
            "format_version": FORMAT_VERSION,
            "tokenizer": tokenizer_fingerprint,
            "text_key": config.text_key,
            "id_key": config.id_key,
            "filters": filters_json,
            "dtype": dtype,
            "shard_tokens": shard_tokens,
            "unit_bytes": unit_bytes,
            "inputs": [
                {"path": f.path, "kind": f.kind, "size": f.size, "id_key": f.id_key or None}
                for f in files
            ],
        }
        | ({"on_bad_record": "skip"} if config.on_bad_record == "skip" else {})
        | ({} if bos_id is None else {"bos_id": bos_id})
    )


class OutState(Enum):
    FRESH = "fresh"  # nothing of ours there (the directory may not exist yet)
    RESUME = "resume"  # an unfinished run of this same job
    COMPLETE = "complete"  # a finished store of this same job


@dataclass(frozen=True)
class OutPlan:
    """What to do with ``--out``: the state found, where to build, and whether the result
    replaces ``out`` at the end (an ``--overwrite`` of a complete store is built beside it,
    in ``staging_dir(out)``, and swapped in whole)."""

    state: OutState
    build: Path
    manifest: Manifest | None = None  # the complete store found (COMPLETE)
    replace: bool = False


def staging_dir(out: Path) -> Path:
    """Where a store that replaces ``out`` is built: a hidden sibling (same file system, so it
    can be swapped in), named after ``out``'s resolved path. One at a time: the writer lock."""
    real = Path(os.path.realpath(out))
    return real.with_name(f".{real.name}.{STAGING_SUFFIX}")


def store_damage(
    directory: Path, manifest: Manifest, stored: tuple[str, bytes] | None
) -> str | None:
    """What is wrong with a store whose manifest is complete, or None: every shard file the
    manifest names must be a regular file of the size it records, and the tokenizer copy must
    be the tokenizer's exact bytes. (Cheap checks, no hashing: ``tokentape verify`` rehashes.)
    The counts a rerun reports from the manifest (``filters``, ``inputs.units``) must be of the
    kinds the writer puts there."""
    problem = summary_problem(manifest)
    if problem is not None:
        return problem
    for file in manifest_files(manifest):
        if file.size is None:  # the tokenizer copy: compared whole below
            continue
        name, size = file.name, file.size
        try:
            st = os.lstat(directory / name)
        except FileNotFoundError:
            return f"{name} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{name} is not a regular file"
        if st.st_size != size:
            return f"{name} holds {st.st_size} bytes, the manifest says {size}"
    if stored is not None:
        name, data = stored
        try:
            with open(open_inside(directory, name, "tokenizer copy"), "rb") as f:
                found = f.read()
        except TokentapeError as exc:  # missing, a link (never followed), not a regular file
            return str(exc)
        if found != data:
            return f"the tokenizer copy {name} differs from the tokenizer"
    return None


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def summary_problem(manifest: Manifest) -> str | None:
    """What is wrong with the manifest fields a rerun's summary shows, or None."""
    fields = {"inputs.units": manifest.inputs.get("units")}
    for key in ("docs_in", "text_bytes", "dropped_docs", "dropped_tokens"):
        fields[f"filters.{key}"] = manifest.filters.get(key)
    for name, value in fields.items():
        if name.startswith("filters.dropped_"):
            ok = isinstance(value, dict) and all(
                isinstance(k, str) and _count(v) for k, v in value.items()
            )
            expected = "an object of counts"
        else:
            ok, expected = _count(value), "a count"
        if not ok:
            return f"{MANIFEST_NAME} field {name} is {value!r:.60}, expected {expected}"
    return None


def _check_staging(staging: Path) -> None:
    """Refuse a staging directory a replacement could not be built in (before ``--overwrite``
    is suggested: it would then refuse)."""
    if staging.is_symlink() or (os.path.lexists(staging) and not staging.is_dir()):
        raise OutputError(f"'{staging}': exists and is not a directory; remove it")
    if staging.exists():
        check_ours(staging, f"staging directory '{staging}'", "move it away")


def _ours_only(directory: Path) -> bool:
    """Whether ``directory`` is a directory (not a link) holding only what is tokentape's."""
    if directory.is_symlink() or not directory.is_dir():
        return False
    try:
        found = survey(directory)
    except OSError:
        return False
    return not found.foreign and not found.unclaimed


def units_dir(work_dir: Path, resume_key: dict[str, Any]) -> Path:
    """The directory of this job's unit files inside the work directory."""
    return work_dir / f"{UNITS_PREFIX}{canonical_hash(resume_key).removeprefix('sha256:')[:16]}"


def _same_run(work: Path, resume_key: dict[str, Any]) -> bool:
    if work.is_symlink():  # never resumed (nor written) through a link: cleared instead
        return False
    try:
        recorded: object = json.loads((work / JOB_FILE).read_text())
        return recorded == resume_key
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def inspect_out(
    out: Path,
    job_hash: str,
    resume_key: dict[str, Any],
    overwrite: bool,
    stored: tuple[str, bytes] | None = None,
    identity: dict[str, Any] | None = None,
    tokenizer: str = "",
) -> OutPlan:
    """Decide what to do with ``out``; refuse a directory that is not ours or not this job's,
    and a store of this job that is damaged (without ``overwrite``). ``stored`` is the
    tokenizer copy this job writes (checked in a complete store); ``identity`` (the job's, with
    its ``tokenizer`` spec) lets a refusal say what differs from the store found.

    Whatever is in ``out`` that tokentape cannot tell is its own (``store.output.survey``) is
    refused, with or without ``overwrite``: nothing would remove it."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out '{out}': exists and is not a directory")
    if out.is_symlink() and not out.exists():
        raise OutputError(
            f"--out '{out}': a symbolic link to {os.readlink(out)!r}, which does not exist; "
            "create that directory or remove the link"
        )
    staging = staging_dir(out)
    if not out.exists():
        if _ours_only(staging):  # an interrupted replacement whose old store is gone
            plan = _staged(staging, job_hash, resume_key, stored)
            if plan.state is not OutState.FRESH:
                return plan
        discard_store(staging)
        return OutPlan(OutState.FRESH, out)
    check_ours(out, f"--out '{out}'", "move it away or choose another --out")
    manifest_path = out / MANIFEST_NAME
    if os.path.lexists(manifest_path):  # a link there is the store's manifest, refused
        try:
            manifest = _read_manifest(manifest_path)
        except TokentapeError as exc:  # unreadable: replaced like any other store
            refusal = f"{exc}; pass --overwrite to replace the store"
        else:
            if manifest.job == job_hash:
                damage = store_damage(out, manifest, stored)
                if damage is None:
                    discard_store(staging)
                    return OutPlan(OutState.COMPLETE, out, manifest)
                refusal = (
                    f"--out '{out}': holds this job's store, but it is damaged ({damage}); "
                    "pass --overwrite to rebuild it"
                )
            else:
                refusal = other_job(f"--out '{out}'", manifest, identity or {}, tokenizer)
        _check_staging(staging)  # where --overwrite builds the replacement
        if not overwrite:
            raise OutputError(refusal)
        return _staged(staging, job_hash, resume_key, stored)
    discard_store(staging)
    job_path = out / WORK_DIR / JOB_FILE
    if job_path.exists():
        if _same_run(out / WORK_DIR, resume_key):
            return OutPlan(OutState.RESUME, out)
        if not overwrite:
            raise OutputError(
                f"--out '{out}': holds an unfinished run with other inputs or settings "
                "(or inputs changed since); pass --overwrite to discard it"
            )
    clear_out(out)
    return OutPlan(OutState.FRESH, out)


def _read_manifest(path: Path) -> Manifest:
    """The manifest at ``path``; one that cannot be read or parsed is a ``StoreError``
    naming it."""
    try:
        with open(open_inside(path.parent, path.name, "the manifest"), "rb") as f:
            return parse_manifest(f.read().decode("utf-8"), str(path))
    except UnicodeDecodeError:
        raise StoreError(f"{path}: not UTF-8 text; not a readable manifest") from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _staged(
    staging: Path, job_hash: str, resume_key: dict[str, Any], stored: tuple[str, bytes] | None
) -> OutPlan:
    """The plan of a build beside ``out`` that replaces it: resume the staging directory an
    interrupted run of this job left (or swap it in, if it finished), else start it afresh.
    What in it tokentape cannot tell is its own is refused, never removed."""
    _check_staging(staging)
    if not staging.exists():
        return OutPlan(OutState.FRESH, staging, replace=True)
    manifest_path = staging / MANIFEST_NAME
    if os.path.lexists(manifest_path):
        try:
            manifest: Manifest | None = _read_manifest(manifest_path)
        except TokentapeError:  # unreadable: built anew
            manifest = None
        if (
            manifest is not None
            and manifest.job == job_hash
            and store_damage(staging, manifest, stored) is None
        ):
            return OutPlan(OutState.COMPLETE, staging, manifest, replace=True)
    elif _same_run(staging / WORK_DIR, resume_key):
        return OutPlan(OutState.RESUME, staging, replace=True)
    clear_out(staging)
    return OutPlan(OutState.FRESH, staging, replace=True)


__all__ = [
    "MAX_WORKERS",
    "OutPlan",
    "OutState",
    "TokenizeConfig",
    "inspect_out",
    "job_identity",
    "staging_dir",
    "store_damage",
    "summary_problem",
    "units_dir",
]


def bad_record_stats(results: list[Any], max_fraction: float) -> dict[str, Any]:
    """The manifest's record of the bad records a skipping job skipped: how many, per reason and
    per input, the first locations (in input order: the same for any worker count), and the
    fraction of the records read."""
    reasons: dict[str, int] = {}
    by_input: dict[str, dict[str, int]] = {}
    first: list[str] = []
    for r in results:  # unit order
        for path, counts in r.bad_records.items():
            mine = by_input.setdefault(path, {})
            for reason, n in counts.items():
                mine[reason] = mine.get(reason, 0) + n
                reasons[reason] = reasons.get(reason, 0) + n
        first += r.bad_first
    skipped = sum(reasons.values())
    records = skipped + sum(r.docs_in for r in results)
    return {
        "policy": "skip",
        "skipped": skipped,
        "records": records,
        "max_fraction": max_fraction,
        "reasons": dict(sorted(reasons.items())),
        "by_input": {p: dict(sorted(c.items())) for p, c in sorted(by_input.items())},
        "first": first[:FIRST_BAD],
    }


def check_bad_fraction(bad: dict[str, Any], inputs: tuple[str, ...]) -> None:
    """Refuse a job whose share of bad records passed its limit (nothing is written)."""
    skipped, records, limit = bad["skipped"], bad["records"], bad["max_fraction"]
    if records and skipped / records > limit:
        reasons = ", ".join(f"{k} {v}" for k, v in bad["reasons"].items())
        first = f"; first: {bad['first'][0]}" if bad["first"] else ""
        raise InputError(
            f"inputs {', '.join(inputs)}: {skipped} of {records} records are bad "
            f"({skipped / records:.2%}, over --max-bad-fraction {limit:g}): {reasons}{first}"
        )

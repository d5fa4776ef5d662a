"""``tokentape tokenize``: inputs → units → (parallel, resumable) unit files → shards → manifest.

1. Plan: expand the inputs in their documented order and cut them into units of work.
2. Tokenize every unit not yet finished (in this process, a pool of ``workers``, or as Ray
   tasks), each into its own unit file under ``OUT/.tokentape-work``. A unit's bytes depend
   only on its input.
3. Assemble: concatenate the unit files in unit order into shards (hashing as they are written),
   with where each document came from (``store.provenance``: its input, record there and id;
   a jsonl line counted on from the lines of the file's earlier units), copy the tokenizer in,
   write the inputs table and ``manifest.json`` last, remove the work directory.

Killed at any moment, the same command resumes: finished units are kept, assembly is redone,
and the result is byte-identical to an uninterrupted run. Bad input removes what this run wrote.

The run holds the output's writer lock (``store.lock``) throughout: a second writer is refused.
``--overwrite`` of a complete store builds the new one in a hidden sibling directory
(``job.staging_dir``) and swaps it in whole (``store.atomic.replace_directory``), so a reader
opening ``OUT`` finds the old store or the new one, never neither.

An object URL as ``out`` (``s3://bucket/stores/web``): the store is built exactly as above in a
local directory (``config.work_dir``, by default ``~/.cache/tokentape/uploads/<hash of the
URL>``, see ``store.upload.upload_work_dir``) and uploaded: each shard's two files as soon as
assembly closes it (``store.upload.ShardUploader``, while the next shards are assembled), the
tokenizer copy and anything not yet up once the build is complete, ``manifest.json`` last
(``store.upload``), so a reader never finds an incomplete store under the URL. A rerun
verifies what is already uploaded (size and ``sha256`` metadata) and uploads only the rest; a
URL whose manifest is this job's is "already complete" without any local work. The writer lock
is the local build directory's: it excludes another writer on this machine (or one sharing that
directory), not one on another machine with its own work directory (the URL is looked at before
the build and again before the manifest goes up, which narrows that race). The default build
directory is scratch space: what another job left there is replaced, and after a successful
upload the local store is removed (only the files tokentape writes). A ``--work-dir`` given is
the user's: a store of another job found there is refused without ``--overwrite``, like a local
``--out``, and the built store is kept there after the upload (a local copy). With
``--executor ray`` on a cluster, the work directory must be on storage every node sees.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.objects.client import is_url, object_store
from tokentape._src.store.atomic import replace_directory, write_atomic
from tokentape._src.store.format import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    choose_dtype,
    content_hash,
    numpy_dtype,
)
from tokentape._src.store.lock import output_lock
from tokentape._src.store.output import JOB_FILE, WORK_DIR, clear_out, discard_store
from tokentape._src.store.provenance import (
    ADDED,
    INPUTS_NAME,
    ShardProvenance,
    inputs_json,
    make_provenance,
)
from tokentape._src.store.safedir import made_directory
from tokentape._src.store.tokenizers import (
    Bos,
    Tokenizer,
    bos_choice,
    choose_bos,
    load_tokenizer,
    tokenizer_manifest,
    tokenizer_report,
)
from tokentape._src.store.upload import (
    ShardUploader,
    check_upload_work_dir,
    inspect_remote,
    upload_store,
    upload_work_dir,
)
from tokentape._src.store.writer import ShardWriter
from tokentape._src.tokenize.filters import FilterSet, parse_filters
from tokentape._src.tokenize.inputs import (
    InputFile,
    Unit,
    UnitPart,
    expand_inputs,
    plan_units,
    with_id_keys,
)
from tokentape._src.tokenize.job import (
    OutState,
    TokenizeConfig,
    bad_record_stats,
    check_bad_fraction,
    inspect_out,
    job_identity,
    summary_problem,
    units_dir,
)
from tokentape._src.tokenize.pool import Pool, PoolJob, WorkerDied
from tokentape._src.tokenize.ray_executor import ray_session, run_ray_tasks
from tokentape._src.tokenize.worker import (
    UnitResult,
    WorkerSettings,
    load_result,
    read_unit,
    unit_intact,
    unit_paths,
)
from tokentape._src.util.faults import crashpoint
from tokentape._src.util.hashing import canonical_hash
from tokentape._src.util.progress import Counters, ProgressCallback, check_callback, watch
from tokentape._src.util.version import __version__
from tokentape.errors import InputError, OutputError, TokentapeError, _reworded


@dataclass(frozen=True)
class TokenizeSummary:
    """What a tokenize run produced (also what ``--json`` prints).

    Attributes:
        out: The store's directory or object URL, as given.
        status: ``"created"``, ``"resumed"`` (an interrupted run's work was reused) or
            ``"already complete"`` (the same job had finished: nothing was redone).
        dtype: The store's token dtype (``uint16`` or ``uint32``).
        vocab_size: The tokenizer's vocabulary size.
        eod_id: The end-of-document id appended to every document.
        docs_in: Documents read from the inputs.
        n_docs: Documents written (those not dropped).
        n_tokens: Tokens written, end-of-document (and beginning-of-document) ids included.
        n_shards: Shards written.
        text_bytes: UTF-8 bytes of the documents' text read.
        dropped_docs: Documents dropped per reason (``empty``, or the name of the filter that
            dropped them), sorted by reason.
        dropped_tokens: The tokens of those documents, per reason.
        units: Units of work the inputs were cut into.
        units_reused: Units an earlier, interrupted run had finished (all of them when the
            store was already complete).
        seconds: Wall-clock seconds of this run.
        content_hash: The store's content hash.
        tokenizer: Which tokenizer made it: ``kind``, ``spec``, ``source`` (the kind and the
            file read), ``eod_id``, ``eod_token`` and ``eod_choice`` (the EOD and why it was
            chosen: ``--eod-token``, the ``eos_token`` of ``tokenizer_config.json``, ...).
        id_keys: The fields the records' ids were read from, with how many inputs each
            (``""``: inputs without one); empty for a store that records no provenance.
        bad_records: With ``on_bad_record="skip"``: the records skipped as bad (``skipped``,
            per ``reasons``, ``by_input``, the ``first`` locations); empty otherwise.
        bos_id: The beginning-of-document id put before every document (``bos``), or None.
            ``tokenizer`` says which token it is and why (``bos_token``, ``bos_choice``).
        ray_nodes: With ``executor="ray"``: the units this run tokenized on each Ray node
            (``IP/NODE``, the node's address and the first 8 hex digits of its Ray id); empty
            otherwise.
    """

    out: str
    status: str  # "created", "resumed" or "already complete"
    dtype: str
    vocab_size: int
    eod_id: int
    docs_in: int
    n_docs: int
    n_tokens: int
    n_shards: int
    text_bytes: int
    dropped_docs: dict[str, int]
    dropped_tokens: dict[str, int]
    units: int
    units_reused: int
    seconds: float
    content_hash: str
    tokenizer: dict[str, Any]
    id_keys: dict[str, int]
    bad_records: dict[str, Any] = field(default_factory=dict)
    bos_id: int | None = None
    ray_nodes: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON-friendly data.

        Returns:
            A dict of the fields.
        """
        return dict(self.__dict__)


ShardDone = Callable[[Path, ShardInfo, ShardProvenance | None], None]
"""Told of every shard (the directory it was built in, and its provenance files' record, if
any) as soon as its files are in place: an upload starts it."""


class _Origins:
    """Where the documents of each unit came from, in the store's terms (``ADDED``): the
    input's index among the job's files and the record in the whole file (a jsonl line counted
    on from the lines of the file's earlier parts); and what each input gave."""

    def __init__(self, files: list[InputFile]) -> None:
        self.files = files
        self.index = {f.path: i for i, f in enumerate(files)}
        self.lines_before = [0] * len(files)
        self.docs_in = [0] * len(files)
        self.docs_kept = [0] * len(files)

    def of_unit(self, unit: Unit, result: UnitResult, records: np.ndarray) -> np.ndarray:
        """``records`` (the unit's ``UNIT_DOC`` rows) as the store records them."""
        inputs = np.array([self.index[p.file.path] for p in unit.parts], dtype=np.uint32)
        pairs = zip(unit.parts, inputs.tolist(), strict=True)
        before = [self.lines_before[i] if _counts_lines(p) else 0 for p, i in pairs]
        offsets = np.array(before, dtype=np.uint64)
        part = records["part"].astype(np.intp)
        added = np.empty(len(records), dtype=ADDED)
        added["input"] = inputs[part]
        added["group"] = records["group"]
        added["record"] = records["record"] + offsets[part]
        added["id_len"] = records["id_len"]
        kept = np.bincount(part, minlength=len(unit.parts)).tolist()
        for k, i in enumerate(inputs.tolist()):
            self.lines_before[i] += result.part_lines[k]
            self.docs_in[i] += result.part_docs_in[k]
            self.docs_kept[i] += kept[k]
        return added

    def table(self) -> list[dict[str, Any]]:
        """The inputs table (``inputs.json``): each input and what it gave."""
        rows = []
        for f, docs_in, kept in zip(self.files, self.docs_in, self.docs_kept, strict=True):
            row: dict[str, Any] = {"path": f.path, "kind": f.kind, "size": f.size}
            if f.version:
                row["version"] = f.version
            row |= {"id_key": f.id_key or None, "docs_in": docs_in, "docs_kept": kept,
                    "docs_dropped": docs_in - kept}  # fmt: skip
            rows.append(row)
        return rows


def _counts_lines(part: UnitPart) -> bool:
    """Whether a part's record numbers are lines within it (jsonl), counted on across parts."""
    return part.file.kind not in ("parquet", "txt")


def _assemble(
    out: Path,
    work_dir: Path,
    units: list[Unit],
    results: list[UnitResult],
    origins: _Origins,
    dtype: str,
    shard_tokens: int,
    on_shard: ShardDone | None = None,
) -> tuple[list[ShardInfo], list[ShardProvenance], int]:
    writer = ShardWriter(out, dtype, shard_tokens)
    told = 0
    try:
        for unit, result in zip(units, results, strict=True):
            got = read_unit(work_dir, result, dtype)
            n_before = len(writer.shards)
            lengths = np.ascontiguousarray(got.docs["length"])
            writer.add(got.tokens, lengths, origins.of_unit(unit, result, got.docs), got.ids)
            if len(writer.shards) > n_before:
                crashpoint("mid-assembly")
            told = _tell(out, writer.shards, writer.provenance, told, on_shard)
        shards = writer.finish()
        _tell(out, shards, writer.provenance, told, on_shard)
    except BaseException:
        writer.abort()
        raise
    return shards, writer.provenance, sum(s.n_tokens for s in shards)


def _tell(
    out: Path,
    shards: list[ShardInfo],
    provenance: list[ShardProvenance],
    told: int,
    on_shard: ShardDone | None,
) -> int:
    """``on_shard`` of every shard from ``told`` on (with its provenance files' record, when
    the writer wrote them); the count told."""
    if on_shard is not None:
        for i in range(told, len(shards)):
            on_shard(out, shards[i], provenance[i] if provenance else None)
    return len(shards)


def _summary(
    out: str | Path,
    manifest: Manifest,
    status: str,
    units_reused: int,
    seconds: float,
    tokenizer: Tokenizer,
    bos: Bos | None,
) -> TokenizeSummary:
    stats = manifest.filters
    return TokenizeSummary(
        out=str(out),
        status=status,
        dtype=manifest.dtype,
        vocab_size=manifest.vocab_size,
        eod_id=manifest.eod_id,
        docs_in=stats["docs_in"],
        n_docs=manifest.n_docs,
        n_tokens=manifest.n_tokens,
        n_shards=len(manifest.shards),
        text_bytes=stats["text_bytes"],
        dropped_docs=stats["dropped_docs"],
        dropped_tokens=stats["dropped_tokens"],
        units=manifest.inputs["units"],
        units_reused=units_reused,
        seconds=seconds,
        content_hash=manifest.content_hash,
        tokenizer=tokenizer_report(tokenizer)
        | {"bos_id": manifest.bos_id, "bos_token": manifest.tokenizer.get("bos_token"),
           "bos_choice": bos_choice(bos)},
        id_keys=_id_keys(manifest),
        bad_records=manifest.extra.get("bad_records", {}),
        bos_id=manifest.bos_id,
    )  # fmt: skip


def _id_keys(manifest: Manifest) -> dict[str, int]:
    """How many inputs had their ids read from each field (``""``: none), as the job recorded
    its inputs; nothing for a store without provenance."""
    if manifest.provenance is None:
        return {}
    files = manifest.inputs.get("files")
    rows = files if isinstance(files, list) else []
    keys = Counter(str(f.get("id_key") or "") for f in rows if isinstance(f, dict))
    return dict(sorted(keys.items()))


def _filter_stats(results: list[UnitResult], filters: FilterSet) -> dict[str, Any]:
    """The manifest's ``filters`` block: configuration and what each reason dropped."""
    dropped_docs: Counter[str] = Counter()
    dropped_tokens: Counter[str] = Counter()
    for r in results:
        dropped_docs.update(r.dropped_docs)
        dropped_tokens.update(r.dropped_tokens)
    return {
        "config": filters.to_json(),
        "docs_in": sum(r.docs_in for r in results),
        "text_bytes": sum(r.text_bytes for r in results),
        "dropped_docs": dict(sorted(dropped_docs.items())),
        "dropped_tokens": dict(sorted(dropped_tokens.items())),
    }


def tokenize(config: TokenizeConfig, progress: ProgressCallback | None = None) -> TokenizeSummary:
    """Run (or resume) a tokenization job and return its summary.

    The job holds the writer lock of ``config.out`` (``store.lock``) from before it looks at
    the directory until it is done; another writer on the same output is refused at once.
    ``progress`` receives a report every half second while units are tokenized (nothing is
    drawn by the library: the command line passes a terminal bar)."""
    check_callback(progress)
    started = time.monotonic()
    with ExitStack() as stack:
        pool = None
        if config.executor == "local":  # its helpers start now, while this process plans
            pool = stack.enter_context(
                Pool(config.tokenizer, config.eod_token, config.filters, config.workers)
            )
        return _tokenize(config, progress, started, pool)


def _tokenize(
    config: TokenizeConfig, progress: ProgressCallback | None, started: float, pool: Pool | None
) -> TokenizeSummary:
    tokenizer = load_tokenizer(config.tokenizer, config.eod_token)
    bos = choose_bos(tokenizer, config.bos, config.bos_token)
    filters = parse_filters(config.filters)
    files = with_id_keys(
        expand_inputs(config.inputs, config.storage_options), config.id_key, config.text_key
    )
    unit_bytes = config.unit_bytes(sum(f.size for f in files))
    units = plan_units(files, unit_bytes)
    dtype = choose_dtype(tokenizer.vocab_size) if config.dtype == "auto" else config.dtype
    itemsize = numpy_dtype(dtype).itemsize
    shard_tokens = max(1, int(config.shard_mb * 2**20) // itemsize)
    identity = job_identity(
        config, files, tokenizer.fingerprint, filters.to_json(), dtype, shard_tokens, unit_bytes,
        None if bos is None else bos.id,
    )  # fmt: skip
    job_hash = canonical_hash(identity)
    job = _Job(
        config=config,
        tokenizer=tokenizer,
        bos=bos,
        filters=filters,
        files=files,
        units=units,
        dtype=dtype,
        shard_tokens=shard_tokens,
        unit_bytes=unit_bytes,
        identity=identity,
        job_hash=job_hash,
        resume_key={"job": job_hash, "mtime_ns": [f.mtime_ns for f in files]},
        started=started,
        pool=pool,
    )
    if is_url(config.out):
        return _to_url(job, config.out, progress)
    out = Path(config.out)
    with output_lock(out, "tokenize"):
        return _run(job, out, progress, config.overwrite)


def _to_url(job: _Job, url: str, progress: ProgressCallback | None) -> TokenizeSummary:
    """Build the store in the local work directory (under its writer lock), then upload it to
    ``url`` (see the module docstring)."""
    config = job.config
    store = object_store(url, config.storage_options)
    scratch = config.work_dir is None  # the default: ours alone, replaced and removed at will
    local = upload_work_dir(url) if scratch else Path(str(config.work_dir))
    if scratch:
        check_upload_work_dir(local)
    with output_lock(local, "tokenize"):
        remote = _complete(
            inspect_remote(
                store, url, job.job_hash, config.overwrite, job.identity, config.tokenizer
            ),
            url,
            config,
        )
        if remote is not None:
            if scratch:
                discard_store(local)  # what a run killed after its upload left behind
            seconds = time.monotonic() - job.started
            reused = len(job.units)
            return _summary(
                url, remote, "already complete", reused, seconds, job.tokenizer, job.bos
            )
        early = ShardUploader(
            store, url, job.job_hash, config.overwrite
        )  # each shard goes up as assembly closes it
        try:
            try:
                built = _run(job, local, progress, scratch or config.overwrite, early.shard_done)
            except OutputError as exc:  # about the work directory: the message names it so
                raise _reworded(exc, str(exc).replace("--out '", "--work-dir '", 1)) from None
            early.finish()  # a refusal of the URL meanwhile is raised here, the build kept
        finally:
            early.close()
        crashpoint("before-upload")
        # Looked at again: the build may have taken hours, and the lock is not the bucket's.
        remote = _complete(
            inspect_remote(
                store, url, job.job_hash, config.overwrite, job.identity, config.tokenizer
            ),
            url,
            config,
        )
        if remote is None:
            report = upload_store(store, local, url, progress=progress)
            crashpoint("after-upload")
        if scratch:
            discard_store(local)
    seconds = time.monotonic() - job.started
    if remote is not None:  # another writer uploaded this job's store meanwhile
        reused = len(job.units)
        return _summary(url, remote, "already complete", reused, seconds, job.tokenizer, job.bos)
    fresh = built.status == "created" and not set(report.kept) - early.uploaded
    return replace(built, out=url, status="created" if fresh else "resumed", seconds=seconds)


def _complete(found: Manifest | None, url: str, config: TokenizeConfig) -> Manifest | None:
    """This job's store found at ``url``, when its summary fields are sound; one whose are not
    is refused (or, with ``--overwrite``, replaced)."""
    problem = None if found is None else summary_problem(found)
    if problem is None:
        return found
    if config.overwrite:
        return None
    raise OutputError(
        f"--out '{url}': holds this job's store, but it is damaged ({problem}); pass "
        "--overwrite to rebuild it"
    )


@dataclass(frozen=True)
class _Job:
    """Everything one run decided before touching ``--out``."""

    config: TokenizeConfig
    tokenizer: Tokenizer
    bos: Bos | None
    """The token put before every document, if any (``--bos``)."""
    filters: FilterSet
    files: list[InputFile]
    """The inputs, in order, each with the field its ids are read from."""
    units: list[Unit]
    dtype: str
    shard_tokens: int
    unit_bytes: int
    identity: dict[str, Any]
    job_hash: str
    resume_key: dict[str, Any]
    started: float
    pool: Pool | None
    """The local executor's processes, helpers already starting (None: Ray)."""


def _run(
    job: _Job,
    out: Path,
    progress: ProgressCallback | None,
    overwrite: bool,
    on_shard: ShardDone | None = None,
) -> TokenizeSummary:
    """The locked part of ``tokenize``: inspect ``out``, build, replace; ``on_shard`` hears of
    every shard as assembly closes it (not of a build beside ``out`` that replaces it: its
    files move when it is swapped in)."""
    config, units = job.config, job.units
    stored = job.tokenizer.stored_file()
    plan = inspect_out(
        out, job.job_hash, job.resume_key, overwrite, stored, job.identity, job.config.tokenizer
    )
    build = plan.build
    work_dir = build / WORK_DIR
    if plan.state is OutState.COMPLETE:
        assert plan.manifest is not None
        shutil.rmtree(work_dir, ignore_errors=True)
        status = "already complete"
        if plan.replace:  # built by an interrupted run, not swapped in yet
            replace_directory(build, Path(os.path.realpath(out)), discard_store)
            status = "resumed"
        seconds = time.monotonic() - job.started
        return _summary(out, plan.manifest, status, len(units), seconds, job.tokenizer, job.bos)

    session = ExitStack()  # the Ray session, if any: connected before anything is written
    ray = None
    if config.executor == "ray":
        ray = session.enter_context(ray_session(config.ray_address, config.workers))
    created = not build.exists()
    unit_dir = units_dir(work_dir, job.resume_key)
    try:
        build.mkdir(parents=True, exist_ok=True)
        for directory in (work_dir, unit_dir):  # helpers write there by path: no link followed
            made_directory(directory, f"tokentape makes it in {build} itself: remove it")
        if plan.state is OutState.FRESH:
            write_atomic(work_dir / JOB_FILE, json.dumps(job.resume_key).encode())
        itemsize = numpy_dtype(job.dtype).itemsize
        settings = WorkerSettings(
            text_key=config.text_key,
            dtype=job.dtype,
            id_limit=min(job.tokenizer.vocab_size, 2 ** (8 * itemsize)),
            work_dir=str(unit_dir),
            storage_options=dict(config.storage_options),
            skip_bad=config.on_bad_record == "skip",
            bos_id=None if job.bos is None else job.bos.id,
        )
        finished = {u.index: _finished(unit_dir, u, job.dtype) for u in units}
        pending = [u for u in units if finished[u.index] is None]
        counters = job.pool.counters if job.pool is not None else Counters()
        reused_bytes = sum(u.n_bytes for u in units if finished[u.index] is not None)
        counters.add(input_bytes=reused_bytes)
        total_bytes = sum(u.n_bytes for u in units)
        ray_nodes: dict[str, int] = {}
        with watch(counters, total_bytes, "tokenize", progress):
            if ray is not None:
                dead = []
                pool_job = PoolJob(
                    config.tokenizer, config.eod_token, config.filters, settings, tuple(pending)
                )
                ray_nodes = run_ray_tasks(
                    ray, pool_job, job.tokenizer.fingerprint, config.workers, counters
                )
            else:
                assert job.pool is not None  # the local executor's
                dead = job.pool.run(pending, settings, job.tokenizer, job.filters)
        session.close()  # a private Ray instance goes before assembly
        results = [load_result(unit_paths(unit_dir, u.index)[2]) for u in units]
        missing = [u.index for u, r in zip(units, results, strict=True) if r is None]
        if missing:
            raise WorkerDied(_unfinished(missing, dead, unit_dir))
        done = [r for r in results if r is not None]  # every one: none is missing
        bad = bad_record_stats(done, config.max_bad_fraction) if settings.skip_bad else None
        if bad is not None:
            check_bad_fraction(bad, config.inputs)
        clear_out(build, keep=(WORK_DIR,))  # what an interrupted assembly left behind
        # A build that replaces ``out`` is moved at the end: its files are uploaded from there.
        told = None if plan.replace else on_shard
        origins = _Origins(job.files)
        shards, provenance, n_tokens = _assemble(
            build, unit_dir, units, done, origins, job.dtype, job.shard_tokens, told
        )
        if n_tokens == 0:
            raise InputError(
                f"inputs {', '.join(config.inputs)}: no document left to store "
                "(all inputs empty or dropped by filters)"
            )
        crashpoint("before-manifest")
        if stored is not None:
            name, data = stored
            write_atomic(build / name, data)
        table = inputs_json(origins.table())
        write_atomic(build / INPUTS_NAME, table)
        manifest = _manifest(job, done, shards, n_tokens)
        manifest = replace(manifest, provenance=make_provenance(table, provenance))
        if bad is not None:
            manifest = replace(manifest, extra=manifest.extra | {"bad_records": bad})
        write_atomic(build / MANIFEST_NAME, manifest.to_json().encode())
        crashpoint("after-manifest")
        shutil.rmtree(work_dir, ignore_errors=True)
        if plan.replace:
            replace_directory(build, Path(os.path.realpath(out)), discard_store)
    except WorkerDied as exc:
        raise TokentapeError(
            f"{out}: {exc}; finished units are kept: run the same command again to resume"
        ) from None
    except TokentapeError:
        _discard(build, created or plan.replace)
        raise
    finally:
        session.close()
    status = "resumed" if plan.state is OutState.RESUME else "created"
    reused = len(units) - len(pending)
    seconds = time.monotonic() - job.started
    summary = _summary(out, manifest, status, reused, seconds, job.tokenizer, job.bos)
    return replace(summary, ray_nodes=ray_nodes)


def _finished(work_dir: Path, unit: Unit, dtype: str) -> UnitResult | None:
    """The result of a unit an earlier run finished, if its files are intact."""
    result = load_result(unit_paths(work_dir, unit.index)[2])
    return result if result is not None and unit_intact(work_dir, result, dtype) else None


def _unfinished(missing: list[int], dead: list[int], work_dir: Path) -> str:
    """Why units are unfinished after every worker returned."""
    if dead:
        return (
            f"a worker process died (exit codes {dead}: killed, or out of memory) before "
            "finishing its units"
        )
    return (
        f"{len(missing)} unit(s) (unit {missing[0]} first) have no finished output in "
        f"{work_dir} although every worker finished; something else removed them"
    )


def _manifest(
    job: _Job, done: list[UnitResult], shards: list[ShardInfo], n_tokens: int
) -> Manifest:
    tokenizer = job.tokenizer
    return Manifest(
        dtype=job.dtype,
        vocab_size=tokenizer.vocab_size,
        eod_id=tokenizer.eod_id,
        tokenizer=tokenizer_manifest(tokenizer)
        | ({} if job.bos is None else {"bos_id": job.bos.id, "bos_token": job.bos.token}),
        shards=tuple(shards),
        n_tokens=n_tokens,
        n_docs=sum(s.n_docs for s in shards),
        content_hash=content_hash(shards, job.dtype),
        filters=_filter_stats(done, job.filters),
        inputs={
            "text_key": job.config.text_key,
            "unit_bytes": job.unit_bytes,
            "units": len(job.units),
            "files": job.identity["inputs"],
        },
        job=job.job_hash,
        created_by=f"tokentape {__version__}",
    )


def _discard(build: Path, created: bool) -> None:
    """Bad input: leave no partial store behind (a staging directory goes whole)."""
    if not build.exists():
        return
    if created:
        shutil.rmtree(build, ignore_errors=True)
    else:
        clear_out(build)


__all__ = ["TokenizeSummary", "tokenize"]

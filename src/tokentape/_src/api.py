"""The command-line jobs as Python functions: ``tokenize``, ``replay``, ``locate``, ``verify``.

Thin over the library: each builds what the command builds from its flags and returns the
result as data. Nothing is drawn on the terminal unless asked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tokentape._src.audit.locate import Located
from tokentape._src.audit.locate import locate as _locate
from tokentape._src.audit.replay import Replayed
from tokentape._src.audit.replay import replay as _replay
from tokentape._src.audit.runs import batching
from tokentape._src.objects.client import check_storage_options
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.tokenize.driver import TokenizeSummary
from tokentape._src.tokenize.driver import tokenize as _tokenize
from tokentape._src.tokenize.job import MAX_WORKERS, TokenizeConfig
from tokentape._src.train.schedule import Schedule
from tokentape._src.util.checks import (
    check_count,
    check_flag,
    check_mb,
    check_optional_text,
    check_path,
    check_text,
    shown,
)
from tokentape._src.util.progress import ProgressCallback, check_callback
from tokentape._src.verify.stores import StoreReport, verify_paths
from tokentape.errors import ArgumentError

PathArg = str | os.PathLike[str]

__all__ = ["locate", "replay", "tokenize", "verify"]


def tokenize(
    inputs: PathArg | Sequence[PathArg],
    out: PathArg,
    *,
    tokenizer: str = "bytes",
    eod_token: str | None = None,
    text_key: str = "text",
    filters: Sequence[str] = (),
    workers: int = 1,
    executor: str = "local",
    ray_address: str | None = None,
    dtype: str = "auto",
    shard_mb: float = 256.0,
    unit_mb: float | None = None,
    overwrite: bool = False,
    progress: ProgressCallback | None = None,
    storage_options: Mapping[str, Any] | None = None,
    work_dir: PathArg | None = None,
) -> TokenizeSummary:
    """Tokenize text files into a token store (``tokentape tokenize``), or resume the job.

    The store is byte-identical for any ``workers`` and after any interruption: rerun the
    same call and finished units are kept.

    Args:
        inputs: Files, directories or globs (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``,
            ``.parquet``, ``.txt``), in order; one path or a sequence of them. Object URLs
            work the same way (``s3://bucket/raw/web/``, ``s3://bucket/raw/**/*.jsonl``).
        out: The store directory to write, or an object URL (``s3://bucket/stores/web``):
            the store is then built in ``work_dir`` and uploaded, its manifest last.
        tokenizer: ``"bytes"``, ``"tiktoken:PATH"`` or the path of a Hugging Face
            ``tokenizer.json``.
        eod_token: The end-of-document token (default: the tokenizer's own).
        text_key: The JSON field or parquet column holding the text.
        filters: Document filters, e.g. ``"unique-lines"``, ``"min-tokens:16"``.
        workers: Worker processes (or Ray tasks in flight). Above 1, helper processes are
            spawned, which import the caller's main module: in a script, call this under
            ``if __name__ == "__main__":``.
        executor: ``"local"`` (a process pool) or ``"ray"``.
        ray_address: The Ray cluster to connect to (``executor="ray"`` only).
        dtype: ``"auto"``, ``"uint16"`` or ``"uint32"``.
        shard_mb: Target shard size in MiB of tokens.
        unit_mb: Input MiB per unit of work (default: chosen from the input size).
        overwrite: Replace a store or an unfinished run with other settings in ``out``.
        progress: Called with a ``Progress`` (bytes, documents and tokens done, elapsed
            seconds) every half second while units are tokenized (from a monitor thread), and
            once at the end with ``final=True``. An exception it raises stops the reports and
            is raised here once the work stops. Nothing is drawn on the terminal.
        storage_options: fsspec options for object URLs among ``inputs`` and ``out`` (e.g.
            ``{"endpoint_url": ...}``); credentials best come from the environment or a
            profile. Never written to the store or printed.
        work_dir: With an object URL as ``out``: the local directory the store is built in
            (default ``~/.cache/tokentape/uploads/<hash of out>``).

    Returns:
        The summary: counts, dropped documents per filter, content hash, status.

    Raises:
        InputError: Bad input: an argument, a missing file, bad JSON, an unknown tokenizer or
            filter (the message names the file, line or field).
        OutputError: ``out`` is not a tokentape directory, holds another job's store (without
            ``overwrite``), cannot be written, or another writer holds it.
    """
    paths = _paths("inputs", inputs)
    check_path("out", out)
    if isinstance(filters, str) or not isinstance(filters, Sequence):
        raise ArgumentError(f"filters must be a list of filter specs, got {filters!r}")
    for spec in filters:
        check_text("filters", spec)
    for name, text in (("tokenizer", tokenizer), ("text_key", text_key)):
        check_text(name, text)
    for name, optional in (("eod_token", eod_token), ("ray_address", ray_address)):
        check_optional_text(name, optional)
    check_count("workers", workers, 1, MAX_WORKERS)
    for name, value, allowed in (
        ("executor", executor, ("local", "ray")),
        ("dtype", dtype, ("auto", "uint16", "uint32")),
    ):
        if value not in allowed:
            raise ArgumentError(f"{name} must be one of {', '.join(allowed)}, got {shown(value)}")
    check_mb("shard_mb", shard_mb)
    if unit_mb is not None:
        check_mb("unit_mb", unit_mb)
    check_flag("overwrite", overwrite)
    check_callback(progress)
    if work_dir is not None:
        check_path("work_dir", work_dir)
    config = TokenizeConfig(
        inputs=tuple(paths),
        out=os.fspath(out),
        tokenizer=tokenizer,
        eod_token=eod_token,
        text_key=text_key,
        filters=tuple(filters),
        workers=workers,
        executor=executor,
        ray_address=ray_address,
        dtype=dtype,
        shard_mb=shard_mb,
        unit_mb=unit_mb,
        overwrite=overwrite,
        storage_options=check_storage_options(storage_options or {}, "storage_options"),
        work_dir=None if work_dir is None else os.fspath(work_dir),
    )
    return _tokenize(config, progress)


def _paths(name: str, given: object) -> list[str]:
    """One path, or an ordered sequence of them (a set's order would change the result)."""
    if isinstance(given, str | os.PathLike):
        given = [given]
    if isinstance(given, str | bytes) or not isinstance(given, Sequence):
        raise ArgumentError(f"{name} must be a path or a list of paths, got {given!r}")
    if not given:
        raise ArgumentError(f"{name}: no paths given")
    for path in given:
        check_path(name, path)
    return [os.fspath(p) for p in given]


def _plan(plan: Plan | PathArg) -> Plan:
    if isinstance(plan, Plan):
        return plan
    check_path("plan", plan)
    return load_plan(plan)


def _schedule(
    plan: Plan,
    global_batch: int | None,
    dp: int | None,
    micro: int | None,
    accum: int | None,
    step_log: PathArg | None,
) -> Schedule | None:
    """The schedule one of ``global_batch``, ``dp``/``micro``/``accum`` or ``step_log`` gives."""
    if step_log is not None:
        check_path("step_log", step_log)
    log = None if step_log is None else os.fspath(step_log)
    shape = batching(
        plan, global_batch=global_batch, dp=dp, micro=micro, accum=accum, log=log, named=_named
    )
    return shape.schedule


def _named(name: str) -> str:
    return "step_log" if name == "log" else name


def replay(
    plan: Plan | PathArg,
    step: int,
    *,
    global_batch: int | None = None,
    dp: int | None = None,
    micro: int | None = None,
    accum: int | None = None,
    step_log: PathArg | None = None,
) -> Replayed:
    """Rebuild the exact batch of optimizer step ``step`` (``tokentape replay``).

    Give the run's batch shape as one of: ``global_batch``; ``dp`` and ``micro`` (and
    ``accum``); or the run's ``step_log`` (needed when the shape changed during the run).

    Args:
        plan: The plan (a ``Plan`` or the path of its ``PLAN.json``).
        step: The optimizer step, from 0.
        global_batch: Samples per optimizer step (ranks then unknown).
        dp: Data-parallel ranks.
        micro: Samples per micro-batch per rank.
        accum: Micro-batches per step (default 1).
        step_log: The run's step log (``steps.jsonl``).

    Returns:
        The step: its positions, their placement on ranks, the token windows (``batch``),
        the documents each window overlaps, and the tokens hash the step log records.

    Raises:
        ArgumentError: No or conflicting batch shapes.
        OutOfRangeError: A step beyond the run or the tape.
        PlanError: The plan, or a step log written for another plan or damaged.
        StoreError: A store is damaged or no longer the plan's (``StoreChanged``).
    """
    resolved = _plan(plan)
    schedule = _schedule(resolved, global_batch, dp, micro, accum, step_log)
    if schedule is None:
        raise ArgumentError("replay needs the batch shape: global_batch, dp/micro or step_log")
    return _replay(resolved, step, schedule)


def locate(
    plan: Plan | PathArg,
    source: str,
    doc: int,
    *,
    global_batch: int | None = None,
    dp: int | None = None,
    micro: int | None = None,
    accum: int | None = None,
    step_log: PathArg | None = None,
    until_step: int | None = None,
) -> Located:
    """Every position (and step, rank) at which a document is trained on (``tokentape locate``).

    Closed form, no scan. Without a batch shape only positions are found.

    Args:
        plan: The plan (a ``Plan`` or the path of its ``PLAN.json``).
        source: The source's name in the plan.
        doc: The document's id in that source.
        global_batch: Samples per optimizer step (ranks then unknown).
        dp: Data-parallel ranks.
        micro: Samples per micro-batch per rank.
        accum: Micro-batches per step (default 1).
        step_log: The run's step log (``steps.jsonl``).
        until_step: Search through this step (default: the horizon, or the log's end).

    Returns:
        The positions (ascending), with epoch, sample and, given a batch shape, their
        placement (``step``, ``dp_rank``, ``micro_step``).

    Raises:
        ArgumentError: Conflicting batch shapes, or ``until_step`` without one.
        InputError: An unknown source.
        OutOfRangeError: A document out of range.
        PlanError: The plan, or a step log written for another plan or damaged.
        StoreError: A store is damaged or no longer the plan's (``StoreChanged``).
    """
    resolved = _plan(plan)
    schedule = _schedule(resolved, global_batch, dp, micro, accum, step_log)
    if until_step is not None and schedule is None:
        raise ArgumentError("until_step needs the batch shape: global_batch, dp/micro or step_log")
    return _locate(resolved, source, doc, schedule, until_step)


def verify(
    paths: PathArg | Iterable[PathArg],
    quick: bool = False,
    *,
    blocks: int | None = None,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[StoreReport]:
    """Rehash stores against their manifests (``tokentape verify``).

    Args:
        paths: Store directories, object URLs of stores (``s3://bucket/stores/web``, read
            through ranged GETs), Megatron prefixes or ``PLAN.json`` files (every store of
            the plan, also checked against the content hash the plan recorded).
        quick: Hash only ``blocks`` blocks per shard instead of every byte.
        blocks: Blocks per shard a quick check hashes (``quick`` only; default 4: the first,
            the last and two picked by a seeded hash of the shard's name).
        vocab_size: A Megatron prefix not named by a plan: ids must be below it.
        eod_id: A Megatron prefix not named by a plan: every document ends with it.
        storage_options: fsspec options for the object URLs given (a plan's sources use the
            plan's ``storage_options``); credentials come from the environment or a profile.

    Returns:
        One report per store (``report.ok``, ``report.problems``), in the order named.

    Raises:
        ArgumentError: ``blocks`` without ``quick``, or ``blocks``, ``vocab_size`` or
            ``eod_id`` not an integer in range.
        TokentapeError: A path is not a store or plan, or a manifest cannot be read at all (a
            store's damage is reported in its ``StoreReport``, not raised).
    """
    options = check_storage_options(storage_options or {}, "storage_options")
    return verify_paths(
        _paths("paths", paths), quick, blocks, vocab_size, eod_id, storage_options=options
    )

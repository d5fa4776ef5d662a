"""The command-line jobs as Python functions: ``tokenize``, ``replay``, ``locate``, ``verify``.

Thin over the library: each builds what the command builds from its flags and returns the
result as data. Nothing is drawn on the terminal unless asked.

The front door of both: the checks of each job's arguments and the building of its settings
live here once, in ``tokenize_config``, ``replay_shape``, ``locate_shape`` and
``verify_stores``, which the public functions and the command line (``cli``) both call. A
``Wording`` says how their errors name what was given: ``PYTHON`` (the parameters, here) or
the command line's flags (``cli.wording.FLAGS``). What only a Python caller can give (a plan
or a step log as a path or a ``Plan``, ``verify``'s one path or list of them) is turned into
what the command line gives, and checked, by the public function before it calls them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokentape._src.audit.find import Handle, one_document
from tokentape._src.audit.find import find_documents as _find_documents
from tokentape._src.audit.locate import Located
from tokentape._src.audit.locate import locate as _locate
from tokentape._src.audit.replay import Replayed
from tokentape._src.audit.replay import replay as _replay
from tokentape._src.audit.report import (
    MAX_SPIKE_WINDOW,
    SPIKE_WINDOW,
    SPIKE_Z,
    TOP_DOCS,
    ReportConfig,
    run_report,
)
from tokentape._src.audit.runinfo import step_log_path, step_log_url
from tokentape._src.audit.runs import Batching, batching, log_schedule
from tokentape._src.objects.client import check_storage_options, is_url
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.tokenize.driver import TokenizeSummary
from tokentape._src.tokenize.driver import tokenize as _tokenize
from tokentape._src.tokenize.job import MAX_WORKERS, TokenizeConfig
from tokentape._src.tokenize.records import check_id_key
from tokentape._src.train.batch import DocOrigin
from tokentape._src.train.schedule import Schedule
from tokentape._src.util.checks import (
    as_index,
    as_parameter,
    check_count,
    check_flag,
    check_int,
    check_mb,
    check_number,
    check_optional_text,
    check_path,
    check_text,
    shown,
)
from tokentape._src.util.progress import ProgressCallback, check_callback
from tokentape._src.verify.stores import StoreReport, verify_paths
from tokentape.errors import ArgumentError, OutOfRangeError

PathArg = str | os.PathLike[str]

__all__ = [
    "PYTHON",
    "Wording",
    "locate",
    "locate_shape",
    "replay",
    "replay_shape",
    "report",
    "report_config",
    "tokenize",
    "tokenize_config",
    "verify",
    "verify_stores",
]
"""The public functions (``tokentape`` exports them), and the checks they share with the
command line (``cli`` calls them)."""


# --- how the shared checks word an error ------------------------------------------------------


@dataclass(frozen=True)
class Wording:
    """How the checks shared by the public functions and the command line word an error.

    A Python caller reads its parameters' names (``step_log``), the command line its flags
    (``--log``).
    """

    named: Callable[[str], str]
    """An argument as a message names it, given its name in the checks (a parameter of the
    public functions, except ``log``: the step log)."""
    replay_without_shape: str
    """The error of a replay given no batch shape."""
    until_step_without_shape: str
    """The error of a locate given a last step to search through but no batch shape."""


def _named(name: str) -> str:
    return {"log": "step_log", "no_bos": "bos=False"}.get(name, name)


PYTHON = Wording(
    named=_named,
    replay_without_shape="replay needs the batch shape: global_batch, dp/micro or step_log",
    until_step_without_shape=(
        "until_step needs the batch shape: global_batch, dp/micro or step_log"
    ),
)
"""The public functions' wording: their parameters' names."""


# --- the checks and settings of each job, shared with the command line ------------------------


def tokenize_config(
    inputs: PathArg | Sequence[PathArg],
    out: PathArg,
    *,
    tokenizer: str = "bytes",
    eod_token: str | None = None,
    text_key: str = "text",
    id_key: str = "auto",
    filters: Sequence[str] = (),
    workers: int = 1,
    executor: str = "local",
    ray_address: str | None = None,
    dtype: str = "auto",
    shard_mb: float = 256.0,
    unit_mb: float | None = None,
    overwrite: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    work_dir: PathArg | None = None,
    on_bad_record: str = "fail",
    max_bad_fraction: float = 0.01,
    bos: bool | None = None,
    bos_token: str | None = None,
    wording: Wording,
) -> TokenizeConfig:
    """The settings of a tokenize job, every argument checked.

    ``tokenize`` and ``tokentape tokenize`` both check their arguments and build their
    settings here. The arguments are ``tokenize``'s, checked in the order the command line's
    always were; ``wording`` names the first refused.

    Returns:
        The job's settings.

    Raises:
        ArgumentError: An argument of the wrong type or value.
    """
    named = wording.named
    paths = _paths(named("inputs"), inputs)
    check_path(named("out"), out)
    check_text(named("tokenizer"), tokenizer)
    check_optional_text(named("eod_token"), eod_token)
    check_text(named("text_key"), text_key)
    check_text(named("id_key"), id_key)
    try:
        check_id_key(id_key)
    except ArgumentError as exc:
        raise ArgumentError(str(exc).replace("--id-key", named("id_key"), 1)) from None
    if isinstance(filters, str) or not isinstance(filters, Sequence):
        raise ArgumentError(f"{named('filters')} must be a list of filter specs, got {filters!r}")
    for spec in filters:
        check_text(named("filters"), spec)
    check_count(named("workers"), workers, 1, MAX_WORKERS)
    _check_choice(named("executor"), executor, ("local", "ray"))
    check_optional_text(named("ray_address"), ray_address)
    if ray_address is not None and executor != "ray":
        raise ArgumentError(f"{named('ray_address')} needs {named('executor')} ray")
    _check_choice(named("dtype"), dtype, ("auto", "uint16", "uint32"))
    check_mb(named("shard_mb"), shard_mb)
    if unit_mb is not None:
        check_mb(named("unit_mb"), unit_mb)
    check_flag(named("overwrite"), overwrite)
    options = check_storage_options(storage_options or {}, named("storage_options"))
    if work_dir is not None:
        check_path(named("work_dir"), work_dir)
    _check_choice(named("on_bad_record"), on_bad_record, ("fail", "skip"))
    if (
        isinstance(max_bad_fraction, bool)
        or not isinstance(max_bad_fraction, int | float)
        or not 0 <= max_bad_fraction <= 1
    ):
        raise ArgumentError(
            f"{named('max_bad_fraction')} must be a fraction between 0 and 1, got "
            f"{shown(max_bad_fraction)}"
        )
    if bos is not None:
        check_flag(named("bos"), bos)
    check_optional_text(named("bos_token"), bos_token)
    if bos is False and bos_token is not None:
        raise ArgumentError(
            f"{named('bos_token')} names a token to put first and {named('no_bos')} puts none: "
            "give one of them"
        )
    return TokenizeConfig(
        inputs=tuple(paths),
        out=os.fspath(out),
        tokenizer=tokenizer,
        eod_token=eod_token,
        text_key=text_key,
        id_key=id_key,
        filters=tuple(filters),
        workers=workers,
        executor=executor,
        ray_address=ray_address,
        dtype=dtype,
        shard_mb=shard_mb,
        unit_mb=unit_mb,
        overwrite=overwrite,
        storage_options=options,
        work_dir=None if work_dir is None else os.fspath(work_dir),
        on_bad_record=on_bad_record,
        max_bad_fraction=float(max_bad_fraction),
        bos=bos,
        bos_token=bos_token,
    )


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ArgumentError(f"{name} must be one of {', '.join(allowed)}, got {shown(value)}")


def replay_shape(
    plan: Plan,
    step: int,
    *,
    global_batch: int | None = None,
    dp: int | None = None,
    micro: int | None = None,
    accum: int | None = None,
    log: str | None = None,
    wording: Wording,
) -> tuple[Schedule, Batching]:
    """The batch shape of a replay, and its step checked against it.

    ``replay`` and ``tokentape replay`` both check their batch shape and step here. The
    arguments are ``replay``'s, but a ``Plan`` and ``log``, the path of the step log (read
    once, keeping the record of ``step``); ``wording`` names the argument refused.

    Returns:
        The schedule, and the batching it came from (whether it names the ranks, the step
        log read).

    Raises:
        ArgumentError: No or conflicting batch shapes, or a step that is not an integer.
        OutOfRangeError: A negative step, or one beyond the step log.
        PlanError: A step log written for another plan or damaged.
    """
    named = wording.named
    step = as_index(named("step"), step)
    shape = batching(
        plan,
        global_batch=global_batch,
        dp=dp,
        micro=micro,
        accum=accum,
        log=log,
        log_steps=(step,),
        named=named,
    )
    if shape.schedule is None:
        raise ArgumentError(wording.replay_without_shape)
    if step < 0:
        raise OutOfRangeError(f"{named('step')} must be >= 0, got {step}")
    if shape.log is not None and step >= shape.log.steps:
        raise OutOfRangeError(
            f"{named('step')} {step}: beyond the step log {log}, which ends at step "
            f"{shape.log.steps - 1}"
        )
    return shape.schedule, shape


def locate_shape(
    plan: Plan,
    *,
    global_batch: int | None = None,
    dp: int | None = None,
    micro: int | None = None,
    accum: int | None = None,
    log: str | None = None,
    until_step: int | None = None,
    wording: Wording,
) -> Batching:
    """The batch shape of a locate, if one is given.

    ``locate`` and ``tokentape locate`` both check their batch shape here. The arguments are
    ``locate``'s, but a ``Plan`` and ``log``, the path of the step log; ``wording`` names the
    argument refused.

    Returns:
        The batching: its schedule (None without a shape), whether it names the ranks.

    Raises:
        ArgumentError: Conflicting batch shapes, or ``until_step`` without one.
        PlanError: A step log written for another plan or damaged.
    """
    shape = batching(
        plan,
        global_batch=global_batch,
        dp=dp,
        micro=micro,
        accum=accum,
        log=log,
        named=wording.named,
    )
    if until_step is not None and shape.schedule is None:
        raise ArgumentError(wording.until_step_without_shape)
    if isinstance(until_step, int) and not isinstance(until_step, bool) and until_step < 0:
        raise OutOfRangeError(f"{wording.named('until_step')} {until_step}: expected a step >= 0")
    return shape


def verify_stores(
    paths: Sequence[str],
    quick: bool = False,
    *,
    blocks: int | None = None,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: ProgressCallback | None = None,
    wording: Wording,
) -> list[StoreReport]:
    """Verify stores, the options checked first.

    ``verify`` and ``tokentape verify`` both run here. The arguments are ``verify``'s, but
    ``paths``, a sequence of paths as given, and ``progress``, called with a ``Progress`` of
    the bytes and tokens checked; the options are checked by ``verify_paths``
    (``check_options``), ``wording`` naming the one refused.

    Returns:
        One report per store, in the order named.

    Raises:
        ArgumentError: An option of the wrong type or value.
        TokentapeError: A path is not a store or plan, or a manifest cannot be read at all.
    """
    options = check_storage_options(storage_options or {}, wording.named("storage_options"))
    return verify_paths(
        list(paths),
        quick,
        blocks,
        vocab_size,
        eod_id,
        progress,
        named=wording.named,
        storage_options=options,
    )


# --- the public functions -------------------------------------------------------------------


def tokenize(
    inputs: PathArg | Sequence[PathArg],
    out: PathArg,
    *,
    tokenizer: str = "bytes",
    eod_token: str | None = None,
    text_key: str = "text",
    id_key: str = "auto",
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
    on_bad_record: str = "fail",
    max_bad_fraction: float = 0.01,
    bos: bool | None = None,
    bos_token: str | None = None,
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
        id_key: The field holding each record's own id (dotted for a nested one:
            ``"meta.url"``), recorded with the document it became (``Source.provenance``);
            ``"auto"``: the first of ``id``, ``doc_id``, ``url`` in each input's first
            record; ``"none"``: no ids (the input and record are recorded still).
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
        on_bad_record: ``"fail"`` (a record that is not JSON, not valid UTF-8, or whose text
            is missing, null or not a string stops the job, naming it) or ``"skip"`` (each is
            counted, per input and reason, with the first locations, in the manifest and the
            summary's ``bad_records``, and skipped; the store is byte-identical for any
            ``workers``).
        max_bad_fraction: With ``"skip"``: refuse the job at the end, writing no store, when
            more than this fraction of the records were bad.
        bos: Put a beginning-of-document (BOS) token before every document: ``True``,
            ``False``, or ``None`` (default): as the tokenizer does when called on a text
            (``add_bos_token`` of its ``tokenizer_config.json``, else its post-processor).
            Only a Hugging Face tokenizer has one; the manifest records it.
        bos_token: The BOS token to use (implies ``bos=True``).

    Returns:
        The summary: counts, dropped documents per filter, content hash, status.

    Raises:
        InputError: Bad input: an argument, a missing file, bad JSON, an unknown tokenizer or
            filter (the message names the file, line or field).
        OutputError: ``out`` is not a tokentape directory, holds another job's store (without
            ``overwrite``), cannot be written, or another writer holds it.
    """
    config = tokenize_config(
        inputs,
        out,
        tokenizer=tokenizer,
        eod_token=eod_token,
        text_key=text_key,
        id_key=id_key,
        filters=filters,
        workers=workers,
        executor=executor,
        ray_address=ray_address,
        dtype=dtype,
        shard_mb=shard_mb,
        unit_mb=unit_mb,
        overwrite=overwrite,
        storage_options=storage_options,
        work_dir=work_dir,
        on_bad_record=on_bad_record,
        max_bad_fraction=max_bad_fraction,
        bos=bos,
        bos_token=bos_token,
        wording=PYTHON,
    )
    check_callback(progress)
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
    """A ``Plan``, or the plan at a path."""
    if isinstance(plan, Plan):
        return plan
    check_path("plan", plan)
    return load_plan(plan)


def _step_log(step_log: PathArg | None) -> str | None:
    if step_log is None:
        return None
    check_path("step_log", step_log)
    return os.fspath(step_log)


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
        ArgumentError: No or conflicting batch shapes, or a step that is not an integer.
        OutOfRangeError: A negative step, or one beyond the step log, the run or the tape.
        PlanError: The plan, or a step log written for another plan or damaged.
        StoreError: A store is damaged or no longer the plan's (``StoreChanged``).
    """
    resolved = _plan(plan)
    log = _step_log(step_log)
    schedule, _ = replay_shape(
        resolved,
        step,
        global_batch=global_batch,
        dp=dp,
        micro=micro,
        accum=accum,
        log=log,
        wording=PYTHON,
    )
    return _replay(resolved, step, schedule)


def locate(
    plan: Plan | PathArg,
    source: str | None = None,
    doc: int | None = None,
    *,
    id: str | None = None,
    input: str | None = None,
    record: int | None = None,
    global_batch: int | None = None,
    dp: int | None = None,
    micro: int | None = None,
    accum: int | None = None,
    step_log: PathArg | None = None,
    until_step: int | None = None,
) -> Located:
    """Every position (and step, rank) at which a document is trained on (``tokentape locate``).

    Closed form, no scan. Without a batch shape only positions are found. Name the document
    by ``source`` and ``doc``, or by the user's handle: ``id``, or ``input`` and ``record``
    (searched in ``source``, or in every source of the plan; see ``find_documents``).

    Args:
        plan: The plan (a ``Plan`` or the path of its ``PLAN.json``).
        source: The source's name in the plan.
        doc: The document's id in that source.
        id: The id of the document's record (the field tokenize's ``id_key`` read).
        input: The input the document was read from (with ``record``): its path as
            tokenize named it, the same local file, or the end of its path.
        record: The record in ``input``: a jsonl line (from 1), a parquet row (from 0), 0
            for a ``.txt`` file.
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
        InputError: An unknown source; a handle that names no document, or several (the
            message lists them).
        OutOfRangeError: A document out of range.
        PlanError: The plan, or a step log written for another plan or damaged.
        StoreError: A store is damaged or no longer the plan's (``StoreChanged``).
    """
    resolved = _plan(plan)
    log = _step_log(step_log)
    shape = locate_shape(
        resolved,
        global_batch=global_batch,
        dp=dp,
        micro=micro,
        accum=accum,
        log=log,
        until_step=until_step,
        wording=PYTHON,
    )
    source, doc = named_document(resolved, source, doc, id, input, record, PYTHON)
    return _locate(resolved, source, doc, shape.schedule, until_step)


def named_document(
    plan: Plan,
    source: str | None,
    doc: int | None,
    id: str | None,
    input: str | None,
    record: int | None,
    wording: Wording,
) -> tuple[str, int]:
    """The document that ``locate``'s arguments name.

    ``locate`` and ``tokentape locate`` both read their document here: ``source`` and ``doc``,
    or a handle (``id``, or ``input`` and ``record``) searched in ``source`` or in every source
    of the plan; ``wording`` names the arguments refused.

    Returns:
        The document's source (its name in the plan) and id there.

    Raises:
        ArgumentError: No document named, or two ways of naming it at once.
        InputError: A handle naming no document, or several (listed).
        StoreError: No source searched records provenance.
    """
    n = wording.named
    if id is not None and not isinstance(id, str):
        raise ArgumentError(f"{n('id')} must be a string, got {shown(id)}")
    if input is not None and not isinstance(input, str):
        raise ArgumentError(f"{n('input')} must be a path (text), got {shown(input)}")
    if record is not None:
        as_index(n("record"), record)
    if id is None and input is None and record is None:
        if source is not None and doc is None:
            raise ArgumentError(
                f"{n('doc')} must be an integer (a document id of {shown(source)}), or name the "
                f"document by {n('id')}, or {n('input')} and {n('record')}"
            )
        if source is None or doc is None:
            raise ArgumentError(
                f"name a document: {n('source')} and {n('doc')}, {n('id')}, or {n('input')} "
                f"and {n('record')}"
            )
        return source, doc
    if doc is not None:
        raise ArgumentError(
            f"give {n('doc')} or a handle ({n('id')}, or {n('input')} and {n('record')}), not both"
        )
    if id is not None and (input is not None or record is not None):
        raise ArgumentError(f"give {n('id')} or {n('input')} and {n('record')}, not both")
    if id is None and (input is None or record is None):
        raise ArgumentError(f"{n('input')} and {n('record')} go together")
    found = one_document(plan, Handle(id, input, record), source)
    return found.source, found.doc


def excise(
    plan: Plan | PathArg,
    from_consumed: int,
    *,
    docs: Sequence[tuple[str, int]] = (),
    ids: Sequence[str] = (),
    steps: tuple[int, int] | None = None,
    step_log: PathArg | None = None,
) -> Plan:
    """A plan leaving documents, or logged steps' samples, out of a run (``tokentape excise``).

    The new plan gives the same sample at every position below ``from_consumed``; from it on,
    it is this plan's sequence without every sample holding a token of ``docs`` or of the
    documents with ``ids``, and without the samples steps ``steps`` drew (read from the run's
    ``step_log``), the rest in order. Save it (``Plan.save``) and resume the run on it from a
    checkpoint at ``consumed`` no later than its first excised position; see ``Plan.excise``.

    Args:
        plan: The run's plan (a ``Plan`` or the path of its ``PLAN.json``).
        from_consumed: The ``consumed`` of the checkpoint the run goes on from.
        docs: Documents to leave out, as (source name, document id).
        ids: Documents to leave out by their record's id (every match in every source).
        steps: Logged steps (first, last) whose samples to leave out.
        step_log: The run's step log (``steps.jsonl``): needed with ``steps``.

    Returns:
        The new plan; ``excisions[-1]`` records what it left out, per source.

    Raises:
        ArgumentError: Arguments of the wrong type, ``steps`` without ``step_log``.
        InputError: An unknown source or id.
        OutOfRangeError: A document out of range; steps outside the log, or before
            ``from_consumed``.
        PlanError: Nothing to leave out, too many samples, a step log of another plan.
        StoreError: A store that changed since the plan was made.
    """
    resolved = _plan(plan)
    check_int("from_consumed", from_consumed, 0)  # before comparing the steps' start with it
    positions = np.zeros(0, dtype=np.int64)
    if steps is not None:
        if step_log is None:
            raise ArgumentError("steps need the run's step_log (the steps' positions)")
        if not (isinstance(steps, tuple) and len(steps) == 2):
            raise ArgumentError(f"steps must be (first, last), got {shown(steps)}")
        first, last = (as_index("steps", x) for x in steps)
        if last < first:
            raise ArgumentError(f"steps ({first}, {last}): the last is before the first")
        schedule = log_schedule(str(_step_log(step_log)), resolved)
        start, _ = schedule.start(first)
        end, config = schedule.start(last)
        positions = np.arange(start, end + config.global_batch, dtype=np.int64)
        if start < from_consumed:
            raise OutOfRangeError(
                f"steps {first}..{last} start at position {start:,}, before from_consumed "
                f"{from_consumed:,}: excise from a checkpoint at or before step {first}"
            )
    elif step_log is not None:
        raise ArgumentError("step_log goes with steps")
    return resolved.excise(from_consumed, docs=docs, ids=ids, positions=positions, steps=steps)


def find_documents(
    plan: Plan | PathArg,
    *,
    id: str | None = None,
    input: str | None = None,
    record: int | None = None,
    source: str | None = None,
) -> list[DocOrigin]:
    """The documents a user's handle names (``tokentape locate --id`` / ``--input --record``).

    Searched through the provenance each store recorded at tokenize (a binary search per
    shard, whatever the store's size); sources that record none are passed over.

    Args:
        plan: The plan (a ``Plan`` or the path of its ``PLAN.json``).
        id: The id of the record (the field tokenize's ``id_key`` read).
        input: The input the document was read from (with ``record``).
        record: The record in ``input``: a jsonl line (from 1), a parquet row (from 0), 0 for
            a ``.txt`` file.
        source: Search this source only (default: every source of the plan).

    Returns:
        Each document found: ``source``, ``doc`` and its ``origin``; [] when none.

    Raises:
        ArgumentError: Neither or both of ``id`` and ``input``/``record``.
        InputError: An input no searched source read, or one matching several inputs.
        StoreError: No searched source records provenance.
    """
    return _find_documents(_plan(plan), Handle(id, input, record), source)


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
    return verify_stores(
        _paths("paths", paths),
        quick,
        blocks=blocks,
        vocab_size=vocab_size,
        eod_id=eod_id,
        storage_options=storage_options,
        wording=PYTHON,
    )


def report_config(
    spike_window: int, spike_z: float, top: int, named: Callable[[str], str] = as_parameter
) -> ReportConfig:
    """``report``'s settings, checked; ``named`` spells a parameter (the command line: a flag)."""
    check_int(named("spike_window"), spike_window, 5, MAX_SPIKE_WINDOW)
    if spike_window % 2 == 0:
        raise ArgumentError(f"{named('spike_window')} must be odd, got {spike_window}")
    check_number(named("spike_z"), spike_z, 0.0, positive=True)
    check_int(named("top"), top, 1, 1000)
    return ReportConfig(spike_window, float(spike_z), top)


def report(
    step_log: PathArg,
    plan: Plan | PathArg,
    *,
    loss_log: PathArg | None = None,
    spike_window: int = SPIKE_WINDOW,
    spike_z: float = SPIKE_Z,
    top: int = TOP_DOCS,
) -> dict[str, Any]:
    """The data of a run's report (``tokentape report``; ``--json`` prints this dict).

    Sections: ``identity`` (the plan: index hash, sources and their content hashes, phases,
    excisions), ``run`` (steps, samples, resumes), ``timeline`` (batch shapes, resumes, plan
    changes, phase starts, excisions, by step), ``mixture`` (planned against realised share
    per source over the run and per phase, samples and tokens per source), ``repetition``
    (passes per source so far and at the horizon against ``max_repeats``; the documents
    trained most, with their provenance), ``loss`` (None without ``loss_log``: the loss
    overall and per source, spikes flagged by a robust z-score with their top documents as
    ``replay`` gives them), ``commands`` and ``rules`` (how series are downsampled and spikes
    flagged). Computed in closed form from the plan and one pass over each log.

    Args:
        step_log: The run's step log, or a run directory holding ``steps.jsonl``.
        plan: The plan the run ended under (a ``Plan`` or its ``PLAN.json``): it answers for
            every step of the log.
        loss_log: The trainer's loss log (one JSON line a step: ``step``, ``loss``, and
            optionally ``loss_by_source`` and ``tokens_by_source``; docs/train.md).
        spike_window: Logged steps in the centred window of the robust z-score (odd, 5..1001).
        spike_z: A step is flagged when its robust z-score is at least this (> 0).
        top: How many of the most trained documents to list (1..1000).

    Returns:
        The report as a JSON-ready dict (non-finite numbers are None).

    Raises:
        ArgumentError: Arguments of the wrong type or out of range.
        InputError: A loss log that is not one (its file, line and field named).
        PlanError: A step log that is not one, or of another plan.
        StoreError: A store that changed since the plan was made.
    """
    config = report_config(spike_window, spike_z, top)
    resolved = _plan(plan)
    check_path("step_log", step_log)
    log = step_log_url(os.fspath(step_log)) if is_url(step_log) else step_log_path(step_log)
    if loss_log is not None:
        check_path("loss_log", loss_log)
    plan_path = os.fspath(plan) if not isinstance(plan, Plan) else "PLAN.json"
    loss = None if loss_log is None else os.fspath(loss_log)
    return run_report(resolved, plan_path, str(log), loss, config)

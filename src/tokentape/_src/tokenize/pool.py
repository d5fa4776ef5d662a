"""Run units of work on ``workers`` processes: this one plus ``workers - 1`` spawned helpers.

Every process claims the next unfinished unit from a shared counter, in order, until none is
left, so the calling process starts at once while the helpers are still starting up, and no
unit is handed out twice. A unit's output depends only on the unit, never on who made it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.sharedctypes import Synchronized
from typing import Any

from tokentape._src.store.tokenizers import Tokenizer, load_tokenizer
from tokentape._src.tokenize import streams
from tokentape._src.tokenize.filters import FilterSet, parse_filters
from tokentape._src.tokenize.inputs import Unit
from tokentape._src.tokenize.worker import WorkerSettings, tokenize_unit
from tokentape._src.util.faults import CRASH_ENV, crashpoint
from tokentape._src.util.progress import Counters
from tokentape.errors import TokentapeError

HELPER_CRASH = "helper-unit"  # test hook: a helper SIGKILLs itself when it claims a unit
SINGLE_THREAD_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}


class WorkerDied(Exception):
    """Units were left unfinished because the process or task tokenizing them died (killed, out
    of memory, node lost); the units that finished are kept. The message says what died."""


@dataclass(frozen=True)
class PoolJob:
    """What a helper process (or Ray task) needs to rebuild the job's tokenizer, filters and
    settings."""

    tokenizer_spec: str
    eod_token: str | None
    filter_specs: tuple[str, ...]
    settings: WorkerSettings
    units: tuple[Unit, ...]


@contextmanager
def single_threaded_tokenizers() -> Iterator[None]:
    """Tokenizer libraries on the calling thread only, for the duration (env restored after)."""
    saved = {k: os.environ.get(k) for k in SINGLE_THREAD_ENV}
    os.environ.update(SINGLE_THREAD_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _drain(
    job: PoolJob,
    tokenizer: Tokenizer,
    filters: FilterSet,
    next_unit: Synchronized,
    abort: Synchronized,
    counters: Counters,
    helper: bool,
) -> None:
    """Claim and tokenize units until none is left or another process failed."""
    if not helper and os.environ.get(CRASH_ENV) == HELPER_CRASH:
        _let_a_helper_claim_first(next_unit)
    while not abort.value:
        with next_unit.get_lock():
            i = next_unit.value
            next_unit.value += 1
        if i >= len(job.units):
            return
        unit = job.units[i]
        if helper:
            crashpoint(HELPER_CRASH)
        tokenize_unit(unit, tokenizer, filters, job.settings, counters)
        if not helper:
            crashpoint("after-unit")


def _let_a_helper_claim_first(next_unit: Synchronized, timeout: float = 60.0) -> None:
    """Test hook for ``HELPER_CRASH``: hold the calling process back until a helper has
    claimed a unit, so that the helper dies holding one whatever the timing."""
    deadline = time.monotonic() + timeout
    while next_unit.value == 0 and time.monotonic() < deadline:
        time.sleep(0.01)


PR_SET_PDEATHSIG = 1
"""Linux ``prctl`` option: the signal this process gets when its parent dies."""


def _exit_when_orphaned(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def _die_with_parent(parent: int) -> None:
    """End this helper as soon as the run that started it dies (``kill -9``, out of memory), so
    that it never writes into a work directory that a rerun has meanwhile taken over (a rerun
    with other settings clears it and starts again). On Linux the kernel kills it at once
    (``PR_SET_PDEATHSIG``); elsewhere a thread checks twice a second."""
    if sys.platform.startswith("linux"):
        with suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the above took effect
        os._exit(1)
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()


def _helper_main(
    job: PoolJob,
    next_unit: Synchronized,
    abort: Synchronized,
    counters: Counters,
    errors: Any,
    parent: int,
) -> None:
    _die_with_parent(parent)
    os.environ.update(SINGLE_THREAD_ENV)
    try:
        tokenizer = load_tokenizer(job.tokenizer_spec, job.eod_token)
        filters = parse_filters(job.filter_specs)
        _drain(job, tokenizer, filters, next_unit, abort, counters, helper=True)
    except TokentapeError as exc:
        abort.value = 1
        errors.put(exc)  # our own exception, pickled: its subtype comes back


def run_units(
    job: PoolJob, tokenizer: Tokenizer, filters: FilterSet, workers: int, counters: Counters
) -> list[int]:
    """Tokenize the units of ``job`` on ``workers`` processes (this one included).

    Raises the first ``TokentapeError`` any process met. Returns the exit codes of helpers that
    died; a unit such a helper had claimed is left unfinished (its marker file is missing).
    """
    ctx = get_context("spawn")
    next_unit = ctx.Value("q", 0)
    abort = ctx.Value("b", 0)
    errors = ctx.SimpleQueue()
    n_helpers = min(workers, len(job.units)) - 1
    helpers = [
        ctx.Process(
            target=_helper_main,
            args=(job, next_unit, abort, counters, errors, os.getpid()),
            daemon=True,
        )
        for _ in range(n_helpers)
    ]
    for p in helpers:
        p.start()
    try:
        with single_threaded_tokenizers():
            _drain(job, tokenizer, filters, next_unit, abort, counters, helper=False)
    except BaseException:
        abort.value = 1
        raise
    finally:
        streams.forget()  # this process's streams of the job's files: closed with the job
        for p in helpers:
            p.join()
    if not errors.empty():
        raise errors.get()
    return [code for p in helpers if (code := p.exitcode)]  # joined: every exit code is set

"""Run units of work on ``workers`` processes: this one plus ``workers - 1`` spawned helpers.

The helpers are started before the job is planned (``Pool``), so that their start-up (a fresh
interpreter, imports, the tokenizer) overlaps the calling process's own. Every process claims
the next unfinished unit from a shared counter, in order, until none is left, so the calling
process starts at once while late helpers are still starting up, and no unit is handed out
twice. A unit's output depends only on the unit, never on who made it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized

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
    units: Sequence[Unit],
    settings: WorkerSettings,
    tokenizer: Tokenizer,
    filters: FilterSet,
    shared: _Shared,
    helper: bool,
) -> None:
    """Claim and tokenize units until none is left or another process failed."""
    if not helper and os.environ.get(CRASH_ENV) == HELPER_CRASH:
        _let_a_helper_claim_first(shared.next_unit)
    while not shared.abort.value:
        with shared.next_unit.get_lock():
            i = shared.next_unit.value
            shared.next_unit.value += 1
        if i >= len(units):
            return
        if helper:
            crashpoint(HELPER_CRASH)
        tokenize_unit(units[i], tokenizer, filters, settings, shared.counters)
        if not helper:
            crashpoint("after-unit")


def _let_a_helper_claim_first(next_unit: Synchronized[int], timeout: float = 60.0) -> None:
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
    tokenizer_spec: str,
    eod_token: str | None,
    filter_specs: tuple[str, ...],
    conn: Connection,
    shared: _Shared,
    parent: int,
) -> None:
    """A helper: load the tokenizer and filters at once, then wait on ``conn`` for the units
    (or None: nothing to do) and drain them; an error goes back on ``conn``."""
    _die_with_parent(parent)
    os.environ.update(SINGLE_THREAD_ENV)
    try:
        tokenizer = load_tokenizer(tokenizer_spec, eod_token)
        filters = parse_filters(filter_specs)
        work = conn.recv()
        if work is not None:
            units, settings = work
            _drain(units, settings, tokenizer, filters, shared, helper=True)
    except TokentapeError as exc:
        shared.abort.value = 1
        conn.send(exc)  # our own exception, pickled: its subtype comes back


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while a helper is started, so that it ignores it all its life: a Ctrl-C
    (sent to the whole process group) reaches the run, which stops its helpers and prints the
    one line, instead of each helper printing a traceback, even one still importing."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; a helper started here keeps them
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass(frozen=True)
class _Shared:
    """What the processes of one pool share: the next unit to claim, the abort flag and the
    progress counters. A helper touches them only once handed work."""

    next_unit: Synchronized[int]
    abort: Synchronized[int]
    counters: Counters


@dataclass
class _Helper:
    process: BaseProcess
    conn: Connection
    told: bool = False

    def finish(self) -> TokentapeError | None:
        """Wait for the helper to exit; the error it sent back, if any."""
        error = None
        listening = True
        while True:
            ready = wait([self.process.sentinel, *([self.conn] if listening else [])])
            if self.conn in ready:  # read before the exit: a helper never blocks on sending
                try:
                    error = self.conn.recv()
                except (EOFError, OSError):
                    listening = False
            elif self.process.sentinel in ready:
                break
        self.process.join()
        self.conn.close()
        return error


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Pool:
    """``workers - 1`` helper processes for one job, started before the job is planned.

    A spawned helper takes about half a second to import tokentape and load the tokenizer;
    started first, it does that while the calling process loads its own tokenizer, lists and
    cuts the inputs and looks at the output, instead of after. A helper writes nothing before
    ``run`` hands it the units. Helpers are started at once only up to the CPUs this process
    may use (the units needing more are started by ``run``); those ``run`` does not need, and
    all of them if it is never called, are killed by ``close``, having done nothing. Nothing a
    helper shares with the others is touched before it is handed work, so killing one then
    leaves no lock held.
    """

    def __init__(
        self,
        tokenizer_spec: str,
        eod_token: str | None,
        filter_specs: tuple[str, ...],
        workers: int,
    ) -> None:
        self._ctx = get_context("spawn")
        self._spec = (tokenizer_spec, eod_token, filter_specs)
        self._workers = workers
        self.shared = _Shared(self._ctx.Value("q", 0), self._ctx.Value("b", 0), Counters(self._ctx))
        self._helpers: list[_Helper] = []
        self.started = 0
        """Helper processes started so far."""
        self._start(min(workers, usable_cpus()) - 1)

    @property
    def counters(self) -> Counters:
        return self.shared.counters

    def _start(self, n: int) -> None:
        for _ in range(n):
            ours, theirs = self._ctx.Pipe()
            process = self._ctx.Process(
                target=_helper_main,
                args=(*self._spec, theirs, self.shared, os.getpid()),
                daemon=True,
            )
            with _sigint_ignored():  # the helper inherits it from its first instruction
                process.start()
            theirs.close()
            self._helpers.append(_Helper(process, ours))
            self.started += 1

    def run(
        self,
        units: Sequence[Unit],
        settings: WorkerSettings,
        tokenizer: Tokenizer,
        filters: FilterSet,
    ) -> list[int]:
        """Tokenize ``units`` on this process and ``min(workers, len(units)) - 1`` helpers.

        Raises the first ``TokentapeError`` any process met. Returns the exit codes of helpers
        that died; a unit such a helper had claimed is left unfinished (its marker file is
        missing). Call once.
        """
        need = max(0, min(self._workers, len(units)) - 1)
        self._start(need - len(self._helpers))
        self.close(keep=need)
        working = list(self._helpers)
        for h in working:
            with suppress(OSError):  # a helper that died meanwhile: its exit code tells
                h.conn.send((tuple(units), settings))
            h.told = True
        errors: list[TokentapeError] = []
        try:
            with single_threaded_tokenizers():
                _drain(units, settings, tokenizer, filters, self.shared, helper=False)
        except BaseException:
            self.shared.abort.value = 1
            raise
        finally:
            streams.forget()  # this process's streams of the job's files: closed with the job
            errors = [e for h in working if (e := h.finish()) is not None]
            del self._helpers[:]
        if errors:
            raise errors[0]
        # joined: every exit code is set
        return [code for h in working if (code := h.process.exitcode)]

    def close(self, keep: int = 0, everyone: bool = False) -> None:
        """Kill the helpers from the ``keep``-th on, which were never handed work (``everyone``:
        those at work too: the run stops, its finished units kept for a resume)."""
        if everyone:
            self.shared.abort.value = 1
        for h in self._helpers[keep:]:
            if everyone or not h.told:
                h.process.kill()
        for h in self._helpers[keep:]:
            h.finish()
        del self._helpers[keep:]

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close(everyone=kind is not None)  # Ctrl-C, an error: no helper works on


__all__ = [
    "SINGLE_THREAD_ENV",
    "Pool",
    "PoolJob",
    "WorkerDied",
    "single_threaded_tokenizers",
    "usable_cpus",
]

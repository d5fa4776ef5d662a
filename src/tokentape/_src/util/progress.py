"""Progress of long jobs as data: counters shared with worker processes, ``Progress`` reports
and the callbacks that receive them. Drawing is the command line's business (``cli/progress``)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tokentape.errors import ArgumentError

# Slots of the shared counter array.
DOCS, TOKENS, TEXT_BYTES, INPUT_BYTES = range(4)


class Counters:
    """Four int64 counters in shared memory: documents, tokens, text bytes, input bytes done."""

    def __init__(self, ctx: mp.context.BaseContext | None = None) -> None:
        self.values = (ctx or mp.get_context("spawn")).Array("q", 4)

    def add(
        self, docs: int = 0, tokens: int = 0, text_bytes: int = 0, input_bytes: int = 0
    ) -> None:
        with self.values.get_lock():
            self.values[DOCS] += docs
            self.values[TOKENS] += tokens
            self.values[TEXT_BYTES] += text_bytes
            self.values[INPUT_BYTES] += input_bytes

    def snapshot(self) -> tuple[int, int, int, int]:
        with self.values.get_lock():
            return tuple(self.values[:])


@dataclass(frozen=True)
class Progress:
    """How far a long job is: what a progress callback receives (the library draws nothing)."""

    label: str
    """What is running: ``tokenize``, ``convert``, ``verify``, ``hashing NAME``."""
    done_bytes: int
    """Input bytes done so far (in this run: an interrupted run's reused work excluded)."""
    total_bytes: int
    """Input bytes this run has to do."""
    elapsed: float
    """Seconds since the job started."""
    docs: int = 0
    """Documents done (tokenize only)."""
    tokens: int = 0
    """Tokens done (tokenize and verify)."""
    text_bytes: int = 0
    """Text bytes done (tokenize only)."""
    final: bool = False
    """True on the last call, once the work is over."""


ProgressCallback = Callable[[Progress], None]
"""Called from time to time while a long job runs (at most every ``INTERVAL`` seconds, from the
job's thread or, for tokenize, a monitor thread), and once more with ``final=True`` at the end.
An exception it raises ends the reports and is raised by the job once its work stops."""


def check_callback(callback: object) -> None:
    """Refuse a progress callback that cannot be called, before any work is done."""
    if callback is not None and not callable(callback):
        raise ArgumentError(f"progress must be a callable taking a Progress, got {callback!r}")


INTERVAL = 0.5


@contextlib.contextmanager
def watch(
    counters: Counters,
    total_bytes: int,
    label: str,
    callback: ProgressCallback | None,
    interval: float = INTERVAL,
) -> Iterator[None]:
    """Report ``counters`` to ``callback`` every ``interval`` seconds from a monitor thread
    while the block runs (worker processes update the counters), then once with ``final``."""
    check_callback(callback)
    if callback is None:
        yield
        return
    baseline = counters.snapshot()
    failed: list[BaseException] = []
    start = time.monotonic()
    stop = threading.Event()

    def report(final: bool) -> None:
        docs, tokens, text_bytes, done = (
            a - b for a, b in zip(counters.snapshot(), baseline, strict=True)
        )
        todo = total_bytes - baseline[INPUT_BYTES]
        elapsed = time.monotonic() - start
        callback(Progress(label, done, todo, elapsed, docs, tokens, text_bytes, final))

    def run() -> None:
        while not stop.wait(interval):
            try:
                report(False)
            except BaseException as exc:
                failed.append(exc)
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    if failed:
        raise failed[0]
    report(True)


class Tally:
    """Bytes (and tokens) done by the calling thread, passed on to a callback at most every
    ``interval`` seconds, and once more by ``close``."""

    def __init__(
        self, total_bytes: int, label: str, callback: ProgressCallback, interval: float = INTERVAL
    ) -> None:
        self.total_bytes, self.label, self.callback = total_bytes, label, callback
        self.interval = interval
        self.done_bytes = self.tokens = 0
        self.start = self.last = time.monotonic()

    def add(self, n_bytes: int, n_tokens: int = 0) -> None:
        """Count work just done; reports when ``interval`` has passed since the last report."""
        self.done_bytes += n_bytes
        self.tokens += n_tokens
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self._report(False)

    def close(self) -> None:
        """The final report."""
        self._report(True)

    def _report(self, final: bool) -> None:
        elapsed = time.monotonic() - self.start
        done, total = self.done_bytes, self.total_bytes
        self.callback(Progress(self.label, done, total, elapsed, tokens=self.tokens, final=final))


@contextlib.contextmanager
def tally(
    total_bytes: int, label: str, callback: ProgressCallback | None
) -> Iterator[Tally | None]:
    """A ``Tally`` reporting to ``callback`` (closed at the end), or None without a callback."""
    check_callback(callback)
    if callback is None:
        yield None
        return
    counting = Tally(total_bytes, label, callback)
    try:
        yield counting
    finally:
        counting.close()


__all__ = ["Counters", "Progress", "ProgressCallback", "Tally", "check_callback", "tally", "watch"]

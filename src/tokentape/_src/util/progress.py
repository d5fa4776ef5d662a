"""Live counters shared with worker processes, and a terminal progress bar that reads them."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TextIO

# Slots of the shared counter array.
DOCS, TOKENS, TEXT_BYTES, INPUT_BYTES = range(4)


class Counters:
    """Four int64 counters in shared memory: documents, tokens, text bytes, input bytes done."""

    def __init__(self, ctx: mp.context.BaseContext | None = None) -> None:
        self.values = (ctx or mp.get_context("spawn")).Array("q", 4)

    def add(self, docs: int = 0, tokens: int = 0, text_bytes: int = 0, input_bytes: int = 0):
        with self.values.get_lock():
            self.values[DOCS] += docs
            self.values[TOKENS] += tokens
            self.values[TEXT_BYTES] += text_bytes
            self.values[INPUT_BYTES] += input_bytes

    def snapshot(self) -> tuple[int, int, int, int]:
        with self.values.get_lock():
            return tuple(self.values[:])


def _human(n: float, unit: str = "") -> str:
    for suffix in ("", "k", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.1f}{suffix}{unit}" if suffix else f"{n:.0f}{unit}"
        n /= 1000
    return f"{n:.1f}P{unit}"


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@dataclass
class ProgressBar:
    """Redraws one stderr line every ``interval`` seconds from ``counters``, on a terminal only."""

    counters: Counters
    total_input_bytes: int
    label: str = "tokenize"
    interval: float = 0.5
    stream: TextIO | None = sys.stderr
    baseline: tuple[int, int, int, int] = (0, 0, 0, 0)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.monotonic()

    @property
    def enabled(self) -> bool:
        return self.stream is not None and self.stream.isatty()

    def __enter__(self) -> ProgressBar:
        self._start = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None and self.stream is not None:
            self._thread.join()
            self.stream.write("\r" + self.line() + "\n")
            self.stream.flush()

    def _run(self) -> None:
        assert self.stream is not None
        while not self._stop.wait(self.interval):
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.stream.flush()

    def line(self) -> str:
        docs, tokens, text_bytes, done = (
            a - b for a, b in zip(self.counters.snapshot(), self.baseline, strict=True)
        )
        elapsed = max(time.monotonic() - self._start, 1e-9)
        todo = max(self.total_input_bytes - self.baseline[INPUT_BYTES], 1)
        frac = min(done / todo, 1.0)
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        eta = _clock(elapsed * (1 - frac) / frac) if frac > 0 else "?:??:??"
        return (
            f"{self.label} [{bar}] {frac:6.1%}  {_human(docs / elapsed)} docs/s  "
            f"{_human(tokens / elapsed)} tok/s  {text_bytes / elapsed / 1e6:.1f} MB/s  "
            f"elapsed {_clock(elapsed)}  ETA {eta}"
        )


class BytesBar(ProgressBar):
    """The progress bar of a long read (hashing, converting): bytes done, rate and ETA."""

    def line(self) -> str:
        done = self.counters.snapshot()[INPUT_BYTES] - self.baseline[INPUT_BYTES]
        elapsed = max(time.monotonic() - self._start, 1e-9)
        frac = min(done / max(self.total_input_bytes, 1), 1.0)
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        eta = _clock(elapsed * (1 - frac) / frac) if frac > 0 else "?:??:??"
        return (
            f"{self.label} [{bar}] {frac:6.1%}  {_human(done / elapsed, 'B')}/s  "
            f"elapsed {_clock(elapsed)}  ETA {eta}"
        )


@contextlib.contextmanager
def bytes_progress(
    total: int, label: str, stream: TextIO | None = sys.stderr
) -> Iterator[Callable[[int], None] | None]:
    """A ``BytesBar`` on ``stream`` when it is a terminal: yields a callback taking the bytes
    just done, or None (no terminal, nothing to draw)."""
    if stream is None or not stream.isatty():
        yield None
        return
    counters = Counters()
    with BytesBar(counters, total, label=label, stream=stream):
        yield lambda n_bytes: counters.add(input_bytes=n_bytes)

"""The progress bar the command line draws on a terminal from the library's ``Progress``."""

from __future__ import annotations

import sys
from typing import TextIO

from tokentape._src.util.progress import Progress

WIDTH = 24


def _human(n: float, unit: str = "") -> str:
    for suffix in ("", "k", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.1f}{suffix}{unit}" if suffix else f"{n:.0f}{unit}"
        n /= 1000
    return f"{n:.1f}P{unit}"


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def bar_line(p: Progress) -> str:
    """One line: label, bar, share done, rates, elapsed time and ETA."""
    elapsed = max(p.elapsed, 1e-9)
    frac = min(p.done_bytes / max(p.total_bytes, 1), 1.0)
    filled = int(frac * WIDTH)
    bar = "#" * filled + "-" * (WIDTH - filled)
    eta = _clock(elapsed * (1 - frac) / frac) if frac > 0 else "?:??:??"
    if p.docs or p.text_bytes:  # tokenize: documents, tokens and text per second
        rates = (
            f"{_human(p.docs / elapsed)} docs/s  {_human(p.tokens / elapsed)} tok/s  "
            f"{p.text_bytes / elapsed / 1e6:.1f} MB/s"
        )
    elif p.tokens:  # verify: bytes and tokens per second
        rates = f"{_human(p.done_bytes / elapsed, 'B')}/s  {p.tokens / elapsed / 1e6:.1f}M tok/s"
    else:
        rates = f"{_human(p.done_bytes / elapsed, 'B')}/s"
    return f"{p.label} [{bar}] {frac:6.1%}  {rates}  elapsed {_clock(elapsed)}  ETA {eta}"


class TerminalBar:
    """A progress callback that redraws one line on ``stream`` (a terminal), ending it with a
    newline on the final report."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __call__(self, p: Progress) -> None:
        end = "\n" if p.final else "\x1b[K"
        self.stream.write("\r" + bar_line(p) + end)
        self.stream.flush()


def terminal_bar(quiet: bool = False, stream: TextIO | None = None) -> TerminalBar | None:
    """The bar for stderr when it is a terminal and the command is not ``quiet`` (``--json``),
    else None (nothing is drawn)."""
    stream = sys.stderr if stream is None else stream
    if quiet or not stream.isatty():
        return None
    return TerminalBar(stream)

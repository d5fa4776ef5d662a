"""How the command line shows the library's ``Progress``: a bar redrawn on a terminal, or,
where there is none (Slurm, ``nohup``, ``| tee``), one plain line every so often.

``--progress {auto,bar,lines,none}`` (or ``TOKENTAPE_PROGRESS``) chooses; ``auto`` (the
default) draws the bar on a terminal and writes lines elsewhere, every
``TOKENTAPE_PROGRESS_SECONDS`` (default 15) of the job's own clock. A job shorter than that
writes no line at all: a script's short command stays quiet. ``--json`` quiets ``auto``
(a chosen mode still writes, on stderr).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
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


MODES = ("auto", "bar", "lines", "none")
DEFAULT_SECONDS = 15.0


class ProgressLines:
    """A progress callback that writes one plain line (no carriage return, no escape) every
    ``seconds`` of the job's elapsed time, and the last one when the job ends, if it wrote
    any before (``seconds`` 0: every report, the last one always)."""

    def __init__(self, stream: TextIO, seconds: float) -> None:
        self.stream, self.seconds = stream, seconds
        self.due = seconds
        self.written = 0
        self.label: str | None = None

    def __call__(self, p: Progress) -> None:
        if p.label != self.label:  # a command's next job (``plan`` hashing another store)
            self.label, self.due, self.written = p.label, self.seconds, 0
        if p.final:
            if self.written or self.seconds == 0:
                self._write(p)
            return
        if p.elapsed >= self.due:
            self._write(p)
            periods = math.floor(p.elapsed / self.seconds) if self.seconds > 0 else 0
            self.due = max(self.due, (periods + 1) * self.seconds)

    def _write(self, p: Progress) -> None:
        self.stream.write(bar_line(p) + "\n")
        self.stream.flush()
        self.written += 1


def add_progress_arg(p: argparse.ArgumentParser) -> None:
    """The ``--progress`` flag of a command that reports progress."""
    p.add_argument(
        "--progress",
        choices=MODES,
        default=None,
        help="auto (default; or $TOKENTAPE_PROGRESS): a bar on a terminal, else a plain line "
        "every $TOKENTAPE_PROGRESS_SECONDS (15) for logs; bar, lines or none",
    )


def progress_callback(
    mode: str | None, quiet: bool = False, stream: TextIO | None = None
) -> Callable[[Progress], None] | None:
    """The callback for ``--progress MODE`` (None: ``$TOKENTAPE_PROGRESS``, else auto) on
    ``stream`` (stderr); ``quiet`` (``--json``) silences auto."""
    from tokentape.errors import InputError

    stream = sys.stderr if stream is None else stream
    chosen = mode or os.environ.get("TOKENTAPE_PROGRESS") or "auto"
    if chosen not in MODES:
        raise InputError(f"TOKENTAPE_PROGRESS={chosen!r}: expected one of {', '.join(MODES)}")
    raw = os.environ.get("TOKENTAPE_PROGRESS_SECONDS")
    try:
        seconds = DEFAULT_SECONDS if raw is None else float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < math.inf:
        raise InputError(f"TOKENTAPE_PROGRESS_SECONDS={raw!r}: expected seconds >= 0")
    if chosen == "none" or (chosen == "auto" and quiet):
        return None
    if chosen == "bar" or (chosen == "auto" and stream.isatty()):
        return TerminalBar(stream)
    return ProgressLines(stream, seconds)


def terminal_bar(quiet: bool = False, stream: TextIO | None = None) -> TerminalBar | None:
    """The bar for stderr when it is a terminal and the command is not ``quiet`` (``--json``),
    else None (nothing is drawn)."""
    stream = sys.stderr if stream is None else stream
    if quiet or not stream.isatty():
        return None
    return TerminalBar(stream)

"""The ``tokentape`` console script: every command of the CLI, and the demo.

The commands are imported when ``main`` runs, inside its guard: a Ctrl-C while Python is
still importing them ends the program with the same one line as one during a command
(``tokentape: interrupted``, exit code 130), not a traceback of the import."""

from __future__ import annotations

import sys
from collections.abc import Sequence

EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    try:
        from tokentape._src.cli.app import main as run
        from tokentape._src.demo import command as demo
    except KeyboardInterrupt:
        print("tokentape: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return run(argv, extra=(demo,))


__all__ = ["main"]

"""The ``tokentape`` console script: every command of the CLI, and the demo."""

from __future__ import annotations

from collections.abc import Sequence

from tokentape._src.cli.app import main as run
from tokentape._src.demo import command as demo


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    return run(argv, extra=(demo,))


__all__ = ["main"]

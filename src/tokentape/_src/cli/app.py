"""The ``tokentape`` program's frame: parser, dispatch, and one-line errors.

Bad input prints one line ``tokentape: error: ...`` and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, Protocol

from tokentape._src.cli import (
    convert,
    corpora,
    info,
    locate,
    plan,
    replay,
    smoke,
    stage,
    tokenize,
    verify,
)
from tokentape._src.util.version import __version__
from tokentape.errors import TokentapeError

EXIT_USAGE = 2


class Command(Protocol):
    """A command module: it adds its sub-parser, whose ``func`` runs the command."""

    def add_parser(self, sub: argparse._SubParsersAction) -> None: ...


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors in the program's one-line form (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("tokentape").strip()
        where = f"{command}: " if command else ""
        self.exit(EXIT_USAGE, f"tokentape: error: {where}{message} (see {self.prog} --help)\n")


COMMANDS = (tokenize, info, plan, stage, smoke, replay, verify, locate, convert, corpora)
"""The command modules, in ``--help`` order: each has ``add_parser(sub)``."""


def build_parser(extra: Sequence[Command] = ()) -> argparse.ArgumentParser:
    """The program's parser: every command of ``COMMANDS``, then those of ``extra``."""
    parser = _Parser(
        prog="tokentape",
        description="A deterministic, replayable data pipeline for LLM pretraining.",
    )
    parser.add_argument("--version", action="version", version=f"tokentape {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (*COMMANDS, *extra):
        command.add_parser(sub)
    return parser


def _one_line(message: str) -> str:
    """A message kept on one line, whatever a file or field name in it holds."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def main(argv: Sequence[str] | None = None, extra: Sequence[Command] = ()) -> int:
    """Run one command line; returns the exit code (errors are one line on stderr, code 2)."""
    try:
        args: Any = build_parser(extra).parse_args(argv)
    except SystemExit as exc:  # a usage error (one line, above), --help or --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE if exc.code else 0
    try:
        return args.func(args)
    except TokentapeError as exc:
        print(f"tokentape: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except OSError as exc:  # a file system error the command did not anticipate: one line
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"tokentape: error: {_one_line(f'{where}{exc.strerror or exc}')}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        again = (
            "; run the same command again to resume"
            if args.command in ("tokenize", "stage")
            else ""
        )
        print(f"tokentape: interrupted{again}", file=sys.stderr)
        return 130

"""The ``tokentape`` program's frame: parser, dispatch, and one-line errors.

Bad input prints one line ``tokentape: error: ...`` and exits with code 2.

Standard output closed by its reader (``tokentape info STORE | head -1``) is not an error: the
command stops, prints nothing more and exits with code 0. Only a ``BrokenPipeError`` of a write
to (or flush of) ``sys.stdout`` counts as that: while a command runs, ``sys.stdout`` is
``_GuardedStdout``, which turns one into ``_StdoutClosed``. Any other ``BrokenPipeError`` (a
pipe to a helper process that died, a socket) is an error like any other: one line, code 2.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import traceback
from collections.abc import Iterable, Sequence
from contextlib import suppress
from typing import Any, NoReturn, Protocol, TextIO, cast

from tokentape._src.cli import (
    convert,
    corpora,
    excise,
    info,
    locate,
    megatron,
    plan,
    replay,
    report,
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

    def add_parser(self, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors in the program's one-line form (exit code 2), with a
    "did you mean" for a misspelled flag, command or choice."""

    _words: tuple[str, ...] = ()
    """The command-line words this parser was last given (to find a misspelled flag in)."""

    def _parse_known_args(self, arg_strings: list[str], *rest: Any) -> Any:
        self._words = tuple(arg_strings)
        return super()._parse_known_args(arg_strings, *rest)

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("tokentape").strip()
        where = f"{command}: " if command else ""
        hint = self._suggestion(message)
        self.exit(
            EXIT_USAGE, f"tokentape: error: {where}{message}{hint} (see {self.prog} --help)\n"
        )

    def _options(self) -> list[str]:
        """This parser's long flags, and those of the sub-command named on its command line."""
        options = [o for o in self._option_string_actions if o.startswith("--")]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = next((w for w in self._words if w in action.choices), None)
                if isinstance(chosen, str) and isinstance(action.choices[chosen], _Parser):
                    options += action.choices[chosen]._options()
        return options

    def _suggestion(self, message: str) -> str:
        """``; did you mean X?`` for the likely intent of a misspelled choice or flag, or ``''``."""
        choice = re.match(r"argument .*?: invalid choice: '?(.*?)'? \(choose from (.*)\)$", message)
        if choice:
            choices = [c.strip("'") for c in choice[2].split(", ")]
            close = difflib.get_close_matches(choice[1], choices, n=1)
            return f"; did you mean '{close[0]}'?" if close else ""
        required = message.removeprefix("the following arguments are required: ")
        if required != message:  # only a missing flag is the likely intent
            options = [o for o in required.split(", ") if o.startswith("--")]
        elif message.startswith("unrecognized arguments"):
            options = self._options()
        else:
            return ""
        known = self._options()
        for word in self._words:
            if word == "--":  # what follows is positional
                break
            flag = word.split("=", 1)[0]
            if not flag.startswith("--") or any(o.startswith(flag) for o in known):
                continue  # not a flag, or a known one (argparse takes a unique prefix)
            close = difflib.get_close_matches(flag, options, n=1)
            if close:
                return f"; {flag[:40]}: did you mean {close[0]}?"
        return ""


COMMANDS = (
    tokenize,
    info,
    plan,
    stage,
    smoke,
    replay,
    report,
    verify,
    locate,
    excise,
    convert,
    megatron,
    corpora,
)
"""The command modules, in ``--help`` order: each has ``add_parser(sub)``."""


class _Version(argparse.Action):
    """``--version``: the version and which permutation walk this install runs."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from tokentape._src.tape.permutation import KERNEL_NOTE, kernel

        walk = "compiled" if kernel() == "compiled" else f"numpy: {KERNEL_NOTE}"
        print(f"tokentape {__version__} (permutation walk: {walk})")
        parser.exit()


def build_parser(extra: Sequence[Command] = ()) -> argparse.ArgumentParser:
    """The program's parser: every command of ``COMMANDS``, then those of ``extra``."""
    parser = _Parser(
        prog="tokentape",
        description="A deterministic, replayable data pipeline for LLM pretraining.",
    )
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="show the version, and whether the permutation's compiled loop is built, and exit",
    )
    # Sub-parsers are _Parsers, ArgumentParsers to the commands (the type parameter is invariant).
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND"),
    )
    for command in (*COMMANDS, *extra):
        command.add_parser(sub)
    return parser


def _one_line(message: str) -> str:
    """A message kept on one line, whatever a file or field name in it holds."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


class _StdoutClosed(Exception):
    """The reader of standard output went away (``| head``): the command stops, exit code 0."""


class _GuardedStdout:
    """``sys.stdout`` while a command runs: the stream it wraps, but a ``BrokenPipeError`` of a
    write or flush becomes ``_StdoutClosed`` (so that it is told apart from any other)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise _StdoutClosed from None

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise _StdoutClosed from None

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer, ...
        return getattr(self._stream, name)


def _silence(stream: TextIO) -> None:
    """Point the closed standard output's descriptor at the null device: what is left in its
    buffer then goes there when the interpreter flushes it on exit, instead of failing with
    "Exception ignored ... BrokenPipeError" (and exit code 120)."""
    with suppress(OSError, ValueError, AttributeError):  # no descriptor (a test's capture)
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)


def _where(exc: BaseException) -> str:
    """Where ``exc`` was raised: the innermost frame's file name, line and function."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    last = frames[-1]
    return f"{os.path.basename(last.filename)}:{last.lineno} in {last.name}"


def main(argv: Sequence[str] | None = None, extra: Sequence[Command] = ()) -> int:
    """Run one command line; returns the exit code (errors are one line on stderr, code 2)."""
    stdout = sys.stdout
    if stdout is None:  # no standard output at all (pythonw): nothing to guard
        return _run(argv, extra)
    sys.stdout = cast(TextIO, _GuardedStdout(stdout))
    code = 0  # a command stopped by its reader going away: not an error
    try:
        code = _run(argv, extra)
        sys.stdout.flush()  # what the command printed: a closed pipe may show only here
    except _StdoutClosed:  # output piped into `head` and the like
        _silence(stdout)  # (closed at this last flush: the command's code stands)
    finally:
        sys.stdout = stdout
    return code


def _run(argv: Sequence[str] | None, extra: Sequence[Command]) -> int:
    try:
        args: Any = build_parser(extra).parse_args(argv)
    except SystemExit as exc:  # a usage error (one line, above), --help or --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE if exc.code else 0
    try:
        code: int = args.func(args)
        return code
    except TokentapeError as exc:
        print(f"tokentape: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError as exc:  # not standard output's (that is _StdoutClosed): an error
        where = f"{exc.filename}: " if exc.filename else ""
        message = (
            f"{where}broken pipe at {_where(exc)}: the process or connection this command was "
            "writing to went away (not its standard output)"
        )
        print(f"tokentape: error: {_one_line(message)}", file=sys.stderr)
        return EXIT_USAGE
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

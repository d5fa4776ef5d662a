"""The exception types a user sees: what went wrong, where, and what was expected.

Every error tokentape raises on purpose is a ``TokentapeError``; its subtypes say which kind of
thing was refused, so that a trainer can catch one kind without matching message text::

    TokentapeError
    ├── InputError (also a ValueError)      invalid input: an argument, a value, a spec, a file
    │   ├── ArgumentError                   an argument of a library call
    │   │   └── ArgumentTypeError           ... of the wrong type (also a TypeError)
    │   └── OutOfRangeError (IndexError)    an index outside its range
    │       └── IndexOutOfRange             ... of a permutation (also a ValueError)
    ├── PlanError                           a plan (TOML, PLAN.json) or step log refused
    ├── StoreError                          a store or Megatron prefix missing or damaged
    │   └── StoreChanged                    a store no longer matches the plan
    ├── ResumeRefused                       a data state that cannot be resumed on this plan
    ├── OutputError                         an output that cannot be written as asked
    │   ├── OutputLocked                    another process writes the same output
    │   ├── CacheLocked                     a stage cache's lock not released in time
    │   └── WriteFailed (also an OSError)   a file write failed (no space, no permission)
    └── ObjectStorageError                  object storage kept failing past the retries

Misuse of the Python API raises an ``ArgumentError`` or an ``OutOfRangeError``, which are also
the builtin exception a caller would expect (``ValueError``, ``IndexError``), so
``except ValueError`` keeps working. The message is always one line; the data some subtypes
carry (``StoreChanged.planned``, ``ResumeRefused.differences``) is what the message names. Every
type pickles with its message and data (a worker process re-raises it in the parent).
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

_E = TypeVar("_E", bound=BaseException)


class TokentapeError(Exception):
    """Bad input or a refused operation.

    The message is a single line naming the file (and line or field) and what was expected.
    The command-line program prints it and exits with code 2, without a traceback.
    """


class InputError(TokentapeError, ValueError):
    """Invalid input: an argument, a command-line value, a spec or an input file.

    The input is an argument of a library call, a command-line value, a tokenizer spec, a
    filter spec, or an input corpus file that cannot be read as its format. Also a
    ``ValueError``. The message names the argument, value or file and what was expected.
    """


class ArgumentError(InputError):
    """An argument of a library call has the wrong type or value; the message names it."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type; also a ``TypeError``, as a caller would expect.

    Raised by the permutation functions (``tape``) for a non-integer size, seed or index.
    """


class OutOfRangeError(InputError, IndexError):
    """An index argument (a position, sample, document or rank) lies outside its range.

    The message names the argument and the range. Also an ``IndexError``.
    """


class IndexOutOfRange(OutOfRangeError, ValueError):
    """An index outside ``[0, n)`` of a permutation; also a ``ValueError``.

    The permutation functions raised ``ValueError`` before the error types existed, and
    still do through this subtype.
    """


class PlanError(TokentapeError):
    """A plan refused: an invalid plan, a repeat budget exceeded, or a foreign step log.

    That is: a plan file (TOML) or ``PLAN.json`` that is invalid, a plan whose repeat budgets
    (``max_repeats``) refuse it, or a step log that belongs to another plan or is damaged. The
    message names the file and the field.
    """


class StoreError(TokentapeError):
    """A token store or Megatron prefix that is missing, damaged or not what it says.

    That is: missing, damaged, not confined to its directory (a link, a FIFO), or not what its
    manifest (or identity sidecar) says. The message names the file and what was expected.
    """


class StoreChanged(StoreError):
    """A store no longer matches the plan: its content hash differs from the one planned.

    Attributes:
        path: The store's directory (or Megatron prefix), as the plan names it; None when the
            raiser did not give it.
        planned: The content hash the plan recorded.
        found: The content hash the store has now.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        planned: str | None = None,
        found: str | None = None,
    ) -> None:
        """Carry the message and what differs.

        Args:
            message: The one-line message (it names the store and the two hashes).
            path: The store's directory (or Megatron prefix) as the plan names it; None when
                not known.
            planned: The content hash the plan recorded; None when not known.
            found: The content hash the store has now; None when not known.
        """
        super().__init__(message)
        self.path = path
        self.planned = planned
        self.found = found


class ResumeRefused(TokentapeError):
    """A saved data state (``DataState``, a checkpoint) cannot be resumed on this plan.

    The plan's index hash differs from the one the state was saved with.

    Attributes:
        differences: One ``(field, saved, now)`` per difference the message names, e.g.
            ``("seed", 1234, 7)``, ``("sources.web.content_hash", "sha256:…", "sha256:…")``,
            ``("sources", "math", None)`` (a source removed; ``(None, name)``: added) or
            ``("source order", [...], [...])``. Empty when the state's recorded identity shows
            no difference (the message then says "(identity unchanged)").
    """

    def __init__(self, message: str, *, differences: tuple[tuple[str, Any, Any], ...] = ()) -> None:
        """Carry the message and the differences it names.

        Args:
            message: The one-line message naming every difference.
            differences: One ``(field, saved, now)`` per difference (see ``differences``
                above); empty when the recorded identity shows none.
        """
        super().__init__(message)
        self.differences = tuple(differences)


class OutputError(TokentapeError):
    """An output that cannot be written as asked.

    That is: held by another writer (the store's lock), an existing directory that is not ours
    or not empty (without ``--overwrite``), or a file that already exists. The message names
    the path and what to do.
    """


class OutputLocked(OutputError):
    """Another process is writing the same output (its lock is held); the message names it.

    The message gives the holder's host, pid, command and start time as its lock records
    them, or says that it cannot tell who holds the lock.
    """


class CacheLocked(OutputError):
    """Another process held a stage cache's lock for longer than the wait allowed."""


class WriteFailed(OutputError, OSError):
    """Writing a file failed (no space, no permission, the destination is a directory, ...).

    The message names the destination, never a temporary name. It is an ``OSError`` too
    (with ``filename`` the destination), so callers that fall back on ``OSError`` keep
    working.
    """

    def __str__(self) -> str:
        """The destination and the reason, on one line."""
        return f"'{self.filename}': {self.strerror}"


class ObjectStorageError(TokentapeError):
    """Object storage kept failing: a read or write of one object failed on every attempt.

    Raised after the retry budget (``TOKENTAPE_IO_RETRIES`` attempts with exponential backoff)
    on 5xx answers, throttling, dropped connections, timeouts or bodies cut short. The message
    names the object and the last error, never a credential.

    Attributes:
        url: The object (or prefix) that could not be read or written.
        last_error: The last attempt's error, one line.
    """

    def __init__(self, message: str, *, url: str = "", last_error: str = "") -> None:
        """Carry the message, the object's URL and the last error.

        Args:
            message: The one-line message.
            url: The object's URL.
            last_error: The last attempt's error.
        """
        super().__init__(message)
        self.url = url
        self.last_error = last_error


def _reworded(exc: _E, message: str) -> _E:
    """``exc``'s type and data under another message.

    A re-raise that adds where it happened keeps the subtype (and ``StoreChanged``'s or
    ``ResumeRefused``'s data).
    """
    new = copy.copy(exc)
    new.args = (message,)
    return new

"""The exception types a user sees: what went wrong, where, and what was expected.

Every error tokentape raises on purpose is a ``TokentapeError``. Misuse of the Python API
raises one of the two subtypes below, which are also the builtin exception a caller would
expect (``ValueError``, ``IndexError``), so ``except ValueError`` keeps working.
"""


class TokentapeError(Exception):
    """Bad input or a refused operation.

    The message is a single line naming the file (and line or field) and what was expected.
    The command-line program prints it and exits with code 2, without a traceback.
    """


class ArgumentError(TokentapeError, ValueError):
    """An argument of a library call has the wrong type or value; the message names it."""


class OutOfRangeError(TokentapeError, IndexError):
    """An index argument (a position, sample, document or rank) lies outside its range; the
    message names the argument and the range."""

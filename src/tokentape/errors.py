"""The one exception type a user sees: what went wrong, where, and what was expected."""


class TokentapeError(Exception):
    """Bad input or a refused operation.

    The message is a single line naming the file (and line or field) and what was expected.
    The command-line program prints it and exits with code 2, without a traceback.
    """

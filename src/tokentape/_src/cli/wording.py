"""How the checks the command line shares with the public functions (``api``) word an error
here: by the flags and arguments the user typed."""

from __future__ import annotations

from tokentape._src.api import Wording
from tokentape._src.util.checks import as_flag

_ARGUMENTS = {"inputs": "input", "filters": "--filter", "source": "SOURCE", "doc": "DOC"}
"""The arguments the command line spells otherwise than as ``--`` and the parameter's name."""


def named(name: str) -> str:
    """An argument of the shared checks as the command line spells it: ``shard_mb`` ->
    ``--shard-mb``, ``log`` -> ``--log``; tokenize's ``inputs`` are each an ``input``, its
    ``filters`` each a ``--filter``."""
    return _ARGUMENTS.get(name) or as_flag(name)


FLAGS = Wording(
    named=named,
    replay_without_shape=(
        "which positions make step N? give --log steps.jsonl (required when the batch "
        "shape ever changed), --global-batch B, or --dp/--micro/--accum"
    ),
    until_step_without_shape=(
        "--until-step needs the batch configuration: --global-batch, --dp/--micro/--accum or --log"
    ),
)
"""The command line's wording."""

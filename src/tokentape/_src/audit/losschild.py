"""A big loss log read in a second process while this one reads the step log.

The two logs of a long run are a million JSON lines each; parsing is all the report's time,
and one process parses one at a time. ``LossReader`` starts ``python -m
tokentape._src.audit.losschild LOG NAME...`` for a log of ``BACKGROUND_BYTES`` or more: it
reads the lines (``read_loss_lines``) and writes one JSON header line, then the arrays as an
``.npz`` (read back with ``allow_pickle=False``). A log it refuses comes back as the same
one-line ``InputError``; a child that fails otherwise, or cannot start, is not trusted: the log
is read again here.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tokentape._src.audit.losslog import LossLines, read_loss_lines
from tokentape.errors import InputError

BACKGROUND_BYTES = 32 << 20
"""Logs this large (about 150,000 lines) are read in a second process."""


class LossReader:
    """The lines of a loss log, read here or in a second process (``lines()`` waits)."""

    def __init__(self, path: str, names: list[str], background: int = BACKGROUND_BYTES) -> None:
        self.path, self.names = path, names
        self.child: subprocess.Popen[bytes] | None = None
        try:
            big = os.stat(path).st_size >= background
        except OSError:
            big = False  # read here: the error names the file
        if big:
            env = {**os.environ, "PYTHONPATH": _path_with_package()}
            try:
                self.child = subprocess.Popen(
                    [sys.executable, "-m", __name__, path, *names],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    stdin=subprocess.DEVNULL,
                    env=env,
                )
            except OSError:
                self.child = None

    def lines(self) -> LossLines:
        child, self.child = self.child, None
        if child is None:
            return read_loss_lines(self.path, self.names)
        out, _ = child.communicate()
        head, _, body = out.partition(b"\n")
        try:
            header = json.loads(head.decode())
        except (ValueError, UnicodeDecodeError):
            header = {}
        if isinstance(header, dict) and isinstance(header.get("refused"), str):
            raise InputError(header["refused"])
        if child.returncode != 0 or header != {"ok": True}:
            return read_loss_lines(self.path, self.names)  # not trusted: read it here
        with np.load(io.BytesIO(body), allow_pickle=False) as npz:
            return LossLines.from_arrays({k: npz[k] for k in npz.files})

    def close(self) -> None:
        """Stop a child still reading (the report failed before it needed the lines)."""
        child, self.child = self.child, None
        if child is not None and child.poll() is None:
            child.kill()
            child.communicate()


def _path_with_package() -> str:
    """``PYTHONPATH`` with the directory this ``tokentape`` is imported from first."""
    here = str(Path(__file__).resolve().parents[3])  # .../tokentape/_src/audit/this file
    rest = os.environ.get("PYTHONPATH", "")
    return here + (os.pathsep + rest if rest else "")


def _main(argv: list[str]) -> int:
    path, names = argv[0], argv[1:]
    out = sys.stdout.buffer
    try:
        lines = read_loss_lines(path, names)
    except InputError as exc:
        out.write(json.dumps({"refused": str(exc)}).encode() + b"\n")
        return 2
    buffer = io.BytesIO()
    np.savez(buffer, **lines.arrays())  # type: ignore[arg-type]  # (numpy's stub: **kwds)
    out.write(b'{"ok": true}\n' + buffer.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))

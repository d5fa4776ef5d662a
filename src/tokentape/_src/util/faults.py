"""Fault injection for the kill tests: die at a named point when the environment says so."""

from __future__ import annotations

import os
import signal

CRASH_ENV = "TOKENTAPE_CRASH_AT"


def crashpoint(name: str) -> None:
    """Test hook: SIGKILL this process at the named point when ``TOKENTAPE_CRASH_AT`` says so."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["CRASH_ENV", "crashpoint"]

"""Staging a plan's bucket stores on a thread of its own while the loader streams.

``BackgroundStage(plan, cache_dir)`` waits until ``start()`` (the loader calls it once its
first step is built, so that the stage does not compete with the first batch), then runs
``stage_plan`` (one downloader per node and store, the node's other ranks waiting for it, every
block verified: ``stage.stage``) and keeps its result: the staged plan, or the error it raised.
The loader switches its reads to the staged copies between steps once the result is there.
"""

from __future__ import annotations

import os
import threading

from tokentape._src.plan.plan import Plan
from tokentape._src.stage.stage import stage_plan


class BackgroundStage:
    """One plan's stage, run on a daemon thread once started."""

    def __init__(self, plan: Plan, cache_dir: str | os.PathLike[str]) -> None:
        self._plan, self._cache_dir = plan, cache_dir
        self._go = threading.Event()
        self._done = threading.Event()
        self._cancelled = False
        self.result: Plan | None = None
        """The staged plan (same index hash, its bucket sources read from ``cache_dir``)."""
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tokentape-stage", daemon=True)
        self._thread.start()

    def start(self) -> None:
        """Let the stage begin (idempotent)."""
        self._go.set()

    def cancel(self) -> None:
        """A stage not begun never begins; one under way runs on (it is safe to interrupt at
        any point: the next stage resumes from what it verified)."""
        self._cancelled = True
        self._go.set()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the stage has ended (or ``timeout`` seconds); whether it has."""
        return self._done.wait(timeout)

    def _run(self) -> None:
        self._go.wait()
        try:
            if not self._cancelled:
                self.result = stage_plan(self._plan, self._cache_dir)
        except BaseException as exc:  # handed to the loader, raised from its step()
            self.error = exc
        finally:
            self._done.set()


__all__ = ["BackgroundStage"]

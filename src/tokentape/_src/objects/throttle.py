"""Slowing down when object storage says so: what a throttle answer is, and a request budget.

S3 serves about 5,500 GETs a second per partitioned prefix and answers more with ``503
SlowDown`` (other stores: ``429``, ``Throttling``...); it splits a busy prefix over time. A
thousand nodes staging one store at once get many such answers (benchmarks/fleet_sim.py). They
are not failures: ``ObjectStore.call`` waits and asks again, and they do not count against its
retry budget (``TOKENTAPE_IO_THROTTLE_S`` bounds the time spent so).

``Gate`` is the budget an ``ObjectStore`` keeps for its requests in flight, so that a
throttled node asks less instead of piling retries onto the prefix: it halves the requests it
allows in flight when one is throttled (once for the requests sent before that answer, however
many of them are throttled too), and allows one more after about as many answered requests as
it allows (additive increase, multiplicative decrease), up to ``ceiling``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping

THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "503",
        "429",
        "ServiceUnavailable",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
    }
)
"""Error codes of answers that mean "ask less often" (S3, and S3-compatible stores)."""


def answers(exc: BaseException) -> Iterator[tuple[object, object]]:
    """The (error code, HTTP status) of each server answer behind ``exc`` and what caused it
    (botocore's ``response``; either may be None)."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, Mapping):
            error = response.get("Error") or {}
            yield error.get("Code"), (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        seen = seen.__cause__ or seen.__context__


def throttled(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a server's answer to slow down: a throttle code
    or HTTP status 503 or 429."""
    return any(
        (isinstance(code, str) and code in THROTTLE_CODES) or status in (429, 503)
        for code, status in answers(exc)
    )


class Gate:
    """How many requests may be in flight at once, halved when one is throttled and grown
    back by one per about ``limit`` answered requests, between 1 and ``ceiling``."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = max(1, ceiling)
        self._start()

    def _start(self) -> None:
        """Full room (at construction, and in a forked child: the parent's requests in
        flight are not its own)."""
        self._pid = os.getpid()
        self.limit = float(self.ceiling)
        self.in_flight = 0
        self.epoch = 0
        """Bumped by each decrease: a throttle of a request sent before it does not count."""
        self._changed = threading.Condition()

    def enter(self) -> int:
        """Wait for room, take it; returns the epoch to hand back to ``leave``."""
        if self._pid != os.getpid():
            self._start()
        with self._changed:
            while self.in_flight >= int(self.limit):
                self._changed.wait()
            self.in_flight += 1
            return self.epoch

    def leave(self, epoch: int, was_throttled: bool) -> None:
        """A request sent at ``epoch`` was answered (``was_throttled``: told to slow down)."""
        with self._changed:
            self.in_flight -= 1
            if not was_throttled:
                self.limit = min(float(self.ceiling), self.limit + 1 / self.limit)
            elif epoch == self.epoch:  # the first throttle since the last decrease
                self.limit = max(1.0, min(self.limit, self.in_flight + 1.0) / 2)
                self.epoch += 1
            self._changed.notify_all()


__all__ = ["THROTTLE_CODES", "Gate", "answers", "throttled"]

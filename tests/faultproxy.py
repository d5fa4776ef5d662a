"""A fault-injecting HTTP proxy for the object-storage tests and benchmark (standard library only).

``FaultProxy(upstream)`` listens on ``127.0.0.1`` (a free port) and forwards every request
(method, path, query, headers, body; chunked request bodies are de-chunked and sent with a
``Content-Length``) to the upstream S3 endpoint (moto on loopback), one fresh upstream
connection per request. Clients get HTTP/1.1 keep-alive: every response carries a
``Content-Length`` (an upstream body without one is read whole first).

Faults, set at run time with ``proxy.set(...)`` (thread-safe; each draw from one seeded RNG,
one draw per request, so a given request order gives the same faults):

- ``delay``: seconds slept before each request is forwarded (latency);
- ``slowdown``: the fraction of requests answered ``503 SlowDown`` with S3's XML error body;
- ``drop``: the fraction of connections closed without any response;
- ``truncate``: the fraction of responses sent with their full ``Content-Length`` but only half
  of the body, then the connection closed (``before_cut``, when set, is called in between: a
  test holds the connection open there until its client has read what was sent);
- ``corrupt``: the fraction of responses whose body has one byte flipped (same length);
- ``stall``: the fraction of requests held ``stall_seconds`` (default 2 s) before they are
  forwarded (beyond a client's read timeout: a timeout);
- ``deny``: the fraction of requests answered ``403 AccessDenied`` (with ``methods={"PUT"}``: a
  bucket one may read but not write).

``before`` (not a fault: another writer) is called with each request's method, path and
``Range`` header (None without one), in the proxy's handler thread, before the request is
forwarded: a test rewrites an object there at a chosen request, as another writer would.

``mirror`` (not a fault: a faster server) maps request paths (``/BUCKET/KEY``) to local files
holding those objects' exact bytes: a GET of one is answered from the file, reading only the
range asked for (206 with ``Content-Range``; 412 when ``If-Match`` is not the file's MD5 ETag,
which is what the server gives an object uploaded in one PUT), instead of being forwarded.
moto answers a ranged GET by copying the whole object under a lock; the benchmarks use this to
measure against a server that reads ranges as S3 does.

``methods`` limits the faults (not the delay) to some methods (e.g. ``{"GET"}``); ``ranged``
limits them to requests with a ``Range`` header. Counters (``stats()``): requests seen, faults
by kind, body bytes sent to clients (``bytes_sent``: what a client fetched) and received.
Nothing here listens anywhere but loopback or forwards anywhere but ``upstream``.

    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.set(slowdown=0.3)
        store = object_store(url, {"endpoint_url": proxy.endpoint})
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import random
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FAULTS = ("slowdown", "drop", "truncate", "corrupt", "stall", "deny")
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
}
SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<RequestId>FAULTPROXY</RequestId><HostId>faultproxy</HostId></Error>"
)
DENIED_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message>"
    b"<RequestId>FAULTPROXY</RequestId><HostId>faultproxy</HostId></Error>"
)
PRECONDITION_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you "
    b"specified did not hold</Message><Condition>If-Match</Condition>"
    b"<RequestId>FAULTPROXY</RequestId></Error>"
)
COPY_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Faults:
    """What the proxy does to requests: a delay and the fraction of each fault."""

    delay: float = 0.0
    slowdown: float = 0.0
    drop: float = 0.0
    truncate: float = 0.0
    corrupt: float = 0.0
    stall: float = 0.0
    deny: float = 0.0
    stall_seconds: float = 2.0
    methods: frozenset[str] | None = None
    ranged: bool = False
    before: Callable[[str, str, str | None], None] | None = None
    before_cut: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.delay < 0 or self.stall_seconds < 0:
            raise ValueError(f"delays must be >= 0, got {self.delay}, {self.stall_seconds}")
        for name in FAULTS:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a fraction in [0, 1], got {value}")
        if sum(getattr(self, name) for name in FAULTS) > 1.0:
            raise ValueError("the fault fractions must add up to at most 1")


@dataclass
class Stats:
    """Counters since the proxy started (or ``reset``)."""

    requests: int = 0
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULTS, 0))
    bytes_sent: int = 0
    bytes_received: int = 0
    log: list[tuple[str, str, int | None, str | None]] = field(default_factory=list)
    """(method, path, status forwarded or None, fault or None) per request, in arrival order."""

    @property
    def faulted(self) -> int:
        return sum(self.faults.values())


_Ticket = tuple[Stats, int]
"""The counters a request was drawn under and its index in their log."""


_RANGE = re.compile(r"bytes=(\d+)-(\d+)$")


class Recorder:
    """A ``before`` hook that records every request in arrival order: its method, its path
    without the query, and its byte range ``(start, stop)`` (None without a ``Range``)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, tuple[int, int] | None]] = []
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str, range_header: str | None) -> None:
        found = _RANGE.match(range_header or "")
        span = (int(found[1]), int(found[2]) + 1) if found else None
        with self._lock:
            self.seen.append((method, path.split("?", 1)[0], span))

    def requests(self) -> list[tuple[str, str, tuple[int, int] | None]]:
        with self._lock:
            return list(self.seen)

    def ranged_gets(self, suffix: str = "") -> list[tuple[str, int, int]]:
        """(object name, start, stop) of each ranged GET of an object named ``...suffix``."""
        return [
            (path.rsplit("/", 1)[-1], *span)
            for method, path, span in self.requests()
            if method == "GET" and span is not None and path.endswith(suffix)
        ]


class FaultProxy:
    """A loopback HTTP proxy to ``upstream`` (``http://host:port``) that injects faults."""

    def __init__(
        self,
        upstream: str,
        seed: int = 0,
        mirror: Mapping[str, Path] | None = None,
        **faults: Any,
    ) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or not parsed.hostname or parsed.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = (parsed.hostname, parsed.port)
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._faults = Faults(**faults)
        self._stats = Stats()
        self._sockets: set[socket.socket] = set()
        self.mirror = {path: (Path(f), _md5_etag(Path(f))) for path, f in (mirror or {}).items()}
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread: threading.Thread | None = None
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"

    # --- configuration and counters ----------------------------------------------------

    def set(self, **changes: Any) -> Faults:
        """Change some fault settings (``delay=0.01``, ``slowdown=0.3``, ``methods={"GET"}``,
        ...); the others stay. Returns the new settings."""
        if "methods" in changes and changes["methods"] is not None:
            changes["methods"] = frozenset(m.upper() for m in changes["methods"])
        with self._lock:
            self._faults = replace(self._faults, **changes)
            return self._faults

    def clear(self) -> None:
        """No faults and no delay from now on."""
        with self._lock:
            self._faults = Faults()

    @property
    def faults(self) -> Faults:
        with self._lock:
            return self._faults

    def stats(self) -> Stats:
        """A copy of the counters."""
        with self._lock:
            s = self._stats
            return Stats(s.requests, dict(s.faults), s.bytes_sent, s.bytes_received, list(s.log))

    def reset(self) -> None:
        """Counters back to zero."""
        with self._lock:
            self._stats = Stats()

    def _draw(self, method: str, path: str, ranged: bool) -> tuple[Faults, str | None, _Ticket]:
        """The settings, the fault for this request (or None), and where to record it."""
        with self._lock:
            faults = self._faults
            stats = self._stats
            stats.requests += 1
            u = self._rng.random()
            chosen = None
            applies = (faults.methods is None or method in faults.methods) and (
                ranged or not faults.ranged
            )
            if applies:
                edge = 0.0
                for name in FAULTS:
                    edge += getattr(faults, name)
                    if u < edge:
                        chosen = name
                        break
            if chosen is not None:
                stats.faults[chosen] += 1
            stats.log.append((method, path, None, chosen))
            return faults, chosen, (stats, len(stats.log) - 1)

    def _record(self, ticket: _Ticket, status: int | None, sent: int, got: int) -> None:
        """The status and bytes of a request, unless the counters were reset meanwhile."""
        stats, index = ticket
        with self._lock:
            if stats is not self._stats:
                return
            method, path, _, fault = stats.log[index]
            stats.log[index] = (method, path, status, fault)
            stats.bytes_sent += sent
            stats.bytes_received += got

    # --- lifetime -----------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every client connection still open."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            open_sockets = list(self._sockets)
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _md5_etag(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return f'"{digest.hexdigest()}"'


def _ranged_answer(
    path: Path, etag: str, range_header: str | None, if_match: str | None
) -> tuple[int, list[tuple[str, str]], bytes]:
    """A mirrored object's answer: the range asked for (or all of it), read from its file."""
    base = [("ETag", etag), ("Accept-Ranges", "bytes"), ("x-amz-request-id", "FAULTPROXY")]
    if if_match is not None and if_match.strip().strip('"') != etag.strip('"'):
        return 412, [*base, ("Content-Type", "application/xml")], PRECONDITION_BODY
    size = path.stat().st_size
    found = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header or "")
    with open(path, "rb") as f:
        if found is None:
            return 200, [*base, ("Content-Type", "binary/octet-stream")], f.read()
        start = int(found[1])
        stop = min(size, int(found[2]) + 1) if found[2] else size
        f.seek(start)
        data = f.read(max(0, stop - start))
    headers = [*base, ("Content-Type", "binary/octet-stream"),
               ("Content-Range", f"bytes {start}-{start + len(data) - 1}/{size}")]  # fmt: skip
    return 206, headers, data


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy

    def server_bind(self) -> None:
        host, _ = self.server_address[:2]
        assert host == "127.0.0.1", host  # loopback only
        super().server_bind()


class _Dropped(Exception):
    """The connection is to be closed without a response."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms stalls
    timeout = 60  # an idle keep-alive connection ends after a minute
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.proxy._lock:
            self.server.proxy._sockets.add(self.connection)

    def finish(self) -> None:
        with self.server.proxy._lock:
            self.server.proxy._sockets.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._forward()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_OPTIONS = do_PATCH = do_GET

    # --- one request ----------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline(65537)  # the CRLF after the chunk
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self) -> None:
        proxy = self.server.proxy
        body = self._read_body()
        faults, fault, ticket = proxy._draw(self.command, self.path, "Range" in self.headers)
        if faults.before is not None:
            faults.before(self.command, self.path, self.headers.get("Range"))
        if faults.delay:
            time.sleep(faults.delay)
        if fault == "stall":
            time.sleep(faults.stall_seconds)
        if fault == "drop":
            proxy._record(ticket, None, 0, len(body))
            self._drop()
            return
        if fault in ("slowdown", "deny"):
            status, answer = (503, SLOWDOWN_BODY) if fault == "slowdown" else (403, DENIED_BODY)
            headers = [("Content-Type", "application/xml"), ("x-amz-request-id", "FAULTPROXY")]
            proxy._record(ticket, status, len(answer), len(body))
            self._respond(status, headers, answer)
            return
        try:
            status, headers, payload = self._upstream(body)
        except (OSError, http.client.HTTPException):
            proxy._record(ticket, 502, 0, len(body))
            self._drop()
            return
        if fault == "corrupt" and payload:
            middle = len(payload) // 2
            payload = payload[:middle] + bytes([payload[middle] ^ 0xFF]) + payload[middle + 1 :]
        cut = len(payload) // 2 if fault == "truncate" and len(payload) > 1 else None
        # counted before sending, so a client that has its answer sees it counted
        proxy._record(ticket, status, len(payload) if cut is None else cut, len(body))
        self._respond(status, headers, payload, cut=cut, before_cut=faults.before_cut)

    def _upstream(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        key = self.path.split("?", 1)[0]
        mirrored = self.server.proxy.mirror.get(key) if self.command == "GET" else None
        if mirrored is not None:
            return _ranged_answer(
                *mirrored, self.headers.get("Range"), self.headers.get("If-Match")
            )
        host, port = self.server.proxy.upstream
        conn = http.client.HTTPConnection(host, port, timeout=120)
        try:
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() not in HOP_BY_HOP and k.lower() not in ("content-length", "expect")
            }
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body or None, headers=headers)
            response = conn.getresponse()
            payload = response.read() if self.command != "HEAD" else b""
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
            return response.status, kept, payload
        finally:
            conn.close()

    def _respond(
        self,
        status: int,
        headers: list[tuple[str, str]],
        payload: bytes,
        cut: int | None = None,
        before_cut: Callable[[], None] | None = None,
    ) -> None:
        """Send the response (the first ``cut`` bytes of the body only, then ``before_cut``,
        then close, when ``cut`` is set); a client already gone (e.g. after its timeout) ends
        the connection."""
        try:
            self._send(status, headers, payload, cut, before_cut)
        except OSError:
            self.close_connection = True

    def _send(
        self,
        status: int,
        headers: list[tuple[str, str]],
        payload: bytes,
        cut: int | None,
        before_cut: Callable[[], None] | None = None,
    ) -> None:
        self.send_response_only(status)
        has_length = False
        for key, value in headers:
            if key.lower() == "content-length":
                if self.command == "HEAD":
                    has_length = True
                    self.send_header(key, value)
                continue
            self.send_header(key, value)
        if not has_length:
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command == "HEAD" or status in (204, 304):
            return
        body = payload if cut is None else payload[:cut]
        for start in range(0, len(body), COPY_CHUNK):
            self.wfile.write(body[start : start + COPY_CHUNK])
        self.wfile.flush()
        if cut is not None:
            if before_cut is not None:
                before_cut()
            self._drop(send_nothing=False)

    def _drop(self, send_nothing: bool = True) -> None:
        """Close the connection now (no response at all when ``send_nothing``)."""
        self.close_connection = True
        try:
            if send_nothing:
                self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

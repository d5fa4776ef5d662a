"""Object storage: which paths are object URLs, and reading and writing objects with retries.

A location is a local path or an object URL (``s3://bucket/key``, and whatever else fsspec
knows: ``gs://``, ``az://``...); ``is_url`` tells which. Object storage goes through fsspec
(``s3fs`` for S3), installed by the ``tokentape[s3]`` extra and imported only when a URL is
used. Endpoint and credentials come from the standard places (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, profiles) and from ``storage_options`` (the
keyword arguments of the fsspec filesystem, e.g. ``{"endpoint_url": ...}``).

Every call retries with exponential backoff on anything but "not found" and "access denied"
(5xx, resets, timeouts, a body shorter than asked for): ``TOKENTAPE_IO_RETRIES`` attempts in
all (default 6), the first wait ``TOKENTAPE_IO_BACKOFF`` seconds (default 0.2), doubling up to
5 s. After the last attempt an ``ObjectStorageError`` names the object and the last error, in
one line. An answer to slow down (503 SlowDown, 429...) is not an attempt: it is waited out,
up to ``TOKENTAPE_IO_THROTTLE_S`` seconds (default 900) a call, and it halves the requests the
store allows in flight (``objects.throttle``). Messages never carry a credential: ``redact``
removes every secret this process knows of (the AWS variables, secret-looking storage options)
from any text built from a library's error.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tokentape._src.objects.throttle import Gate, answers, throttled
from tokentape.errors import (
    ArgumentError,
    InputError,
    ObjectStorageError,
    StoreChanged,
    StoreError,
    TokentapeError,
)

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
_SECRET_KEY = re.compile(
    r"secret|token|password|passwd|passphrase|credential|sas|account_key|private_key|"
    r"connection_string|auth|^key$",
    re.I,
)
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
_ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_ACCESS_KEY_ID")
MAX_BACKOFF = 5.0
MAX_THROTTLE_WAIT = 20.0
"""The longest single wait on an answer to slow down (the waits are random below it)."""
MIN_THROTTLE_WAIT = 0.05
"""The first wait's ceiling on an answer to slow down, even with ``TOKENTAPE_IO_BACKOFF=0``
(which would ask again at once, for ever)."""
MAX_IN_FLIGHT = 4096
"""Requests one ``ObjectStore`` has in flight at most (its ``gate``'s ceiling)."""
CHUNK_BYTES = 8 * 2**20
"""The most bytes ``ObjectStore.read_into`` holds of a streamed body at a time."""
EXTRA_HINT = "object storage needs fsspec and s3fs: pip install 'tokentape[s3]'"

StorageOptions = Mapping[str, Any]
"""The keyword arguments of the fsspec filesystem of a URL's scheme (JSON-friendly)."""

_T = TypeVar("_T")


def is_url(path: object) -> bool:
    """Whether ``path`` is an object URL (``scheme://...``, not ``file://``)."""
    if not isinstance(path, str):
        return False
    match = _URL.match(path)
    return match is not None and match.group(1).lower() != "file"


def join(base: str, name: str) -> str:
    """``name`` (a plain file name) inside the URL "directory" ``base``."""
    return base.rstrip("/") + "/" + name


def parent(url: str) -> str:
    """The URL "directory" holding ``url``."""
    scheme, _, rest = url.partition("://")
    head, _, _ = rest.rstrip("/").rpartition("/")
    return f"{scheme}://{head}"


def basename(url: str) -> str:
    """The last component of ``url``."""
    return url.rstrip("/").rpartition("/")[2]


def parse_storage_options(text: str, where: str) -> dict[str, Any]:
    """A ``--storage-options`` value: a JSON object (the fsspec filesystem's keyword
    arguments)."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{where}: not valid JSON ({exc})") from None
    return check_storage_options(value, where)


def check_storage_options(value: object, where: str) -> dict[str, Any]:
    """``value`` when it is a JSON object with text keys, else an error naming ``where``."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ArgumentError(f"{where}: expected an object of options (name → value)")
    return dict(value)


def secret_keys(options: StorageOptions, prefix: str = "") -> list[str]:
    """The (dotted) names of the options that look like credentials (a credential-like name
    holding a table counts whole: a service account's key file, say)."""
    found = []
    for key, value in options.items():
        name = f"{prefix}{key}"
        if _SECRET_KEY.search(str(key)):
            found.append(name)
        elif isinstance(value, Mapping):
            found += secret_keys(value, name + ".")
    return found


def _leaves(value: object) -> Iterator[str]:
    """Every text inside ``value`` (tables and lists walked)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)


def _secret_values(options: StorageOptions) -> Iterator[str]:
    for key, value in options.items():
        if _SECRET_KEY.search(str(key)):
            yield from _leaves(value)
        elif isinstance(value, Mapping):
            yield from _secret_values(value)


_known_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def _remember_secrets(options: StorageOptions) -> None:
    with _secrets_lock:
        _known_secrets.update(s for s in _secret_values(options) if len(s) >= 4)


def redact(text: str) -> str:
    """``text`` with every credential this process knows of replaced by ``***``."""
    secrets = {os.environ.get(name, "") for name in _SECRET_ENV} | _known_secrets
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact(f"{type(exc).__name__}: {text}" if not str(exc).strip() else text)


@dataclass(frozen=True)
class ObjectInfo:
    """An object's URL, size in bytes, and a version tag (ETag or modification time)."""

    url: str
    size: int
    version: str


@dataclass(frozen=True)
class Retry:
    """How often and how patiently a call is retried (from the environment by default)."""

    attempts: int
    backoff: float
    throttle_s: float = 900.0
    """The most seconds one call waits in all on answers that say "slow down" (503
    SlowDown...), which do not count as attempts (``objects.throttle``)."""

    @classmethod
    def from_env(cls) -> Retry:
        try:
            attempts = int(os.environ.get("TOKENTAPE_IO_RETRIES", "6"))
            backoff = float(os.environ.get("TOKENTAPE_IO_BACKOFF", "0.2"))
            throttle_s = float(os.environ.get("TOKENTAPE_IO_THROTTLE_S", "900"))
        except ValueError:
            raise InputError(
                "TOKENTAPE_IO_RETRIES must be an integer, TOKENTAPE_IO_BACKOFF and "
                "TOKENTAPE_IO_THROTTLE_S numbers"
            ) from None
        return cls(max(1, attempts), max(0.0, backoff), max(0.0, throttle_s))


class _Short(OSError):
    """A body shorter (or longer) than the range asked for: retried like a reset."""


_REFUSED = {
    "NoCredentialsError",
    "PartialCredentialsError",
    "NoRegionError",
    "InvalidRegionError",
    "UnknownSignatureVersionError",
    "ParamValidationError",
    "InvalidEndpointConfigurationError",
}
"""botocore's errors for a request it will not send (the setting, not the network, is wrong)."""


def _permanent(exc: BaseException) -> bool:
    """Not found, access denied, an object changed: raised as they are (the caller says what
    it was)."""
    return isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError | TokentapeError)


def _precondition_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the server's 412 answer to ``If-Match``."""
    return any(
        code in ("PreconditionFailed", "412") or status == 412 for code, status in answers(exc)
    )


PINNED_PROTOCOLS = ("s3", "s3a")
"""Where a read carries the object's ETag as an ``If-Match`` precondition (S3's API); elsewhere
a pinned read is a plain read, checked by the hashes alone."""


def _refused(exc: BaseException) -> bool:
    """A request the client will not send: a bad endpoint, option, region or credentials."""
    return isinstance(exc, ValueError | TypeError) or type(exc).__name__ in _REFUSED


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError:
        raise InputError(EXTRA_HINT) from None
    return fsspec


_filesystems: dict[str, Any] = {}
_fs_lock = threading.Lock()


def _filesystem(protocol: str, options: StorageOptions) -> Any:
    """The fsspec filesystem for ``protocol`` with ``options`` (one per distinct setting and
    endpoint environment); S3's own retries are off: ``ObjectStore`` retries."""
    opts = dict(options)
    if protocol in ("s3", "s3a"):
        config = dict(opts.get("config_kwargs", {}))
        # One request per attempt (botocore's max_attempts counts retries, total_ the first).
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        config.setdefault("connect_timeout", 10)
        config.setdefault("read_timeout", 60)
        opts["config_kwargs"] = config
    env = {name: os.environ.get(name) for name in _ENDPOINT_ENV}
    # One per process too: an s3fs filesystem is not fork-safe (a forked DataLoader worker).
    key = json.dumps([os.getpid(), protocol, opts, env], sort_keys=True, default=repr)
    with _fs_lock:
        fs = _filesystems.get(key)
        if fs is None:
            fsspec = _fsspec()
            try:
                fs = fsspec.filesystem(protocol, skip_instance_cache=True, **opts)
            except ImportError as exc:
                raise InputError(f"{protocol}:// URLs: {exc}; {EXTRA_HINT}") from None
            except (ValueError, TypeError) as exc:
                raise InputError(f"storage options for {protocol}://: {_one_line(exc)}") from None
            if protocol in ("s3", "s3a"):
                fs.retries = 1  # s3fs's own retry loop: off (ObjectStore.call retries)
            _filesystems[key] = fs
    return fs


class ObjectStore:
    """Objects under one scheme and set of storage options, every call retried."""

    def __init__(self, protocol: str, options: StorageOptions | None = None) -> None:
        self.protocol = protocol
        self.options = dict(options or {})
        _remember_secrets(self.options)
        self._fs = _filesystem(protocol, self.options)
        self._pid = os.getpid()
        self.retry = Retry.from_env()
        self.gate = Gate(MAX_IN_FLIGHT)
        """Requests in flight at once: fewer while the store says to slow down."""
        self._jitter = random.Random()

    @property
    def fs(self) -> Any:
        """The fsspec filesystem, made anew in a forked child (one is not fork-safe)."""
        if self._pid != os.getpid():
            self._fs = _filesystem(self.protocol, self.options)
            self._pid = os.getpid()
        return self._fs

    def canonical(self, url: str) -> str:
        """``url`` as listings spell it (``scheme://bucket/key``), for telling duplicates
        apart."""
        return f"{self.protocol}://{self._key(url)}"

    def _key(self, url: str) -> str:
        scheme, sep, rest = url.partition("://")
        key: str = self.fs._strip_protocol(scheme.lower() + sep + rest if sep else url)
        return key

    def call(self, what: str, url: str, fn: Callable[[], _T]) -> _T:
        """``fn()`` with retries, within this store's request budget (``gate``); ``what`` and
        ``url`` name it in the final error. An answer to slow down is waited out (a random
        wait, up to twice as long each time, at most ``MAX_THROTTLE_WAIT``) without counting
        as an attempt, up to ``throttle_s`` seconds in all."""
        delay, attempt, slowed, waited = self.retry.backoff, 0, 0, 0.0
        while True:
            epoch = self.gate.enter()
            try:
                result = fn()
            except Exception as exc:
                slow = throttled(exc)
                self.gate.leave(epoch, slow)
                if _permanent(exc):
                    raise
                if _refused(exc):
                    raise InputError(
                        f"{url}: {what} refused by the client ({_one_line(exc)}); check "
                        "--storage-options (storage_options), AWS_ENDPOINT_URL and the "
                        "credentials"
                    ) from None
                if slow and waited < self.retry.throttle_s:
                    first = max(self.retry.backoff, MIN_THROTTLE_WAIT)
                    cap = min(MAX_THROTTLE_WAIT, first * 2 ** min(slowed, 16))
                    pause = min(self._jitter.uniform(0.0, cap), self.retry.throttle_s - waited)
                    slowed, waited = slowed + 1, waited + pause
                    time.sleep(pause)
                    continue
                attempt += 1
                if attempt >= self.retry.attempts:
                    held = f", and told to slow down for {waited:.1f} s" if waited else ""
                    raise ObjectStorageError(
                        f"{url}: {what} failed after {attempt} attempts{held} ({_one_line(exc)})",
                        url=url,
                        last_error=_one_line(exc),
                    ) from None
                time.sleep(delay)
                delay = min(MAX_BACKOFF, delay * 2)
                continue
            except BaseException:
                self.gate.leave(epoch, False)
                raise
            self.gate.leave(epoch, False)
            return result

    def info(self, url: str) -> ObjectInfo | None:
        """The object at ``url``, or None when there is none (or it is a "directory")."""

        def get() -> dict[str, Any] | None:
            try:
                found: dict[str, Any] = self.fs.info(self._key(url))
            except FileNotFoundError:
                return None
            return found

        self.fs.invalidate_cache()
        found = self.call("reading the object's size", url, get)
        if found is None or found.get("type") != "file":
            return None
        return ObjectInfo(url, int(found["size"]), _version(found))

    def exists_dir(self, url: str) -> bool:
        """Whether any object lies under the prefix ``url/``."""
        self.fs.invalidate_cache()
        return bool(self.call("listing", url, lambda: self.fs.find(self._key(url), maxdepth=1)))

    def find(self, url: str) -> list[ObjectInfo]:
        """Every object under the prefix ``url/`` (recursively), sorted by URL."""
        self.fs.invalidate_cache()
        found = self.call("listing", url, lambda: self.fs.find(self._key(url), detail=True))
        return sorted(
            (self._info(name, d) for name, d in found.items() if d.get("type") == "file"),
            key=lambda i: i.url,
        )

    def glob(self, pattern: str) -> list[ObjectInfo]:
        """The objects matching ``pattern`` (``*``, ``?``, ``[...]``, ``**``), sorted."""
        self.fs.invalidate_cache()
        found = self.call("listing", pattern, lambda: self.fs.glob(self._key(pattern), detail=True))
        return sorted(
            (self._info(name, d) for name, d in found.items() if d.get("type") == "file"),
            key=lambda i: i.url,
        )

    def glob_dirs(self, pattern: str) -> list[str]:
        """The "directories" (prefixes) matching ``pattern``, as URLs."""
        found = self.call("listing", pattern, lambda: self.fs.glob(self._key(pattern), detail=True))
        return sorted(self._url(n) for n, d in found.items() if d.get("type") == "directory")

    def _url(self, key: str) -> str:
        return f"{self.protocol}://{key}"

    def _info(self, key: str, detail: Mapping[str, Any]) -> ObjectInfo:
        return ObjectInfo(self._url(key), int(detail.get("size") or 0), _version(detail))

    def read(
        self, url: str, start: int | None = None, stop: int | None = None, etag: str = ""
    ) -> bytes:
        """Bytes ``[start, stop)`` of the object (the whole object without a range); a body of
        another length than asked for is retried. With ``etag`` (the version recorded when the
        object was planned or first looked at), the GET carries it as ``If-Match``: an object
        rewritten since (even at the same size) is refused with ``StoreChanged``, never
        served (S3; ``PINNED_PROTOCOLS``)."""

        whole = start is None and stop is None
        # s3fs reads a whole object after a HEAD for its size (to split a large one into
        # parallel parts): one round trip more for every manifest, sidecar and tokenizer copy.
        kwargs = {"max_concurrency": 1} if whole and self.protocol == "s3" else {}
        pinned = bool(etag) and self.protocol in PINNED_PROTOCOLS

        def get() -> bytes:
            key = self._key(url)
            try:
                if pinned:
                    data = _get_if_match(self.fs, key, start, stop, etag)
                else:
                    data = self.fs.cat_file(key, start=start, end=stop, **kwargs)
            except Exception as exc:
                if pinned and _precondition_failed(exc):
                    raise _changed(url, etag) from None
                raise
            if start is not None and stop is not None and len(data) != stop - start:
                raise _Short(f"got {len(data)} bytes of a {stop - start}-byte range")
            return data

        return self.call("reading", url, get)

    def read_into(
        self,
        url: str,
        start: int,
        stop: int,
        sink: Callable[[bytes], None],
        etag: str = "",
        chunk_bytes: int = CHUNK_BYTES,
    ) -> int:
        """Bytes ``[start, stop)`` of the object handed to ``sink`` in order, in pieces of at
        most ``chunk_bytes`` as they arrive, so that one GET may ask for far more than is held
        in memory; returns the GETs it took. A GET that fails midway is followed by one for
        the rest only, so nothing handed over is fetched again (the retry budget counts the
        GETs in a row that handed nothing over).
        With ``etag``, pinned as ``read`` is (S3: one GET streamed; elsewhere the range is
        read in pieces of ``chunk_bytes``). What ``sink`` raises is raised, never retried."""
        pos, requests = start, 0
        if not (etag and self.protocol in PINNED_PROTOCOLS):
            while pos < stop:
                data = self.read(url, pos, min(stop, pos + chunk_bytes), etag)
                requests += 1
                _hand_over(sink, data)
                pos += len(data)
            return requests

        def get() -> None:
            """A GET of the rest; one that ends early having handed something over is not a
            failure (the next asks for the rest, with the retry budget whole again)."""
            nonlocal pos, requests
            requests += 1
            began = pos
            try:
                for data in _stream_if_match(self.fs, self._key(url), pos, stop, etag, chunk_bytes):
                    if len(data) > stop - pos:
                        raise _Short(f"got more than the {stop - start}-byte range")
                    _hand_over(sink, data)
                    pos += len(data)
            except Exception as exc:
                if _precondition_failed(exc):
                    raise _changed(url, etag) from None
                if pos == began:
                    raise
            if pos == began:
                raise _Short(f"the body ended {stop - pos} bytes short of the range")

        try:
            while pos < stop:
                self.call("reading", url, get)
        except _SinkFailed as failed:
            raise failed.error from None
        return requests

    def read_whole(self, url: str, size: int) -> bytes:
        """The whole object, which must hold ``size`` bytes (a shorter body is retried)."""
        if size == 0:
            return b""
        return self.read(url, 0, size)

    def read_checked(
        self,
        url: str,
        start: int,
        stop: int,
        check: Callable[[bytes], str | None],
        etag: str = "",
    ) -> bytes:
        """Bytes ``[start, stop)`` that ``check`` accepts (it returns None, or what is wrong):
        fetched again while it does not (a body damaged on the way), up to the retry budget,
        then a ``StoreError`` naming the object and what ``check`` said; ``etag``: see
        ``read``."""
        delay = self.retry.backoff
        for attempt in range(1, self.retry.attempts + 1):
            data = self.read(url, start, stop, etag) if stop > start else b""
            problem = check(data)
            if problem is None:
                return data
            if attempt < self.retry.attempts:
                time.sleep(delay)
                delay = min(MAX_BACKOFF, delay * 2)
        raise StoreError(
            f"{url}: {problem} after {self.retry.attempts} fetches; the object changed or was "
            "damaged (run `tokentape verify`)"
        )

    def put_bytes(self, url: str, data: bytes, metadata: Mapping[str, str] | None = None) -> None:
        """Write the object ``url`` (replaced whole, atomically for readers)."""
        kwargs = {"Metadata": dict(metadata)} if metadata and self.protocol == "s3" else {}
        self.call("writing", url, lambda: self.fs.pipe_file(self._key(url), data, **kwargs))

    def put_file(
        self, local: str | os.PathLike[str], url: str, metadata: Mapping[str, str] | None = None
    ) -> None:
        """Upload the local file ``local`` to ``url`` (multipart when large)."""
        kwargs = {"Metadata": dict(metadata)} if metadata and self.protocol == "s3" else {}
        self.call(
            "uploading", url, lambda: self.fs.put_file(os.fspath(local), self._key(url), **kwargs)
        )

    def metadata(self, url: str) -> dict[str, str]:
        """The user metadata of the object (empty where the scheme has none)."""
        if self.protocol != "s3":
            return {}
        found = self.call("reading metadata", url, lambda: self.fs.metadata(self._key(url)))
        return {str(k).lower(): str(v) for k, v in (found or {}).items()}

    def delete(self, url: str) -> None:
        """Remove the object ``url`` (nothing when there is none)."""

        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self._key(url))

        self.call("deleting", url, rm)

    def open_reader(self, url: str, size: int, buffer_bytes: int = 8 * 2**20) -> io.BufferedReader:
        """A seekable, buffered reader of the object (``size`` bytes), every read a retried
        ranged GET: inputs are streamed, never copied to disk first."""
        return io.BufferedReader(_RangeFile(self, url, size), buffer_size=buffer_bytes)


class _RangeFile(io.RawIOBase):
    """A read-only raw file over ranged GETs of one object."""

    def __init__(self, store: ObjectStore, url: str, size: int) -> None:
        self.store, self.url, self.size, self.pos = store, url, size, 0
        self.name = url

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readall(self) -> bytes:
        """The rest of the object in one ranged GET (not one per 8 KiB)."""
        if self.pos >= self.size:
            return b""
        data = self.store.read(self.url, self.pos, self.size)
        self.pos = self.size
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        stop = min(self.size, self.pos + len(view))
        if stop <= self.pos:
            return 0
        data = self.store.read(self.url, self.pos, stop)
        view[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _changed(url: str, etag: str) -> StoreChanged:
    """The error of a pinned read the server refused: the object is no longer ``etag``."""
    return StoreChanged(
        f"{url}: the object was rewritten since it was recorded (its ETag is no longer "
        f"{etag}); it is not the object planned: check who writes there, then re-run "
        "`tokentape plan` (and `tokentape verify` the store)",
        path=url,
    )


class _SinkFailed(BaseException):
    """What a ``read_into`` sink raised, carried past the retries (not an ``Exception``)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def _hand_over(sink: Callable[[bytes], None], data: bytes) -> None:
    try:
        sink(data)
    except BaseException as exc:
        raise _SinkFailed(exc) from exc


def _stream_if_match(
    fs: Any, key: str, start: int, stop: int, etag: str, chunk_bytes: int
) -> Iterator[bytes]:
    """An S3 GET of bytes ``[start, stop)`` of ``key`` with ``If-Match: "etag"``, its body
    read in pieces of at most ``chunk_bytes`` (on fsspec's event loop; handed over here)."""
    from fsspec.asyn import sync

    bucket, path, _ = fs.split_path(key)
    request = {"Bucket": bucket, "Key": path, "IfMatch": f'"{etag}"'}
    request["Range"] = f"bytes={start}-{stop - 1}"
    response = sync(fs.loop, fs._call_s3, "get_object", **request)
    body = response["Body"]

    async def close() -> None:
        body.close()

    try:
        while data := sync(fs.loop, body.read, chunk_bytes):
            yield data
    finally:
        sync(fs.loop, close)


def _get_if_match(fs: Any, key: str, start: int | None, stop: int | None, etag: str) -> bytes:
    """An S3 GET of ``key`` (bytes ``[start, stop)``, or all) with ``If-Match: "etag"``."""
    from fsspec.asyn import sync

    bucket, path, _ = fs.split_path(key)
    request = {"Bucket": bucket, "Key": path, "IfMatch": f'"{etag}"'}
    if start is not None or stop is not None:
        request["Range"] = f"bytes={start or 0}-{'' if stop is None else stop - 1}"

    async def get() -> bytes:
        response = await fs._call_s3("get_object", **request)
        try:
            body: bytes = await response["Body"].read()
        finally:
            response["Body"].close()
        return body

    data: bytes = sync(fs.loop, get)
    return data


def _version(detail: Mapping[str, Any]) -> str:
    for key in ("ETag", "etag", "md5", "LastModified", "last_modified", "mtime"):
        if detail.get(key) is not None:
            return str(detail[key]).strip('"')
    return ""


def object_store(url: str, options: StorageOptions | None = None) -> ObjectStore:
    """The ``ObjectStore`` for ``url``'s scheme with ``options``."""
    match = _URL.match(url)
    if match is None:
        raise ArgumentError(f"'{url}' is not an object URL (scheme://bucket/key)")
    return ObjectStore(match.group(1).lower(), options)


__all__ = [
    "CHUNK_BYTES",
    "EXTRA_HINT",
    "PINNED_PROTOCOLS",
    "ObjectInfo",
    "ObjectStore",
    "Retry",
    "StorageOptions",
    "basename",
    "check_storage_options",
    "is_url",
    "join",
    "object_store",
    "parent",
    "parse_storage_options",
    "redact",
    "secret_keys",
]

"""Object URLs as tokenizer inputs: which objects a URL, prefix or glob names, and reading them.

The rules are those of local inputs (``tokenize.inputs``), with a prefix in place of a
directory:

- A URL naming an object is that object (it must have a supported suffix).
- Otherwise a URL is a prefix ("directory"): every object below ``URL/`` whose name ends in a
  supported suffix, sorted by its key relative to the prefix (plain string order); others are
  ignored.
- A URL holding ``*``, ``?`` or ``[`` that names no object is a glob, matched as Python's
  ``glob.glob(recursive=True)`` matches a local tree holding the same keys: a wildcard stays
  within one ``/``-separated component and skips names starting with ``.`` unless the pattern
  does; ``**`` spans "directories" (and a trailing ``**`` matches the prefix itself, as
  ``dir/**`` matches ``dir/`` locally). Matches are sorted, a matching prefix expands as above.
  The bucket must be named literally.

An object's identity is its size and version tag (ETag); ``version_number`` turns the tag into
the integer the driver keeps in the place of a local file's modification time, so a changed
object is a changed input on resume. Objects are streamed with ranged GETs
(``ObjectStore.open_reader``), never copied to disk first.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, BinaryIO

from tokentape._src.objects.client import ObjectInfo, ObjectStore, object_store, redact
from tokentape.errors import InputError

_GLOB_CHARS = frozenset("*?[")


def is_glob(text: str) -> bool:
    """Whether ``text`` holds a glob wildcard."""
    return bool(_GLOB_CHARS.intersection(text))


def version_number(version: str) -> int:
    """A stable non-negative 63-bit integer naming an object's version tag (0 for none)."""
    if not version:
        return 0
    return int.from_bytes(hashlib.sha256(version.encode("utf-8")).digest()[:8], "big") >> 1


def _store(url: str, options: Mapping[str, Any]) -> ObjectStore:
    return object_store(url, options)


def _split(url: str) -> tuple[str, str, str]:
    """(scheme, bucket, key) of ``url`` (the key without leading or trailing ``/``)."""
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    return scheme.lower(), bucket, key.strip("/")


@contextmanager
def _listing_errors(spec: str) -> Iterator[None]:
    """A missing bucket or a refused listing as one line naming the input."""
    try:
        yield
    except FileNotFoundError as exc:
        raise InputError(f"input '{spec}': no such bucket or object ({_reason(exc)})") from None
    except PermissionError as exc:
        raise InputError(f"input '{spec}': access denied ({_reason(exc)})") from None


def _reason(exc: BaseException) -> str:
    return redact(" ".join(str(exc).split()) or type(exc).__name__)


def expand_url(
    spec: str,
    options: Mapping[str, Any],
    supported: Callable[[str], bool],
    expected: str,
) -> list[tuple[str, ObjectInfo]]:
    """The objects ``spec`` names, in order, each as (its path for messages and the manifest,
    its listing). ``supported`` tells a supported name; ``expected`` lists the suffixes."""
    store = _store(spec, options)
    with _listing_errors(spec):
        found = store.info(spec)
        if found is not None:
            if not supported(spec):
                raise InputError(
                    f"input '{spec}': unsupported file type; expected one of {expected}"
                )
            return [(spec, ObjectInfo(store.canonical(spec), found.size, found.version))]
        if is_glob(spec):
            return [(i.url, i) for i in _expand_glob(store, spec, supported, expected)]
        listed = _below(store, spec)
    if not listed:
        raise InputError(f"input '{spec}': no such object or prefix")
    objects = [i for i in listed if supported(i.url)]
    if not objects:
        raise InputError(
            f"input '{spec}': prefix holds no supported object ({len(listed)} object(s)); "
            f"expected one of {expected}"
        )
    return [(i.url, i) for i in objects]


def _below(store: ObjectStore, prefix: str) -> list[ObjectInfo]:
    """Every object under ``prefix/``, sorted by key (so by key relative to the prefix);
    "directory" markers (keys ending in ``/``) left out."""
    return [i for i in store.find(prefix) if not i.url.endswith("/")]


def _expand_glob(
    store: ObjectStore, spec: str, supported: Callable[[str], bool], expected: str
) -> list[ObjectInfo]:
    scheme, bucket, key = _split(store.canonical(spec))
    if is_glob(bucket):
        raise InputError(f"input '{spec}': a glob cannot match bucket names; name the bucket")
    parts = key.split("/")
    literal = next(i for i, p in enumerate(parts) if is_glob(p))
    root = f"{scheme}://{bucket}" + "".join("/" + p for p in parts[:literal])
    base = f"{scheme}://{bucket}/"
    objects = _below(store, root)
    keys = {i.url.removeprefix(base): i for i in objects}
    dirs = {k.rpartition("/")[0] for k in keys}
    for d in list(dirs):
        while d:
            d = d.rpartition("/")[0]
            dirs.add(d)
    dirs.discard("")
    pattern = _pattern(parts)
    candidates = [*keys, *dirs]
    if parts[-1] == "**":  # 'dir/**' matches 'dir/' itself, as glob.glob does
        candidates += [d + "/" for d in dirs]
    matches = sorted(c for c in candidates if pattern.fullmatch(c))
    if not matches:
        raise InputError(f"input '{spec}': glob matched no objects")
    found: list[ObjectInfo] = []
    for match in matches:
        if match in keys:
            if supported(match):
                found.append(keys[match])
        else:
            inside = match.rstrip("/") + "/"
            found.extend(keys[k] for k in sorted(keys) if k.startswith(inside) and supported(k))
    if not found:
        raise InputError(
            f"input '{spec}': glob matched {len(matches)} object(s) or prefix(es) but no "
            f"supported object; expected one of {expected}"
        )
    return found


def _pattern(parts: list[str]) -> re.Pattern[str]:
    """A regular expression matching keys as ``glob.glob(recursive=True)`` matches paths."""
    out = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            visible = r"(?!\.)[^/]+"
            out.append(f"(?:{visible}(?:/{visible})*)?" if last else f"(?:{visible}/)*")
        else:
            out.append(_component(part) + ("" if last else "/"))
    return re.compile("".join(out), re.DOTALL)


def _component(part: str) -> str:
    """One path component of a glob: ``*``/``?``/``[...]`` within it; a wildcard component
    matches no hidden name unless it starts with ``.`` itself."""
    if not is_glob(part):
        return re.escape(part)
    out = [] if part.startswith(".") else [r"(?!\.)"]
    i = 0
    while i < len(part):
        c = part[i]
        i += 1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i
            if j < len(part) and part[j] == "!":
                j += 1
            if j < len(part) and part[j] == "]":
                j += 1
            j = part.find("]", j)
            if j < 0:
                out.append(re.escape("["))
                continue
            body = part[i:j].replace("\\", "\\\\")
            i = j + 1
            if body.startswith("!"):
                body = "^" + body[1:]
            elif body.startswith("^"):
                body = "\\" + body
            out.append(f"(?!/)[{body}]")
        else:
            out.append(re.escape(c))
    return "".join(out)


# --- reading


def check_unchanged(url: str, size: int, version: str, options: Mapping[str, Any]) -> None:
    """Refuse an object that is gone, or whose size or version tag changed since planning."""
    try:
        found = _store(url, options).info(url)
    except PermissionError as exc:
        raise InputError(f"{url}: access denied ({_reason(exc)})") from None
    if found is None:
        raise InputError(
            f"{url}: no longer exists (it did when the inputs were planned); re-run to plan again"
        )
    if found.size != size:
        raise InputError(
            f"{url}: size changed since the inputs were planned "
            f"({size} -> {found.size} bytes); re-run to plan again"
        )
    if version and found.version and found.version != version:
        raise InputError(
            f"{url}: changed since the inputs were planned (version {version} -> "
            f"{found.version}); re-run to plan again"
        )


def open_object(url: str, size: int, options: Mapping[str, Any], buffer_bytes: int) -> BinaryIO:
    """A seekable reader of the object (``size`` bytes): buffered, retried ranged GETs."""
    return _store(url, options).open_reader(url, size, max(1, buffer_bytes))


def read_object(url: str, size: int, options: Mapping[str, Any]) -> bytes:
    """The whole object (``size`` bytes, a shorter body retried)."""
    try:
        return _store(url, options).read_whole(url, size)
    except FileNotFoundError:
        raise InputError(f"{url}: no longer exists; re-run to plan again") from None
    except PermissionError as exc:
        raise InputError(f"{url}: access denied ({_reason(exc)})") from None


__all__ = [
    "check_unchanged",
    "expand_url",
    "is_glob",
    "open_object",
    "read_object",
    "version_number",
]

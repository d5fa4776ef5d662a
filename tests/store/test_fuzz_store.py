"""Fuzzing the readers of a store's untrusted bytes: ``manifest.json``, ``.idx.npy``, a
Megatron ``.idx``, a Megatron sidecar, and the tokenizer copy (and tokenizer files given by
path). Random mutations of valid files (bit flips, truncations, insertions, deletions, JSON
fields replaced by values of the wrong type or range, removed, added, nudged) must give a
``TokentapeError`` or a correct result: what is read is the store's own bytes, as its
(possibly edited but self-consistent) files describe them. Never another exception, never a
file outside the store.

``make fuzz`` runs these with many more examples (TOKENTAPE_HYPOTHESIS_PROFILE=fuzz).
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import write_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokentape._src.megatron import identity as megatron_identity
from tokentape._src.megatron.format import MegatronWriter, idx_path, parse_header, read_index
from tokentape._src.megatron.source import MEGATRON, MegatronSource
from tokentape._src.store.format import MANIFEST_NAME
from tokentape._src.store.reader import Source
from tokentape._src.store.tokenizers import Tokenizer, load_tokenizer
from tokentape._src.verify.stores import Target, check_megatron_target, check_store
from tokentape.errors import TokentapeError

pytestmark = pytest.mark.fuzz

FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SEQ_LEN = 5


# --- mutations ----------------------------------------------------------------------------------


def _position(n: int, head: int) -> st.SearchStrategy[int]:
    """A byte position in ``[0, n)``, half the time within the first ``head`` bytes."""
    return st.one_of(st.integers(0, max(0, min(n, head) - 1)), st.integers(0, max(0, n - 1)))


@st.composite
def mutated_bytes(draw: st.DrawFn, data: bytes, head: int = 64) -> bytes:
    """``data`` after one to three byte-level mutations (biased towards the header)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "overwrite"]))
        if not out:
            kind = "insert"
        i = draw(_position(len(out), head))
        if kind == "flip":
            out[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del out[i:]
        elif kind == "insert":
            out[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del out[i : i + draw(st.integers(1, 16))]
        else:
            blob = draw(st.binary(min_size=1, max_size=8))
            out[i : i + len(blob)] = blob
    return bytes(out)


SPECIAL_STRINGS = [
    "",
    "..",
    "../decoy/part-00000",
    "/etc/passwd",
    "part-00000",
    "part-00001",
    "part-00000/../part-00001",
    "tokenizer.json",
    "../tokenizer.json",
    "uint16",
    "uint32",
    "int64",
    "hf",
    "tiktoken",
    "bytes",
    "none",
    "<|endoftext|>",
    "sha256:",
    "0" * 64,
]
SPECIAL_INTS = [0, 1, -1, 2, 255, 256, 257, 2**16, 2**31, 2**32, 2**53, 2**63 - 1, 2**63, 2**64]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(SPECIAL_INTS),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(SPECIAL_STRINGS),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _nodes(value: Any, path: tuple = ()) -> Iterator[tuple]:
    """The path of every node below the root (dict keys and list indices)."""
    if isinstance(value, dict | list):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in items:
            yield (*path, key)
            yield from _nodes(child, (*path, key))


def _matches(path: tuple, pattern: tuple) -> bool:
    return len(path) == len(pattern) and all(
        p in (q, "*") for q, p in zip(path, pattern, strict=True)
    )


@st.composite
def mutated_json(
    draw: st.DrawFn, data: Any, extra: list[Any] | None = None, hot: tuple = ()
) -> Any:
    """``data`` with one to three fields replaced (wrong type, range, a nudged number, one of
    ``extra``), removed, or added; half the time a field matching one of the ``hot`` patterns
    (paths with ``"*"`` for any key)."""
    data = copy.deepcopy(data)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_nodes(data))
        if not paths:
            return draw(json_values)
        hot_paths = [q for q in paths if any(_matches(q, h) for h in hot)]
        if hot_paths and draw(st.booleans()):
            paths = hot_paths
        *parent_path, key = draw(st.sampled_from(paths))
        parent = data
        for step in parent_path:
            parent = parent[step]
        old = parent[key]
        op = draw(st.sampled_from(["replace", "nudge", "delete", "add", "pick"]))
        if op == "nudge" and type(old) is int:
            parent[key] = old + draw(st.integers(-3, 3))
        elif op == "delete":
            del parent[key]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(json_values)
        elif op == "pick" and extra:
            parent[key] = draw(st.sampled_from(extra))
        else:
            parent[key] = draw(json_values)
    return data


@st.composite
def mutated_json_text(
    draw: st.DrawFn, data: Any, extra: list[Any] | None = None, hot: tuple = ()
) -> bytes:
    """Either a JSON-level mutation of ``data`` or a byte-level one of its text."""
    text = json.dumps(data, indent=2).encode()
    if draw(st.booleans()):
        return json.dumps(draw(mutated_json(data, extra, hot))).encode()
    return draw(mutated_bytes(text, head=len(text)))


@contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def refused_or(check: Callable[[], None]) -> None:
    """Run ``check``: a ``TokentapeError`` is a fine outcome; any other exception fails."""
    try:
        check()
    except TokentapeError as exc:
        assert "\n" not in str(exc), str(exc)


# --- what a store serves, and what is correct -----------------------------------------------


def served(src: Source | MegatronSource) -> dict[str, Any]:
    """Everything a reader asks of an open source."""
    n = src.n_samples(SEQ_LEN)
    samples = np.arange(n)
    rows = np.zeros((n, SEQ_LEN + 1), dtype=np.int64)
    src.windows_into(samples, SEQ_LEN, rows)
    segment, position = np.zeros_like(rows), np.zeros_like(rows)
    src.segments_into(samples, SEQ_LEN, segment, position)
    return {
        "tokens": src.tokens(0, src.n_tokens).tolist(),
        "windows": rows.tolist(),
        "docs": [src.doc(i).tolist() for i in range(src.n_docs)],
        "spans": [src.doc_span(i) for i in range(src.n_docs)],
        "segments": (segment.tolist(), position.tolist()),
        "docs_in": [src.docs_in(k, SEQ_LEN) for k in range(n)],
    }


def check_consistent(view: dict[str, Any]) -> None:
    """The documents partition the tokens; each document is its span without the EOD."""
    tokens, spans = view["tokens"], view["spans"]
    assert [s for s, _ in spans] == [0, *[e for _, e in spans[:-1]]] if spans else not tokens
    if spans:
        assert spans[-1][1] == len(tokens)
    for (start, end), doc in zip(spans, view["docs"], strict=True):
        assert start < end and doc == tokens[start : end - 1]
    for k, row in enumerate(view["windows"]):
        assert row == tokens[k * SEQ_LEN : k * SEQ_LEN + SEQ_LEN + 1]


# --- a tokentape store --------------------------------------------------------------------------

DOCS = [[(11 * i + j) % 4000 for j in range(1 + (i * 7) % 13)] for i in range(30)]


@pytest.fixture(scope="module")
def hf_store(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer_json: Path) -> Path:
    """A store of several shards with a Hugging Face tokenizer copy, and beside it a decoy
    store of the same shape with other tokens (what a store reading outside itself would
    return)."""
    root = tmp_path_factory.mktemp("fuzz")
    tok = load_tokenizer(str(hf_tokenizer_json))
    write_store(root / "store", DOCS, shard_tokens=60, tok=tok)
    write_store(root / "decoy", [[t ^ 1 for t in d] for d in DOCS], shard_tokens=60, tok=tok)
    return root


def copy_store(root: Path, to: Path) -> Path:
    for name in ("store", "decoy"):
        shutil.copytree(root / name, to / name)
    return to / "store"


def test_fuzz_helpers_see_a_valid_store(hf_store: Path) -> None:
    view = served(Source(hf_store / "store"))
    check_consistent(view)
    assert view["docs"] == DOCS


NAMES = [
    "../decoy/part-00000",
    "../decoy/part-00001",
    "../decoy/tokenizer.json",
    "./part-00000",
    "part-00000/",
    "/etc/hostname",
    "part-00001",
    "part-00002",
    "..",
    "",
]
"""Names a hostile manifest may give its files (the decoy store is beside the store)."""
MANIFEST_HOT = (
    *[("shards", "*", key) for key in ("name", "n_tokens", "n_docs", "idx_bytes")],
    *[(key,) for key in ("dtype", "n_tokens", "n_docs", "format_version", "shards")],
    *[("tokenizer", key) for key in ("file", "kind", "eod_token", "eod_id", "fingerprint")],
)
"""Fields a reader acts on: where a mutation is most likely to matter."""
SIDECAR_HOT = (
    ("files", "*", "*"),
    *[("identity", key) for key in ("dtype", "n_tokens", "n_docs", "min_id", "max_id", "end_id")],
)


@functools.cache
def truth(store: Path) -> tuple[dict[str, Any], str]:
    """What the intact ``store`` serves, and the text of its first tokens."""
    return served(Source(store)), _decoded(Source(store))


def _decoded(src: Source) -> str:
    return src.decode(src.tokens(0, min(30, src.n_tokens)))


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzz_manifest(hf_store: Path, data: st.DataObject) -> None:
    original = json.loads((hf_store / "store" / MANIFEST_NAME).read_text())
    expected, decoded = truth(hf_store / "store")
    renamed = data.draw(st.booleans())
    if renamed:  # a shard (or the tokenizer copy) named outside, or renamed
        original = copy.deepcopy(original)
        shard = data.draw(st.sampled_from(original["shards"]))
        shard["name"] = data.draw(st.sampled_from(NAMES) | st.text(max_size=20))
        if data.draw(st.booleans()):
            original["tokenizer"]["file"] = data.draw(st.sampled_from(NAMES))
    text = json.dumps(original).encode()
    if not renamed or data.draw(st.booleans()):
        text = data.draw(mutated_json_text(original, SPECIAL_STRINGS + SPECIAL_INTS, MANIFEST_HOT))
    with scratch() as tmp:
        store = copy_store(hf_store, tmp)
        (store / MANIFEST_NAME).write_bytes(text)

        def check() -> None:
            src = Source(store)
            assert served(src) == expected  # the store's own tokens, never the decoy's
            with suppress(TokentapeError):  # a tokenizer block edited: refused, or the same
                assert _decoded(src) == decoded
            check_store(store)  # verify finds problems or none, and never crashes

        refused_or(check)


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzz_document_index(hf_store: Path, data: st.DataObject) -> None:
    manifest = json.loads((hf_store / "store" / MANIFEST_NAME).read_text())
    shard = data.draw(st.integers(0, len(manifest["shards"]) - 1))
    name = manifest["shards"][shard]["name"] + ".idx.npy"
    raw = (hf_store / "store" / name).read_bytes()
    mutated = data.draw(mutated_bytes(raw, head=140))
    keep_size = data.draw(st.booleans())  # else the manifest is told the new size
    tokens = truth(hf_store / "store")[0]["tokens"]
    with scratch() as tmp:
        store = copy_store(hf_store, tmp)
        (store / name).write_bytes(mutated)
        if not keep_size:
            manifest["shards"][shard]["idx_bytes"] = len(mutated)
            (store / MANIFEST_NAME).write_text(json.dumps(manifest))

        def check() -> None:
            view = served(Source(store))
            assert view["tokens"] == tokens
            check_consistent(view)

        refused_or(check)
        refused_or(lambda: check_store(store))


# --- tokenizer copies and tokenizer files --------------------------------------------------------


def small_ranks() -> bytes:
    tokens = [bytes([b]) for b in range(256)] + [b"ab", b"abc", b"  ", b"the", b"\n\n"]
    return b"".join(base64.b64encode(t) + b" %d\n" % r for r, t in enumerate(tokens))


@pytest.fixture(scope="module")
def tokenizer_stores(tmp_path_factory: pytest.TempPathFactory, hf_store: Path) -> Path:
    """``hf`` (the store above) and ``tiktoken`` (a small ranks file) stores."""
    root = tmp_path_factory.mktemp("tok")
    shutil.copytree(hf_store / "store", root / "hf")
    ranks = root / "small.tiktoken"
    ranks.write_bytes(small_ranks())
    tok = load_tokenizer(f"tiktoken:{ranks}")
    write_store(root / "tiktoken", [list(b"the abc") for _ in range(4)], 100, tok=tok)
    return root


@pytest.mark.slow
@FUZZ
@given(kind=st.sampled_from(["hf", "tiktoken"]), data=st.data())
def test_fuzz_tokenizer_copy(tokenizer_stores: Path, kind: str, data: st.DataObject) -> None:
    """A changed tokenizer copy is refused (the fingerprint covers its bytes) before it is
    parsed; the same bytes given by path load as a tokenizer or are one clear error."""
    name = "tokenizer.json" if kind == "hf" else "tokenizer.tiktoken"
    store = tokenizer_stores / kind
    original: Tokenizer = Source(store).tokenizer
    raw = (store / name).read_bytes()
    mutated = data.draw(mutated_bytes(raw, head=len(raw)))
    with scratch() as tmp:
        shutil.copytree(store, tmp / "s")
        (tmp / "s" / name).write_bytes(mutated)

        def from_store() -> None:
            tok = Source(tmp / "s").tokenizer
            assert mutated == raw and tok.fingerprint == original.fingerprint

        refused_or(from_store)
        spec = f"{kind}:{tmp / 's' / name}"

        def from_path() -> None:
            tok = load_tokenizer(spec)
            ids = tok.encode("the abc\n\nxyz")
            assert all(0 <= i < tok.vocab_size for i in ids)
            tok.decode(ids)

        refused_or(from_path)


# --- Megatron prefixes --------------------------------------------------------------------------

VOCAB, EOD_ID = 300, 299


@pytest.fixture(scope="module")
def megatron_prefix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A small Megatron dataset, with sidecars recorded at once (the racy window off) in a
    private cache directory."""
    root = tmp_path_factory.mktemp("mega")
    saved = megatron_identity.RACY_SECONDS, os.environ.get("TOKENTAPE_CACHE_DIR")
    megatron_identity.RACY_SECONDS = 0.0
    os.environ["TOKENTAPE_CACHE_DIR"] = str(root / "cache")
    try:
        writer = MegatronWriter(root / "d", "uint16")
        for i in range(25):
            doc = np.array([(7 * i + j) % EOD_ID for j in range(i % 6)] + [EOD_ID])
            writer.add(doc, np.array([len(doc)]))
        writer.finish()
        MegatronSource(root / "d", VOCAB, EOD_ID)  # records a sidecar
        yield root / "d"
    finally:
        megatron_identity.RACY_SECONDS = saved[0]
        if saved[1] is None:
            os.environ.pop("TOKENTAPE_CACHE_DIR", None)
        else:
            os.environ["TOKENTAPE_CACHE_DIR"] = saved[1]


@FUZZ
@given(head=st.binary(max_size=48), size=st.integers(0, 2**70))
def test_fuzz_megatron_header(head: bytes, size: int) -> None:
    refused_or(lambda: parse_header(Path("x.idx"), size, head))


@FUZZ
@given(data=st.data())
def test_fuzz_megatron_index(megatron_prefix: Path, data: st.DataObject) -> None:
    raw = idx_path(megatron_prefix).read_bytes()
    mutated = data.draw(mutated_bytes(raw, head=34))
    with scratch() as tmp:
        prefix = tmp / "d"
        shutil.copyfile(f"{megatron_prefix}.bin", f"{prefix}.bin")
        idx_path(prefix).write_bytes(mutated)

        def check() -> None:
            src = MegatronSource(prefix, VOCAB, EOD_ID)
            view = served(src)
            on_disk = np.fromfile(f"{prefix}.bin", dtype=src.index.dtype)
            assert view["tokens"] == on_disk.tolist()
            check_consistent(view)
            assert read_index(prefix).n_docs == src.n_docs

        refused_or(check)
        refused_or(lambda: verify_megatron(prefix, data.draw(st.booleans())))


def verify_megatron(prefix: Path, quick: bool) -> None:
    target = Target(prefix, str(prefix), kind=MEGATRON, vocab_size=VOCAB, eod_id=EOD_ID)
    check_megatron_target(target, quick=quick)


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzz_megatron_sidecar(megatron_prefix: Path, data: st.DataObject) -> None:
    """A damaged sidecar counts as absent or is refused; one that is still well formed
    vouches only for files with its keys, and the source served is the data's own."""
    sidecar = Path(f"{megatron_prefix}.tokentape.json")
    truth = MegatronSource(megatron_prefix, VOCAB, EOD_ID)
    expected, content = served(truth), truth.manifest.content_hash
    original = json.loads(sidecar.read_text())
    mutated = data.draw(mutated_json_text(original, SPECIAL_INTS, SIDECAR_HOT))
    sidecar.write_bytes(mutated)
    megatron_identity.read_sidecars(megatron_prefix)

    def check() -> None:
        src = MegatronSource(megatron_prefix, VOCAB, EOD_ID)
        assert served(src) == expected
        assert src.manifest.content_hash == content

    try:
        refused_or(check)
        sidecar.write_bytes(mutated)
        refused_or(lambda: verify_megatron(megatron_prefix, data.draw(st.booleans())))
    finally:
        sidecar.write_text(json.dumps(original))

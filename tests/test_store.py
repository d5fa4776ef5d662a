"""Shard writer and memory-mapped reader, against a plain in-memory model of the stream."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape import TokentapeError, open_source
from tokentape.store.atomic import write_atomic
from tokentape.store.format import (
    MANIFEST_NAME,
    Manifest,
    choose_dtype,
    content_hash,
    read_manifest,
)
from tokentape.store.writer import ShardWriter
from tokentape.tokenize.tokenizers import load_tokenizer, tokenizer_manifest

EOD = 256


def write_store(
    directory: Path, docs: list[list[int]], shard_tokens: int, block_bytes: int = 64
) -> Manifest:
    """Write ``docs`` (each followed by EOD) with the shard writer, plus a manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(directory, "uint16", shard_tokens, block_bytes=block_bytes)
    # Feed in two calls to exercise appends that continue an open shard.
    half = len(docs) // 2
    for chunk in (docs[:half], docs[half:]):
        if chunk:
            flat = np.array([t for d in chunk for t in [*d, EOD]], dtype=np.int64)
            writer.add(flat, np.array([len(d) + 1 for d in chunk]))
    shards = writer.finish()
    manifest = Manifest(
        dtype="uint16",
        vocab_size=257,
        eod_id=EOD,
        tokenizer=tokenizer_manifest(load_tokenizer("bytes")),
        shards=tuple(shards),
        n_tokens=sum(s.n_tokens for s in shards),
        n_docs=sum(s.n_docs for s in shards),
        content_hash=content_hash(shards, "uint16"),
        filters={},
        inputs={},
        job="test",
        created_by="test",
    )
    write_atomic(directory / MANIFEST_NAME, manifest.to_json().encode())
    return manifest


docs_strategy = st.lists(
    st.lists(st.integers(0, 255), min_size=0, max_size=40), min_size=1, max_size=30
)


@settings(max_examples=60, deadline=None)
@given(docs=docs_strategy, shard_tokens=st.integers(1, 120), seq_len=st.integers(1, 50))
def test_reader_matches_the_concatenated_stream(docs, shard_tokens, seq_len):
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_store(Path(tmp) / "s", docs, shard_tokens)
        src = open_source(Path(tmp) / "s")
        stream = [t for d in docs for t in [*d, EOD]]
        starts = np.cumsum([0] + [len(d) + 1 for d in docs])[:-1]
        assert src.n_tokens == len(stream) and src.n_docs == len(docs)
        assert list(src.tokens(0, src.n_tokens)) == stream
        for i, d in enumerate(docs):
            assert list(src.doc(i)) == d
        # Shards hold whole documents and stay within the target unless one document is larger.
        for s in manifest.shards:
            assert s.n_tokens <= shard_tokens or s.n_docs == 1
        n = (len(stream) - 1) // seq_len
        assert src.n_samples(seq_len) == max(n, 0)
        for k in range(n):
            lo, hi = k * seq_len, k * seq_len + seq_len + 1
            assert list(src.window(k, seq_len)) == stream[lo:hi]
            ends = [*starts[1:], len(stream)]
            expected = [i for i in range(len(docs)) if starts[i] < hi and ends[i] > lo]
            assert src.docs_in(k, seq_len) == expected


def test_hashes_match_the_files(tmp_path):
    rng = np.random.default_rng(0)
    docs = [list(rng.integers(0, 256, size=int(rng.integers(1, 300)))) for _ in range(50)]
    manifest = write_store(tmp_path / "s", docs, shard_tokens=1000, block_bytes=100)
    assert len(manifest.shards) > 2
    for s in manifest.shards:
        data = (tmp_path / "s" / s.bin_file).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s.bin_sha256
        blocks = [hashlib.sha256(data[i : i + 100]).hexdigest() for i in range(0, len(data), 100)]
        assert list(s.block_sha256) == blocks
        idx = (tmp_path / "s" / s.idx_file).read_bytes()
        assert hashlib.sha256(idx).hexdigest() == s.idx_sha256
        assert len(idx) == s.idx_bytes
        starts = np.load(tmp_path / "s" / s.idx_file, allow_pickle=False)
        assert starts.dtype == np.int64 and starts[0] == 0 and np.all(np.diff(starts) > 0)
    # The manifest reads back to the same value.
    assert read_manifest(tmp_path / "s") == manifest


def test_window_spans_a_shard_boundary(tmp_path):
    docs = [[1] * 9, [2] * 9, [3] * 9]  # 10 tokens each with EOD; one document per shard
    manifest = write_store(tmp_path / "s", docs, shard_tokens=10)
    assert [s.n_tokens for s in manifest.shards] == [10, 10, 10]
    src = open_source(tmp_path / "s")
    assert list(src.window(1, 8)) == [1, EOD] + [2] * 7  # tokens 8..16
    assert src.docs_in(1, 8) == [0, 1]


def test_open_refuses_a_truncated_shard(tmp_path):
    write_store(tmp_path / "s", [[5] * 100], shard_tokens=1000)
    shard = tmp_path / "s" / "part-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(TokentapeError, match=r"part-00000\.bin: size is 200 bytes.*202"):
        open_source(tmp_path / "s")


def test_open_refuses_an_incomplete_store(tmp_path):
    (tmp_path / "s").mkdir()
    with pytest.raises(TokentapeError, match=r"no manifest\.json"):
        open_source(tmp_path / "s")
    with pytest.raises(TokentapeError, match="no such directory"):
        open_source(tmp_path / "missing")


def test_manifest_validation_names_the_field(tmp_path):
    write_store(tmp_path / "s", [[1, 2]], shard_tokens=10)
    path = tmp_path / "s" / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["n_docs"] = "one"
    path.write_text(json.dumps(data))
    with pytest.raises(TokentapeError, match="field 'n_docs' is str, expected int"):
        read_manifest(tmp_path / "s")
    data["n_docs"] = 1
    data["format_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(TokentapeError, match="format_version 99 is not supported"):
        read_manifest(tmp_path / "s")


@pytest.mark.parametrize(
    ("vocab", "dtype"),
    [(257, "uint16"), (65_536, "uint16"), (65_537, "uint32"), (128_256, "uint32")],
)
def test_dtype_rule(vocab, dtype):
    assert choose_dtype(vocab) == dtype


def test_decode_uses_the_stored_tokenizer(tmp_path):
    text = "héllo wörld"
    write_store(tmp_path / "s", [list(text.encode())], shard_tokens=100)
    src = open_source(tmp_path / "s")
    assert src.decode(src.doc(0)) == text


def _window_sums(args: tuple[str, int]) -> list[int]:
    directory, seq_len = args
    src = open_source(directory)
    return [
        int(src.window(k, seq_len).astype(np.int64).sum()) for k in range(src.n_samples(seq_len))
    ]


def test_many_processes_read_one_store_at_once(tmp_path):
    rng = np.random.default_rng(1)
    docs = [list(rng.integers(0, 256, size=int(rng.integers(1, 200)))) for _ in range(200)]
    write_store(tmp_path / "s", docs, shard_tokens=2000)
    expected = _window_sums((str(tmp_path / "s"), 64))
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(_window_sums, [(str(tmp_path / "s"), 64)] * 8)
    assert all(r == expected for r in results) and len(expected) > 100

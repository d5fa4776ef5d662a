"""Megatron interop with megatron-core itself (needs megatron-core and torch): datasets written
by its own IndexedDatasetBuilder are read in place, what `tokentape convert` writes is read by
its IndexedDataset, and the tests' builder (``helpers.build``, tokentape's own writer) writes
the very bytes megatron-core's builder writes, so that tests/megatron/test_megatron.py, which
runs without megatron-core, reads genuine Megatron files.

Expectations are derived from the documents the tests build (plain numpy), never from the code
under test.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    MEGATRON_DTYPES,
    Docs,
    build,
    check_reads_as,
    cli,
    flat_docs,
    random_docs,
    starts_of,
    stream_of,
    write_store,
)

from tokentape._src.megatron import identity as megatron_identity
from tokentape._src.megatron.source import MegatronSource
from tokentape._src.store.reader import Source

with warnings.catch_warnings():  # megatron-core warns that Apex / Transformer Engine are absent
    warnings.simplefilter("ignore")
    mcore = pytest.importorskip("megatron.core.datasets.indexed_dataset")
torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.megatron, pytest.mark.torch]


def core_build(prefix: Path, docs: Docs, dtype: type) -> None:
    """Write ``docs`` with megatron-core's builder, using both of its ways to add a document."""
    builder = mcore.IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for i, seqs in enumerate(docs):
        if i % 2:
            for s in seqs:
                builder.add_item(torch.from_numpy(np.asarray(s, dtype=np.int64)))
            builder.end_document()
        else:
            flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
            builder.add_document(flat.astype(np.int64), [len(s) for s in seqs])
    builder.finalize(f"{prefix}.idx")


@pytest.fixture(autouse=True)
def trusted_timestamps(monkeypatch):
    """As in test_megatron.py: files just written may have their identity recorded."""
    monkeypatch.setattr(megatron_identity, "RACY_SECONDS", 0.0)


# --- reading megatron-core's files in place ----------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "vocab"), MEGATRON_DTYPES, ids=[d.__name__ for d, _ in MEGATRON_DTYPES]
)
def test_reads_what_megatron_core_wrote(tmp_path, dtype, vocab):
    eod = vocab - 1
    docs = random_docs(int(vocab), 40, vocab, eod)
    prefix = tmp_path / "data_text_document"
    core_build(prefix, docs, dtype)
    src = MegatronSource(prefix, vocab, eod)
    check_reads_as(src, docs, dtype)
    # The peer agrees on what a document is: its sequences between two document indices.
    peer = mcore.IndexedDataset(str(prefix))
    assert np.array_equal(src.index.document_indices, peer.document_indices)
    for i in range(len(docs)):
        first, stop = peer.document_indices[i], peer.document_indices[i + 1]
        got = np.concatenate([peer[j] for j in range(first, stop)]).astype(np.int64)
        assert np.array_equal(got, flat_docs(docs)[i])


# --- convert: megatron-core reads what tokentape writes -----------------------------------------


def test_to_megatron_is_read_by_megatron_core(tmp_path, capsys):
    docs = [list(d[0][:-1]) for d in random_docs(11, 80, 257, 256, max_seqs=1)]
    write_store(tmp_path / "store", docs, shard_tokens=64)
    prefix = tmp_path / "out" / "web_text_document"
    code, out, _ = cli(capsys, "convert", "--to", "megatron", tmp_path / "store", prefix, "--json")
    assert code == 0 and json.loads(out)["n_docs"] == len(docs)
    peer = mcore.IndexedDataset(str(prefix))
    assert peer.index.dtype == np.uint16
    assert len(peer) == len(docs)
    assert np.array_equal(peer.document_indices, np.arange(len(docs) + 1))
    for i, doc in enumerate(docs):
        assert peer[i].tolist() == [*doc, 256]
    # Its identity was recorded while writing: reading it in place hashes nothing.
    assert MegatronSource(prefix, 257, 256).manifest.content_hash == json.loads(out)["content_hash"]
    assert json.loads(Path(f"{prefix}.tokentape.json").read_text())["identity"]["end_id"] == 256
    code, _, err = cli(capsys, "convert", "--to", "megatron", tmp_path / "store", prefix)
    assert code == 2 and "pass --overwrite" in err
    assert (
        cli(capsys, "convert", "--to", "megatron", tmp_path / "store", prefix, "--overwrite")[0]
        == 0
    )


def test_round_trips_keep_documents_tokens_and_the_content_hash(tmp_path, capsys):
    # Megatron (int32, documents of several sequences, ids above 65,535) -> tokentape.
    vocab, eod = 70_000, 0
    docs = random_docs(12, 60, vocab, eod)
    assert stream_of(docs).max() > 2**16
    core_build(tmp_path / "m", docs, np.int32)
    store = tmp_path / "store"
    args = ("--vocab-size", vocab, "--eod-id", eod, "--shard-mb", "0.0005")
    code, _, _ = cli(capsys, "convert", "--from", "megatron", tmp_path / "m", store, *args)
    assert code == 0
    src = Source(store)
    assert src.manifest.dtype == "uint32" and len(src.manifest.shards) > 1
    assert np.array_equal(src.tokens(0, src.n_tokens), stream_of(docs))
    assert np.array_equal(src.doc_starts, starts_of(docs))
    assert cli(capsys, "verify", store)[0] == 0
    # -> Megatron again (int32: the vocabulary needs it) -> read by megatron-core.
    code, _, _ = cli(capsys, "convert", "--to", "megatron", store, tmp_path / "again")
    assert code == 0
    peer = mcore.IndexedDataset(str(tmp_path / "again"))
    assert peer.index.dtype == np.int32
    assert [peer[i].tolist() for i in range(len(peer))] == [d.tolist() for d in flat_docs(docs)]
    # -> tokentape again: the very same store content.
    code, _, _ = cli(
        capsys, "convert", "--from", "megatron", tmp_path / "again", tmp_path / "s2", *args
    )
    assert code == 0
    assert Source(tmp_path / "s2").manifest.content_hash == src.manifest.content_hash


# --- the tests' own builder writes megatron-core's bytes ------------------------------------------


def builds() -> dict[str, tuple[Docs, type]]:
    """Documents as the tests without megatron-core build them: several sequences each (some
    empty), one sequence each (the writer's route), empty documents, none at all."""
    text = [b"hello world", b"", b"megatron"]
    return {
        **{d.__name__: (random_docs(int(v), 40, v, v - 1), d) for d, v in MEGATRON_DTYPES},
        "one sequence each": (random_docs(11, 30, 257, 256, max_seqs=1), np.uint16),
        "no eod": ([[np.frombuffer(t, dtype=np.uint8).astype(np.int64)] for t in text], np.uint16),
        "empty document": (
            [*random_docs(36, 5, 257, 256), [], *random_docs(37, 3, 257, 256)],
            np.uint16,
        ),
        "empty sequence": (
            [*random_docs(38, 4, 257, 256), [np.zeros(0, dtype=np.int64)]],
            np.int32,
        ),
        "one document": ([[np.array([256])]], np.uint16),
        "no document": ([], np.uint16),
    }


@pytest.mark.parametrize("case", list(builds()))
def test_the_tests_builder_writes_megatron_cores_bytes(tmp_path, case):
    docs, dtype = builds()[case]
    core_build(tmp_path / "core", docs, dtype)
    build(tmp_path / "ours", docs, dtype)
    for suffix in (".bin", ".idx"):
        ours = Path(f"{tmp_path / 'ours'}{suffix}").read_bytes()
        assert ours == Path(f"{tmp_path / 'core'}{suffix}").read_bytes(), suffix

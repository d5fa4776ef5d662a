"""Batch assembly: token windows equal the store's own per-sample windows, across shards."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import SIZES, small_shard_stores, write_docs

from tokentape._src.plan.plan import resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.store.reader import Source
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.train.batch import Batcher
from tokentape.errors import ArgumentError, TokentapeError


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("batch")
    small_shard_stores(path)
    return path


@pytest.mark.slow
def test_batch_windows_equal_the_stores_windows(root):
    plan = resolve_plan(load_plan_spec(root / "mix.toml"))
    assert all(len(Source(s.path).manifest.shards) > 3 for s in plan.sources)
    batcher = Batcher(plan, dtype=np.int32)
    stores = [Source(s.path) for s in plan.sources]  # opened apart from the batcher's
    rng = np.random.default_rng(0)
    for positions in (np.arange(0, 700), rng.integers(0, 10**6, 500), np.arange(10**9, 10**9 + 64)):
        b = batcher.batch(positions)
        assert b.tokens.shape == (positions.size, plan.seq_len + 1) and b.tokens.dtype == np.int32
        for i, (d, k) in enumerate(zip(b.source.tolist(), b.sample.tolist(), strict=True)):
            expected = stores[d].window(k, plan.seq_len)
            assert np.array_equal(b.tokens[i], expected)
        assert np.array_equal(b.inputs[:, 1:], b.targets[:, :-1])
    # Over the first 700 positions every source was read, some across shard boundaries.
    assert set(batcher.batch(np.arange(700)).source.tolist()) == {0, 1, 2}


def test_a_store_changed_after_planning_is_refused(root, tmp_path):
    shutil.copytree(root, tmp_path / "r")
    plan = resolve_plan(load_plan_spec(tmp_path / "r" / "mix.toml"))
    write_docs(tmp_path / "r" / "code.jsonl", "code", SIZES["code"], edit="?")
    config = TokenizeConfig(
        inputs=(str(tmp_path / "r" / "code.jsonl"),),
        out=str(tmp_path / "r" / "stores" / "code"),
        overwrite=True,
    )
    tokenize(config)
    with pytest.raises(TokentapeError, match=r"source 'code'\) changed since the plan was made"):
        Batcher(plan)


def test_segment_ids_and_positions_follow_the_documents(root):
    plan = resolve_plan(load_plan_spec(root / "mix.toml"))
    batcher = Batcher(plan, segments=True)
    b = batcher.batch(np.arange(0, 300))
    assert b.segment_ids is not None and b.doc_positions is not None
    seq_len = plan.seq_len
    stores = [Source(s.path) for s in plan.sources]
    for i, (d, k) in enumerate(zip(b.source.tolist(), b.sample.tolist(), strict=True)):
        src = stores[d]
        docs = src.docs_in(k, seq_len)
        assert b.segment_ids[i, 0] == 0 and b.segment_ids[i, -1] == len(docs) - 1
        for t in range(seq_len + 1):  # brute force: which document holds token t, and where
            token = k * seq_len + t
            doc = int(np.searchsorted(src.doc_starts, token, side="right")) - 1
            assert b.segment_ids[i, t] == docs.index(doc)
            assert b.doc_positions[i, t] == token - src.doc_starts[doc]
        seqlens = np.diff(b.cu_seqlens(i))
        assert seqlens.sum() == seq_len and len(seqlens) == len(set(b.segment_ids[i, :-1]))
    # Some windows hold several documents.
    assert int(b.segment_ids[:, -1].max()) >= 1


def test_positions_that_are_not_integers_are_refused(root):
    """Float positions were truncated (1.5 read position 1); the tape refuses them, so does
    the batcher."""
    batcher = Batcher(resolve_plan(load_plan_spec(root / "mix.toml")))
    with pytest.raises(ArgumentError, match="positions must be integers, got dtype float64"):
        batcher.batch(np.array([1.5, 2.0]))
    assert batcher.batch(np.array([1, 2], dtype=np.uint32)).positions.tolist() == [1, 2]

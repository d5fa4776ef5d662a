"""A beginning-of-document (BOS) token (issue 29, item 7): by default a document gets what the
tokenizer itself puts before a text (``add_bos_token`` of ``tokenizer_config.json``, else its
``tokenizer.json`` post-processor), ``--bos``/``--bos-token``/``--no-bos`` decide otherwise; the
manifest records it, ``verify`` checks it, a plan refuses stores that differ unless it says
``mixed_bos = true``, and replay counts it as the document's first token.

The expected tokens come from the Hugging Face ``tokenizers`` library itself
(``encode(text, add_special_tokens=...)``) and from how the test builds its tokenizer, never
from the code under test."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import tokenizers
from helpers import cli
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import models, pre_tokenizers, processors

import tokentape
from tokentape._src.tokenize import worker
from tokentape.errors import ArgumentError, InputError, PlanError

SPECIALS = ("<|endoftext|>", "<s>", "<|begin_of_text|>")
EOD, S, BEGIN = 0, 1, 2
BEGIN_TOKEN = SPECIALS[BEGIN]
WORDS = [f"w{k}" for k in range(20)]
DOCS = [" ".join(WORDS[(i * 7 + j) % 20] for j in range(3 + i % 5)) for i in range(60)]


def _tokenizer(template: str | None = None) -> tokenizers.Tokenizer:
    """A word-level tokenizer: the SPECIALS (ids 0, 1, 2), ``[UNK]``, then WORDS; with
    ``template``, a post-processor that puts that special token before a text (Llama 3)."""
    vocab = {name: i for i, name in enumerate((*SPECIALS, "[UNK]"))}
    vocab |= {w: len(vocab) + k for k, w in enumerate(WORDS)}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(SPECIALS))
    if template is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{template} $A", special_tokens=[(template, vocab[template])]
        )
    return tok


def _tok_dir(root, config: dict | None = None, template: str | None = None):
    root.mkdir(parents=True)
    _tokenizer(template).save(str(root / "tokenizer.json"))
    if config is not None:
        (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def _docs(path, docs=DOCS):
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def _stored(store) -> list[list[int]]:
    """Every document of the store, as its token ids."""
    src = tokentape.open_source(store)
    try:
        out = []
        for i in range(src.n_docs):
            a, b = src.doc_span(i)
            out.append(src.tokens(a, b).tolist())
        return out
    finally:
        src.close()


def _expected(tok: tokenizers.Tokenizer, bos: int | None, docs=DOCS) -> list[list[int]]:
    head = [] if bos is None else [bos]
    return [head + tok.encode(d, add_special_tokens=False).ids + [EOD] for d in docs]


def test_add_bos_token_in_the_config_puts_its_bos_token_first(tmp_path):
    tok_dir = _tok_dir(tmp_path / "tok", {"add_bos_token": True, "bos_token": "<s>"})
    out = tmp_path / "store"
    summary = tokentape.tokenize(_docs(tmp_path / "d.jsonl"), out, tokenizer=str(tok_dir))
    assert _stored(out) == _expected(_tokenizer(), S)
    assert summary.bos_id == S
    assert summary.tokenizer["bos_token"] == "<s>"
    assert "add_bos_token" in summary.tokenizer["bos_choice"]
    assert summary.n_tokens == sum(len(d) for d in _expected(_tokenizer(), S))
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["tokenizer"]["bos_id"], manifest["tokenizer"]["bos_token"]) == (S, "<s>")


def test_the_post_processor_bos_is_what_tokenizer_of_a_text_gives(tmp_path):
    """Llama 3's way: no add_bos_token, a template; each document is what the library gives
    for ``tokenizer(text)``, then the EOD."""
    tok_dir = _tok_dir(tmp_path / "tok", {"eos_token": "<|endoftext|>"}, template=BEGIN_TOKEN)
    out = tmp_path / "store"
    summary = tokentape.tokenize(_docs(tmp_path / "d.jsonl"), out, tokenizer=str(tok_dir))
    lib = _tokenizer(BEGIN_TOKEN)
    assert _stored(out) == [[*lib.encode(d).ids, EOD] for d in DOCS]
    assert summary.bos_id == BEGIN and "post-processor" in summary.tokenizer["bos_choice"]


def test_add_bos_token_false_wins_over_the_template_and_no_bos_over_both(tmp_path):
    docs = _docs(tmp_path / "d.jsonl")
    off = _tok_dir(tmp_path / "off", {"add_bos_token": False, "bos_token": "<s>"}, BEGIN_TOKEN)
    summary = tokentape.tokenize(docs, tmp_path / "a", tokenizer=str(off))
    assert summary.bos_id is None and _stored(tmp_path / "a") == _expected(_tokenizer(), None)
    on = _tok_dir(tmp_path / "on", {"add_bos_token": True, "bos_token": "<s>"})
    summary = tokentape.tokenize(docs, tmp_path / "b", tokenizer=str(on), bos=False)
    assert summary.bos_id is None and _stored(tmp_path / "b") == _expected(_tokenizer(), None)
    assert "bos_id" not in json.loads((tmp_path / "b" / "manifest.json").read_text())["tokenizer"]


def test_bos_without_a_named_token_takes_a_known_one_and_bos_token_names_it(tmp_path):
    docs = _docs(tmp_path / "d.jsonl")
    bare = _tok_dir(tmp_path / "bare")  # no config, no template: nothing by default
    assert tokentape.tokenize(docs, tmp_path / "none", tokenizer=str(bare)).bos_id is None
    summary = tokentape.tokenize(docs, tmp_path / "known", tokenizer=str(bare), bos=True)
    assert summary.bos_id == S and _stored(tmp_path / "known") == _expected(_tokenizer(), S)
    summary = tokentape.tokenize(
        docs, tmp_path / "named", tokenizer=str(bare / "tokenizer.json"), bos_token=BEGIN_TOKEN
    )
    assert summary.bos_id == BEGIN
    assert _stored(tmp_path / "named") == _expected(_tokenizer(), BEGIN)


def test_the_store_is_the_same_for_any_worker_count(tmp_path):
    tok_dir = _tok_dir(tmp_path / "tok", {"add_bos_token": True, "bos_token": "<s>"})
    many = [_docs(tmp_path / f"d{k}.jsonl", DOCS[k::3] * 40) for k in range(3)]
    hashes = {
        tokentape.tokenize(
            many, tmp_path / f"w{w}", tokenizer=str(tok_dir), workers=w, unit_mb=0.004
        ).content_hash
        for w in (1, 2)
    }
    assert len(hashes) == 1
    lib = _tokenizer()
    flat = [d for k in range(3) for d in DOCS[k::3] * 40]
    assert _stored(tmp_path / "w2") == _expected(lib, S, flat)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    bos=st.one_of(st.none(), st.integers(0, 300)),
    block=st.integers(1, 50),
)
def test_a_long_document_written_block_by_block_is_framed_the_same(counts, bos, block):
    """The two ways a unit's tokens are written (a batch at once; a long one block by block)
    give the documents framed as BOS, text, EOD."""
    rng = np.random.default_rng(len(counts))
    flat = rng.integers(0, 1000, size=sum(counts), dtype=np.uint32)
    counts_a = np.array(counts, dtype=np.int64)
    expected, start = [], 0
    for n in counts:
        expected += ([] if bos is None else [bos]) + flat[start : start + n].tolist() + [7]
        start += n
    assert worker.framed(flat, counts_a, 7, bos).tolist() == expected
    out = io.BytesIO()
    saved = worker.WRITE_BLOCK
    worker.WRITE_BLOCK = block  # below the batch's size: the block-by-block path
    try:
        worker._write_tokens(out, flat, counts_a, 7, bos, np.dtype("<u4"))
    finally:
        worker.WRITE_BLOCK = saved
    assert np.frombuffer(out.getvalue(), dtype="<u4").tolist() == expected


def test_refusals_are_one_line(tmp_path, capsys):
    docs = _docs(tmp_path / "d.jsonl")
    bare = _tok_dir(tmp_path / "bare")
    for args, words in [
        (["--bos-token", "<nope>", "--tokenizer", bare], "'<nope>' is not in its vocabulary"),
        (["--bos"], "the bytes tokenizer 'bytes' has no beginning-of-document token"),
        (["--bos-token", "<s>", "--no-bos", "--tokenizer", bare], "and --no-bos puts none"),
    ]:
        code, out, err = cli(capsys, "tokenize", docs, "--out", tmp_path / "x", *args)
        assert code == 2 and out == "" and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1 and words in err, err
        assert not (tmp_path / "x").exists()
    bad = _tok_dir(tmp_path / "bad", {"add_bos_token": "yes"})
    code, _, err = cli(capsys, "tokenize", docs, "--out", tmp_path / "x", "--tokenizer", bad)
    assert code == 2 and "add_bos_token is 'yes', not true or false" in err, err
    assert "--no-bos" in err
    unnamed = _tok_dir(tmp_path / "unnamed", {"add_bos_token": True})
    code, _, err = cli(capsys, "tokenize", docs, "--out", tmp_path / "x", "--tokenizer", unnamed)
    assert code == 2 and "add_bos_token is true but it names no bos_token" in err, err
    with pytest.raises(ArgumentError, match="bos_token names a token to put first and bos=False"):
        tokentape.tokenize(docs, tmp_path / "x", tokenizer=str(bare), bos=False, bos_token="<s>")
    with pytest.raises(InputError, match=r"--bos: tokenizer .* names no beginning-of-document"):
        no_known = tmp_path / "no_known"
        no_known.mkdir()
        vocab = {"<|endoftext|>": 0, "[UNK]": 1, "w0": 2}
        plain = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        plain.add_special_tokens(["<|endoftext|>"])
        plain.save(str(no_known / "tokenizer.json"))
        tokentape.tokenize(docs, tmp_path / "x", tokenizer=str(no_known), bos=True)


def test_a_rerun_with_another_bos_names_the_flag(tmp_path, capsys):
    docs = _docs(tmp_path / "d.jsonl")
    bare = _tok_dir(tmp_path / "bare")
    out = tmp_path / "store"
    assert cli(capsys, "tokenize", docs, "--out", out, "--tokenizer", bare)[0] == 0
    code, _, err = cli(capsys, "tokenize", docs, "--out", out, "--tokenizer", bare, "--bos")
    assert code == 2 and f"--bos: null -> {S}" in err and "--overwrite" in err, err


def test_info_and_the_summary_show_it(tmp_path, capsys):
    tok_dir = _tok_dir(tmp_path / "tok", {"add_bos_token": True, "bos_token": "<s>"})
    out = tmp_path / "store"
    code, text, err = cli(capsys, "tokenize", _docs(tmp_path / "d.jsonl"), "--out", out,
                          "--tokenizer", tok_dir)  # fmt: skip
    assert code == 0, err
    assert "start of document" in text and f"id {S} '<s>' (add_bos_token" in text, text
    code, text, err = cli(capsys, "info", out)
    assert code == 0 and f"beginning-of-document id {S} ('<s>')" in text, text


def _plan_toml(stores: dict, extra: str = "") -> str:
    sources = "".join(
        f'[[source]]\nname = "{name}"\npath = "{path}"\nweight = 1\nmax_repeats = 50\n'
        for name, path in stores.items()
    )
    return f"seq_len = 8\nseed = 3\ntotal_samples = 40\n{extra}\n{sources}"


def test_a_plan_refuses_stores_that_start_documents_differently(tmp_path, capsys):
    docs = _docs(tmp_path / "d.jsonl")
    with_bos = _tok_dir(tmp_path / "on", {"add_bos_token": True, "bos_token": "<s>"})
    without = _tok_dir(tmp_path / "off")
    tokentape.tokenize(docs, tmp_path / "a", tokenizer=str(with_bos))
    tokentape.tokenize(docs, tmp_path / "b", tokenizer=str(without))
    stores = {"a": tmp_path / "a", "b": tmp_path / "b"}
    spec = tmp_path / "p.toml"
    spec.write_text(_plan_toml(stores))
    code, out, err = cli(capsys, "plan", spec, "--out", tmp_path / "PLAN.json")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert (
        "source 'b' starts its documents with no beginning-of-document token, 'a' with "
        f"beginning-of-document id {S} ('<s>')"
        in err
        and "mixed_bos = true" in err
    ), err
    assert not (tmp_path / "PLAN.json").exists()
    spec.write_text(_plan_toml(stores, "mixed_bos = true"))
    code, _, err = cli(capsys, "plan", spec, "--out", tmp_path / "PLAN.json")
    assert code == 0, err
    tables = {
        name: {"path": str(path), "weight": 1, "max_repeats": 50} for name, path in stores.items()
    }
    with pytest.raises(PlanError, match="'b' starts its documents with no beginning"):
        tokentape.Plan.build(tables, seq_len=8, seed=3, total_samples=40)
    plan = tokentape.Plan.build(tables, seq_len=8, seed=3, total_samples=40, mixed_bos=True)
    assert [s.name for s in plan.sources] == ["a", "b"]
    spec.write_text(_plan_toml(stores, 'mixed_bos = "yes"'))
    code, _, err = cli(capsys, "plan", spec, "--out", tmp_path / "PLAN.json")
    assert code == 2 and "'mixed_bos' must be true or false" in err, err


def test_replay_counts_the_bos_as_its_documents_first_token(tmp_path):
    """Each replayed window is its source's tokens from sample * seq_len; a BOS id stands at
    every document start inside it, and nowhere else; the documents replay lists for it are
    exactly those whose tokens it holds."""
    tok_dir = _tok_dir(tmp_path / "tok", {"add_bos_token": True, "bos_token": "<s>"})
    store = tmp_path / "store"
    tokentape.tokenize(_docs(tmp_path / "d.jsonl"), store, tokenizer=str(tok_dir))
    plan = tokentape.Plan.build(
        {"web": {"path": str(store), "weight": 1, "max_repeats": 50}},
        seq_len=8, seed=3, total_samples=40,
    )  # fmt: skip
    src = tokentape.open_source(store)
    try:
        starts = [src.doc_span(d)[0] for d in range(src.n_docs)]
        ends = [src.doc_span(d)[1] for d in range(src.n_docs)]
        for step_index in range(3):
            step = tokentape.replay(plan, step_index, global_batch=4)
            for i in range(step.batch.positions.size):
                lo = int(step.batch.sample[i]) * 8
                window = step.batch.tokens[i]
                assert window.tolist() == src.tokens(lo, lo + 9).tolist()
                inside = [a - lo for a in starts if lo <= a < lo + 9]
                assert np.flatnonzero(window == S).tolist() == inside
                held = [d for d in range(src.n_docs) if starts[d] < lo + 9 and ends[d] > lo]
                assert list(range(int(step.doc_first[i]), int(step.doc_last[i]) + 1)) == held
    finally:
        src.close()


def test_verify_finds_documents_that_do_not_start_with_the_recorded_bos(tmp_path, capsys):
    docs = _docs(tmp_path / "d.jsonl")
    tok_dir = _tok_dir(tmp_path / "tok", {"add_bos_token": True, "bos_token": "<s>"})
    good = tmp_path / "good"
    tokentape.tokenize(docs, good, tokenizer=str(tok_dir))
    code, _, err = cli(capsys, "verify", good)
    assert code == 0, err
    bare = tmp_path / "bare"  # a store without BOS whose manifest now claims one
    tokentape.tokenize(docs, bare, tokenizer=str(_tok_dir(tmp_path / "t2")))
    manifest = json.loads((bare / "manifest.json").read_text())
    manifest["tokenizer"] |= {"bos_id": S, "bos_token": "<s>"}
    (bare / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = cli(capsys, "verify", bare)
    assert code != 0
    assert "missing beginning-of-document id" in out + err, out + err
    assert f"{len(DOCS)} document(s) without it; first: document 0 starts at token 0" in out + err

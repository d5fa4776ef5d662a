"""A long document encoded in pieces gives the tokens of the whole document (issue 14 item 2),
for every tokenizer kind: checked against the tokenizer's own encoding of the whole text on
adversarial documents (long lines, no whitespace, unicode, repeated text), with pieces made
small so that a test text is cut many times."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tokenizers
from conftest import EOD, pydoc_texts
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import models, normalizers, pre_tokenizers, trainers

from tokentape._src.store.tokenizers import load_tokenizer
from tokentape._src.tokenize.pieces import can_cut, encode_documents, iter_pieces

PIECE = 64  # characters per piece in these tests: many cuts in a short text


def pieces(text: str, tok, piece_chars: int) -> list[str]:
    return list(iter_pieces(text, tok, piece_chars))


def _save(tok: tokenizers.Tokenizer, path: Path) -> Path:
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def wordpiece_json(tmp_path_factory) -> Path:
    """A WordPiece model over a whitespace pre-tokenizer with a lowercasing normalizer."""
    tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordPieceTrainer(vocab_size=2000, special_tokens=["[UNK]", EOD])
    tok.train_from_iterator(pydoc_texts(), trainer=trainer)
    return _save(tok, tmp_path_factory.mktemp("wp") / "tokenizer.json")


@pytest.fixture(scope="module")
def unigram_json(tmp_path_factory) -> Path:
    """A SentencePiece-like Unigram model over a metaspace pre-tokenizer."""
    tok = tokenizers.Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=1500, special_tokens=[EOD], unk_token=EOD)
    tok.train_from_iterator(pydoc_texts(), trainer=trainer)
    return _save(tok, tmp_path_factory.mktemp("uni") / "tokenizer.json")


@pytest.fixture(scope="module")
def tokenizers_by_kind(hf_tokenizer_json, gpt2_tiktoken, wordpiece_json, unigram_json) -> dict:
    return {
        "bytes": load_tokenizer("bytes"),
        "tiktoken": load_tokenizer(f"tiktoken:{gpt2_tiktoken}"),
        "hf-bytelevel-bpe": load_tokenizer(str(hf_tokenizer_json)),
        "hf-wordpiece": load_tokenizer(str(wordpiece_json), eod_token=EOD),
        "hf-unigram-metaspace": load_tokenizer(str(unigram_json), eod_token=EOD),
    }


KINDS = ["bytes", "tiktoken", "hf-bytelevel-bpe", "hf-wordpiece", "hf-unigram-metaspace"]
ALPHABET = "abcxyzAZéжш中文 \n\t0123456789.,;'\"-!?()"
documents = st.text(st.sampled_from(ALPHABET), min_size=0, max_size=700)


def whole(tok, text: str) -> list[int]:
    flat, _ = tok.encode_flat([text])
    return flat.tolist()


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=60, deadline=None)
@given(text=documents)
def test_pieces_give_the_tokens_of_the_whole_document(tokenizers_by_kind, kind, text):
    tok = tokenizers_by_kind[kind]
    flat, counts = encode_documents(tok, ["short", text, "x"], piece_chars=PIECE)
    expected = [whole(tok, t) for t in ("short", text, "x")]
    assert counts.tolist() == [len(e) for e in expected]
    assert flat.tolist() == [i for e in expected for i in e]


ADVERSARIAL = {
    "long line without whitespace": "abcdefghij" * 200,
    "digits and punctuation only": "1234567890.,;!?" * 100,
    "unicode words": " ".join(["héllo", "жизнь", "中文字", "naïve", "Ωmega"] * 80),
    "repeated text": "the same sentence again and again. " * 60,
    "spaces runs": "a  b   c    d " * 120,
    "newlines and tabs": "line one\nline two\t tab\n\n" * 80,
    "contractions": "it's we'll they'd you're I'm can't " * 60,
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_documents(tokenizers_by_kind, kind, name):
    tok = tokenizers_by_kind[kind]
    text = ADVERSARIAL[name]
    parts = pieces(text, tok, PIECE)
    assert "".join(parts) == text
    got = np.concatenate([tok.encode_flat([p])[0] for p in parts]).tolist()
    assert got == whole(tok, text), [len(p) for p in parts]


@pytest.mark.parametrize("kind", KINDS)
def test_documents_with_spaces_between_letters_are_really_cut(tokenizers_by_kind, kind):
    tok = tokenizers_by_kind[kind]
    assert can_cut(tok)
    parts = pieces(ADVERSARIAL["repeated text"], tok, PIECE)
    assert len(parts) > 10 and all(len(p) >= PIECE for p in parts[:-1])
    if kind != "bytes":  # every cut just before a space between two letters
        assert all(p[0] == " " and p[1].isalpha() for p in parts[1:])


def test_a_tokenizer_that_prepends_or_has_spaced_added_tokens_is_not_cut(tmp_path):
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["some text " * 50], trainers.BpeTrainer(special_tokens=[EOD]))
    tok.normalizer = normalizers.Prepend("▁")
    prepends = load_tokenizer(str(_save(tok, tmp_path / "prepend.json")))
    assert not can_cut(prepends)
    assert pieces("some text " * 50, prepends, PIECE) == ["some text " * 50]
    tok.normalizer = None
    tok.add_tokens(["text some"])
    spaced = load_tokenizer(str(_save(tok, tmp_path / "spaced.json")))
    assert not can_cut(spaced)
    tok2 = tokenizers.Tokenizer(models.BPE())
    tok2.train_from_iterator(["some text " * 50], trainers.BpeTrainer(special_tokens=[EOD]))
    no_pre = load_tokenizer(str(_save(tok2, tmp_path / "nopre.json")))
    assert not can_cut(no_pre)  # no pre-tokenizer: the whole text is one pre-token

"""Tokenizer adapters: equal to the libraries they wrap, stable fingerprints, clear errors."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import tokenizers
from conftest import EOD, big_vocab_text, pydoc_texts
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.store.tokenizers import (
    GPT2_SPLIT_PATTERN,
    ByteTokenizer,
    HFTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    load_tokenizer,
    tokenizer_from_manifest,
    tokenizer_manifest,
)
from tokentape.errors import TokentapeError

DOCS = [
    "",
    " ",
    "Hello world",
    "Hello world\n",
    "  leading and trailing  ",
    "tabs\tand\r\nwindows line ends\r\n",
    "many     spaces\n\n\n\n   \t\t  and blank lines\n\n",
    "naïve café — “quotes” ‘single’ …",
    "日本語のテキストと中文文本",
    "עברית ועربية mixed RTL",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷",
    "combining e\u0301 and zero\u200bwidth",
    "numbers 1234567890 3.14159 -42 1e10",
    "code: def f(x):\n    return x ** 2  # comment\n",
    f"a document that mentions {EOD} in its text",
    EOD,
    f"{EOD}{EOD}",
    "don't it's we're they've I'm you'll he'd",
    "x" * 5000,
    " " * 300 + "end",
    *pydoc_texts()[:40],
]

TEXT = st.text(
    alphabet=st.characters(codec="utf-8"),
    max_size=200,
) | st.lists(st.sampled_from(["<|endoftext|>", " ", "\n", "  ", "a", "é", "😀", "'s", "1"])).map(
    "".join
)


# --------------------------------------------------------------------------------------------
# helpers


def gpt2_reference(path: Path) -> tiktoken.Encoding:
    """A tiktoken Encoding built straight from the ranks file, independently of the adapter."""
    ranks = {}
    for line in path.read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(
        name="gpt2-reference",
        pat_str=GPT2_SPLIT_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={EOD: 50256},
    )


def one_line_error(excinfo: pytest.ExceptionInfo[TokentapeError]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def store_copy(tok: Tokenizer, store: Path) -> dict:
    """Copy the tokenizer into ``store`` as a store writer would; return the manifest block."""
    store.mkdir(parents=True, exist_ok=True)
    stored = tok.stored_file()
    if stored is not None:
        (store / stored[0]).write_bytes(stored[1])
    return json.loads(json.dumps(tokenizer_manifest(tok)))


@pytest.fixture(scope="module")
def hf(hf_tokenizer_json: Path) -> Tokenizer:
    return load_tokenizer(str(hf_tokenizer_json))


@pytest.fixture(scope="module")
def gpt2(gpt2_tiktoken: Path) -> Tokenizer:
    return load_tokenizer(f"tiktoken:{gpt2_tiktoken}")


# --------------------------------------------------------------------------------------------
# bytes


def test_bytes_tokenizer() -> None:
    tok = load_tokenizer("bytes")
    assert isinstance(tok, ByteTokenizer)
    assert (tok.kind, tok.vocab_size, tok.eod_id, tok.eod_token) == ("bytes", 257, 256, None)
    assert tok.encode("hé😀") == list("hé😀".encode())
    assert tok.decode([*tok.encode("hé"), 256, *tok.encode("!")]) == "hé!"
    assert tok.decode([0xFF, 0x41]) == "\ufffdA"
    assert tok.stored_file() is None
    assert tok.encode_batch(DOCS) == [list(d.encode()) for d in DOCS]


def test_lone_surrogates_become_replacement_char(hf: Tokenizer, gpt2: Tokenizer) -> None:
    for tok in (load_tokenizer("bytes"), hf, gpt2):
        assert tok.encode("x\ud800y") == tok.encode("x\ufffdy")
        assert tok.encode_batch(["x\udfffy"]) == [tok.encode("x\ufffdy")]


# --------------------------------------------------------------------------------------------
# Hugging Face


def test_hf_matches_library(hf: Tokenizer, hf_tokenizer_json: Path) -> None:
    assert isinstance(hf, HFTokenizer)
    assert (hf.kind, hf.eod_token, hf.vocab_size) == ("hf", EOD, 4000)
    raw = tokenizers.Tokenizer.from_file(str(hf_tokenizer_json))
    assert hf.eod_id == raw.token_to_id(EOD)
    plain = [d for d in DOCS if EOD not in d]
    expected = [raw.encode(d, add_special_tokens=False).ids for d in plain]
    assert hf.encode_batch(plain) == expected
    assert [hf.encode(d) for d in plain] == expected
    # Documents that spell the EOD token: the library, told to treat special tokens as text.
    raw.encode_special_tokens = True
    expected = [raw.encode(d, add_special_tokens=False).ids for d in DOCS]
    assert hf.encode_batch(DOCS) == expected
    for ids in expected:
        assert all(0 <= i < hf.vocab_size for i in ids)


def test_hf_eod_text_is_plain_text(hf: Tokenizer) -> None:
    for doc in (EOD, f"a {EOD} b", f"{EOD}{EOD}"):
        ids = hf.encode(doc)
        assert hf.eod_id not in ids
        assert hf.decode(ids) == doc
    assert hf.decode([hf.eod_id]) == EOD


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(TEXT, max_size=8))
def test_hf_roundtrip_and_batch(hf: Tokenizer, texts: list[str]) -> None:
    batch = hf.encode_batch(texts)
    assert batch == [hf.encode(t) for t in texts]
    for text, ids in zip(texts, batch, strict=True):
        assert hf.decode(ids) == text
        assert hf.eod_id not in ids


def test_hf_ignores_truncation_padding_and_templates(
    hf_tokenizer_json: Path, hf: Tokenizer, tmp_path: Path
) -> None:
    raw = tokenizers.Tokenizer.from_file(str(hf_tokenizer_json))
    raw.enable_truncation(8)
    raw.enable_padding(length=64)
    raw.post_processor = tokenizers.processors.TemplateProcessing(
        single=f"{EOD} $A {EOD}", special_tokens=[(EOD, hf.eod_id)]
    )
    path = tmp_path / "tokenizer.json"
    raw.save(str(path))
    tok = load_tokenizer(str(path))
    doc = pydoc_texts()[0]
    assert tok.encode(doc) == hf.encode(doc)
    assert len(tok.encode(doc)) > 64


def test_hf_prefix_and_explicit_eod(hf_tokenizer_json: Path, hf: Tokenizer) -> None:
    tok = load_tokenizer(f"hf:{hf_tokenizer_json}", eod_token=EOD)
    assert tok.spec == f"hf:{hf_tokenizer_json}"
    assert (tok.eod_id, tok.fingerprint) == (hf.eod_id, hf.fingerprint)


def test_hf_eod_candidates_in_order(tmp_path: Path) -> None:
    vocab = {"[UNK]": 0, "a": 1, "<eos>": 2, "</s>": 3}
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    path = tmp_path / "t.json"
    raw.save(str(path))
    tok = load_tokenizer(str(path))
    assert (tok.eod_token, tok.eod_id) == ("</s>", 3)
    assert load_tokenizer(str(path), eod_token="<eos>").eod_id == 2


def test_hf_non_special_eod_never_leaks(hf_tokenizer_json: Path, tmp_path: Path) -> None:
    raw = tokenizers.Tokenizer.from_file(str(hf_tokenizer_json))
    raw.add_tokens(["</s>"])  # an added token that is not special: text can produce it
    path = tmp_path / "tokenizer.json"
    raw.save(str(path))
    assert load_tokenizer(str(path)).encode("a</s>b") == raw.encode("a</s>b").ids
    tok = load_tokenizer(str(path), eod_token="</s>")
    assert tok.encode("plain text") == raw.encode("plain text").ids
    with pytest.raises(TokentapeError) as excinfo:
        tok.encode("a</s>b")
    assert one_line_error(excinfo) == (
        f"tokenizer {str(path)!r}: document text encodes to the end-of-document id 4000 "
        "('</s>' is not a special token); name a special token with --eod-token"
    )


def test_big_vocab(big_vocab_tokenizer_json: Path) -> None:
    tok = load_tokenizer(str(big_vocab_tokenizer_json))
    assert tok.vocab_size == 70_002
    assert (tok.eod_token, tok.eod_id) == (EOD, 0)
    ids = tok.encode(big_vocab_text())
    assert ids == [2, 65_536, 65_537, 70_001, 1]
    assert max(ids) > 65_535
    assert tok.decode(ids[:2]) == "w0 w65534"


@pytest.mark.subprocess
def test_hf_encode_batch_starts_no_threads(hf_tokenizer_json: Path) -> None:
    if not Path("/proc/self/task").is_dir():
        pytest.skip("needs /proc to count threads")
    # Threads are counted after imports (numpy's BLAS may start its own) and after loading;
    # the library's own encode_batch, run last, shows that the count does see a rayon pool.
    script = (
        "import os, sys\n"
        "from tokentape._src.store.tokenizers import load_tokenizer\n"
        "def threads(): return len(os.listdir('/proc/self/task'))\n"
        "tok = load_tokenizer(sys.argv[1])\n"
        "docs = ['some text to encode %d ' % i * 20 for i in range(3000)]\n"
        "before = threads()\n"
        "assert len(tok.encode_batch(docs)) == 3000\n"
        "after = threads()\n"
        "assert 'TOKENIZERS_PARALLELISM' not in os.environ\n"
        "tok.backend.encode_batch(docs)\n"
        "print(before, after, threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TOKENIZERS_PARALLELISM",)}
    result = subprocess.run(
        [sys.executable, "-c", script, str(hf_tokenizer_json)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    before, after, library = map(int, result.stdout.split())
    assert after == before
    assert library > before


# --------------------------------------------------------------------------------------------
# tiktoken (GPT-2)


def test_gpt2_basics(gpt2: Tokenizer) -> None:
    assert isinstance(gpt2, TiktokenTokenizer)
    assert (gpt2.kind, gpt2.eod_token, gpt2.eod_id, gpt2.vocab_size) == (
        "tiktoken",
        EOD,
        50256,
        50257,
    )
    # Well-known GPT-2 ids.
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode("!") == [0]
    assert gpt2.decode([15496, 995, 50256]) == f"Hello world{EOD}"


def test_gpt2_matches_reference(gpt2: Tokenizer, gpt2_tiktoken: Path) -> None:
    ref = gpt2_reference(gpt2_tiktoken)
    expected = [ref.encode(d, allowed_special=set(), disallowed_special=()) for d in DOCS]
    assert gpt2.encode_batch(DOCS) == expected
    assert [gpt2.encode(d) for d in DOCS] == expected
    for ids in expected:
        assert 50256 not in ids


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(TEXT, max_size=8))
def test_gpt2_roundtrip_and_batch(gpt2: Tokenizer, texts: list[str]) -> None:
    batch = gpt2.encode_batch(texts)
    assert batch == [gpt2.encode(t) for t in texts]
    for text, ids in zip(texts, batch, strict=True):
        assert gpt2.decode(ids) == text
        assert all(0 <= i < 50256 for i in ids)


def test_tiktoken_eod_name_must_be_its_token(gpt2_tiktoken: Path, gpt2: Tokenizer) -> None:
    """A ranks file has no special tokens: the only EOD a tiktoken tokenizer can have is the
    one tokentape adds (``<|endoftext|>`` at max rank + 1); any other name would be used for
    that id without being that token, so it is refused, naming it and what is accepted."""
    spec = f"tiktoken:{gpt2_tiktoken}"
    for name in ("<|eot|>", "<|im_end|>", "", "hello", " <|endoftext|>"):
        with pytest.raises(TokentapeError) as info:
            load_tokenizer(spec, eod_token=name)
        assert str(info.value) == (
            f"tokenizer {spec!r}: --eod-token {name!r} is not a token of this tiktoken ranks "
            "file; accepted: '<|endoftext|>' (the special token tokentape adds at max rank + 1), "
            "or leave --eod-token out"
        )
    tok = load_tokenizer(spec, eod_token=EOD)
    assert (tok.eod_token, tok.eod_id) == (EOD, 50256) == (gpt2.eod_token, gpt2.eod_id)
    assert tok.fingerprint == gpt2.fingerprint
    assert tok.decode([50256]) == EOD


def test_tiktoken_manifest_eod_name_checked(tmp_path: Path, gpt2: Tokenizer) -> None:
    info = store_copy(gpt2, tmp_path)
    for name in ("<|eot|>", None):
        with pytest.raises(TokentapeError, match=r"field tokenizer\.eod_token is"):
            tokenizer_from_manifest(info | {"eod_token": name}, tmp_path)


def small_ranks(extra: int = 0) -> bytes:
    """A valid ranks file: the 256 single bytes plus ``extra`` merged pairs."""
    tokens = [bytes([b]) for b in range(256)]
    tokens += [b"ab", b"abc", b"  ", b"the"][:extra]
    return b"".join(base64.b64encode(t) + b" %d\n" % r for r, t in enumerate(tokens))


def test_tiktoken_small_file(tmp_path: Path) -> None:
    path = tmp_path / "small.tiktoken"
    path.write_bytes(small_ranks(extra=2))
    tok = load_tokenizer(f"tiktoken:{path}")
    assert (tok.eod_id, tok.vocab_size) == (258, 259)
    assert tok.encode("abc ab") == [257, 32, 256]
    assert tok.decode(tok.encode("héllo 😀")) == "héllo 😀"


# --------------------------------------------------------------------------------------------
# fingerprints


def test_fingerprints(
    hf_tokenizer_json: Path, gpt2_tiktoken: Path, big_vocab_tokenizer_json: Path, tmp_path: Path
) -> None:
    hf1 = load_tokenizer(str(hf_tokenizer_json))
    copy = tmp_path / "copy.json"
    copy.write_bytes(hf_tokenizer_json.read_bytes())
    assert load_tokenizer(str(copy)).fingerprint == hf1.fingerprint  # content, not path
    assert load_tokenizer(str(hf_tokenizer_json)).fingerprint == hf1.fingerprint
    big = load_tokenizer(str(big_vocab_tokenizer_json))
    big_unk = load_tokenizer(str(big_vocab_tokenizer_json), eod_token="[UNK]")
    gpt2 = load_tokenizer(f"tiktoken:{gpt2_tiktoken}")
    small = tmp_path / "small.tiktoken"
    small.write_bytes(small_ranks(extra=1))
    small2 = tmp_path / "small2.tiktoken"
    small2.write_bytes(small_ranks(extra=2))
    prints = [
        t.fingerprint
        for t in (
            hf1,
            big,
            big_unk,
            gpt2,
            load_tokenizer("bytes"),
            load_tokenizer(f"tiktoken:{small}"),
            load_tokenizer(f"tiktoken:{small2}"),
        )
    ]
    assert len(set(prints)) == len(prints)
    for fp in prints:
        assert fp.startswith("sha256:") and len(fp) == 7 + 64
    assert load_tokenizer("bytes").fingerprint == ByteTokenizer().fingerprint


# --------------------------------------------------------------------------------------------
# errors


def test_unknown_spec(tmp_path: Path, monkeypatch) -> None:
    """A spec that is no file, directory or cached model name: one line saying what is
    expected (the directory and model-name cases are in test_tokenizer_specs.py)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    missing = str(tmp_path / "missing.json")
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(missing)
    assert one_line_error(excinfo) == (
        f"unknown tokenizer spec {missing!r}: no such file or directory; expected 'bytes', "
        "'tiktoken:PATH', a Hugging Face tokenizer.json or a directory holding one, or a model "
        "name in the local Hugging Face cache ([hf:]NAME)"
    )
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer("gpt2")
    assert one_line_error(excinfo).startswith(
        "unknown tokenizer spec 'gpt2': no such file or directory, and no tokenizer.json of "
        "model 'gpt2' in the local Hugging Face cache"
    )
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(str(empty))
    assert one_line_error(excinfo).startswith(
        f"tokenizer directory '{empty}': no tokenizer.json in it"
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("tiktoken:", "tokenizer spec 'tiktoken:': expected tiktoken:PATH"),
        ("hf:", "tokenizer spec 'hf:': expected hf:PATH"),
        ("tiktoken:/no/such/file", "tokenizer file '/no/such/file': not found"),
        ("hf:/no/such/tokenizer.json", "tokenizer file '/no/such/tokenizer.json': not found"),
    ],
)
def test_spec_errors(spec: str, expected: str) -> None:
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(spec)
    assert one_line_error(excinfo).startswith(expected)


def test_bytes_rejects_eod_token() -> None:
    with pytest.raises(TokentapeError, match="--eod-token '<x>': the bytes tokenizer"):
        load_tokenizer("bytes", eod_token="<x>")


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        (b"", "no ranks"),
        (b"not-base64! 0\n", "line 1: expected '<base64 token> <rank>'"),
        (small_ranks() + b"YWI=\n", "line 257: expected '<base64 token> <rank>'"),
        (small_ranks() + b"YWI= x\n", "line 257: expected '<base64 token> <rank>'"),
        (small_ranks() + b"YWI= -3\n", "line 257: expected '<base64 token> <rank>'"),
        (small_ranks() + b"YWI= 1 2\n", "line 257: expected '<base64 token> <rank>'"),
        (small_ranks() + b"QQ== 300\n", "line 257: token listed twice"),
        (small_ranks() + b"YWI= 5\n", "a rank is given to more than one token"),
        (small_ranks()[: small_ranks().index(b"\n") + 1], "255 of the 256 single bytes"),
    ],
)
def test_malformed_ranks(tmp_path: Path, content: bytes, detail: str) -> None:
    path = tmp_path / "bad.tiktoken"
    path.write_bytes(content)
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(f"tiktoken:{path}")
    message = one_line_error(excinfo)
    assert message.startswith(f"tiktoken ranks file '{path}': ")
    assert detail in message


def test_malformed_hf_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": ')
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(str(bad))
    assert one_line_error(excinfo).startswith(f"tokenizer file '{bad}': not valid JSON")
    other = tmp_path / "other.json"
    other.write_text('{"hello": "world"}')
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(str(other))
    assert one_line_error(excinfo).startswith(
        f"tokenizer file '{other}': not a Hugging Face tokenizer.json"
    )


def test_hf_eod_errors(tmp_path: Path, hf_tokenizer_json: Path) -> None:
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1}, "[UNK]"))
    path = tmp_path / "noeod.json"
    raw.save(str(path))
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(str(path))
    assert one_line_error(excinfo) == (
        f"tokenizer {str(path)!r}: no end-of-document token among <|endoftext|>, </s>, "
        "<|end_of_text|>, <eos>, <|eos|>; name one with --eod-token"
    )
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(str(hf_tokenizer_json), eod_token="</s>")
    assert one_line_error(excinfo) == (
        f"tokenizer {str(hf_tokenizer_json)!r}: --eod-token '</s>' is not in its vocabulary"
    )


def test_decode_refuses_out_of_range(hf: Tokenizer, gpt2: Tokenizer) -> None:
    for tok in (hf, gpt2, load_tokenizer("bytes")):
        with pytest.raises(TokentapeError, match="outside the vocabulary"):
            tok.decode([1, tok.vocab_size])
        with pytest.raises(TokentapeError, match="outside the vocabulary"):
            tok.decode([-1])


# --------------------------------------------------------------------------------------------
# manifest round trip


def test_manifest_roundtrip(
    tmp_path: Path, hf_tokenizer_json: Path, gpt2_tiktoken: Path, big_vocab_tokenizer_json: Path
) -> None:
    specs = [
        ("bytes", None),
        (str(hf_tokenizer_json), None),
        (f"hf:{big_vocab_tokenizer_json}", None),
        (f"tiktoken:{gpt2_tiktoken}", EOD),
    ]
    sample = f"Hello {EOD} wörld 😀 w1 w70000"
    for i, (spec, eod) in enumerate(specs):
        tok = load_tokenizer(spec, eod_token=eod)
        store = tmp_path / f"store{i}"
        info = store_copy(tok, store)
        assert set(info) == {
            "kind",
            "spec",
            "vocab_size",
            "eod_id",
            "eod_token",
            "fingerprint",
            "file",
        }
        assert info["spec"] == spec
        again = tokenizer_from_manifest(info, store)
        assert tokenizer_manifest(again) == info
        assert again.encode(sample) == tok.encode(sample)
        assert again.decode(tok.encode(sample)) == tok.decode(tok.encode(sample))


def test_manifest_refuses_changed_file(tmp_path: Path, hf: Tokenizer, gpt2: Tokenizer) -> None:
    for tok in (hf, gpt2):
        store = tmp_path / tok.kind
        info = store_copy(tok, store)
        name = info["file"]
        (store / name).write_bytes((store / name).read_bytes() + b"\n")
        with pytest.raises(TokentapeError) as excinfo:
            tokenizer_from_manifest(info, store)
        message = one_line_error(excinfo)
        assert message.startswith(f"{store / 'manifest.json'}: tokenizer fingerprint")
        assert "does not match" in message


def test_manifest_field_errors(tmp_path: Path, hf: Tokenizer) -> None:
    info = store_copy(hf, tmp_path)
    where = f"{tmp_path / 'manifest.json'}"
    cases = [
        ({"file": "../tokenizer.json"}, "field tokenizer.file is '../tokenizer.json'"),
        ({"kind": "sentencepiece"}, "field tokenizer.kind is 'sentencepiece'"),
        ({"eod_id": "7"}, "field tokenizer.eod_id missing or not int"),
        ({"fingerprint": "sha256:00"}, "tokenizer fingerprint sha256:00 does not match"),
        ({"vocab_size": 5}, "eod_id/vocab_size"),
    ]
    for change, detail in cases:
        with pytest.raises(TokentapeError) as excinfo:
            tokenizer_from_manifest({**info, **change}, tmp_path)
        message = one_line_error(excinfo)
        assert message.startswith(where) and detail in message
    with pytest.raises(TokentapeError, match=r"field tokenizer\.spec missing"):
        tokenizer_from_manifest({k: v for k, v in info.items() if k != "spec"}, tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(TokentapeError) as excinfo:
        tokenizer_from_manifest(info, tmp_path)
    assert one_line_error(excinfo).startswith(f"tokenizer file '{tmp_path / 'tokenizer.json'}'")
    assert "not found" in str(excinfo.value)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(texts=st.lists(st.text(max_size=60), max_size=8))
def test_encode_flat_is_encode_batch_concatenated(texts, hf_tokenizer_json, gpt2_tiktoken):
    for spec in ("bytes", str(hf_tokenizer_json), f"tiktoken:{gpt2_tiktoken}"):
        tok = load_tokenizer(spec)
        flat, counts = tok.encode_flat(texts)
        batch = tok.encode_batch(texts)
        assert flat.dtype == np.uint32 and counts.dtype == np.int64
        assert counts.tolist() == [len(ids) for ids in batch]
        assert flat.tolist() == [i for ids in batch for i in ids]


def test_hf_encode_batch_fast_path_gives_the_same_ids(hf_tokenizer_json, monkeypatch):
    tok = load_tokenizer(str(hf_tokenizer_json))
    texts = [*pydoc_texts()[:50], "bad \ud800 surrogate", "<|endoftext|> inside"]
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    slow = tok.encode_batch(texts)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    assert tok.encode_batch(texts) == slow == [tok.encode(t) for t in texts]

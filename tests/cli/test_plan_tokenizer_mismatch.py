"""`tokentape plan` of stores made by different tokenizers: refused in one line that names
what differs for each store (its tokenizer, vocabulary and end-of-document token), with
whatever a crafted manifest gives it escaped."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from cli_helpers import CORPUS, bpe_tokenizer, docs_jsonl, refusal, tok_dir
from helpers import PLAN, cli, one_line_refusal, write_docs

from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig


@pytest.fixture(scope="module")
def bpe_json(tmp_path_factory) -> Path:
    """A small byte-level BPE trained here, with <|endoftext|> (id 0) and </s> (id 1)."""
    return bpe_tokenizer(tmp_path_factory.mktemp("bpe"))


def test_tokenizer_mismatch_names_what_differs(tmp_path, bpe_json, capsys):
    mytok = tok_dir(tmp_path / "mytok", bpe_json, {"eos_token": "</s>"})
    docs = docs_jsonl(tmp_path / "d.jsonl", CORPUS[:20])
    base = ["tokenize", docs, "--tokenizer", f"{mytok}/"]
    assert cli(capsys, *base, "--out", tmp_path / "one")[0] == 0
    assert cli(capsys, *base, "--out", tmp_path / "two", "--eod-token", "<|endoftext|>")[0] == 0
    (tmp_path / "p.toml").write_text(
        "seq_len = 8\nseed = 1\ntotal_samples = 4\n"
        + "".join(
            f'[[source]]\nname = "{n}"\npath = "{tmp_path / n}"\nweight = 1\n'
            for n in ("one", "two")
        )
    )
    err = one_line_refusal(*cli(capsys, "plan", tmp_path / "p.toml"))
    found = re.search(r"'two' with (.*), 'one' with (.*); re-tokenize", err)
    assert found, err
    assert found[1] != found[2], err


def test_tokenizer_mismatch_escapes_a_crafted_spec(tmp_path, bpe_json, capsys):
    mytok = tok_dir(tmp_path / "mytok", bpe_json, {"eos_token": "</s>"})
    docs = docs_jsonl(tmp_path / "d.jsonl", CORPUS[:20])
    assert cli(capsys, "tokenize", docs, "--tokenizer", mytok, "--out", tmp_path / "one")[0] == 0
    two = tmp_path / "two"
    assert (
        cli(capsys, "tokenize", docs, "--tokenizer", mytok / "tokenizer.json", "--out", two)[0] == 0
    )
    manifest = json.loads((two / "manifest.json").read_text())
    manifest["tokenizer"]["spec"] = "evil\x1b]0;pwned\x07/"
    (two / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "p.toml").write_text(
        "seq_len = 8\nseed = 1\ntotal_samples = 4\n"
        + "".join(
            f'[[source]]\nname = "{n}"\npath = "{tmp_path / n}"\nweight = 1\n'
            for n in ("one", "two")
        )
    )
    err = one_line_refusal(*cli(capsys, "plan", tmp_path / "p.toml"))
    assert "another tokenizer" in err
    assert "\x1b" not in err and "\x07" not in err


@pytest.fixture
def mismatched(mixture_stores, tmp_path, hf_tokenizer_json) -> Path:
    """The shared stores, with 'math' re-tokenized by a BPE (EOD 0 '<|endoftext|>'): the plan
    file of a mixture of two tokenizers."""
    shutil.copytree(mixture_stores / "stores", tmp_path / "stores")
    shutil.rmtree(tmp_path / "stores" / "math")
    write_docs(tmp_path / "math.jsonl", "math", 15)
    tokenize(
        TokenizeConfig(
            inputs=(str(tmp_path / "math.jsonl"),),
            out=str(tmp_path / "stores" / "math"),
            tokenizer=str(hf_tokenizer_json),
        )
    )
    (tmp_path / "mix.toml").write_text(PLAN)
    return tmp_path / "mix.toml"


def test_the_tokenizer_mismatch_names_each_eod(mismatched, capsys):
    err = refusal(*cli(capsys, "plan", mismatched))
    assert "'math' with hf 'tokenizer.json' (vocabulary 4000) and EOD 0 '<|endoftext|>'" in err
    assert "'web' with bytes (vocabulary 257) and EOD 256" in err


def test_the_tokenizer_mismatch_escapes_a_crafted_eod_token_and_fingerprint(mismatched, capsys):
    manifest_file = mismatched.parent / "stores" / "math" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["tokenizer"]["eod_token"] = "x\n\x1b[2J"
    manifest["tokenizer"]["fingerprint"] = "sha256:\x1b]0;t\x07"
    manifest_file.write_text(json.dumps(manifest))
    err = refusal(*cli(capsys, "plan", mismatched))
    assert "another tokenizer" in err
    assert "EOD 0 'x\\n\\x1b[2J'" in err and "sha256:\\x1b]0;t\\x07" in err
    assert "\x1b" not in err and "\x07" not in err

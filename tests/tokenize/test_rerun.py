"""A tokenize rerun over a finished store with other settings or inputs is refused (without
--overwrite), and the refusal names what differs, by the flag that sets it."""

from __future__ import annotations

import re

import pytest
from helpers import cli


@pytest.fixture
def done(tmp_path, capsys):
    """A store of two JSONL files, made with the defaults."""
    for name, texts in (("a", ["hello world", "second doc"]), ("b", ["third one"])):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(f'{{"text": "{t}", "body": "{t}!"}}\n' for t in texts)
        )
    code, _, err = cli(
        capsys, "tokenize", tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--out", tmp_path / "st"
    )
    assert code == 0, err
    return tmp_path


def _refusal(capsys, root, *args):
    before = (root / "st" / "manifest.json").read_bytes()
    code, _, err = cli(capsys, "tokenize", *args, "--out", root / "st")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert (root / "st" / "manifest.json").read_bytes() == before  # nothing replaced
    return err


def test_the_same_job_again_is_not_refused(done, capsys):
    code, out, _ = cli(capsys, "tokenize", done / "a.jsonl", done / "b.jsonl", "--out", done / "st")
    assert code == 0 and "already complete" in out


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--filter", "unique-lines"], r'--filter: \[\] -> \[\{"name":"unique-lines"'),
        (["--text-key", "body"], r'--text-key: "text" -> "body"'),
        (["--dtype", "uint32"], r'--dtype: "uint16" -> "uint32"'),
        (["--unit-mb", "0.001"], r"--unit-mb: 1048576 -> 1048"),
    ],
)
def test_a_changed_setting_is_named(done, capsys, extra, named):
    err = _refusal(capsys, done, done / "a.jsonl", done / "b.jsonl", *extra)
    assert re.search(named, err), err
    assert "pass --overwrite to replace it" in err


def test_another_tokenizer_is_named(done, capsys, hf_tokenizer_json):
    err = _refusal(
        capsys, done, done / "a.jsonl", done / "b.jsonl", "--tokenizer", hf_tokenizer_json
    )
    assert f"--tokenizer: bytes -> {hf_tokenizer_json}" in err, err


def test_changed_inputs_are_named(done, capsys):
    err = _refusal(capsys, done, done / "a.jsonl")
    assert re.search(r"INPUT: -\S*b\.jsonl", err), err
    with open(done / "b.jsonl", "a") as f:
        f.write('{"text": "grown"}\n')
    err = _refusal(capsys, done, done / "a.jsonl", done / "b.jsonl")
    assert re.search(r"INPUT: \S*b\.jsonl \d+ -> \d+ bytes", err), err


def test_without_tokenizer_the_summary_says_it_made_a_byte_level_store(tmp_path, capsys):
    """The default stays the byte tokenizer (no file to fetch, every text tokenizes), and the
    summary says that it was the default and how to choose a model's tokenizer."""
    (tmp_path / "a.jsonl").write_text('{"text": "hi"}\n')
    code, out, err = cli(capsys, "tokenize", tmp_path / "a.jsonl", "--out", tmp_path / "st")
    assert code == 0, err
    assert "bytes, the default: a byte-level store" in out and "--tokenizer tokenizer.json" in out
    code, out, err = cli(
        capsys, "tokenize", tmp_path / "a.jsonl", "--out", tmp_path / "s2", "--tokenizer", "bytes"
    )
    assert code == 0, err
    assert "the default" not in out and re.search(r"tokenizer\s+bytes\n", out)

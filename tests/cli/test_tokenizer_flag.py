"""`tokentape tokenize --tokenizer` and `--eod-token`, as a new user and as a hostile one: a
``save_pretrained`` directory (its ``tokenizer_config.json`` read, or refused in one line when
crafted, never ignored), a model in the local Hugging Face cache (read through its links; a
name with path parts never reaches the cache; a cache variable at garbage is a miss naming
it), and an end-of-document token checked against the vocabulary. Nothing is written on a
refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_helpers import CORPUS, bpe_tokenizer, docs_jsonl, tok_dir
from helpers import cli, one_line_refusal, run_cli


@pytest.fixture(scope="module")
def bpe_json(tmp_path_factory) -> Path:
    """A small byte-level BPE trained here, with <|endoftext|> (id 0) and </s> (id 1)."""
    return bpe_tokenizer(tmp_path_factory.mktemp("bpe"))


# --- the README's Tokenize section, as a newcomer -------------------------------------------


def test_readme_tokenize_a_parquet_corpus_with_a_tokenizer_directory(tmp_path, bpe_json, capsys):
    """README: `tokentape tokenize data/web/ --out stores/web --tokenizer mytok/ --filter ...`
    then `tokentape info stores/web`, with a save_pretrained directory and parquet files."""
    mytok = tok_dir(tmp_path / "mytok", bpe_json, {"eos_token": "</s>"})
    web = tmp_path / "data" / "web"
    web.mkdir(parents=True)
    pq.write_table(pa.table({"text": CORPUS[:60]}), web / "part-0.parquet")
    pq.write_table(pa.table({"text": CORPUS[60:]}), web / "part-1.parquet")
    out = tmp_path / "stores" / "web"
    code, text, err = cli(
        capsys, "tokenize", f"{web}/", "--out", out, "--tokenizer", f"{mytok}/",
        "--filter", "unique-lines", "--filter", "min-tokens:16", "--workers", "2",
    )  # fmt: skip
    assert code == 0, err
    assert f"hf {mytok}/tokenizer.json" in text
    assert "id 1 '</s>' (the eos_token of tokenizer_config.json)" in text
    code, info, err = cli(capsys, "info", out)
    assert code == 0, err
    assert "end-of-document id 1" in info and "vocabulary 400 ids" in " ".join(info.split())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["eod_token"] == "</s>"
    assert (out / "tokenizer.json").read_bytes() == bpe_json.read_bytes()


# --- crafted tokenizer_config.json ------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"eos_token": "<nope>"}, "the eos_token '<nope>' of its tokenizer_config.json is not in"),
        ([1, 2], "expected a JSON object"),
        ('{"eos_token": ', "not valid JSON"),
        ("\udcff", "not valid JSON"),
        ({"eos_token": 7}, "eos_token is 7"),
        ({"eos_token": {"content": 7}}, "eos_token is 7"),
        ({"eos_token": ""}, "eos_token is ''"),
    ],
)
def test_a_bad_tokenizer_config_is_one_line_and_writes_nothing(
    tmp_path, bpe_json, capsys, config, words
):
    if config == "\udcff":
        d = tok_dir(tmp_path / "tok", bpe_json)
        (d / "tokenizer_config.json").write_bytes(b"\xff\xfe{")
    else:
        d = tok_dir(tmp_path / "tok", bpe_json, config)
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    err = one_line_refusal(
        *cli(capsys, "tokenize", docs, "--out", tmp_path / "o", "--tokenizer", d)
    )
    assert words in err
    assert not (tmp_path / "o").exists()


def test_an_added_token_eos_is_its_content(tmp_path, bpe_json, capsys):
    config = {"eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False}}
    d = tok_dir(tmp_path / "tok", bpe_json, config)
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    code, out, err = cli(capsys, "tokenize", docs, "--out", tmp_path / "o", "--tokenizer", d)
    assert code == 0, err
    assert "id 1 '</s>' (the eos_token of tokenizer_config.json)" in out


def test_a_config_eos_not_in_vocab_yields_to_a_named_eod_token(tmp_path, bpe_json, capsys):
    d = tok_dir(tmp_path / "tok", bpe_json, {"eos_token": "<nope>"})
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    code, out, err = cli(
        capsys, "tokenize", docs, "--out", tmp_path / "o", "--tokenizer", d,
        "--eod-token", "<|endoftext|>",
    )  # fmt: skip
    assert code == 0, err
    assert "id 0 '<|endoftext|>' (named by --eod-token)" in out


def test_a_dangling_tokenizer_config_is_refused_not_ignored(tmp_path, bpe_json, capsys):
    d = tok_dir(tmp_path / "tok", bpe_json)
    (d / "tokenizer_config.json").symlink_to(tmp_path / "gone.json")  # its blob was removed
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    err = one_line_refusal(
        *cli(capsys, "tokenize", docs, "--out", tmp_path / "o", "--tokenizer", d)
    )
    assert "tokenizer_config.json" in err
    assert not (tmp_path / "o").exists()


def test_an_added_token_eos_without_content_is_refused(tmp_path, bpe_json, capsys):
    d = tok_dir(tmp_path / "tok", bpe_json, {"eos_token": {"lstrip": False}})
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    err = one_line_refusal(
        *cli(capsys, "tokenize", docs, "--out", tmp_path / "o", "--tokenizer", d)
    )
    assert "eos_token" in err
    assert not (tmp_path / "o").exists()


def test_a_config_eos_with_a_lone_surrogate_is_one_line(tmp_path, bpe_json, capsys):
    d = tok_dir(tmp_path / "tok", bpe_json, '{"eos_token": "\\udcff"}')
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    err = one_line_refusal(
        *cli(capsys, "tokenize", docs, "--out", tmp_path / "o", "--tokenizer", d)
    )
    assert "eos_token" in err
    assert not (tmp_path / "o").exists()


# --- --eod-token ------------------------------------------------------------------------------


def test_eod_token_is_checked_against_the_vocabulary(tmp_path, bpe_json, capsys):
    d = tok_dir(tmp_path / "tok", bpe_json, {"eos_token": "</s>"})
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    err = one_line_refusal(
        *cli(capsys, "tokenize", docs, "--out", tmp_path / "o", "--tokenizer", d,
             "--eod-token", "<nope>")
    )  # fmt: skip
    assert "--eod-token '<nope>' is not in its vocabulary" in err
    assert not (tmp_path / "o").exists()


def test_a_non_utf8_eod_token_is_one_line(tmp_path, bpe_json, capsys):
    d = tok_dir(tmp_path / "tok", bpe_json, {"eos_token": "</s>"})
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    err = one_line_refusal(
        *cli(capsys, "tokenize", docs, "--out", tmp_path / "o", "--tokenizer", d,
             "--eod-token", "\udcff")
    )  # fmt: skip
    assert "--eod-token" in err
    assert not (tmp_path / "o").exists()


# --- model names from the local Hugging Face cache ------------------------------------------


def hub_model(cache: Path, repo: str, files: dict[str, bytes]) -> Path:
    """A model laid out as huggingface_hub caches it: snapshot links into blobs, refs/main."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    snap = folder / "snapshots" / ("c" * 40)
    snap.mkdir(parents=True)
    (folder / "blobs").mkdir()
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("c" * 40)
    for i, (name, data) in enumerate(files.items()):
        (folder / "blobs" / f"blob{i}").write_bytes(data)
        (snap / name).symlink_to(Path("../../blobs") / f"blob{i}")
    return snap


def test_a_cached_model_is_read_through_its_symlinks(tmp_path, bpe_json, capsys, monkeypatch):
    cache = tmp_path / "hub"
    config = json.dumps({"eos_token": "</s>"}).encode()
    snap = hub_model(
        cache,
        "org/mini",
        {"tokenizer.json": bpe_json.read_bytes(), "tokenizer_config.json": config},
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    code, out, err = cli(
        capsys, "tokenize", docs, "--out", tmp_path / "o", "--tokenizer", "org/mini"
    )
    assert code == 0, err
    assert f"hf {snap}/tokenizer.json" in out and "id 1 '</s>'" in out


@pytest.mark.parametrize(
    "spec", ["hf:org/../mini", "org/../mini", "hf:/org/mini", "../org/mini", "hf:a/b/c", "a/b/c"]
)
def test_a_model_name_with_path_parts_never_reaches_the_cache(
    tmp_path, bpe_json, capsys, monkeypatch, spec
):
    cache = tmp_path / "hub"
    hub_model(cache, "org/mini", {"tokenizer.json": bpe_json.read_bytes()})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    err = one_line_refusal(*cli(capsys, "tokenize", docs, "--out", "o", "--tokenizer", spec))
    assert "not found" in err or "unknown tokenizer spec" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("garbage", ["file", "dangling"])
def test_a_cache_variable_at_garbage_is_a_miss_naming_it(
    tmp_path, bpe_json, capsys, monkeypatch, garbage
):
    target = tmp_path / "not-a-cache"
    if garbage == "file":
        target.write_text("x")
    else:  # a cache whose tokenizer.json link lost its blob
        hub_model(target, "org/mini", {"tokenizer.json": b"{}"})
        (target / "models--org--mini" / "blobs" / "blob0").unlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(target))
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    err = one_line_refusal(
        *cli(capsys, "tokenize", docs, "--out", tmp_path / "o", "--tokenizer", "org/mini")
    )
    assert str(target) in err and "hf download org/mini" in err
    assert not (tmp_path / "o").exists()


def test_a_garbage_hf_hub_variable_is_one_line(tmp_path, bpe_json):
    cache = tmp_path / "hub"
    hub_model(cache, "org/mini", {"tokenizer.json": bpe_json.read_bytes()})
    docs = docs_jsonl(tmp_path / "d.jsonl", ["hello world"])
    r = run_cli(
        "tokenize", str(docs), "--out", str(tmp_path / "o"), "--tokenizer", "org/mini",
        env={"HF_HUB_CACHE": str(cache), "HF_HUB_ETAG_TIMEOUT": "abc"},
    )  # fmt: skip
    assert "Traceback" not in r.stderr, r.stderr[-500:]
    if r.returncode == 0:  # fixed by tolerating the variable: the model is read from the cache
        assert (tmp_path / "o" / "manifest.json").is_file()
    else:  # fixed by refusing it: one line, nothing written
        assert r.returncode == 2, r.stderr[-500:]
        assert r.stderr.startswith("tokentape: error: ") and r.stderr.count("\n") == 1
        assert not (tmp_path / "o").exists()

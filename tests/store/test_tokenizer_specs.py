"""Tokenizer specs: a ``save_pretrained`` directory, a model in the local Hugging Face cache
(never downloaded; a malformed ``HF_HUB_*`` variable is one line), the hints for a mistaken
spec, and the end-of-document choice each kind makes (checked against the vocabulary, printed
in the tokenize summary)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
import tokenizers
from conftest import EOD
from huggingface_hub.file_download import repo_folder_name
from store_helpers import tok_dir
from tokenizers import models, pre_tokenizers

import tokentape
from tokentape._src.program import main
from tokentape._src.store.tokenizers import (
    HF_EOD_CANDIDATES,
    HFTokenizer,
    eod_choice,
    hf_cache_dir,
    load_tokenizer,
    tokenizer_from_manifest,
    tokenizer_manifest,
)
from tokentape.errors import InputError, TokentapeError

REV_OLD = "a" * 40
REV_MAIN = "b" * 40


def one_line(excinfo: pytest.ExceptionInfo[TokentapeError]) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message, message
    assert isinstance(excinfo.value, InputError), repr(excinfo.value)
    return message


def word_tokenizer(path: Path, specials: tuple[str, ...] = (EOD, "</s>", "<|im_end|>")) -> Path:
    """A word-level tokenizer: the ``specials`` first (special tokens), then ``w0`` .. ``w49``."""
    vocab = {name: i for i, name in enumerate((*specials, "[UNK]"))}
    vocab |= {f"w{k}": len(vocab) + k for k in range(50)}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(specials))
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def pretrained_dir(root: Path, eos: object = "</s>", source: Path | None = None) -> Path:
    """A directory as ``save_pretrained`` writes it: tokenizer.json, tokenizer_config.json."""
    root.mkdir(parents=True, exist_ok=True)
    if source is None:
        word_tokenizer(root / "tokenizer.json")
    else:
        shutil.copyfile(source, root / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1024}
    if eos is not ...:
        config["eos_token"] = eos
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    (root / "special_tokens_map.json").write_text(json.dumps({"unk_token": "[UNK]"}))
    return root


def cache_model(cache: Path, repo_id: str, files: dict[str, bytes], revision: str) -> Path:
    """Put ``files`` in a Hugging Face hub cache the way ``huggingface_hub`` lays it out: blobs
    named by content hash, ``snapshots/<revision>/NAME`` links to them, ``refs/main``."""
    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("../../blobs") / blob.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a network connection fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # offline by construction, not by flag


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None) -> Path:
    """An empty hub cache in ``$HF_HUB_CACHE``; the working directory is elsewhere."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return cache


# --------------------------------------------------------------------------------------------
# a save_pretrained directory


def test_directory_takes_eos_token_from_its_config(tmp_path: Path) -> None:
    d = pretrained_dir(tmp_path / "mytok", eos="</s>")
    for spec in (str(d), f"{d}/", f"hf:{d}"):
        tok = load_tokenizer(spec)
        assert isinstance(tok, HFTokenizer)
        assert (tok.kind, tok.spec, tok.eod_token, tok.eod_id) == ("hf", spec, "</s>", 1)
        assert tok.path == d / "tokenizer.json"
        assert eod_choice(tok) == "1 '</s>' (the eos_token of tokenizer_config.json)"
    # The file alone reads no config: the first known candidate.
    alone = load_tokenizer(str(d / "tokenizer.json"))
    assert (alone.eod_token, alone.eod_id) == (EOD, 0)
    assert (
        eod_choice(alone)
        == f"0 '{EOD}' (the first of {', '.join(HF_EOD_CANDIDATES)} in its vocabulary)"
    )
    # A serialized AddedToken works as well as a string.
    (d / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": {"__type": "AddedToken", "content": "<|im_end|>"}})
    )
    assert load_tokenizer(str(d)).eod_id == 2
    # --eod-token wins over the config.
    named = load_tokenizer(str(d), eod_token="</s>")
    assert (named.eod_id, eod_choice(named)) == (1, "1 '</s>' (named by --eod-token)")


def test_directory_and_its_file_give_one_fingerprint_and_manifest(
    tmp_path: Path, hf_tokenizer_json: Path
) -> None:
    d = pretrained_dir(tmp_path / "bpe", eos=EOD, source=hf_tokenizer_json)
    by_dir = load_tokenizer(str(d))
    by_file = load_tokenizer(str(hf_tokenizer_json))
    assert (by_dir.eod_token, by_dir.eod_id) == (by_file.eod_token, by_file.eod_id) == (EOD, 0)
    assert by_dir.fingerprint == by_file.fingerprint
    assert (
        by_dir.stored_file()
        == by_file.stored_file()
        == (
            "tokenizer.json",
            hf_tokenizer_json.read_bytes(),
        )
    )
    dir_manifest, file_manifest = tokenizer_manifest(by_dir), tokenizer_manifest(by_file)
    assert dir_manifest.pop("spec") == str(d)
    assert file_manifest.pop("spec") == str(hf_tokenizer_json)
    assert dir_manifest == file_manifest
    assert dir_manifest["file"] == "tokenizer.json" and dir_manifest["kind"] == "hf"
    # A different EOD is a different tokenizer: another fingerprint.
    other = pretrained_dir(tmp_path / "w", eos="</s>")
    assert (
        load_tokenizer(str(other)).fingerprint
        != load_tokenizer(str(other / "tokenizer.json")).fingerprint
    )
    assert (
        load_tokenizer(str(other)).fingerprint
        == load_tokenizer(str(other / "tokenizer.json"), eod_token="</s>").fingerprint
    )


def test_directory_without_eos_token_uses_the_candidates(tmp_path: Path) -> None:
    for eos in (..., None):
        d = pretrained_dir(tmp_path / f"d{eos is None}", eos=eos)
        assert (load_tokenizer(str(d)).eod_token, load_tokenizer(str(d)).eod_id) == (EOD, 0)
    bare = tmp_path / "bare"
    word_tokenizer(bare / "tokenizer.json", specials=("</s>", EOD))
    assert load_tokenizer(str(bare)).eod_token == EOD  # no config: the candidates, in order


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            '{"eos_token": "<|eot_id|>"}',
            "the eos_token '<|eot_id|>' of its tokenizer_config.json is not in its "
            "tokenizer.json vocabulary; name one with --eod-token",
        ),
        ('{"eos_token": 7}', "eos_token is 7; expected a token string"),
        ('{"eos_token": ""}', "eos_token is ''; expected a token string"),
        ('{"eos_token": {"content": 3}}', "eos_token is 3; expected a token string"),
        ("{not json", "not valid JSON"),
        ('["eos_token"]', "expected a JSON object"),
    ],
)
def test_bad_config_is_one_line(tmp_path: Path, config: str, expected: str) -> None:
    d = pretrained_dir(tmp_path / "t")
    (d / "tokenizer_config.json").write_text(config)
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(str(d))
    assert expected in one_line(excinfo)
    # Naming the token reads no config at all.
    assert load_tokenizer(str(d), eod_token="</s>").eod_id == 1


def test_directory_without_tokenizer_json(tmp_path: Path, gpt2_tiktoken: Path) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    (d / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(str(d))
    assert one_line(excinfo) == (
        f"tokenizer directory '{d}': no tokenizer.json in it (what a Hugging Face fast "
        "tokenizer's save_pretrained writes)"
    )
    shutil.copyfile(gpt2_tiktoken, d / "gpt2.tiktoken")
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(str(d))
    assert one_line(excinfo).endswith(
        f"; for a tiktoken ranks file use --tokenizer tiktoken:{d / 'gpt2.tiktoken'}"
    )


def test_store_from_a_directory_reloads_from_its_copy(tmp_path: Path) -> None:
    d = pretrained_dir(tmp_path / "mytok", eos="</s>")
    corpus = tmp_path / "a.jsonl"
    corpus.write_text('{"text": "w1 w2 w3"}\n{"text": "w4 w5"}\n')
    out = tmp_path / "store"
    assert main(["tokenize", str(corpus), "--out", str(out), "--tokenizer", f"{d}/", "--json"]) == 0
    info = json.loads((out / "manifest.json").read_text())["tokenizer"]
    assert info == tokenizer_manifest(load_tokenizer(f"{d}/"))
    assert (info["spec"], info["eod_token"], info["eod_id"], info["file"]) == (
        f"{d}/",
        "</s>",
        1,
        "tokenizer.json",
    )
    assert (out / "tokenizer.json").read_bytes() == (d / "tokenizer.json").read_bytes()
    shutil.rmtree(d)  # the store needs only its own copy
    again = tokenizer_from_manifest(info, out)
    assert (again.fingerprint, again.eod_id, again.eod_token) == (info["fingerprint"], 1, "</s>")


# --------------------------------------------------------------------------------------------
# a model in the local Hugging Face cache


def test_model_name_from_the_cache(hf_cache: Path, tmp_path: Path) -> None:
    old = word_tokenizer(tmp_path / "old" / "tokenizer.json", specials=(EOD,))
    new = pretrained_dir(tmp_path / "new", eos="<|im_end|>")
    cache_model(hf_cache, "org/model-1.5", {"tokenizer.json": old.read_bytes()}, REV_OLD)
    files = {n: (new / n).read_bytes() for n in ("tokenizer.json", "tokenizer_config.json")}
    snapshot = cache_model(hf_cache, "org/model-1.5", files, REV_MAIN)
    # huggingface_hub itself reads this as a valid cache holding both revisions.
    scanned = huggingface_hub.scan_cache_dir(hf_cache)
    assert not scanned.warnings
    ((repo,),) = [list(scanned.repos)]
    assert repo.repo_id == "org/model-1.5"
    assert {r.commit_hash for r in repo.revisions} == {REV_OLD, REV_MAIN}
    for spec in ("org/model-1.5", "hf:org/model-1.5"):
        tok = load_tokenizer(spec)
        assert isinstance(tok, HFTokenizer)
        assert tok.path == snapshot / "tokenizer.json"  # refs/main's revision
        assert (tok.spec, tok.eod_token, tok.eod_id) == (spec, "<|im_end|>", 2)
        assert tok.fingerprint == load_tokenizer(str(new)).fingerprint
        assert tok.stored_file() == ("tokenizer.json", files["tokenizer.json"])
        assert tok.encode("w3 w4") == load_tokenizer(str(new)).encode("w3 w4")
    assert load_tokenizer("org/model-1.5", eod_token="</s>").eod_id == 1
    # A single-name model.
    cache_model(hf_cache, "gpt2", {"tokenizer.json": old.read_bytes()}, REV_OLD)
    assert load_tokenizer("gpt2").fingerprint == load_tokenizer(str(old)).fingerprint


def test_a_path_wins_over_a_model_name(hf_cache: Path, tmp_path: Path) -> None:
    cached = word_tokenizer(tmp_path / "c" / "tokenizer.json", specials=(EOD,))
    cache_model(hf_cache, "org/tok", {"tokenizer.json": cached.read_bytes()}, REV_MAIN)
    pretrained_dir(Path("org/tok"), eos="</s>")  # relative to the working directory
    assert load_tokenizer("org/tok").path == Path("org/tok/tokenizer.json")
    assert load_tokenizer("org/tok").eod_token == "</s>"


def test_cache_location_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None
) -> None:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hf_cache_dir() == tmp_path / "home/.cache/huggingface/hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_cache_dir() == tmp_path / "xdg/huggingface/hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    assert hf_cache_dir() == tmp_path / "hf-home/hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hf_cache_dir() == tmp_path / "hub"
    # Read at call time: a model cached under $HF_HOME/hub is found there.
    monkeypatch.delenv("HF_HUB_CACHE")
    tok = word_tokenizer(tmp_path / "t" / "tokenizer.json", specials=(EOD,))
    cache_model(tmp_path / "hf-home/hub", "org/x", {"tokenizer.json": tok.read_bytes()}, REV_MAIN)
    monkeypatch.chdir(tmp_path)
    assert load_tokenizer("hf:org/x").fingerprint == load_tokenizer(str(tok)).fingerprint


def test_model_not_in_the_cache_says_where_and_how(hf_cache: Path, tmp_path: Path) -> None:
    how = (
        f"in the local Hugging Face cache {hf_cache} (tokentape never downloads); make it "
        "available with `hf download {m} tokenizer.json tokenizer_config.json` (or point "
        "HF_HUB_CACHE at a cache that has it), or give the directory holding its tokenizer.json"
    )
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer("meta-llama/Llama-3.2-1B")
    assert one_line(excinfo) == (
        "unknown tokenizer spec 'meta-llama/Llama-3.2-1B': no such file or directory, and no "
        "tokenizer.json of model 'meta-llama/Llama-3.2-1B' "
        + how.replace("{m}", "meta-llama/Llama-3.2-1B")
    )
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer("hf:gpt2")
    assert one_line(excinfo) == (
        "tokenizer 'hf:gpt2': no tokenizer.json of model 'gpt2' " + how.replace("{m}", "gpt2")
    )
    # Cached, but without a tokenizer.json (a slow tokenizer's files only): the same answer.
    cache_model(hf_cache, "org/slow", {"vocab.json": b"{}", "merges.txt": b""}, REV_MAIN)
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer("org/slow")
    assert "no tokenizer.json of model 'org/slow' in the local Hugging Face cache" in one_line(
        excinfo
    )


def test_not_a_path_nor_a_model_name(hf_cache: Path, tmp_path: Path) -> None:
    for spec in (str(tmp_path / "missing.json"), "missing.json", "x:y", "a/b/c", "-"):
        with pytest.raises(TokentapeError) as excinfo:
            load_tokenizer(spec)
        assert one_line(excinfo) == (
            f"unknown tokenizer spec {spec!r}: no such file or directory; expected 'bytes', "
            "'tiktoken:PATH', a Hugging Face tokenizer.json or a directory holding one, or a "
            "model name in the local Hugging Face cache ([hf:]NAME)"
        )
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer("hf:" + "a" * 200)
    assert "not a Hugging Face model id" in one_line(excinfo)


# --------------------------------------------------------------------------------------------
# mistaken specs and the end-of-document token


def test_ranks_file_without_prefix_suggests_it(tmp_path: Path, gpt2_tiktoken: Path) -> None:
    renamed = tmp_path / "ranks.txt"  # recognized by its content too
    shutil.copyfile(gpt2_tiktoken, renamed)
    for path in (gpt2_tiktoken, renamed):
        for spec in (str(path), f"hf:{path}"):
            with pytest.raises(TokentapeError) as excinfo:
                load_tokenizer(spec)
            assert one_line(excinfo) == (
                f"tokenizer file '{path}': a tiktoken ranks file, not a Hugging Face "
                f"tokenizer.json; use --tokenizer tiktoken:{path}"
            )
    assert load_tokenizer(f"tiktoken:{renamed}").eod_id == 50256


def test_tokenizer_json_with_tiktoken_prefix_suggests_dropping_it(
    hf_tokenizer_json: Path,
) -> None:
    with pytest.raises(TokentapeError) as excinfo:
        load_tokenizer(f"tiktoken:{hf_tokenizer_json}")
    assert one_line(excinfo) == (
        f"tiktoken ranks file '{hf_tokenizer_json}': a JSON file, not a ranks file; for a "
        "Hugging Face tokenizer.json drop the 'tiktoken:' prefix"
    )


def test_eod_token_must_be_in_the_vocabulary(tmp_path: Path, gpt2_tiktoken: Path) -> None:
    d = pretrained_dir(tmp_path / "mytok")
    cases = [
        (str(d), f"tokenizer {str(d)!r}: --eod-token '<|nope|>' is not in its vocabulary"),
        (
            str(d / "tokenizer.json"),
            f"tokenizer {str(d / 'tokenizer.json')!r}: --eod-token '<|nope|>' is not in its "
            "vocabulary",
        ),
        (f"tiktoken:{gpt2_tiktoken}", "--eod-token '<|nope|>' is not a token of this tiktoken"),
        ("bytes", "--eod-token '<|nope|>': the bytes tokenizer has no named tokens"),
    ]
    for spec, expected in cases:
        with pytest.raises(TokentapeError) as excinfo:
            load_tokenizer(spec, eod_token="<|nope|>")
        assert expected in one_line(excinfo)


# --------------------------------------------------------------------------------------------
# the command line


def test_summary_prints_the_eod_id_and_token(
    tmp_path: Path, gpt2_tiktoken: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = pretrained_dir(tmp_path / "mytok", eos="</s>")
    corpus = tmp_path / "a.jsonl"
    corpus.write_text('{"text": "w1 w2 w3"}\n')
    cases = [
        (
            str(d),
            f"hf {d / 'tokenizer.json'}",
            "id 1 '</s>' (the eos_token of tokenizer_config.json)",
        ),
        (
            f"tiktoken:{gpt2_tiktoken}",
            f"tiktoken {gpt2_tiktoken}",
            "id 50256 '<|endoftext|>' (the special token tokentape adds to a ranks file, at max "
            "rank + 1)",
        ),
        ("bytes", "bytes", "id 256 (the byte tokenizer's, after the 256 byte ids)"),
    ]
    for i, (spec, source, eod) in enumerate(cases):
        out = tmp_path / f"s{i}"
        assert main(["tokenize", str(corpus), "--out", str(out), "--tokenizer", spec]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert f"  tokenizer          {source}" in lines
        assert f"  end of document    {eod}" in lines
        assert (
            main(["tokenize", str(corpus), "--out", str(out), "--tokenizer", spec, "--json"]) == 0
        )
        block = json.loads(capsys.readouterr().out)["tokenizer"]
        manifest = json.loads((out / "manifest.json").read_text())
        assert (block["eod_id"], block["eod_token"]) == (
            manifest["eod_id"],
            manifest["tokenizer"]["eod_token"],
        )
        assert (block["spec"], block["source"], "id " + block["eod_choice"]) == (spec, source, eod)
        summary = tokentape.tokenize(str(corpus), str(out), tokenizer=spec)  # the library's
        assert summary.status == "already complete" and summary.tokenizer == block


def test_bad_spec_on_the_command_line_is_one_line_exit_2(
    tmp_path: Path, gpt2_tiktoken: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "a.jsonl"
    corpus.write_text('{"text": "w1 w2 w3"}\n')
    d = pretrained_dir(tmp_path / "mytok")
    for extra, names in [
        (["--tokenizer", str(gpt2_tiktoken)], f"use --tokenizer tiktoken:{gpt2_tiktoken}"),
        (["--tokenizer", f"tiktoken:{gpt2_tiktoken}", "--eod-token", "hello"], "'hello'"),
        (["--tokenizer", str(d), "--eod-token", "<|nope|>"], "not in its vocabulary"),
        (["--tokenizer", str(tmp_path)], "no tokenizer.json in it"),
    ]:
        out = tmp_path / "out"
        assert main(["tokenize", str(corpus), "--out", str(out), *extra]) == 2
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tokentape: error: "), captured.err
        assert names in lines[0] and "Traceback" not in captured.err
        assert not out.exists()


def test_help_documents_each_kinds_end_of_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tokenize", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for needle in (
        "bytes built-in: the 256 byte ids; EOD = id 256",
        "EOD = <|endoftext|>, added at max rank + 1",
        "or a directory holding one (what save_pretrained writes)",
        "NAME, hf:NAME a model in the local Hugging Face cache",
        "never downloaded",
        "the eos_token of its tokenizer_config.json; else the first in the vocabulary of "
        + ", ".join(HF_EOD_CANDIDATES),
        "--eod-token must name a token of the vocabulary",
        "The summary prints the tokenizer file and the EOD id and token used",
    ):
        assert needle in text, needle


# --- huggingface_hub's environment --------------------------------------------------------------


def test_a_malformed_hf_hub_variable_is_one_line(tmp_path: Path) -> None:
    """huggingface_hub parses its HF_HUB_* variables at import, raising ValueError."""
    source = tok_dir(tmp_path / "t") / "tokenizer.json"
    cache = tmp_path / "hub"
    repo = cache / repo_folder_name(repo_id="org/mini", repo_type="model")
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / ("b" * 40)).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("b" * 40)
    data = source.read_bytes()
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.write_bytes(data)
    (repo / "snapshots" / ("b" * 40) / "tokenizer.json").symlink_to(blob)
    code = (
        "from tokentape._src.store.tokenizers import load_tokenizer\n"
        "from tokentape.errors import InputError\n"
        "try:\n"
        "    print(load_tokenizer('org/mini').eod_id)\n"
        "except InputError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    good = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert (good.returncode, good.stdout) == (0, "0\n"), good.stderr[-500:]
    env["HF_HUB_ETAG_TIMEOUT"] = "abc"
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert bad.returncode == 0, bad.stderr[-500:]
    assert bad.stdout.count("\n") == 1, bad.stdout
    assert "'org/mini'" in bad.stdout and "huggingface_hub cannot start" in bad.stdout
    assert "'abc'" in bad.stdout and "HF_HUB_*" in bad.stdout

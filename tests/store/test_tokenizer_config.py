"""A ``tokenizer_config.json`` beside a ``tokenizer.json`` is read or refused, never ignored: a
path of that name that is not a readable regular file (a dangling link, a directory, a FIFO) or
is over ``HF_CONFIG_MAX_BYTES``, an ``eos_token`` added token without content, and an
end-of-document token that is not valid text are each refused in one line. (A malformed
``HF_HUB_*`` variable, met when a model name is looked up in the local cache, is in
test_tokenizer_specs.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from store_helpers import tok_dir

from tokentape._src.store.tokenizers import HF_CONFIG_MAX_BYTES, load_tokenizer
from tokentape.errors import InputError


def one_line(excinfo: pytest.ExceptionInfo[InputError]) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message, message
    return message


# --- a config path that is not a readable regular file -----------------------------------------


def test_a_dangling_config_link_is_refused(tmp_path: Path) -> None:
    d = tok_dir(tmp_path / "t")
    (d / "tokenizer_config.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(InputError) as excinfo:
        load_tokenizer(str(d))
    message = one_line(excinfo)
    assert f"'{d / 'tokenizer_config.json'}'" in message and "dangling link" in message
    # Naming the token reads no config at all.
    assert load_tokenizer(str(d), eod_token="</s>").eod_id == 1


def test_a_config_link_to_a_file_is_followed(tmp_path: Path) -> None:
    """A Hugging Face cache snapshot links its files into blobs: such a link is read."""
    d = tok_dir(tmp_path / "t")
    blob = tmp_path / "blob"
    blob.write_text(json.dumps({"eos_token": "</s>"}))
    (d / "tokenizer_config.json").symlink_to(blob)
    tok = load_tokenizer(str(d))
    assert (tok.eod_id, tok.eod_token) == (1, "</s>")


def test_a_config_directory_is_refused(tmp_path: Path) -> None:
    d = tok_dir(tmp_path / "t")
    (d / "tokenizer_config.json").mkdir()
    with pytest.raises(InputError) as excinfo:
        load_tokenizer(str(d))
    assert "tokenizer_config.json': is a directory" in one_line(excinfo)


def test_a_config_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    """Opening a FIFO for reading waits for a writer: it is opened without blocking instead,
    and refused. Run in a child process so that a regression fails instead of hanging."""
    d = tok_dir(tmp_path / "t")
    os.mkfifo(d / "tokenizer_config.json")
    code = (
        "import sys\n"
        "from tokentape._src.store.tokenizers import load_tokenizer\n"
        "from tokentape.errors import InputError\n"
        "try:\n"
        "    load_tokenizer(sys.argv[1])\n"
        "except InputError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(d)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-500:]
    assert result.stdout.count("\n") == 1, result.stdout
    assert "tokenizer_config.json': not a regular file" in result.stdout


# --- a config of unbounded size -----------------------------------------------------------------


def test_a_config_over_the_limit_is_refused(tmp_path: Path) -> None:
    d = tok_dir(tmp_path / "t")
    with open(d / "tokenizer_config.json", "wb") as f:
        f.write(b'{"eos_token": "</s>"}')
        f.truncate(HF_CONFIG_MAX_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(InputError) as excinfo:
        load_tokenizer(str(d))
    assert "tokenizer_config.json': larger than 16 MiB" in one_line(excinfo)


def test_a_config_at_the_limit_is_read(tmp_path: Path) -> None:
    head = '{"eos_token": "</s>"}'
    d = tok_dir(tmp_path / "t", head + " " * (HF_CONFIG_MAX_BYTES - len(head)))
    assert (d / "tokenizer_config.json").stat().st_size == HF_CONFIG_MAX_BYTES
    assert load_tokenizer(str(d)).eod_id == 1


# --- the eos_token itself -----------------------------------------------------------------------


@pytest.mark.parametrize("eos", [{"lstrip": False}, {"content": None, "special": True}, {}])
def test_an_added_token_eos_without_content_is_refused(tmp_path: Path, eos: object) -> None:
    d = tok_dir(tmp_path / "t", json.dumps({"eos_token": eos}))
    with pytest.raises(InputError) as excinfo:
        load_tokenizer(str(d))
    assert "eos_token is an added token without a 'content'" in one_line(excinfo)


def test_an_added_token_eos_with_content_is_read(tmp_path: Path) -> None:
    d = tok_dir(tmp_path / "t", json.dumps({"eos_token": {"content": "</s>", "special": True}}))
    assert load_tokenizer(str(d)).eod_token == "</s>"


def test_a_config_eos_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    d = tok_dir(tmp_path / "t", '{"eos_token": "\\udcff"}')
    with pytest.raises(InputError) as excinfo:
        load_tokenizer(str(d))
    message = one_line(excinfo)
    assert "the eos_token '\\udcff' of its tokenizer_config.json is not valid text" in message


@pytest.mark.parametrize("token", ["\udcff", "a\ud800b"])
def test_an_eod_token_that_is_not_utf8_is_refused(tmp_path: Path, token: str) -> None:
    d = tok_dir(tmp_path / "t", json.dumps({"eos_token": "</s>"}))
    for spec in (str(d), str(d / "tokenizer.json")):
        with pytest.raises(InputError) as excinfo:
            load_tokenizer(spec, eod_token=token)
        message = one_line(excinfo)
        assert f"--eod-token {token!r} is not valid text" in message
        assert "not in its vocabulary" in message

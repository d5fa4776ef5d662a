"""Shared setup of the store tests: a small input to tokenize, a directory holding a small
word-level ``tokenizer.json`` (and a ``tokenizer_config.json``), and the check of a refusal's
one line on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
from tokenizers import models, pre_tokenizers


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("tokentape: error: "), lines[0]
    return lines[0]


def small_input(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(50)))
    return path


SPECIALS = ("<|endoftext|>", "</s>")


def tok_dir(root: Path, config: str | None = None) -> Path:
    """``tokenizer.json`` (a word-level tokenizer: ``<|endoftext|>`` 0, ``</s>`` 1, ``[UNK]``,
    then ``w0`` .. ``w9``) and, unless None, ``config`` as its ``tokenizer_config.json``."""
    vocab = {name: i for i, name in enumerate((*SPECIALS, "[UNK]"))}
    vocab |= {f"w{k}": len(vocab) + k for k in range(10)}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(SPECIALS))
    root.mkdir(parents=True)
    tok.save(str(root / "tokenizer.json"))
    if config is not None:
        (root / "tokenizer_config.json").write_text(config)
    return root

"""Shared setup of the command-line tests: documents and a small BPE trained on them, a
``save_pretrained``-like tokenizer directory, a one-source plan over a byte store, and the
checks of a refusal's one line."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
from helpers import cli
from tokenizers import decoders, models, pre_tokenizers, trainers

CORPUS = [
    f"document {i}: the quick brown fox jumps over the lazy dog. " * (i % 5 + 1) for i in range(120)
]


def refusal(code: int, out: str, err: str) -> str:
    """The refusal's one line: exit 2, nothing on stdout, no traceback."""
    assert code == 2, (code, out, err)
    assert out == ""
    assert err.startswith("tokentape: error: ") and err.count("\n") == 1, err
    return err


def bpe_tokenizer(root: Path) -> Path:
    """A small byte-level BPE trained on ``CORPUS``, with <|endoftext|> (id 0) and </s> (id 1),
    saved as ``root/tokenizer.json``."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    path = root / "tokenizer.json"
    tok.save(str(path))
    return path


def tok_dir(root: Path, bpe_json: Path, config: object = ...) -> Path:
    """A save_pretrained-like directory: tokenizer.json and (unless ...) tokenizer_config.json."""
    root.mkdir(parents=True)
    (root / "tokenizer.json").write_bytes(bpe_json.read_bytes())
    if config is not ...:
        text = config if isinstance(config, str) else json.dumps(config)
        (root / "tokenizer_config.json").write_text(text)
    return root


def docs_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def byte_plan(root: Path, capsys, docs: list[str], seq_len: int | None = None) -> Path:
    """A one-source plan over a byte store of ``docs``; by default one window holds them all."""
    store = root / "store"
    code, _, err = cli(
        capsys, "tokenize", docs_jsonl(root / "d.jsonl", docs), "--out", store, "--tokenizer",
        "bytes",
    )  # fmt: skip
    assert code == 0, err
    n_tokens = sum(len(d.encode()) + 1 for d in docs)
    seq_len = seq_len or n_tokens - 1
    (root / "p.toml").write_text(
        f"seq_len = {seq_len}\nseed = 1\ntotal_tokens = {seq_len * ((n_tokens - 1) // seq_len)}\n"
        f'[[source]]\nname = "b"\npath = "{store}"\nweight = 1\n'
    )
    code, _, err = cli(capsys, "plan", root / "p.toml", "--out", root / "p.json")
    assert code == 0, err
    return root / "p.json"

"""A new user's first hour (issue 29, "done when"): parquet shards with null texts in a bucket,
a ``save_pretrained``-style tokenizer directory whose config says ``add_bos_token``, every
command's output piped to a file (no terminal), run as separate processes. Nothing stops: the
bad rows are skipped and counted, every document starts with the BOS, the plan, info, replay
and verify work against the bucket, and no output holds a traceback or a progress bar's
carriage return."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tokenizers

import tokentape

pytestmark = pytest.mark.s3

BOS = "<s>"
EOS = "</s>"


def _tokenizer_dir(root: Path, bpe_json: Path) -> Path:
    """A directory as ``save_pretrained`` writes it for a Llama-style tokenizer: the BPE with
    ``<s>`` and ``</s>`` added, and a config that adds the BOS and names the EOS."""
    tok = tokenizers.Tokenizer.from_file(str(bpe_json))
    tok.add_special_tokens([BOS, EOS])
    root.mkdir()
    tok.save(str(root / "tokenizer.json"))
    config = {"add_bos_token": True, "bos_token": BOS, "eos_token": EOS, "model_max_length": 4096}
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def _shards(root: Path, s3) -> tuple[int, int]:
    """Three parquet shards in the bucket, every seventh text null; (good rows, null rows)."""
    good = bad = 0
    for k in range(3):
        texts = []
        for i in range(60):
            if i % 7 == 3:
                texts.append(None)
                bad += 1
            else:
                texts.append(
                    f"Shard {k} row {i}: the quick brown fox jumps over the lazy dog. " * 3
                )
                good += 1
        path = root / f"part-{k}.parquet"
        pq.write_table(pa.table({"text": pa.array(texts, pa.string()),
                                 "id": [f"s{k}-{i}" for i in range(60)]}), path)  # fmt: skip
        s3.put(f"{s3.url}/raw/part-{k}.parquet", path.read_bytes())
    return good, bad


def _run(root: Path, *args: str) -> str:
    """``tokentape ARGS`` in its own process, its output piped to a file as under ``| tee``."""
    log = root / "out.log"
    with open(log, "w") as out:
        command = [sys.executable, "-m", "tokentape", *args]
        done = subprocess.run(command, cwd=root, stdout=out, stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text()
    assert done.returncode == 0, (args, text)
    assert "Traceback" not in text and "\r" not in text, text
    return text


def test_the_first_hour_runs_without_a_stop(tmp_path, s3, hf_tokenizer_json):
    good, bad = _shards(tmp_path, s3)
    tok = _tokenizer_dir(tmp_path / "mytok", hf_tokenizer_json)
    store = f"{s3.url}/stores/web"
    out = _run(tmp_path, "tokenize", f"{s3.url}/raw/*.parquet", "--out", store, "--tokenizer",
               "mytok/", "--on-bad-record", "skip", "--max-bad-fraction", "0.2",
               "--workers", "2")  # fmt: skip
    assert f"{bad} skipped of {good + bad}" in out and "'text' is null" in out, out
    assert "start of document" in out and "add_bos_token" in out, out
    source = tokentape.open_source(store)
    try:
        assert source.n_docs == good
        bos = tokenizers.Tokenizer.from_file(str(tok / "tokenizer.json")).token_to_id(BOS)
        eos = tokenizers.Tokenizer.from_file(str(tok / "tokenizer.json")).token_to_id(EOS)
        first = [source.tokens(*source.doc_span(i))[[0, -1]].tolist() for i in range(3)]
        assert first == [[bos, eos]] * 3  # the BOS first, the config's eos_token last
    finally:
        source.close()
    (tmp_path / "mix.toml").write_text(
        f'seq_len = 64\nseed = 7\ntotal_samples = 40\n[[source]]\nname = "web"\n'
        f'path = "{store}"\nweight = 1\nmax_repeats = 4\n'
    )
    _run(tmp_path, "plan", "mix.toml", "--out", f"{s3.url}/plans/PLAN.json")
    out = _run(tmp_path, "info", f"{s3.url}/plans/PLAN.json")
    assert "index hash" in out, out
    out = _run(tmp_path, "info", store)
    assert f"beginning-of-document id {bos}" in out and f"{bad} skipped" in out, out
    out = _run(tmp_path, "replay", f"{s3.url}/plans/PLAN.json", "--step", "2", "--global-batch",
               "4", "--show-text")  # fmt: skip
    assert "part-" in out and BOS in out, out
    out = _run(tmp_path, "verify", f"{s3.url}/plans/PLAN.json")
    assert f"{store}: ok" in out, out

"""`tokentape stage` as a process against a real S3 server (moto): the report, the staged
plan, reuse, one-line errors."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import run_cli, tree_bytes, write_store
from objstore import SECRET_KEY

from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.store.tokenizers import load_tokenizer

pytestmark = [pytest.mark.s3, pytest.mark.subprocess, pytest.mark.slow]


def _remote_plan(root: Path, s3, tokenizer_json: Path) -> tuple[Path, dict[str, Path]]:
    """PLAN.json over two uploaded stores (paths rewritten to their URLs), and the stores."""
    tok = load_tokenizer(f"hf:{tokenizer_json}")
    rng = random.Random(3)
    stores = {}
    for name, n in (("web", 60), ("code", 40)):
        docs = [[rng.randrange(1, tok.vocab_size) for _ in range(rng.randint(5, 50))]]
        docs += [[rng.randrange(1, tok.vocab_size) for _ in range(rng.randint(5, 50))]
                 for _ in range(n)]  # fmt: skip
        stores[name] = root / "local" / name
        write_store(stores[name], docs, 400, 64, tok)
    local = Plan.build(
        {
            name: {"path": str(path), "weight": 1, "max_repeats": 1000}
            for name, path in stores.items()
        },
        seq_len=16,
        seed=3,
        total_samples=100,
    )
    urls = {n: s3.upload_tree(p, f"{s3.url}/stores/{n}") for n, p in stores.items()}
    remote = replace(local, sources=tuple(replace(s, path=urls[s.name]) for s in local.sources))
    plan = root / "PLAN.json"
    remote.save(plan)
    return plan, stores


def test_stage_reports_each_source_and_reuses(tmp_path, s3, hf_tokenizer_json):
    plan, stores = _remote_plan(tmp_path, s3, hf_tokenizer_json)
    cache, out = tmp_path / "cache", tmp_path / "staged.json"
    r = run_cli("stage", str(plan), "--cache", str(cache), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["index_hash"] == load_plan(plan).index_hash
    rows = {row["name"]: row for row in report["sources"]}
    assert set(rows) == {"web", "code"}
    for name, row in rows.items():
        assert row["url"] == f"{s3.url}/stores/{name}" and row["staged"] and not row["cached"]
        assert row["downloaded_bytes"] == row["total_bytes"] > 0 and row["reused_bytes"] == 0
        assert tree_bytes(Path(row["path"])) == tree_bytes(stores[name])
    staged = load_plan(out)
    assert staged.index_hash == report["index_hash"]
    assert [s.path for s in staged.sources] == [rows[s.name]["path"] for s in staged.sources]

    again = run_cli("stage", str(plan), "--cache", str(cache), "--workers", "2")
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert len(lines) == 2
    for line, name in zip(lines, ("web", "code"), strict=True):
        assert line.startswith(f"{name}: {s3.url}/stores/{name} -> {rows[name]['path']} ")
        assert "already staged" in line
    assert SECRET_KEY not in r.stdout + r.stderr + again.stdout + again.stderr


def test_stage_corrupted_block_is_one_line_exit_2(tmp_path, s3, hf_tokenizer_json):
    plan, _ = _remote_plan(tmp_path, s3, hf_tokenizer_json)
    target = f"{s3.url}/stores/code/part-00000.bin"
    data = bytearray(s3.get(target))
    data[64 * 2] ^= 0x01
    s3.put(target, bytes(data))
    r = run_cli(
        "stage", str(plan), "--cache", str(tmp_path / "cache"), env={"TOKENTAPE_IO_RETRIES": "2"}
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"tokentape: error: {target}: block 2 (bytes 128-192)")
    assert SECRET_KEY not in r.stderr


def test_stage_bad_arguments_and_help(tmp_path):
    help_text = run_cli("stage", "--help")
    assert help_text.returncode == 0
    assert "tokentape stage mix.json --cache" in help_text.stdout
    assert "resumes" in help_text.stdout
    missing = run_cli("stage", str(tmp_path / "nope.json"), "--cache", str(tmp_path / "c"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "no such file" in missing.stderr
    workers = run_cli("stage", "x.json", "--cache", "c", "--workers", "0")
    assert workers.returncode == 2 and "--workers" in workers.stderr
    options = run_cli("stage", "x.json", "--cache", "c", "--storage-options", "[1]")
    assert options.returncode == 2 and "--storage-options" in options.stderr

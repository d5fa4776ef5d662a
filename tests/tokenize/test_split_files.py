"""One big input file is many units of work (issue 14, item 1): a .jsonl.zst or .jsonl.gz cut
in its decompressed text, a parquet file with one big row group cut into rows. The store is
byte-identical for 1 and 2 workers, holds every document in order, and a run killed after a
unit of such a file resumes to the same bytes."""

from __future__ import annotations

import gzip
import json
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import make_documents, run_cli, tree_bytes

from tokentape import open_source

UNIT_MB = "0.004"  # about 4 KB of input (text or row-group bytes) per unit


def _jsonl(docs: list[str]) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in docs).encode()


@pytest.fixture(scope="module", params=["zst", "gz", "parquet"])
def big_file(request, tmp_path_factory) -> tuple[Path, list[str]]:
    """One file of ~100 KB of text in the given format, and its documents in order."""
    root = tmp_path_factory.mktemp(f"big-{request.param}")
    docs = make_documents(400, seed=11)
    if request.param == "zst":
        path = root / "corpus.jsonl.zst"
        path.write_bytes(zstandard.ZstdCompressor(level=3).compress(_jsonl(docs)))
    elif request.param == "gz":
        path = root / "corpus.jsonl.gz"
        path.write_bytes(gzip.compress(_jsonl(docs), mtime=0))
    else:
        path = root / "corpus.parquet"
        pq.write_table(pa.table({"text": docs}), path, row_group_size=len(docs))  # one group
    return path, docs


def _args(path: Path, out: Path, workers: str) -> list[str]:
    return ["tokenize", str(path), "--out", str(out), "--unit-mb", UNIT_MB, "--shard-mb",
            "0.01", "--workers", workers, "--json"]  # fmt: skip


@pytest.mark.subprocess
def test_one_big_file_is_many_units_and_byte_identical_for_any_worker_count(big_file, tmp_path):
    path, docs = big_file
    trees, units = [], []
    for workers in ("1", "2"):
        result = run_cli(*_args(path, tmp_path / f"w{workers}", workers))
        assert result.returncode == 0, result.stderr
        units.append(json.loads(result.stdout)["units"])
        trees.append(tree_bytes(tmp_path / f"w{workers}"))
    assert units[0] == units[1] > 4  # one file, many units: the same whatever the workers
    assert trees[0] == trees[1]
    src = open_source(tmp_path / "w2")
    assert src.n_docs == len(docs)
    assert [src.decode(src.doc(i)) for i in range(len(docs))] == docs


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_kill_after_a_unit_of_a_split_file_resumes_to_the_same_bytes(big_file, tmp_path):
    path, _ = big_file
    reference = run_cli(*_args(path, tmp_path / "ref", "1"))
    assert reference.returncode == 0, reference.stderr
    args = _args(path, tmp_path / "s", "2")
    killed = run_cli(*args, env={"TOKENTAPE_CRASH_AT": "after-unit"})
    assert killed.returncode == -signal.SIGKILL
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["status"] == "resumed" and summary["units_reused"] >= 1
    assert tree_bytes(tmp_path / "s") == tree_bytes(tmp_path / "ref")

"""One big input file is many units of work (issue 14, item 1), whose progress moves as it is
read (item 3): a .jsonl.zst or .jsonl.gz cut
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
from helpers import RecordingCounters, make_documents, run_cli, tree_bytes

from tokentape import open_source
from tokentape._src.store.tokenizers import load_tokenizer
from tokentape._src.tokenize.filters import parse_filters
from tokentape._src.tokenize.inputs import expand_inputs, plan_units
from tokentape._src.tokenize.worker import WorkerSettings, tokenize_unit

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


@pytest.mark.parametrize("kind", ["jsonl", "zst", "parquet"])
def test_a_unit_reports_its_input_bytes_as_it_reads_them(kind, tmp_path):
    """Progress moves inside a unit (issue 14 item 3): the unit's input bytes arrive in many
    reports as its documents are read, adding up to the unit's size exactly."""
    docs = make_documents(3000, seed=5)
    text = _jsonl(docs)
    if kind == "jsonl":
        path = tmp_path / "c.jsonl"
        path.write_bytes(text)
    elif kind == "zst":
        path = tmp_path / "c.jsonl.zst"
        path.write_bytes(zstandard.ZstdCompressor().compress(text))
    else:
        path = tmp_path / "c.parquet"
        pq.write_table(pa.table({"text": docs}), path, row_group_size=len(docs))
    [file] = expand_inputs([str(path)])
    unit_bytes = len(text) // 2 if kind == "zst" else file.size + 1  # zst: cut in its text
    unit = plan_units([file], unit_bytes)[0]
    settings = WorkerSettings("text", "uint16", 257, str(tmp_path))
    counters = RecordingCounters()
    result = tokenize_unit(unit, load_tokenizer("bytes"), parse_filters(()), settings, counters)
    reports = [n for n in counters.input_reports if n > 0]
    assert result.docs_in > 5 * 256 // (2 if kind == "zst" else 1)
    assert len(reports) >= 4  # a batch of 256 documents at a time, not once at the end
    assert sum(counters.input_reports) == unit.n_bytes and max(reports) < unit.n_bytes


def test_a_long_document_moves_the_progress_while_its_pieces_are_encoded(tmp_path):
    """A heartbeat (issue 14 item 3): one document of 5 MB is encoded in pieces of 1 MiB, and
    the unit's input bytes are reported piece by piece, not once when it is done."""
    words = "some words of a very long log dump " * 150_000  # 5.25 MB, spaces between letters
    path = tmp_path / "one.jsonl"
    path.write_bytes(_jsonl([words]))
    [file] = expand_inputs([str(path)])
    [unit] = plan_units([file], file.size + 1)
    settings = WorkerSettings("text", "uint16", 257, str(tmp_path))
    counters = RecordingCounters()
    result = tokenize_unit(unit, load_tokenizer("bytes"), parse_filters(()), settings, counters)
    reports = [n for n in counters.input_reports if n > 0]
    assert result.docs_in == 1 and result.n_tokens == len(words) + 1
    assert len(reports) >= 4 and sum(counters.input_reports) == unit.n_bytes

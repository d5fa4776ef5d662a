"""``tokentape tokenize --executor ray`` on a real (local) Ray: the store is byte-identical to
the local executor's, a killed driver resumes, a task whose worker dies is retried, and errors
are the local executor's one-liners.

In-process runs share one module-scoped Ray (``tokenize`` uses a session this process already
opened); the runs that must be real command lines start their own, as a user's would."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_documents, run_cli, tree_bytes, write_jsonl

from tokentape._src.program import main
from tokentape._src.store.lock import output_lock
from tokentape._src.store.output import WORK_DIR
from tokentape._src.store.tokenizers import load_tokenizer
from tokentape._src.tokenize import ray_executor
from tokentape._src.tokenize.filters import parse_filters
from tokentape._src.tokenize.inputs import expand_inputs, plan_units
from tokentape._src.tokenize.pool import PoolJob
from tokentape._src.tokenize.worker import WorkerSettings, tokenize_unit, unit_paths
from tokentape._src.util.faults import CRASH_ENV

ray = pytest.importorskip("ray")

# Every test here needs Ray, whose start (a cluster of processes) alone takes seconds.
pytestmark = [pytest.mark.ray, pytest.mark.subprocess, pytest.mark.slow]

FILTERS = ("--filter", "max-tokens:150", "--filter", "min-tokens:4")


@pytest.fixture(scope="module")
def ray_cluster():
    """One private local Ray with 2 CPUs for this module's in-process runs."""
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Mixed formats, cut into a few dozen units by ``args``."""
    root = tmp_path_factory.mktemp("ray-corpus")
    docs = make_documents(1500, seed=11)
    (root / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:700]))
    with gzip.open(root / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in docs[700:900])
    pq.write_table(pa.table({"text": docs[900:1100]}), root / "c.parquet", row_group_size=20)
    (root / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[1100:]))
    (root / "e.txt").write_text(docs[0])
    return root


def args(root: Path, out: Path, tokenizer: str, *extra: str) -> list[str]:
    return [
        "tokenize",
        str(root),
        "--out",
        str(out),
        "--tokenizer",
        tokenizer,
        "--unit-mb",
        "0.01",
        "--shard-mb",
        "0.05",
        "--json",
        *extra,
    ]


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def local_hf_store(corpus, hf_tokenizer_json, tmp_path_factory) -> dict[str, bytes]:
    """The local executor's store (1 worker) of ``corpus`` with the HF tokenizer, no filter."""
    out = tmp_path_factory.mktemp("ray-ref") / "s"
    assert main(args(corpus, out, str(hf_tokenizer_json))) == 0
    return tree_bytes(out)


@pytest.mark.parametrize("kind", ["hf", "bytes"])
def test_byte_identical_to_the_local_executor(
    kind, corpus, hf_tokenizer_json, ray_cluster, tmp_path, capsys
):
    tokenizer = str(hf_tokenizer_json) if kind == "hf" else "bytes"
    local = tmp_path / "local"
    code, out, err = run_main([*args(corpus, local, tokenizer, *FILTERS)], capsys)
    assert code == 0, err
    expected = json.loads(out)
    assert expected["units"] > 20 and expected["n_shards"] > 1
    assert expected["dropped_docs"]["max-tokens"] > 0 and expected["dropped_docs"]["min-tokens"] > 0
    for workers in ("1", "3"):
        store = tmp_path / f"ray{workers}"
        argv = args(corpus, store, tokenizer, *FILTERS, "--executor", "ray", "--workers", workers)
        code, out, err = run_main(argv, capsys)
        assert code == 0, err
        summary = json.loads(out)  # standard output holds the summary and nothing else
        assert summary["status"] == "created" and summary["units_reused"] == 0
        for key in ("n_tokens", "n_docs", "docs_in", "dropped_docs", "content_hash", "units"):
            assert summary[key] == expected[key], key
        assert tree_bytes(store) == tree_bytes(local), f"--workers {workers}"
        assert not (store / WORK_DIR).exists()


def test_driver_killed_mid_run_then_rerun_is_byte_identical(
    corpus, hf_tokenizer_json, local_hf_store, ray_cluster, tmp_path, capsys
):
    """SIGKILL the command (which started its own local Ray) once a unit has finished; the
    rerun resumes from the finished units."""
    out = tmp_path / "s"
    argv = args(corpus, out, str(hf_tokenizer_json), "--executor", "ray", "--workers", "2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokentape", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: Ray's helpers are cleaned up below
    )
    work = out / WORK_DIR
    deadline = time.monotonic() + 120
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if work.is_dir() and any(work.glob("units-*/unit-*.json")):
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert not (out / "manifest.json").exists()
    finished = len(list(work.glob("units-*/unit-*.json")))
    code, stdout, err = run_main(argv, capsys)
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["status"] == "resumed"
    assert finished <= summary["units_reused"] < summary["units"]
    assert tree_bytes(out) == local_hf_store


def test_a_task_whose_worker_dies_is_retried(
    corpus, hf_tokenizer_json, local_hf_store, ray_cluster, tmp_path, capsys, monkeypatch
):
    # With the hook set, the first task of a run to start exits its worker process (os._exit)
    # before tokenizing its unit. Without retries the unit is lost: exit 2, other units kept.
    monkeypatch.setenv(CRASH_ENV, ray_executor.RAY_TASK_CRASH)
    on_ray = ("--executor", "ray", "--workers", "2")
    argv = [*args(corpus, tmp_path / "s", str(hf_tokenizer_json)), *on_ray]
    with monkeypatch.context() as m:
        m.setattr(ray_executor, "MAX_RETRIES", 0)
        code, out, err = run_main(argv, capsys)
    assert code == 2 and out == ""
    assert "1 Ray task(s) failed (unit " in err and "WorkerCrashedError" in err
    assert "finished units are kept: run the same command again to resume" in err
    assert any((tmp_path / "s" / WORK_DIR).glob(f"units-*/{ray_executor.CRASH_MARKER}"))
    # The same command resumes.
    monkeypatch.delenv(CRASH_ENV)
    code, out, err = run_main(argv, capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["status"] == "resumed" and summary["units_reused"] == summary["units"] - 1
    assert tree_bytes(tmp_path / "s") == local_hf_store
    # With Ray's retries (the default), the dead task is rerun and the store is complete.
    monkeypatch.setenv(CRASH_ENV, ray_executor.RAY_TASK_CRASH)
    code, out, err = run_main(
        [*args(corpus, tmp_path / "r", str(hf_tokenizer_json)), *on_ray], capsys
    )
    assert code == 0, err
    assert json.loads(out)["status"] == "created"
    assert tree_bytes(tmp_path / "r") == local_hf_store


GOOD = [json.dumps({"text": t}) for t in make_documents(60, seed=2)]


def test_bad_line_is_reported_as_file_line_through_the_cli(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "early.jsonl", GOOD)
    write_jsonl(data / "late.jsonl", [GOOD[0], GOOD[1], '{"text": "unterminated'])
    common = ["tokenize", str(data), "--tokenizer", "bytes", "--unit-mb", "0.002"]
    code, _, local_err = run_main([*common, "--out", str(tmp_path / "local")], capsys)
    assert code == 2
    result = run_cli(*common, "--out", str(tmp_path / "out"), "--executor", "ray", "--workers", "2")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "late.jsonl:3: invalid JSON" in lines[0], result.stderr
    assert lines == local_err.strip().splitlines()  # the local executor's very message
    assert not (tmp_path / "out").exists()


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port held bound but not listening while the block runs: a connection to it
    is refused, and no other process (another test worker) can take it meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_unreachable_address_and_missing_ray_are_one_line_errors(tmp_path, capsys, monkeypatch):
    data = write_jsonl(tmp_path / "d.jsonl", GOOD)
    common = ["tokenize", str(data), "--out", str(tmp_path / "out"), "--executor", "ray"]
    with refusing_port() as port:
        address = f"127.0.0.1:{port}"
        result = run_cli(*common, "--ray-address", address)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"tokentape: error: --ray-address {address}: cannot connect (Connection refused); "
        "is the Ray head node running and reachable?"
    ]
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    code, out, err = run_main(common, capsys)
    assert code == 2 and out == ""
    assert err.startswith(
        "tokentape: error: --executor ray needs Ray: pip install 'tokentape[ray]'"
    )
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_ray_run_on_a_locked_output_is_refused_before_ray_starts(tmp_path, tmp_path_factory):
    """The command holds the output's lock, not its tasks: a second command on the same
    output is refused at once (no Ray is started), naming the holder."""
    data = write_jsonl(tmp_path / "d.jsonl", GOOD)
    out = tmp_path / "out"
    ray_dir = tmp_path_factory.mktemp("ray-tmp")  # where a Ray started by the run would write
    with output_lock(out, "tokenize"):
        result = run_cli(
            "tokenize",
            str(data),
            "--out",
            str(out),
            "--executor",
            "ray",
            "--workers",
            "2",
            env={"RAY_TMPDIR": str(ray_dir)},
        )
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is being written by tokentape tokenize on host" in lines[0]
    assert f"pid {os.getpid()}," in lines[0]
    assert list(ray_dir.iterdir()) == []  # refused before Ray started
    assert sorted(os.listdir(tmp_path)) == ["d.jsonl"]


def test_a_task_returns_its_unit_and_writes_nothing_where_the_driver_works(
    corpus, hf_tokenizer_json, ray_cluster, tmp_path
):
    """A node need not see the driver's work directory: a task tokenizes in a scratch
    directory of its own and returns the unit's files, which equal the local worker's."""
    unit = plan_units(expand_inputs((str(corpus / "a.jsonl"),)), 4096)[1]
    tokenizer = load_tokenizer(str(hf_tokenizer_json), None)
    elsewhere = tmp_path / "driver-only" / "units"  # no node has it
    settings = WorkerSettings("text", "uint16", tokenizer.vocab_size, str(elsewhere))
    job = ray_executor.TaskJob(
        PoolJob(str(hf_tokenizer_json), None, (), settings, ()), tokenizer.fingerprint, os.getcwd()
    )
    task = ray.remote(ray_executor._tokenize_unit_task)
    outcome = ray.get(task.remote(job, unit))
    assert outcome.error is None and outcome.result is not None
    assert not (tmp_path / "driver-only").exists()
    here = tmp_path / "here"
    here.mkdir()
    local = tokenize_unit(unit, tokenizer, parse_filters(()), replace(settings, work_dir=str(here)))
    assert outcome.result == local
    tokens, docs, _ = unit_paths(here, unit.index)
    assert (outcome.tokens, outcome.docs) == (tokens.read_bytes(), docs.read_bytes())
    assert outcome.node.startswith("127.0.0.1/")

"""The local pool: helpers start before the job is planned, only those the units need work, the
others are killed having done nothing, and a helper's error comes back to the caller."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from helpers import make_documents, run_cli, write_jsonl

from tokentape._src.store.tokenizers import load_tokenizer
from tokentape._src.tokenize.filters import parse_filters
from tokentape._src.tokenize.inputs import expand_inputs, plan_units
from tokentape._src.tokenize.pool import Pool, usable_cpus
from tokentape._src.tokenize.worker import WorkerSettings, load_result, unit_paths
from tokentape.errors import TokentapeError

pytestmark = pytest.mark.subprocess


def _units(tmp_path: Path, n_docs: int, unit_bytes: int) -> list:
    docs = [json.dumps({"text": t}) for t in make_documents(n_docs, seed=5)]
    files = expand_inputs([str(write_jsonl(tmp_path / "in.jsonl", docs))])
    return plan_units(files, unit_bytes)


def _settings(tmp_path: Path) -> WorkerSettings:
    work = tmp_path / "work"
    work.mkdir()
    return WorkerSettings(text_key="text", dtype="uint16", id_limit=257, work_dir=str(work))


def _run(pool: Pool, units: list, settings: WorkerSettings) -> list[int]:
    return pool.run(units, settings, load_tokenizer("bytes", None), parse_filters(()))


def _finished(settings: WorkerSettings, units: list) -> list[int]:
    return [
        u.index for u in units if load_result(unit_paths(settings.work_dir, u.index)[2]) is not None
    ]


def test_helpers_start_with_the_pool_and_unused_ones_are_killed():
    pool = Pool("bytes", None, (), workers=3)
    processes = [h.process for h in pool._helpers]
    assert pool.started == len(processes) == min(3, usable_cpus()) - 1
    assert all(p.is_alive() for p in processes)
    pool.close()
    assert not any(p.is_alive() for p in processes)
    # killed before they were handed anything (a helper that had finished would exit with 0)
    assert all(p.exitcode == -signal.SIGKILL for p in processes)


def test_a_job_of_one_unit_runs_here_and_kills_every_helper(tmp_path):
    units = _units(tmp_path, 5, 2**20)
    assert len(units) == 1
    settings = _settings(tmp_path)
    with Pool("bytes", None, (), workers=4) as pool:
        processes = [h.process for h in pool._helpers]
        assert _run(pool, units, settings) == []
    assert _finished(settings, units) == [0]
    assert all(p.exitcode == -signal.SIGKILL for p in processes)


def test_helpers_beyond_the_cpus_are_started_when_the_units_need_them(tmp_path):
    workers = usable_cpus() + 2
    units = _units(tmp_path, 300, 256)
    assert len(units) > workers
    settings = _settings(tmp_path)
    with Pool("bytes", None, (), workers=workers) as pool:
        assert pool.started == usable_cpus() - 1
        assert _run(pool, units, settings) == []
        assert pool.started == workers - 1
    assert _finished(settings, units) == [u.index for u in units]


def test_an_error_met_by_a_helper_comes_back_to_the_caller(tmp_path):
    """The helpers' tokenizer cannot load (the caller's can): the helper's own error is
    raised by ``run``, after every process stopped."""
    units = _units(tmp_path, 40, 256)
    settings = _settings(tmp_path)
    missing = tmp_path / "missing.tiktoken"
    with (
        Pool(f"tiktoken:{missing}", None, (), workers=2) as pool,
        pytest.raises(TokentapeError, match=r"missing\.tiktoken"),
    ):
        _run(pool, units, settings)


def test_a_bad_tokenizer_with_two_workers_is_one_line(tmp_path):
    docs = [json.dumps({"text": t}) for t in make_documents(20, seed=1)]
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    out = tmp_path / "s"
    result = run_cli(
        "tokenize", str(src), "--out", str(out), "--tokenizer", "tiktoken:nope.tiktoken",
        "--workers", "2",
    )  # fmt: skip
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "nope.tiktoken" in result.stderr
    assert not out.exists()

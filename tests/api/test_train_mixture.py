"""examples/train_mixture.py: stopped (at a step count, or by SIGKILL) and rerun, it trains on
exactly the batches of an uninterrupted run, and its plan is the three-source mixture."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokentape._src.corpora import write_builtin_corpora
from tokentape._src.train.steplog import read_step_log

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.torch]

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_mixture.py"
STEPS = 40


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mixture") / "corpora"
    write_builtin_corpora(root)
    return root


def _start(corpora: Path, run: Path, steps: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), str(corpora), str(run), str(steps)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _run(corpora: Path, run: Path, steps: int) -> None:
    proc = _start(corpora, run, steps)
    output = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode == 0, output


def _applied(run: Path) -> list[tuple[int, int, str]]:
    """(step, consumed, tokens hash) of every step the optimizer applied, by the step log."""
    return [(r.step, r.consumed, r.tokens_hash) for r in read_step_log(run / "steps.jsonl")]


@pytest.fixture(scope="module")
def uninterrupted(corpora, tmp_path_factory) -> list[tuple[int, int, str]]:
    run = tmp_path_factory.mktemp("whole")
    _run(corpora, run, STEPS)
    return _applied(run)


def test_uninterrupted_run_trains_the_three_sources(uninterrupted, corpora):
    assert [(s, c) for s, c, _ in uninterrupted] == [(s, 8 * s) for s in range(STEPS)]
    assert len({h for _, _, h in uninterrupted}) == STEPS


def test_stopped_and_rerun_sees_the_same_batches(uninterrupted, corpora, tmp_path):
    _run(corpora, tmp_path, 3)
    assert _applied(tmp_path) == uninterrupted[:3]
    _run(corpora, tmp_path, STEPS)
    assert _applied(tmp_path) == uninterrupted
    lines = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert len(lines) == STEPS  # resumed at step 3 exactly: nothing redone, nothing skipped


def test_killed_and_rerun_sees_the_same_batches(uninterrupted, corpora, tmp_path):
    proc = _start(corpora, tmp_path, 10_000)
    log, deadline = tmp_path / "steps.jsonl", time.monotonic() + 240
    while not log.exists() or len(log.read_text().splitlines()) < 3:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    done = len(log.read_text().splitlines())
    assert 3 <= done < STEPS, "killed too late to test a resume; raise STEPS"
    _run(corpora, tmp_path, STEPS)
    assert _applied(tmp_path) == uninterrupted

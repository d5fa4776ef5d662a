"""Ctrl-C (issue 29, item 3): SIGINT to the whole process group of ``tokentape tokenize
--workers 2``, as a terminal sends it, at moments chosen by the job's observable progress (how
many units it has finished, drawn at random): the program ends with the one clean line and code
130, no traceback from any process, and the same command then finishes the same store as a run
never interrupted. Also while Python is still importing the commands."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for

INTERRUPTED = "tokentape: interrupted; run the same command again to resume"


def _corpus(path: Path) -> Path:
    with open(path, "w") as f:
        for i in range(60_000):
            f.write(json.dumps({"text": f"words and more words, number {i} " * 8}) + "\n")
    return path


def _command(corpus: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "tokentape", "tokenize", str(corpus), "--out", str(out),
            "--workers", "2", "--unit-mb", "0.25", "--progress", "none"]  # fmt: skip


def _finished_units(out: Path) -> int:
    return sum(1 for _ in out.glob(".tokentape-work/**/unit-*.json"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _corpus(tmp_path_factory.mktemp("ctrl-c") / "big.jsonl")


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "st"
    subprocess.run(_command(corpus, out), check=True, capture_output=True, timeout=600)
    return json.loads((out / "manifest.json").read_text())["content_hash"]


@pytest.mark.parametrize("seed", range(4))
def test_ctrl_c_at_a_random_unit_is_one_line_and_resumes(corpus, reference, tmp_path, seed):
    out = tmp_path / "st"
    after = random.Random(seed).randrange(0, 8)  # finished units before the signal
    proc = subprocess.Popen(_command(corpus, out), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    # The program has started (its output directory exists): a SIGINT while the interpreter
    # itself still starts up (importing runpy, before any of tokentape runs) is Python's to
    # report, with a traceback of its own.
    wait_for(
        lambda: (
            (out.exists() and _finished_units(out) >= after) or (out / "manifest.json").exists()
        ),
        f"{after} finished units",
        lambda: proc.poll() is None,
    )
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=600)
    if proc.returncode == 0:  # it had finished: nothing to interrupt
        assert stderr == ""
    elif proc.returncode == -signal.SIGINT:  # before Python set its handler: killed, silent
        assert stderr == "" and stdout == ""
    else:
        assert proc.returncode == 130, stderr
        assert stderr == INTERRUPTED + "\n" and stdout == ""
    again = subprocess.run(_command(corpus, out), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "manifest.json").read_text())["content_hash"] == reference


def test_ctrl_c_while_importing_is_one_line(tmp_path):
    """The signal as the program starts (before its commands are imported): a child that
    interrupts itself at its first line of tokentape code, as Ctrl-C would at that moment. It
    raises the signal in its own main thread: ``os.kill`` of its own pid may be delivered to
    another thread (numpy's), later, after the imports are done."""
    code = (
        "import os, signal, sys\n"
        "import tokentape._src.program as program\n"
        "import builtins\n"
        "real = builtins.__import__\n"
        "def interrupting(name, *a, **k):\n"
        "    if name == 'tokentape._src.cli.app':\n"
        "        signal.raise_signal(signal.SIGINT)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = interrupting\n"
        "sys.exit(program.main(['--version']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 130 and done.stderr == "tokentape: interrupted\n", done.stderr

"""Exit codes never lie about a broken pipe: standard output closed by its reader (``| head``)
stops the command quietly with code 0, but any other ``BrokenPipeError`` (a pipe to a helper
process that died, a socket) is an error like any other: one line on stderr, code 2. Every
case runs the program as a real process, its standard output a real pipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import write_docs, write_store

pytestmark = pytest.mark.subprocess

BREAKER = """
import os, subprocess, sys
from types import SimpleNamespace

from tokentape._src.cli.app import main


def run(args):
    if args.stdout == "live":
        print("started", flush=True)  # standard output works, and is used
    if args.how == "os-pipe":  # a pipe whose reader has gone
        r, w = os.pipe()
        os.close(r)
        os.write(w, b"x")
    else:  # a helper process that died, written to on its standard input
        helper = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)
        helper.wait()
        os.write(helper.stdin.fileno(), b"work for the helper")
    return 0


def add_parser(sub):
    parser = sub.add_parser("break-a-pipe")
    parser.add_argument("how")
    parser.add_argument("stdout")
    parser.set_defaults(func=run)


sys.exit(main(sys.argv[1:], extra=(SimpleNamespace(add_parser=add_parser),)))
"""


def closed_pipe() -> int:
    """The write end of a pipe whose read end is already closed (a reader that went away)."""
    r, w = os.pipe()
    os.close(r)
    return w


def environment(buffering: str = "buffered") -> dict[str, str]:
    """The environment of a program run: its standard output block-buffered, as a user's is
    when it is a pipe (what is left in the buffer is written at exit), or unbuffered."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return env if buffering == "buffered" else {**env, "PYTHONUNBUFFERED": "1"}


def run(argv: list[str], stdout: str, buffering: str = "buffered") -> subprocess.CompletedProcess:
    """Run ``argv`` with standard output a live pipe, or one whose reader is gone."""
    env = environment(buffering)
    if stdout == "live":
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    w = closed_pipe()
    try:
        return subprocess.run(
            argv, stdout=w, stderr=subprocess.PIPE, text=True, env=env, timeout=120
        )
    finally:
        os.close(w)


def tokentape(*args: object) -> list[str]:
    return [sys.executable, "-m", "tokentape", *map(str, args)]


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("tokentape: error: "), stderr
    return stderr


@pytest.mark.parametrize("stdout", ["live", "closed"])
@pytest.mark.parametrize("how", ["os-pipe", "dead-helper"])
def test_a_broken_pipe_that_is_not_stdout_is_an_error(how, stdout, tmp_path):
    script = tmp_path / "breaker.py"
    script.write_text(BREAKER)
    done = run([sys.executable, str(script), "break-a-pipe", how, stdout], stdout)
    assert done.returncode == 2, (done.returncode, done.stderr)
    line = one_error_line(done.stderr)
    assert "broken pipe" in line and "not its standard output" in line, line
    if stdout == "live":
        assert done.stdout == "started\n"


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """A small store (a short ``info``) and one of many shards (a long ``info --json``)."""
    root = tmp_path_factory.mktemp("exit-codes")
    write_docs(root / "d.jsonl", "web", 50)
    small = root / "small"
    done = subprocess.run(tokentape("tokenize", root / "d.jsonl", "--out", small), timeout=120)
    assert done.returncode == 0
    many = root / "many"
    write_store(many, [[1, 2, 3]] * 1000, shard_tokens=8)
    return {"small": small, "many": many}


@pytest.mark.parametrize("buffering", ["buffered", "unbuffered"])
@pytest.mark.parametrize("command", ["info", "version", "help"])
def test_stdout_closed_before_the_first_write_is_exit_0_and_silent(command, buffering, stores):
    """Buffered, the output meets the closed pipe only when flushed: at the command's end, or
    by the interpreter at exit (which would print "Exception ignored" and exit 120)."""
    args = {"info": ("info", stores["small"]), "version": ("--version",), "help": ("--help",)}
    done = run(tokentape(*args[command]), "closed", buffering)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize("buffering", ["buffered", "unbuffered"])
def test_stdout_closed_mid_output_is_exit_0_and_silent(buffering, stores):
    """``tokentape info STORE --json | head -c 10``: the reader takes 10 bytes of far more
    than a pipe holds, and goes."""
    argv = tokentape("info", stores["many"], "--json")
    assert len(subprocess.run(argv, capture_output=True, timeout=120).stdout) > 2**20 // 8
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment(buffering)
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(10) == b'{\n  "forma'
        proc.stdout.close()  # `head` is done
        stderr = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert (code, stderr) == (0, "")


def test_a_helper_dying_mid_tokenize_is_a_failure_with_no_store(tmp_path):
    """The real case: ``tokenize --workers 2`` whose helper process is killed holding a unit.
    The exit code says so (with one line), and no store is there."""
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(4000))
    )
    out = tmp_path / "out"
    argv = tokentape("tokenize", data, "--out", out, "--workers", "2", "--unit-mb", "0.05")
    env = {**os.environ, "TOKENTAPE_CRASH_AT": "helper-unit"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, (done.returncode, done.stderr)
    line = one_error_line(done.stderr)
    assert "a worker process died" in line and "run the same command again" in line, line
    assert not (out / "manifest.json").exists()
    assert not [n for n in os.listdir(out) if n.startswith("part-")]

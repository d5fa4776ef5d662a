"""Adversarial review of confinement, the writer lock and ``--overwrite``: things planted at
the names tokentape writes (the lock file, the staging directory), crafted lock files held
by a real lock, processes killed at each step of a replacement."""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokentape.cli import main
from tokentape.store.lock import OutputLocked, lock_path, output_lock


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("tokentape: error: "), lines[0]
    return lines[0]


def small_input(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(50)))
    return path


# --- the lock file: whatever is planted at its name is never followed nor clobbered -----------


@pytest.mark.parametrize("target", ["victim.txt", "absent.txt", "victim-dir"])
def test_a_symlink_planted_at_the_lock_name_is_refused_and_not_followed(target, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "victim-dir").mkdir()
    out = tmp_path / "out"
    link = lock_path(out)
    link.symlink_to(target)
    code = main(["tokenize", str(small_input(tmp_path)), "--out", str(out)])
    line = one_line_error(capsys)
    assert code == 2
    assert "symbolic link" in line and str(link) in line, line
    assert victim.read_text() == "precious\n"  # not truncated, not written
    assert not (tmp_path / "absent.txt").exists()  # not created through a dangling link
    assert list((tmp_path / "victim-dir").iterdir()) == []
    assert link.is_symlink() and os.readlink(link) == target  # not removed: not ours
    assert not out.exists()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_fifo_or_directory_at_the_lock_name_is_one_line(kind, tmp_path, capsys):
    out = tmp_path / "out"
    planted = lock_path(out)
    if kind == "fifo":
        os.mkfifo(planted)
    else:
        planted.mkdir()
    code = main(["tokenize", str(small_input(tmp_path)), "--out", str(out)])
    line = one_line_error(capsys)
    assert code == 2 and str(planted) in line
    assert ("directory" if kind == "directory" else "not a regular file") in line, line
    assert "parent directory must be writable" not in line  # not the misleading reason
    assert planted.exists() and not out.exists()


def hold(path: Path, data: bytes) -> int:
    """A real exclusive flock on ``path`` (its own open file description, so the lock
    conflicts with any other open of the file, in this process too) holding ``data``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


@pytest.mark.parametrize(
    "data",
    [
        json.dumps({"host": socket.gethostname(), "pid": 10**23}).encode(),
        b"[" * 3000,
        b"\xff\xfe\x00garbage",
        b'{"host": {"a": 1}, "pid": "x", "command": null}',
    ],
    ids=["pid-overflow", "deep-nesting", "binary", "wrong-types"],
)
def test_a_crafted_lock_file_held_by_another_is_a_refusal_never_a_crash(data, tmp_path):
    out = tmp_path / "out"
    fd = hold(lock_path(out), data)
    try:
        with pytest.raises(OutputLocked) as refused, output_lock(out, "tokenize"):
            pass
    finally:
        os.close(fd)
    assert "\n" not in str(refused.value)


holder_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=300),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@pytest.mark.fuzz
@given(
    record=st.fixed_dictionaries(
        {"host": st.text(min_size=1, max_size=50).filter(lambda h: h != os.uname().nodename)},
        optional={k: holder_values for k in ("pid", "command", "since", "out")},
    )
)
def test_any_holder_record_of_another_host_is_named_on_one_line(record, tmp_path_factory):
    out = tmp_path_factory.mktemp("held") / "out"
    fd = hold(lock_path(out), json.dumps(record).encode())
    try:
        with pytest.raises(OutputLocked) as refused, output_lock(out, "tokenize"):
            pass
    finally:
        os.close(fd)
    message = str(refused.value)
    assert message.isprintable(), message
    assert "is being written by tokentape " in message

"""One writer per output: ``tokenize`` and ``convert`` (both directions) hold an exclusive
lock beside their output, whatever spelling names it. Real processes: commands started
together, a holder killed with SIGKILL, a store damaged behind a finished run's back (a rerun
never calls it complete). A lock held by another is a refusal in one line, whatever its file
holds."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import make_documents, run_cli, tree_bytes, write_jsonl
from hypothesis import given
from hypothesis import strategies as st
from store_helpers import one_line_error, small_input

from tokentape import open_source
from tokentape._src.program import main
from tokentape._src.store.lock import lock_path, output_lock
from tokentape.errors import OutputLocked, TokentapeError

UNITS = ("--unit-mb", "0.05", "--shard-mb", "0.1")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """About 6 MB of JSON lines: a run takes a second or two, long enough to overlap."""
    path = tmp_path_factory.mktemp("lock-corpus") / "c.jsonl"
    write_jsonl(path, [json.dumps({"text": t}) for t in make_documents(12_000, seed=9)])
    return path


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("lock-ref") / "s"
    assert main(["tokenize", str(corpus), "--out", str(out), *UNITS, "--json"]) == 0
    return tree_bytes(out)


def tokenize_cmd(corpus: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tokentape",
        "tokenize",
        str(corpus),
        "--out",
        str(out),
    ]


def start(corpus: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*tokenize_cmd(corpus, out), *UNITS, "--workers", "2", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def refusal_line(stderr: str) -> str:
    """The one line of a refused writer, checked for the holder's host, pid and time."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("tokentape: error: "), lines[0]
    assert "is being written by tokentape" in lines[0], lines[0]
    assert f"on host {socket.gethostname()}, pid " in lines[0] and ", since 20" in lines[0]
    return lines[0]


@pytest.mark.subprocess
@pytest.mark.slow
def test_commands_started_together_one_writes_the_other_is_refused(corpus, reference, tmp_path):
    """Two ``tokenize`` runs on one ``--out`` started at once, five times over: one writes
    the store, the other is refused with one line naming the holder (or, if it came after,
    finds the store complete); the store is always whole and byte-identical."""
    refusals = 0
    for round_ in range(5):
        out = tmp_path / f"s{round_}"
        procs = [start(corpus, out), start(corpus, out)]
        results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
        statuses = []
        for rc, stdout, stderr in results:
            if rc == 2:
                line = refusal_line(stderr)
                holder = next(p.pid for p in procs if f"pid {p.pid}," in line)
                assert holder in [p.pid for p in procs]
                statuses.append("refused")
            else:
                assert rc == 0, stderr
                statuses.append(json.loads(stdout)["status"])
        assert sorted(statuses) in (["created", "refused"], ["already complete", "created"])
        refusals += statuses.count("refused")
        assert tree_bytes(out) == reference
        assert not lock_path(out).exists()
        assert sorted(os.listdir(tmp_path)) == sorted(f"s{i}" for i in range(round_ + 1))
    assert refusals >= 1  # the runs did overlap, at least once


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_second_writer_is_refused_at_once_and_touches_nothing(corpus, reference, tmp_path):
    store = tmp_path / "store"
    assert main(["tokenize", str(corpus), "--out", str(store), *UNITS, "--json"]) == 0
    prefix = tmp_path / "mega"
    assert main(["convert", "--to", "megatron", str(store), str(prefix), "--json"]) == 0
    before, names = tree_bytes(tmp_path), sorted(os.listdir(tmp_path))
    back = tmp_path / "back"
    cli = [sys.executable, "-m", "tokentape", "convert"]
    vocabulary = ["--vocab-size", "257", "--eod-id", "256"]
    commands = [
        [*tokenize_cmd(corpus, store), *UNITS, "--overwrite"],
        [*tokenize_cmd(corpus, tmp_path / "new" / "deeper"), *UNITS],
        [*cli, "--to", "megatron", str(store), str(prefix), "--overwrite"],
        [*cli, "--from", "megatron", str(prefix), str(back), *vocabulary],
    ]
    held = {0: store, 1: tmp_path / "new" / "deeper", 2: prefix, 3: back}
    for i, command in enumerate(commands):
        with output_lock(held[i], "tokenize"):
            # Refused at once: waiting for the holder (this process) would never end.
            result = subprocess.run(command, capture_output=True, text=True, timeout=120)
            assert result.returncode == 2, result.stderr
            line = refusal_line(result.stderr)
            assert f"pid {os.getpid()}," in line and str(lock_path(held[i])) in line
        assert tree_bytes(tmp_path) == before, command
        assert sorted(os.listdir(tmp_path)) == names, command
    assert tree_bytes(store) == reference


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_holder_killed_by_sigkill_leaves_a_stale_lock_the_next_run_takes_over(
    corpus, reference, tmp_path
):
    out = tmp_path / "s"
    proc = start(corpus, out)
    lock = lock_path(out)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the holder has recorded itself and made a unit
        recorded = lock.exists() and f'"pid": {proc.pid}' in lock.read_text()
        if recorded and any((out / ".tokentape-work").glob("units-*/unit-*.json")):
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    record = json.loads(lock.read_text())  # left behind, naming a process that is gone
    assert record["pid"] == proc.pid and record["command"] == "tokenize"
    rerun = run_cli("tokenize", str(corpus), "--out", str(out), *UNITS, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["status"] == "resumed"
    assert tree_bytes(out) == reference
    assert not lock.exists()


def test_the_lock_api_refuses_in_process_and_releases(tmp_path):
    out = tmp_path / "x"
    with output_lock(out, "convert") as path:
        record = json.loads(path.read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        refused = pytest.raises(OutputLocked, match=r"being written by tokentape convert on host")
        with refused, output_lock(out, "tokenize"):
            pass
    assert not path.exists()
    with output_lock(out, "tokenize"):  # free again
        pass


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("remove-bin", r"part-00003\.bin is missing"),
        ("remove-idx", r"part-00001\.idx\.npy is missing"),
        ("truncate-bin", r"part-00002\.bin holds 10 bytes, the manifest says \d+"),
    ],
)
def test_a_rerun_on_a_damaged_store_does_not_claim_success(
    damage, expected, corpus, reference, tmp_path
):
    out = tmp_path / "s"
    args = ["tokenize", str(corpus), "--out", str(out), *UNITS]
    assert main([*args, "--json"]) == 0
    if damage == "remove-bin":
        (out / "part-00003.bin").unlink()
    elif damage == "remove-idx":
        (out / "part-00001.idx.npy").unlink()
    else:
        with open(out / "part-00002.bin", "r+b") as f:
            f.truncate(10)
    damaged = tree_bytes(out)
    result = run_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "damaged" in lines[0] and "--overwrite" in lines[0], lines
    assert re.search(expected, lines[0]), lines[0]
    assert tree_bytes(out) == damaged  # left as it was
    rebuilt = run_cli(*args, "--overwrite", "--json")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert tree_bytes(out) == reference
    assert open_source(out).n_tokens > 0


def test_an_output_under_a_file_is_one_line(corpus, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    for out in (blocker / "s", blocker / "deeper" / "s"):
        assert main(["tokenize", str(corpus), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("Not a directory" in err or "is not a directory" in err)
        assert str(blocker) in err
    assert os.listdir(tmp_path) == ["a-file"] and blocker.read_text() == "mine"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (b"\xff\xfe\x00 not text", "manifest.json: not UTF-8 text"),
        (b'{"format": 5}', "manifest.json: not a tokentape store manifest"),
        (b"", "manifest.json"),
    ],
)
def test_an_unreadable_manifest_is_one_line_and_overwrite_replaces_it(
    manifest, expected, corpus, reference, tmp_path, capsys
):
    out = tmp_path / "s"
    args = ["tokenize", str(corpus), "--out", str(out), *UNITS]
    assert main([*args, "--json"]) == 0
    (out / "manifest.json").write_bytes(manifest)
    damaged = tree_bytes(out)
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "pass --overwrite" in err, err
    assert tree_bytes(out) == damaged
    assert main([*args, "--overwrite", "--json"]) == 0
    assert tree_bytes(out) == reference


# --- a lock held by another: whatever its file holds, a refusal in one line ------------------


def hold(path: Path, data: bytes) -> int:
    """A real exclusive flock on ``path`` (its own open file description, so the lock
    conflicts with any other open of the file, in this process too) holding ``data``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


@pytest.mark.slow
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


def test_every_spelling_of_an_output_takes_the_same_lock(tmp_path, capsys, monkeypatch):
    """A tokenize or a convert --from naming the locked output another way (relative, with
    ``./``, a trailing slash, ``..``, through a linked parent or a link to it) is refused."""
    monkeypatch.chdir(tmp_path)
    data = small_input(tmp_path)
    store = tmp_path / "src"
    assert main(["tokenize", str(data), "--out", str(store)]) == 0
    assert main(["convert", "--to", "megatron", str(store), str(tmp_path / "m" / "p")]) == 0
    (tmp_path / "sub").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path)
    (tmp_path / "link-to-s").symlink_to("s")
    capsys.readouterr()
    spellings = ["s", "./s", "s/", "sub/../s", str(tmp_path / "s"), "linked/s", "link-to-s"]
    with output_lock(tmp_path / "s", "tokenize"):
        for out in spellings:
            assert main(["tokenize", str(data), "--out", out]) == 2, out
            assert "is being written by tokentape tokenize" in one_line_error(capsys)
            convert = ["convert", "--from", "megatron", "m/p", out, "--vocab-size", "257"]
            assert main([*convert, "--eod-id", "256"]) == 2, out
            assert "is being written by tokentape tokenize" in one_line_error(capsys)
    assert not (tmp_path / "s").exists()


# --- a rerun of a finished run never calls a damaged store complete -------------------------


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["inputs"].pop("units"),
        lambda m: m["inputs"].update(units="x"),
        lambda m: m["filters"].update(docs_in="x"),
        lambda m: m["filters"].update(text_bytes=-1),
        lambda m: m["filters"].update(dropped_docs=5),
        lambda m: m["filters"].update(dropped_tokens={"min-tokens": "\n" * 9}),
        lambda m: m["filters"].pop("dropped_docs"),
    ],
    ids=["no-units", "units-text", "docs-in-text", "negative", "not-object", "odd", "missing"],
)
def test_a_rerun_on_a_store_whose_summary_fields_were_edited_is_one_line(edit, tmp_path, capsys):
    """A rerun of a finished job reports counts from its manifest; fields of the wrong kind
    (hand-edited, the job hash kept) were tracebacks (KeyError, AttributeError, ValueError)."""
    data = small_input(tmp_path)
    out = tmp_path / "s"
    assert main(["tokenize", str(data), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    for extra in ([], ["--json"]):
        assert main(["tokenize", str(data), "--out", str(out), *extra]) == 2
        line = one_line_error(capsys)
        assert "damaged (manifest.json field " in line and "--overwrite" in line, line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(["tokenize", str(data), "--out", str(out), "--overwrite"]) == 0


def test_a_rerun_never_calls_complete_a_store_whose_tokenizer_copy_is_a_link(
    hf_tokenizer_json, tmp_path, capsys
):
    """The tokenizer copy replaced by a link to an identical file outside: opening the store
    refuses it, so a rerun must not say 'already complete' (it read through the link)."""
    data, out = small_input(tmp_path), tmp_path / "s"
    argv = ["tokenize", str(data), "--out", str(out), "--tokenizer", str(hf_tokenizer_json)]
    assert main(argv) == 0
    outside = tmp_path / "outside.json"
    os.replace(out / "tokenizer.json", outside)
    (out / "tokenizer.json").symlink_to(outside)
    with pytest.raises(TokentapeError, match="symbolic link"):
        open_source(out)
    capsys.readouterr()
    assert main(argv) == 2
    line = one_line_error(capsys)
    assert "damaged" in line and "symbolic link" in line and "--overwrite" in line, line
    assert main([*argv, "--overwrite"]) == 0
    assert open_source(out).n_docs == 50


@pytest.mark.parametrize("target", ["copy", "absent"])
def test_a_rerun_never_calls_complete_a_store_whose_manifest_is_a_link(target, tmp_path, capsys):
    data, out = small_input(tmp_path), tmp_path / "s"
    argv = ["tokenize", str(data), "--out", str(out)]
    assert main(argv) == 0
    outside = tmp_path / "manifest-copy.json"
    os.replace(out / "manifest.json", outside)
    (out / "manifest.json").symlink_to(outside if target == "copy" else tmp_path / "absent")
    capsys.readouterr()
    assert main(argv) == 2
    line = one_line_error(capsys)
    assert "manifest.json: the manifest is a symbolic link" in line and "--overwrite" in line
    assert main([*argv, "--overwrite"]) == 0
    assert open_source(out).n_docs == 50 and not (out / "manifest.json").is_symlink()
    assert outside.exists()  # the link was replaced, not what it pointed to

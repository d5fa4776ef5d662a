"""Adversarial review of confinement, the writer lock and ``--overwrite``: things planted at
the names tokentape writes (the lock file, the staging directory), crafted lock files held
by a real lock, processes killed at each step of a replacement."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import make_documents, tree_bytes, wait_for, write_jsonl
from hypothesis import given
from hypothesis import strategies as st

from tokentape._src.plan.open import open_source
from tokentape._src.program import main
from tokentape._src.store.lock import lock_path, output_lock
from tokentape.errors import OutputLocked, TokentapeError


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


# --- --overwrite: the old tree is removed, but only what is ours --------------------------------


def tokenize_argv(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tokentape",
        "tokenize",
        str(corpus),
        "--out",
        str(out),
        "--unit-mb",
        "0.05",
        "--shard-mb",
        "0.1",
        *extra,
    ]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("review-corpus") / "c.jsonl"
    write_jsonl(path, [json.dumps({"text": t}) for t in make_documents(6_000, seed=3)])
    return path


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_file_put_in_the_old_store_during_an_overwrite_is_not_deleted(corpus, tmp_path):
    """The old store is checked for foreign files before the build starts; one put there while
    the new store is being built (the writer paused with SIGSTOP) survives the swap: it is left
    in the hidden sibling, which the next ``--overwrite`` then names instead of deleting."""
    out = tmp_path / "s"
    subprocess.run(tokenize_argv(corpus, out, "--filter", "min-tokens:3"), check=True)
    writer = subprocess.Popen(tokenize_argv(corpus, out, "--overwrite"), stderr=subprocess.PIPE)
    staging = tmp_path / ".s.tokentape-next"
    deadline = time.monotonic() + 60
    while not staging.exists() and writer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(writer.pid, signal.SIGSTOP)
    assert staging.exists(), "the build finished before it could be paused"
    (out / "notes.txt").write_text("mine\n")
    os.kill(writer.pid, signal.SIGCONT)
    assert writer.wait(timeout=120) == 0, writer.stderr.read()
    assert (staging / "notes.txt").read_text() == "mine\n"  # not deleted
    assert sorted(os.listdir(staging)) == ["notes.txt"]  # the old store's files are gone
    again = subprocess.run(
        tokenize_argv(corpus, out, "--overwrite", "--filter", "min-tokens:3"),
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "notes.txt" in again.stderr, again.stderr
    assert (staging / "notes.txt").read_text() == "mine\n"


@pytest.mark.subprocess
def test_a_link_at_the_work_directory_name_is_removed_never_followed(corpus, tmp_path):
    """A ``.tokentape-work`` in ``--out`` that is a symbolic link to a directory elsewhere is
    removed as a link; nothing is written or removed where it points."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f").write_text("keep\n")
    out = tmp_path / "s"
    out.mkdir()
    (out / ".tokentape-work").symlink_to(elsewhere)
    done = subprocess.run(tokenize_argv(corpus, out), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert os.listdir(elsewhere) == ["f"] and (elsewhere / "f").read_text() == "keep\n"
    assert (out / "manifest.json").is_file() and not (out / ".tokentape-work").exists()


# --- verify reads only the store's own files, even while they are being swapped for links -----

SWAPPER = """
import os, sys, time
bin_file, saved, outside, stop = sys.argv[1:5]
tmp_file, tmp_link = bin_file + ".f", bin_file + ".l"
while not os.path.exists(stop):
    os.symlink(outside, tmp_link)
    os.rename(tmp_link, bin_file)
    os.link(saved, tmp_file)
    os.rename(tmp_file, bin_file)
"""


@pytest.mark.subprocess
@pytest.mark.slow
def test_verify_never_reads_through_a_link_swapped_in_after_its_check(tmp_path):
    """Another process swaps a shard file back and forth with a link to a file outside the
    store (atomic renames) while ``verify`` runs again and again: no report ever shows the
    outside file's size or hash (it was never read); each one is clean or names the link."""
    from tokentape._src.verify.stores import check_store

    store = tmp_path / "s"
    assert main(["tokenize", str(small_input(tmp_path)), "--out", str(store), "--json"]) == 0
    bin_file = store / "part-00000.bin"
    saved = tmp_path / "saved.bin"
    os.link(bin_file, saved)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"\x07\x00" * 4321)  # another size and hash than the shard
    stop = tmp_path / "stop"
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(bin_file), str(saved), str(outside), str(stop)]
    )
    outside_size = f"{outside.stat().st_size} bytes"
    outside_hash = hashlib.sha256(outside.read_bytes()).hexdigest()
    seen = 0
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            for problem in check_store(store).problems:
                text = str(problem)
                assert outside_size not in text and outside_hash not in text, text
                seen += 1
    finally:
        stop.touch()
        swapper.wait(timeout=30)
    assert seen > 0  # the swapping was seen (as links, never read)
    assert check_store(store).problems == ()


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("crash_at", ["after-manifest", "after-unit"])
def test_a_replacement_killed_after_the_old_store_went_aside_resumes_from_the_sibling(
    crash_at, corpus, tmp_path
):
    """Where names cannot be exchanged, ``--overwrite`` renames the old store aside, then the
    new one in. Killed between the two (here: killed with the new store finished, or half
    built, in the hidden sibling, and the old store then renamed aside as that first rename
    does), the rerun finds no ``--out`` but the sibling: it resumes there (units reused) and
    moves the result in, instead of throwing it away and starting over."""
    out = tmp_path / "s"
    subprocess.run(tokenize_argv(corpus, out, "--filter", "min-tokens:3"), check=True)
    killed = subprocess.run(
        tokenize_argv(corpus, out, "--overwrite", "--workers", "1"),
        env={**os.environ, "TOKENTAPE_CRASH_AT": crash_at},
        capture_output=True,
    )
    assert killed.returncode == -signal.SIGKILL
    staging = tmp_path / ".s.tokentape-next"
    assert staging.is_dir()
    out.rename(tmp_path / f".s.old-{socket.gethostname()}-12345")  # the fallback's first step
    done = subprocess.run(
        [*tokenize_argv(corpus, out, "--overwrite"), "--json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["status"] == "resumed" and summary["units_reused"] > 0, summary
    assert not staging.exists()
    reference = tmp_path / "reference"
    subprocess.run(tokenize_argv(corpus, reference), check=True)
    assert tree_bytes(out) == tree_bytes(reference)


@pytest.mark.subprocess
def test_convert_from_never_records_the_hash_of_an_index_swapped_in_meanwhile(corpus, tmp_path):
    """``convert --from megatron`` hashes the source ``.idx`` after converting. Another
    ``.idx`` renamed onto the prefix meanwhile (the convert paused with SIGSTOP) is refused;
    the store never records a hash of an index its documents did not come from."""
    small = tmp_path / "small"
    assert main(["tokenize", str(small_input(tmp_path)), "--out", str(small)]) == 0
    assert main(["convert", "--to", "megatron", str(small), str(tmp_path / "q" / "b")]) == 0
    store = tmp_path / "s"
    subprocess.run(tokenize_argv(corpus, store), check=True)
    prefix = tmp_path / "p" / "a"
    assert main(["convert", "--to", "megatron", str(store), str(prefix)]) == 0
    idx = prefix.with_suffix(".idx")
    original = hashlib.sha256(idx.read_bytes()).hexdigest()
    other = tmp_path / "q" / "b.idx"
    out = tmp_path / "conv"
    argv = [
        sys.executable,
        "-m",
        "tokentape",
        "convert",
        "--from",
        "megatron",
        str(prefix),
    ]
    argv += [str(out), "--vocab-size", "257", "--eod-id", "256", "--shard-mb", "0.01", "--json"]
    converting = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while converting.poll() is None and time.monotonic() < deadline:
        if any(n.startswith(".conv.tokentape-convert-") for n in os.listdir(tmp_path)):
            break
        time.sleep(0.0005)
    os.kill(converting.pid, signal.SIGSTOP)
    swap = idx.with_name(".a.idx.swap")
    swap.write_bytes(other.read_bytes())
    os.replace(swap, idx)
    os.kill(converting.pid, signal.SIGCONT)
    _, stderr = converting.communicate(timeout=120)
    if converting.returncode == 0:  # it had hashed the index before the pause: the right one
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["inputs"]["idx_sha256"] == original
    else:
        assert converting.returncode == 2, stderr
        assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
        assert "changed while it was being converted" in stderr, stderr
        assert not out.exists()


def test_reloading_a_stores_tokenizer_by_path_never_follows_a_link(hf_tokenizer_json, tmp_path):
    """``tokenizer_from_manifest`` without the copy's bytes reads ``tokenizer.json`` from the
    store itself: a link there (even to an identical file outside) is refused, not read."""
    from tokentape._src.store.format import read_manifest
    from tokentape._src.store.tokenizers import tokenizer_from_manifest

    store = tmp_path / "s"
    argv = ["tokenize", str(small_input(tmp_path)), "--out", str(store)]
    assert main([*argv, "--tokenizer", str(hf_tokenizer_json)]) == 0
    info = read_manifest(store).tokenizer
    assert tokenizer_from_manifest(info, store).vocab_size > 0  # the store's own copy
    outside = tmp_path / "outside.json"
    os.replace(store / "tokenizer.json", outside)
    (store / "tokenizer.json").symlink_to(outside)
    with pytest.raises(TokentapeError, match=r"tokenizer\.json: tokenizer copy is a symbolic"):
        tokenizer_from_manifest(info, store)


def test_a_directory_at_the_sidecar_name_is_refused_before_the_prefix_is_written(tmp_path, capsys):
    store = tmp_path / "s"
    assert main(["tokenize", str(small_input(tmp_path)), "--out", str(store)]) == 0
    capsys.readouterr()
    prefix = tmp_path / "m" / "x"
    prefix.parent.mkdir()
    planted = prefix.parent / "x.tokentape.json"
    planted.mkdir()
    assert main(["convert", "--to", "megatron", str(store), str(prefix)]) == 2
    line = one_line_error(capsys)
    assert str(planted) in line and "sidecar" in line, line
    assert sorted(os.listdir(prefix.parent)) == ["x.tokentape.json"]  # nothing written


def test_an_out_that_is_a_dangling_link_is_one_line_naming_it(tmp_path, capsys):
    out = tmp_path / "dl"
    out.symlink_to("absent")
    assert main(["tokenize", str(small_input(tmp_path)), "--out", str(out)]) == 2
    line = one_line_error(capsys)
    assert "a symbolic link to 'absent', which does not exist" in line, line
    assert out.is_symlink() and not (tmp_path / "absent").exists()


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


def work_files(work: Path) -> dict[str, int]:
    """Every file and directory below ``work`` (unit files are in a subdirectory), by mtime."""
    if not work.exists():
        return {}
    return {str(p.relative_to(work)): p.stat().st_mtime_ns for p in work.rglob("*")}


@pytest.mark.subprocess
def test_a_killed_runs_helper_writes_nothing_after_the_run_died(corpus, tmp_path):
    """The run is SIGKILLed after its first unit while its helper process is tokenizing
    others. The helper must die with it: a rerun with other settings clears the work directory
    and starts again, and a helper still writing there broke it ('No such file or directory'
    of a temporary name, 'Directory not empty') or could slip a unit of the old settings in."""
    out = tmp_path / "s"
    argv = [*tokenize_argv(corpus, out), "--workers", "2"]
    mark = f"TOKENTAPE_TEST_MARK={tmp_path}"  # inherited by every process the run starts
    env = {**os.environ, "TOKENTAPE_CRASH_AT": "after-unit", "TOKENTAPE_TEST_MARK": str(tmp_path)}
    killed = subprocess.run(argv, env=env)
    assert killed.returncode == -signal.SIGKILL
    work = out / ".tokentape-work"
    before = work_files(work)
    wait_for(lambda: not processes_with(mark), "the run's helper process to be gone")
    assert work_files(work) == before


def processes_with(variable: str) -> list[int]:
    """The live processes whose environment holds ``variable`` (``NAME=value``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if variable.encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("crash_at", "whole"), [("prefix-idx-aside", "old"), ("prefix-bin-in", "new")]
)
def test_a_prefix_install_killed_between_its_renames_is_made_whole_by_the_next_convert(
    crash_at, whole, corpus, tmp_path
):
    """``convert --to megatron --overwrite`` puts the new pair in with three renames (the old
    ``.idx`` aside, the new ``.bin`` in, the new ``.idx`` in). Killed between them, the prefix
    had no ``.idx``: every later convert to it was refused ('exists without a Megatron index
    ... remove it yourself') and the old index stayed under a hidden name. The next convert
    puts back the pair the ``.bin`` in place belongs to, then does its own work."""
    small, big = tmp_path / "small", tmp_path / "big"
    assert main(["tokenize", str(small_input(tmp_path)), "--out", str(small)]) == 0
    subprocess.run(tokenize_argv(corpus, big), check=True)
    prefix = tmp_path / "m" / "p"
    assert main(["convert", "--to", "megatron", str(small), str(prefix)]) == 0

    def pair() -> tuple[bytes, bytes]:
        return prefix.with_suffix(".bin").read_bytes(), prefix.with_suffix(".idx").read_bytes()

    old = pair()
    argv = [
        sys.executable,
        "-m",
        "tokentape",
        "convert",
        "--to",
        "megatron",
        str(big),
    ]
    killed = subprocess.run(
        [*argv, str(prefix), "--overwrite"],
        env={**os.environ, "TOKENTAPE_CRASH_AT": crash_at},
        capture_output=True,
    )
    assert killed.returncode == -signal.SIGKILL
    assert not prefix.with_suffix(".idx").exists()
    again = subprocess.run([*argv, str(prefix)], capture_output=True, text=True)
    assert again.returncode == 2 and "exists; pass --overwrite" in again.stderr, again.stderr
    if whole == "old":
        assert pair() == old
    else:
        assert pair() != old and open_source(prefix, vocab_size=257, eod_id=256).n_docs > 0
    assert [n for n in os.listdir(prefix.parent) if ".tokentape-" in n and "-old-" in n] == []
    done = subprocess.run([*argv, str(prefix), "--overwrite"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(prefix.parent)) == ["p.bin", "p.idx", "p.tokentape.json"]


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


@pytest.mark.subprocess
@pytest.mark.slow
def test_unit_files_a_stale_helper_of_other_settings_writes_are_never_used(corpus, tmp_path):
    """A helper of a killed run can outlive it (a Ray task runs on until Ray ends the dead
    driver's job) and finish its unit. A rerun with other settings and ``--overwrite`` must
    not take that unit for one of its own: unit files live in a directory named after the
    job, so the stale files (planted here where the old run writes them) lie apart."""
    out, clean = tmp_path / "s", tmp_path / "clean"
    new_settings = ("--filter", "min-tokens:40")

    def killed_at(point: str, argv: list[str]) -> None:
        env = {**os.environ, "TOKENTAPE_CRASH_AT": point}
        assert subprocess.run([*argv, "--workers", "1"], env=env).returncode == -signal.SIGKILL

    killed_at("mid-assembly", tokenize_argv(corpus, out))  # every unit of the old run made
    work = out / ".tokentape-work"
    stale = {p.relative_to(work): p.read_bytes() for p in work.rglob("unit-*") if p.is_file()}
    argv = [*tokenize_argv(corpus, out, *new_settings), "--overwrite"]
    killed_at("after-unit", argv)  # the new run made its first unit only
    planted = 0
    for relative, data in stale.items():  # the stale helper finishes its units now
        target = work / relative
        if not target.exists():  # not a file the new run has already made itself
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            planted += 1
    assert planted >= 3  # units the new run has yet to make
    assert subprocess.run(argv).returncode == 0
    subprocess.run(tokenize_argv(corpus, clean, *new_settings), check=True)
    assert tree_bytes(out) == tree_bytes(clean)

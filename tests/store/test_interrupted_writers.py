"""Writers interrupted by other processes: paused (SIGSTOP) while something changes behind
them, or killed (SIGKILL, ``TOKENTAPE_CRASH_AT``) between the steps of a replacement. The next
run makes the output whole, resumes where it can, and never deletes, follows or uses what is
not its own: a file put in the old store, a link at the work directory's name, a source index
swapped during a convert, unit files a killed run's helpers wrote or still write. Real
processes, on a corpus of 6,000 documents."""

from __future__ import annotations

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
from store_helpers import small_input

from tokentape._src.plan.open import open_source
from tokentape._src.program import main


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
    path = tmp_path_factory.mktemp("writers-corpus") / "c.jsonl"
    write_jsonl(path, [json.dumps({"text": t}) for t in make_documents(6_000, seed=3)])
    return path


# --- --overwrite: the old tree is removed, but only what is ours --------------------------------


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


# --- what a killed run leaves in --out: its work directory, its helpers' units ---------------


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


# --- a source changed during a convert -----------------------------------------------------


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

"""Where tokentape writes outside a stage cache, a name it chooses is never followed through a
planted link nor written into another's file: the writer lock (a hard link, another user's
file), the directory a run's helpers write units into, and the default build directory of an
upload; a link, FIFO or directory at the lock's name, a directory at a Megatron sidecar's.
Each is refused in one line naming it, and a tripwire outside is never touched. (A link at
the work directory's name is in tests/store/test_interrupted_writers.py; the stage cache in
tests/stage/test_stage_confined.py.) The directories the user names may be links: the output
(not a dangling one), the cache's root."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import jsonl_corpus, run_cli, tree_bytes
from store_helpers import one_line_error, small_input

from tokentape._src.program import main
from tokentape._src.store.lock import lock_path
from tokentape._src.store.upload import upload_work_dir
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.util.faults import CRASH_ENV
from tokentape.errors import OutputError

FOREIGN_UID = 4242


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return jsonl_corpus(tmp_path_factory.mktemp("corpus"), 200, seed=5)


@pytest.fixture
def tripwire(tmp_path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "tripwire.txt").write_text("precious\n")
    return outside


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokentape: error: "), err
    return lines[0]


@pytest.mark.parametrize("kind", ["hard link", "foreign"])
def test_the_writer_lock_is_never_another_files_name(kind, corpus, tripwire, tmp_path, capsys):
    """The holder writes its record into the lock file: a hard link there would write it into
    the linked file, another user's file is not ours."""
    if kind == "foreign" and os.geteuid() != 0:
        pytest.skip("planting another user's file needs root (chown)")
    out = tmp_path / "out"
    lock = lock_path(out)
    if kind == "hard link":
        os.link(tripwire / "tripwire.txt", lock)
    else:
        lock.write_text("")
        os.chown(lock, FOREIGN_UID, FOREIGN_UID)
    code = main(["tokenize", str(corpus), "--out", str(out)])
    line = _one_line(capsys)
    expected = "has 2 hard links" if kind == "hard link" else f"belongs to uid {FOREIGN_UID}"
    assert code == 2 and str(lock) in line and expected in line, line
    assert (tripwire / "tripwire.txt").read_text() == "precious\n"
    assert not out.exists()


@pytest.mark.subprocess
def test_a_link_at_a_resumed_runs_units_directory_is_refused(corpus, tripwire, tmp_path, capsys):
    """A run killed before its manifest leaves its units for the rerun; a link planted at the
    units directory's name would have the rerun's helpers write there (and assemble the store
    from what is there): refused, the outside untouched."""
    out = tmp_path / "out"
    killed = run_cli("tokenize", str(corpus), "--out", str(out), env={CRASH_ENV: "before-manifest"})
    assert killed.returncode != 0
    work = out / ".tokentape-work"
    (units,) = [p for p in work.iterdir() if p.name.startswith("units-")]
    shutil.copytree(units, tripwire / "units")
    shutil.rmtree(units)
    units.symlink_to(tripwire / "units")
    before = tree_bytes(tripwire)
    code = main(["tokenize", str(corpus), "--out", str(out)])
    line = _one_line(capsys)
    assert code == 2 and f"'{units}': is a symbolic link" in line and "remove it" in line, line
    assert tree_bytes(tripwire) == before
    assert not (out / "manifest.json").exists()


@pytest.mark.s3
@pytest.mark.parametrize("planted", ["uploads", "digest"])
def test_the_default_upload_directory_follows_no_link_below_the_cache(
    planted, corpus, tripwire, tmp_path, s3, monkeypatch
):
    """``$XDG_CACHE_HOME/tokentape/uploads/<digest>``: the two names below the user's cache
    are tokentape's; a link at either is refused before anything is written (the writer lock
    goes beside the digest's directory)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url = f"{s3.url}/web"
    work = upload_work_dir(url)
    target = work.parent if planted == "uploads" else work
    target.parent.mkdir(parents=True)
    target.symlink_to(tripwire, target_is_directory=True)
    before = tree_bytes(tripwire)
    config = TokenizeConfig(inputs=(str(corpus),), out=url, unit_mb=0.004)
    with pytest.raises(OutputError, match=rf"^'{target}': is a symbolic link .*give --work-dir"):
        tokenize(config)
    assert tree_bytes(tripwire) == before and os.listdir(tripwire) == ["tripwire.txt"]
    assert s3.keys() == []


@pytest.mark.s3
def test_the_users_cache_directory_may_be_a_link(corpus, tmp_path, s3, monkeypatch):
    """The root of the cache is the user's to place (a link to a larger disk, say)."""
    elsewhere = tmp_path / "big-disk"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tokentape").symlink_to(elsewhere, target_is_directory=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url = f"{s3.url}/web"
    summary = tokenize(TokenizeConfig(inputs=(str(corpus),), out=url, unit_mb=0.004))
    assert summary.status == "created"
    manifest = json.loads(s3.get(f"{url}/manifest.json"))
    assert manifest["content_hash"] == summary.content_hash
    assert [p for p in elsewhere.rglob("*") if not p.is_dir()] == []  # built there, removed


# --- whatever is planted at the lock's name, the sidecar's, or as --out is never followed -----


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

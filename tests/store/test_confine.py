"""A store reads only its own files: exact shard names in order, nothing outside its directory,
no symbolic links, nothing but regular files. Refused when a store is opened, planned, or
opened from a PLAN.json; reported by ``tokentape verify`` (exit 1) without reading the file,
even one swapped for a link while verify runs. A store's tokenizer copy is never reloaded
through a link."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import write_store
from store_helpers import small_input

from tokentape import TokentapeError, open_source
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import open_plan_store
from tokentape._src.program import main
from tokentape._src.store.format import MANIFEST_NAME, read_manifest
from tokentape._src.store.tokenizers import load_tokenizer
from tokentape._src.verify.stores import check_store

EOD = 256


DOCS = [[(7 * i + j) % 256 for j in range(5 + i % 9)] for i in range(40)]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    write_store(tmp_path / "store", DOCS, shard_tokens=100)
    assert len(read_manifest(tmp_path / "store").shards) >= 3
    return tmp_path / "store"


def edit_manifest(store: Path, edit) -> None:
    data = json.loads((store / MANIFEST_NAME).read_text())
    edit(data)
    (store / MANIFEST_NAME).write_text(json.dumps(data))


def rename_shard(store: Path, index: int, name: str) -> None:
    """Point shard ``index`` at ``name`` in the manifest and put its files there."""
    data = json.loads((store / MANIFEST_NAME).read_text())
    old = data["shards"][index]["name"]
    target = Path(name) if os.path.isabs(name) else store / name
    target.parent.mkdir(parents=True, exist_ok=True)
    for suffix in (".bin", ".idx.npy"):
        if not os.path.exists(f"{target}{suffix}"):
            shutil.copyfile(store / f"{old}{suffix}", f"{target}{suffix}")
    data["shards"][index]["name"] = name
    (store / MANIFEST_NAME).write_text(json.dumps(data))


def refusal(path: Path) -> str:
    with pytest.raises(TokentapeError) as info:
        open_source(path)
    with pytest.raises(TokentapeError) as again:
        open_source(path)
    assert str(info.value) == str(again.value)
    with pytest.raises(TokentapeError) as planned:
        read_manifest(path)  # what `tokentape plan` reads
    assert str(planned.value) == str(info.value)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "name, why",
    [
        ("../elsewhere/part-00000", "a path, not a plain file name inside the store"),
        ("sub/part-00000", "a path, not a plain file name inside the store"),
        ("part-00000/../part-00000", "a path, not a plain file name inside the store"),
        ("part-0", "not the writer's name for that shard"),
        ("shard-a", "not the writer's name for that shard"),
    ],
)
def test_shard_names_outside_or_unexpected_are_refused(store: Path, name: str, why: str) -> None:
    rename_shard(store, 0, name)
    assert refusal(store) == (
        f"{store / MANIFEST_NAME}: shards[0].name is {name!r}, {why}; expected 'part-00000'"
    )


def test_absolute_shard_name_is_refused(store: Path, tmp_path: Path) -> None:
    name = str(tmp_path / "elsewhere" / "part-00000")
    rename_shard(store, 0, name)
    assert refusal(store) == (
        f"{store / MANIFEST_NAME}: shards[0].name is {name!r}, a path, not a plain file name "
        "inside the store; expected 'part-00000'"
    )


def test_shards_must_be_numbered_in_manifest_order(store: Path) -> None:
    edit_manifest(store, lambda d: d["shards"].reverse())
    last = len(read_manifest_names(store)) - 1
    assert refusal(store).startswith(
        f"{store / MANIFEST_NAME}: shards[0].name is 'part-{last:05d}', not the writer's name "
        "for that shard; expected 'part-00000'"
    )


def read_manifest_names(store: Path) -> list[str]:
    return [s["name"] for s in json.loads((store / MANIFEST_NAME).read_text())["shards"]]


@pytest.mark.parametrize("suffix", [".bin", ".idx.npy"])
@pytest.mark.parametrize("where", ["outside", "inside"])
def test_symlinked_shard_file_is_refused(store: Path, tmp_path: Path, suffix, where) -> None:
    """A shard file that is a symbolic link is refused, wherever it points: to a file of the
    same size outside the store, or to another file of the store itself."""
    path = store / f"part-00001{suffix}"
    if where == "outside":
        target = tmp_path / f"outside{suffix}"
        shutil.copyfile(path, target)
    else:
        target = store / f".copy{suffix}"
        shutil.copyfile(path, target)
    path.unlink()
    path.symlink_to(target)
    assert refusal(store) == (
        f"{path}: {'shard file' if suffix == '.bin' else 'document index'} is a symbolic link "
        f"(to '{target}'); a store reads only regular files inside its own directory"
    )


def test_symlinked_manifest_and_tokenizer_copy_are_refused(
    tmp_path: Path, hf_tokenizer_json: Path
) -> None:
    tok = load_tokenizer(str(hf_tokenizer_json))
    store = tmp_path / "hf"
    write_store(store, [[1, 2, 3], [4, 5]], 100, tok=tok)
    assert open_source(store).decode([1, 2]) == tok.decode([1, 2])
    copy = store / "tokenizer.json"
    shutil.move(copy, tmp_path / "tok.json")
    copy.symlink_to(tmp_path / "tok.json")
    assert refusal(store) == (
        f"{copy}: tokenizer copy is a symbolic link (to '{tmp_path / 'tok.json'}'); a store "
        "reads only regular files inside its own directory"
    )
    assert [str(p) for p in check_store(store).problems] == [
        f"{copy}: not a file of the store (not read): expected a regular file inside the store, "
        f"found a symbolic link (to '{tmp_path / 'tok.json'}')"
    ]
    shutil.move(tmp_path / "tok.json", copy)
    manifest = store / MANIFEST_NAME
    shutil.move(manifest, tmp_path / "manifest.json")
    manifest.symlink_to(tmp_path / "manifest.json")
    assert refusal(store) == (
        f"{manifest}: the manifest is a symbolic link (to '{tmp_path / 'manifest.json'}'); a "
        "store reads only regular files inside its own directory"
    )
    (tmp_path / "manifest.json").unlink()  # a dangling link: still a link, not "no manifest"
    assert refusal(store) == (
        f"{manifest}: the manifest is a symbolic link (to '{tmp_path / 'manifest.json'}'); a "
        "store reads only regular files inside its own directory"
    )


def test_tokenizer_copy_name_is_exact(tmp_path: Path, hf_tokenizer_json: Path) -> None:
    tok = load_tokenizer(str(hf_tokenizer_json))
    store = tmp_path / "hf"
    write_store(store, [[1, 2, 3]], 100, tok=tok)
    shutil.copyfile(store / "tokenizer.json", tmp_path / "tokenizer.json")
    edit_manifest(store, lambda d: d["tokenizer"].update(file="../tokenizer.json"))
    with pytest.raises(TokentapeError, match="is not a plain file name"):
        open_source(store)


def test_fifo_shard_is_refused_without_blocking(store: Path) -> None:
    path = store / "part-00002.idx.npy"
    path.unlink()
    os.mkfifo(path)  # opening it for reading would wait for a writer forever
    assert refusal(store) == (
        f"{path}: document index is not a regular file; a store reads only regular files "
        "inside its own directory"
    )


def test_store_directory_itself_may_be_a_link(store: Path, tmp_path: Path) -> None:
    """The store may live anywhere (a plan's source path, a link to a shared disk): only the
    files inside it are confined."""
    link = tmp_path / "link"
    link.symlink_to(store)
    assert open_source(link).tokens(0, 10).tolist() == open_source(store).tokens(0, 10).tolist()


# --- plan, PLAN.json, verify -------------------------------------------------------------------


def plan_toml(tmp_path: Path, store: Path) -> Path:
    path = tmp_path / "mix.toml"
    path.write_text(
        f'seq_len = 8\nseed = 1\ntotal_samples = 10\n[[source]]\nname = "s"\npath = "{store}"\n'
        "weight = 1\nmax_repeats = 100\n"
    )
    return path


def test_plan_refuses_a_store_reading_outside(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rename_shard(store, 1, "../elsewhere/part-00001")
    out = tmp_path / "PLAN.json"
    assert main(["plan", str(plan_toml(tmp_path, store)), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shards[1].name is '../elsewhere/part-00001'" in err
    assert not out.exists()


def test_plan_json_refuses_a_store_changed_to_read_outside(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "PLAN.json"
    assert main(["plan", str(plan_toml(tmp_path, store)), "--out", str(out)]) == 0
    plan = load_plan(out)
    open_plan_store(plan.sources[0])
    path = store / "part-00000.bin"
    shutil.move(path, tmp_path / "outside.bin")
    path.symlink_to(tmp_path / "outside.bin")  # same bytes: only the link is wrong
    with pytest.raises(TokentapeError, match="shard file is a symbolic link"):
        open_plan_store(load_plan(out).sources[0])


def test_verify_reports_names_and_links_without_reading_them(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rename_shard(store, 0, "../elsewhere/part-00000")
    outside = store.parent / "elsewhere" / "part-00000.bin"
    outside.write_bytes(b"\0" * outside.stat().st_size)  # would be a sha256 mismatch if read
    link = store / "part-00002.bin"
    shutil.move(link, tmp_path / "two.bin")
    link.symlink_to(tmp_path / "two.bin")
    assert main(["verify", str(store)]) == 1
    out = capsys.readouterr().out.splitlines()
    problems = [str(p) for p in check_store(store).problems]
    assert problems == [
        f"{store / MANIFEST_NAME}: shards[0] name (shard not read): expected part-00000, "
        "found ../elsewhere/part-00000",
        f"{link}: not a file of the store (not read): expected a regular file inside the "
        f"store, found a symbolic link (to '{tmp_path / 'two.bin'}')",
    ]
    assert out[:-1] == problems and "FAILED, 2 problem(s)" in out[-1]


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

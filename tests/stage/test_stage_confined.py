"""The stage cache is confined like a store: a symbolic link, a FIFO, a directory, a hard link or
another user's entry planted at any name the cache uses is refused in one line naming it (or,
where it is harmless, replaced), and no byte outside the cache is ever written.

The names are not picked by hand: they are every path a real stage leaves in a cache, complete
(the staged store, its seal, the lock) and interrupted (the staging directory, its marker, a
shard file finished, a shard's ``.part`` and ``.ok``), plus every file of the store at its name
in the staging directory. Against a real S3 server (moto on 127.0.0.1).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tree_bytes, write_store
from objstore import env_with_s3, new_bucket, s3_environment

from tokentape._src.plan.plan import Plan
from tokentape._src.program import main
from tokentape._src.stage.stage import cache_key, stage
from tokentape._src.store.tokenizers import load_tokenizer
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig
from tokentape.errors import OutputError, StoreError

pytestmark = pytest.mark.s3

FOREIGN_UID = 4242
WRITTEN_IN_PLACE = (".lock", ".part", ".ok")
"""Names whose file tokentape writes into (not replaced by a rename): one hard link only."""


def _tree_digest(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed): its kind and, for a file, its sha256."""
    found = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISREG(st.st_mode):
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[rel] = stat.filemode(st.st_mode)[0]
    return found


class World:
    """One store in a bucket, a cache left complete and one left interrupted by a real stage,
    and an outside directory (a tripwire file, a copy of the store) that must never change."""

    def __init__(
        self, root: Path, endpoint: str, tokenizer_json: Path, mp: pytest.MonkeyPatch
    ) -> None:
        tok = load_tokenizer(f"hf:{tokenizer_json}")
        rng = random.Random(3)
        docs = [
            [rng.randrange(1, tok.vocab_size) for _ in range(rng.randint(5, 40))] for _ in range(40)
        ]
        self.local = root / "local" / "web"
        self.manifest = write_store(self.local, docs, 400, 64, tok)
        self.bucket = new_bucket(endpoint)
        self.url = self.bucket.upload_tree(self.local, f"{self.bucket.url}/stores/web")
        self.key = cache_key(self.url)
        self.complete = root / "complete"
        stage(self.url, self.complete)
        self.interrupted = root / "interrupted"
        self._interrupt(self.interrupted, mp)
        self.outside = root / "outside"
        self.outside.mkdir()
        (self.outside / "tripwire.bin").write_bytes(os.urandom(4096))
        shutil.copytree(self.local, self.outside / "store")
        self.plan = Plan.build(
            {"web": {"path": self.url, "weight": 1, "max_repeats": 100}}, seq_len=8, seed=1,
            total_samples=50,
        )  # fmt: skip
        self.plan_path = root / "plan.json"
        self.plan.save(self.plan_path)

    def _interrupt(self, cache: Path, mp: pytest.MonkeyPatch) -> None:
        """Stage with the last block of the second shard damaged in the bucket (one attempt):
        the stage fails with shard 0 finished and shard 1 half verified; then repair it."""
        name = self.manifest.shards[1].bin_file
        good = (self.local / name).read_bytes()
        self.bucket.put(f"{self.url}/{name}", good[:-1] + bytes([good[-1] ^ 1]))
        with mp.context() as one:
            one.setenv("TOKENTAPE_IO_RETRIES", "1")
            with pytest.raises(StoreError, match="does not match"):
                stage(self.url, cache, workers=1, range_bytes=64)
        self.bucket.put(f"{self.url}/{name}", good)

    def names(self) -> set[str]:
        """Every name (path relative to the cache) the two real stages left, and every file of
        the store at its name in the staging directory (a file finished there)."""
        found = {str(p.relative_to(self.complete)) for p in self.complete.rglob("*")}
        found |= {str(p.relative_to(self.interrupted)) for p in self.interrupted.rglob("*")}
        staging = f".{self.key}.staging"
        assert f"{staging}/.{self.manifest.shards[1].bin_file}.ok" in found  # a real stop
        found |= {f"{staging}/{p.name}" for p in (self.complete / self.key).iterdir()}
        return found


@pytest.fixture(scope="module")
def world(tmp_path_factory, s3_server, hf_tokenizer_json):
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3_environment(s3_server.endpoint).items():
            mp.setenv(key, value)
        yield World(tmp_path_factory.mktemp("confined"), s3_server.endpoint, hf_tokenizer_json, mp)


CASES = (
    "{key}",
    "{key}/manifest.json",
    "{key}/part-00000.bin",
    "{key}/part-00000.idx.npy",
    "{key}/tokenizer.json",
    ".{key}.seal",
    ".{key}.lock",
    ".{key}.staging",
    ".{key}.staging/.manifest.json",
    ".{key}.staging/manifest.json",
    ".{key}.staging/part-00000.bin",
    ".{key}.staging/.part-00001.bin.part",
    ".{key}.staging/.part-00001.bin.ok",
    ".{key}.staging/part-00001.idx.npy",
    ".{key}.staging/tokenizer.json",
)
"""Every name the cache uses, one shard standing for all (checked against real stages below):
a name under the staging directory is planted in the interrupted cache, the others in the
complete one."""


def _shape(name: str) -> str:
    return re.sub(r"part-\d{5}", "part-N", name)


def test_the_cases_are_every_name_a_real_stage_uses(world):
    """A name a stage starts to use (or stops using) fails here until the cases follow."""
    cases = {_shape(n.format(key=world.key)) for n in CASES}
    assert cases == {_shape(n) for n in world.names()}


KINDS = ("link-file", "link-dir", "fifo", "dir", "file", "foreign")


def _plant(world: World, cache: Path, name: str, kind: str) -> None:
    """Put a ``kind`` at ``cache/name`` in place of whatever is there."""
    path = cache / name
    was_dir = path.is_dir() and not path.is_symlink()
    if was_dir:
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    if kind == "link-file":
        path.symlink_to(world.outside / "tripwire.bin")
    elif kind == "link-dir":
        path.symlink_to(world.outside / "store", target_is_directory=True)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "file":  # at a file's name: a hard link to the outside; at a directory's: a file
        if was_dir:
            path.write_bytes(b"not a directory")
        else:
            os.link(world.outside / "tripwire.bin", path)
    elif kind == "foreign":
        if was_dir:
            path.mkdir()
        else:
            path.write_bytes(b"someone else's")
        os.chown(path, FOREIGN_UID, FOREIGN_UID)


def _expect_refusal(name: str, kind: str, is_dir: bool) -> bool:
    """Whether tokentape must refuse ``kind`` at ``name`` (else it replaces it, harmlessly)."""
    if kind in ("link-file", "link-dir", "fifo", "foreign"):
        return True
    if kind == "dir":
        return not is_dir  # an empty directory at a directory's name: staged anew
    if is_dir:
        return True  # a regular file where a directory belongs
    return name.endswith(WRITTEN_IN_PLACE)  # a hard link to a file written in place


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", CASES)
def test_a_planted_entry_is_refused_or_replaced_never_followed(world, tmp_path, capsys, name, kind):
    """`tokentape stage PLAN --cache DIR` (in this process): a refusal is exit 2, one line
    naming the planted entry and the remedy, nothing on stdout, the entry left in place; an
    acceptance is exit 0 and the staged copy of the store. Either way the outside is intact."""
    if kind == "foreign" and os.geteuid() != 0:
        pytest.skip("planting another user's file needs root (chown)")
    name = name.format(key=world.key)
    cache = tmp_path / "cache"
    state = world.interrupted if ".staging" in name else world.complete
    shutil.copytree(state, cache, symlinks=True)
    is_dir = (cache / name).is_dir()
    _plant(world, cache, name, kind)
    before = _tree_digest(world.outside)
    refused = _expect_refusal(name, kind, is_dir)
    code = main(["stage", str(world.plan_path), "--cache", str(cache), "--workers", "2", "--json"])
    out, err = capsys.readouterr()
    if refused:
        lines = err.splitlines()
        assert code == 2 and out == "", (kind, name, code, err)
        assert len(lines) == 1 and lines[0].startswith("tokentape: error: "), err
        assert f"'{cache / name}': " in lines[0], lines[0]
        assert "remove it" in lines[0], lines[0]
        assert os.path.lexists(cache / name)  # named, not removed
    else:
        assert code == 0, f"{kind} at {name} refused: {err}"
        staged = json.loads(out)["sources"][0]["path"]
        assert tree_bytes(Path(staged)) == tree_bytes(world.local)
        assert not (cache / name).is_symlink()
    assert _tree_digest(world.outside) == before


def test_a_planted_link_is_refused_by_the_command_and_the_loader(world, tmp_path):
    """`tokentape stage` (a process of its own) exits 2 with one line; ``Loader(cache_dir=...)``
    raises the same error instead of training on the outside copy the staged copy's name points
    to: in its constructor with ``stage="first"``, from the step after its background stage
    failed by default (the steps before are streamed from the bucket)."""
    plan, plan_path = world.plan, world.plan_path
    cache = tmp_path / "cache"
    shutil.copytree(world.complete, cache)
    shutil.rmtree(cache / world.key)
    (cache / world.key).symlink_to(world.outside / "store", target_is_directory=True)
    done = subprocess.run(
        [sys.executable, "-m", "tokentape", "stage", str(plan_path), "--cache", str(cache)],
        capture_output=True, text=True, env=env_with_s3(world.bucket.endpoint), timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokentape: error: "), done.stderr
    assert f"'{cache / world.key}': is a symbolic link (to '{world.outside / 'store'}')" in lines[0]
    assert done.stdout == ""
    with pytest.raises(OutputError, match="is a symbolic link"):
        Loader(plan, 0, BatchConfig(1, 2), cache_dir=cache, stage="first")
    with Loader(plan, 0, BatchConfig(1, 2), cache_dir=cache, prefetch=0) as loader:
        loader.step()
        loader.commit()
        assert loader._stage is not None
        loader._stage.wait()
        with pytest.raises(OutputError, match="is a symbolic link"):
            loader.step()


def test_a_cache_directory_others_can_write_is_refused(world, tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    with pytest.raises(OutputError, match="writable by other users"):
        stage(world.url, cache)
    assert os.listdir(cache) == []
    cache.chmod(0o1777)  # the sticky bit: others cannot rename our entries (like /tmp)
    assert stage(world.url, cache).path == cache / world.key


def test_a_staged_file_changed_on_disk_is_hashed_again_and_fetched_again(world, tmp_path):
    """A same-size rewrite of a staged shard (its mtime put back) is seen by its ctime: the file
    is hashed again, found damaged and fetched again; the other files are kept."""
    cache = tmp_path / "cache"
    shutil.copytree(world.complete, cache)
    entry = cache / world.key
    copied = stage(world.url, cache, expected_hash=world.manifest.content_hash)
    assert copied.cached and copied.rehashed_bytes == copied.total_bytes  # new files: new keys
    assert stage(world.url, cache, expected_hash=world.manifest.content_hash).rehashed_bytes == 0
    target = entry / world.manifest.shards[1].bin_file
    st = target.stat()
    data = bytearray(target.read_bytes())
    data[10] ^= 0xFF
    target.chmod(0o644)
    target.write_bytes(bytes(data))
    target.chmod(0o444)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = stage(world.url, cache, expected_hash=world.manifest.content_hash)
    assert not again.cached and again.downloaded_bytes == len(data)
    assert again.rehashed_bytes == len(data)
    assert tree_bytes(entry) == tree_bytes(world.local)
    third = stage(world.url, cache, expected_hash=world.manifest.content_hash)
    assert third.cached and third.rehashed_bytes == 0  # sealed again once repaired
    everything = stage(world.url, cache, expected_hash=world.manifest.content_hash, verify=True)
    assert everything.cached and everything.rehashed_bytes == everything.total_bytes


def test_an_object_rewritten_after_staging_leaves_the_verified_copy_in_use(world, tmp_path, capsys):
    """A shard rewritten in the bucket at the same size after it was staged: the staged copy
    (verified, sealed) is what a stage on the plan reuses, nothing read from the bucket; a
    fresh stage of the rewritten object fails on its block hashes, exit 2 with one line."""
    cache = tmp_path / "cache"
    shutil.copytree(world.complete, cache)
    name = world.manifest.shards[0].bin_file
    good = (world.local / name).read_bytes()
    world.bucket.put(f"{world.url}/{name}", bytes(b ^ 0x33 for b in good))
    try:
        args = ["stage", str(world.plan_path), "--workers", "2", "--json"]
        assert main([*args, "--cache", str(cache)]) == 0
        row = json.loads(capsys.readouterr().out)["sources"][0]
        assert row["cached"] and row["downloaded_bytes"] == 0
        assert tree_bytes(Path(row["path"])) == tree_bytes(world.local)
        code = main([*args, "--cache", str(tmp_path / "fresh")])
        out, err = capsys.readouterr()
        lines = err.splitlines()
        assert code == 2 and out == "" and len(lines) == 1, err
        assert f"{world.url}/{name}: block 0" in lines[0] and "does not match" in lines[0]
    finally:
        world.bucket.put(f"{world.url}/{name}", good)


def test_a_staged_copy_is_read_only_and_its_seal_is_json(world):
    entry = world.complete / world.key
    for path in entry.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o444, path
    seal = json.loads((world.complete / f".{world.key}.seal").read_text())
    assert set(seal["files"]) == {p.name for p in entry.iterdir() if p.name != "manifest.json"}

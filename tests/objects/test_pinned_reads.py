"""Objects rewritten in place, at the same size, are caught where they are read: every ranged
GET of a store's shard (streamed or staged) and of a Megatron prefix carries the object's
recorded ETag as ``If-Match``, so a rewrite fails the read with ``StoreChanged`` naming the
object, even where the range is smaller than a hash block (which only its length could check
before). Against a real S3 server (moto on 127.0.0.1); the rewrites are real PUTs, made by the
test as another writer would (through a hook of the fault proxy, at a chosen request, where it
must land mid-stage)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import build, cli, random_docs, write_store

from tokentape import BatchConfig, Loader, Plan
from tokentape._src.megatron import identity as megatron_identity
from tokentape._src.megatron.source import megatron_at_url
from tokentape._src.plan.load import load_plan
from tokentape._src.program import main
from tokentape._src.stage.stage import stage
from tokentape._src.store.reader import source_at_url
from tokentape.errors import PlanError, StoreChanged

pytestmark = pytest.mark.s3


def _flipped(data: bytes) -> bytes:
    """The same length, every byte different."""
    return bytes(b ^ 0x5A for b in data)


def _remote_store(root: Path, s3, block_bytes: int):
    """A store of several 400-token shards, on disk and in the bucket."""
    rng = random.Random(11)
    docs = [[rng.randrange(1, 250) for _ in range(rng.randint(5, 40))] for _ in range(60)]
    manifest = write_store(root / "web", docs, shard_tokens=400, block_bytes=block_bytes)
    url = s3.upload_tree(root / "web", f"{s3.url}/stores/web")
    return root / "web", url, manifest


def _plan(url: str) -> Plan:
    """A plan of the one store at ``url``."""
    return Plan.build(
        {"web": {"path": url, "weight": 1, "max_repeats": 100}}, seq_len=8, seed=3,
        total_samples=200,
    )  # fmt: skip


@pytest.fixture
def remote_store(tmp_path, s3):
    """Hash blocks larger than a shard: a window's range is never checked by its hash."""
    return _remote_store(tmp_path, s3, 4096)


def test_a_shard_rewritten_while_streamed_is_refused_by_name(remote_store, s3):
    local, url, manifest = remote_store
    source = source_at_url(url)
    seq = 8
    out = np.zeros((1, seq + 1), dtype=np.int64)
    source.windows_into(np.array([0]), seq, out)  # shard 0 looked at: its version pinned
    first = manifest.shards[0]
    assert first.block_bytes > first.n_tokens * 2  # a window is far smaller than a block
    target = f"{url}/{first.bin_file}"
    s3.put(target, _flipped((local / first.bin_file).read_bytes()))
    last = first.n_tokens // seq - 1  # a window of shard 0 not fetched yet
    with pytest.raises(StoreChanged, match=rf"{target}: the object was rewritten") as caught:
        source.windows_into(np.array([last]), seq, out)
    assert caught.value.path == target
    source.close()


def test_the_loader_stops_on_a_store_rewritten_mid_run(remote_store, s3):
    local, url, manifest = remote_store
    plan = _plan(url)
    with Loader(plan, 0, BatchConfig(1, 4), prefetch=0) as loader:
        loader.step()
        loader.commit()
        for shard in manifest.shards:  # every shard: whatever the next steps read
            s3.put(f"{url}/{shard.bin_file}", _flipped((local / shard.bin_file).read_bytes()))
        with pytest.raises(StoreChanged, match="the object was rewritten"):
            for _ in range(plan.horizon_samples // 4):
                loader.step()
                loader.commit()


def test_a_shard_rewritten_mid_stage_is_refused_by_name(s3, s3_server, tmp_path):
    local, url, manifest = _remote_store(tmp_path, s3, 64)  # a GET per block below
    name = manifest.shards[1].bin_file
    key = f"/{s3.name}/stores/web/{name}"
    seen: list[str] = []  # the ranges of the shard asked for, in order

    def another_writer(method: str, path: str, ranged: str | None) -> None:
        if method == "GET" and ranged and path.startswith(key):
            seen.append(ranged)
            if len(seen) == 2:  # after the first range of the shard was fetched
                s3.put(f"{url}/{name}", _flipped((local / name).read_bytes()))

    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.set(before=another_writer)
        options = {"endpoint_url": proxy.endpoint}
        block = manifest.shards[1].block_bytes
        with pytest.raises(StoreChanged, match=rf"{url}/{name}: the object was rewritten"):
            stage(url, tmp_path / "cache", storage_options=options, workers=1, range_bytes=block)
        statuses = [status for _, path, status, _ in proxy.stats().log if path.startswith(key)]
    assert statuses[0] == 206 and set(statuses[1:]) == {412}
    assert len(set(seen)) == len(seen)  # no range asked for twice: a 412 is not retried


def test_the_stage_command_exits_2_with_one_line_on_a_shard_rewritten_mid_stage(
    remote_store, s3, s3_server, tmp_path, capsys
):
    """`tokentape stage` (in this process), one GET per shard: the last shard is rewritten
    while the first is fetched."""
    local, url, manifest = remote_store
    saved = tmp_path / "plan.json"
    _plan(url).save(saved)
    first, last = manifest.shards[0].bin_file, manifest.shards[-1].bin_file

    def another_writer(method: str, path: str, ranged: str | None) -> None:
        if method == "GET" and ranged and path.endswith(f"/{first}"):
            s3.put(f"{url}/{last}", _flipped((local / last).read_bytes()))

    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.set(before=another_writer)
        options = json.dumps({"endpoint_url": proxy.endpoint})
        args = ["stage", str(saved), "--cache", str(tmp_path / "cache"), "--workers", "1"]
        code = main([*args, "--storage-options", options, "--json"])
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"tokentape: error: {url}/{last}: the object was rewritten"), err


@pytest.fixture
def remote_prefix(tmp_path, s3, monkeypatch):
    """A Megatron prefix in the bucket, identified by `tokentape verify` (its sidecar)."""
    monkeypatch.setattr(megatron_identity, "RACY_SECONDS", 0.0)
    prefix = tmp_path / "mega"
    build(prefix, random_docs(6, 300, 257, 256), np.uint16)
    url = f"{s3.url}/megatron/mega"
    for suffix in (".bin", ".idx"):
        s3.put(url + suffix, Path(f"{prefix}{suffix}").read_bytes())
    return prefix, url


def test_a_megatron_prefix_rewritten_while_streamed_is_refused(remote_prefix, s3, capsys):
    prefix, url = remote_prefix
    code, _, err = cli(capsys, "verify", url, "--vocab-size", "257", "--eod-id", "256")
    assert code == 0, err
    source = megatron_at_url(url, 257, 256)
    out = np.zeros((1, 9), dtype=np.int64)
    source.windows_into(np.array([0]), 8, out)
    source.doc_starts  # noqa: B018 -- the .idx read, pinned too
    s3.put(url + ".bin", _flipped(Path(f"{prefix}.bin").read_bytes()))
    with pytest.raises(StoreChanged, match=rf"{url}.bin: the object was rewritten"):
        source.windows_into(np.array([source.n_tokens // 8 - 1]), 8, out)
    source.close()


def test_the_plan_records_every_objects_version_and_pins_reads_to_it(remote_store, s3, tmp_path):
    """A shard rewritten at the same size after the plan was made (before any loader opened
    it) is refused by name at the first read, not served: the plan's ETag is the pin."""
    local, url, manifest = remote_store
    plan = _plan(url)
    listed = {
        key.rsplit("/", 1)[1]: s3.client.head_object(Bucket=s3.name, Key=key)["ETag"].strip('"')
        for key in s3.keys(url)
    }
    names = [n for s in manifest.shards for n in (s.bin_file, s.idx_file)]
    assert sorted(listed) == sorted([*names, "manifest.json"])
    assert dict(plan.sources[0].versions) == {n: listed[n] for n in names}
    saved = tmp_path / "plan.json"
    plan.save(saved)
    assert json.loads(saved.read_text())["sources"][0]["versions"] == dict(plan.sources[0].versions)
    assert load_plan(saved) == plan
    first = manifest.shards[0].bin_file
    s3.put(f"{url}/{first}", _flipped((local / first).read_bytes()))
    with (
        Loader(load_plan(saved), 0, BatchConfig(1, 4), prefetch=0) as loader,
        pytest.raises(
            StoreChanged, match=rf"{url}/{first}: the object was rewritten since the plan"
        ),
    ):
        for _ in range(plan.horizon_samples // 4):
            loader.step()
            loader.commit()


def test_replay_of_a_plan_whose_store_was_rewritten_is_exit_2_with_one_line(
    remote_store, s3, tmp_path, capsys
):
    local, url, manifest = remote_store
    saved = tmp_path / "plan.json"
    _plan(url).save(saved)
    args = ["replay", str(saved), "--step", "0", "--global-batch", "4", "--json"]
    assert main(args) == 0
    capsys.readouterr()
    for shard in manifest.shards:  # whichever the step reads
        s3.put(f"{url}/{shard.bin_file}", _flipped((local / shard.bin_file).read_bytes()))
    code = main(args)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"tokentape: error: {url}/part-0000"), lines[0]
    assert "the object was rewritten since the plan recorded it" in lines[0]


def test_a_plan_json_with_malformed_versions_is_refused(remote_store, tmp_path):
    _, url, _ = remote_store
    plan = _plan(url)
    data = json.loads(plan.to_json())
    for bad in ({"../part-00000.bin": "x"}, {"part-00000.bin": ""}, ["x"], {"a": 3}):
        data["sources"][0]["versions"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(data))
        with pytest.raises(PlanError, match=r"field 'versions': expected an object"):
            load_plan(tmp_path / "bad.json")

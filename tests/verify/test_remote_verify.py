"""``tokentape verify`` against stores in the bucket: the same checks as on disk, through ranged
GETs, with the same findings; a bucket that denies access is named in one line."""

from __future__ import annotations

import json

import pytest
from faultproxy import FaultProxy
from helpers import cli, plan_of, write_store

import tokentape
import tokentape.megatron
from tokentape.errors import TokentapeError

pytestmark = pytest.mark.s3

DOCS = [list(range(1, 30 + 7 * (i % 5))) for i in range(60)]


@pytest.fixture
def uploaded(tmp_path, s3):
    """A store of several shards of many small blocks, on disk and in the bucket."""
    write_store(tmp_path / "s", DOCS, shard_tokens=500, block_bytes=128)
    return tmp_path / "s", s3.upload_tree(tmp_path / "s", f"{s3.url}/stores/s")


def _same_findings(remote, local) -> None:
    keys = (
        "ok",
        "n_shards",
        "n_tokens",
        "n_docs",
        "blocks_checked",
        "blocks_total",
        "bytes_hashed",
    )
    assert {k: getattr(remote, k) for k in keys} == {k: getattr(local, k) for k in keys}
    assert [(p.what, p.expected, p.found) for p in remote.problems] == [
        (p.what, p.expected, p.found) for p in local.problems
    ]


@pytest.mark.parametrize("quick", [False, True])
def test_an_intact_store_in_the_bucket_verifies_as_on_disk(uploaded, quick):
    local, url = uploaded
    [remote_report] = tokentape.verify(url, quick)
    [local_report] = tokentape.verify(local, quick)
    assert remote_report.ok and remote_report.path == url
    _same_findings(remote_report, local_report)


@pytest.mark.parametrize("quick", [False, True])
def test_damage_in_the_bucket_is_found_as_on_disk(uploaded, s3, quick):
    local, url = uploaded
    path = local / "part-00000.bin"
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01  # block 0: hashed in both modes
    data[2 * 57 + 1] = 0xFF  # the high byte of a token id: out of the byte vocabulary
    path.write_bytes(bytes(data))
    s3.put(f"{url}/part-00000.bin", bytes(data))
    idx = local / "part-00001.idx.npy"
    idx.unlink()
    s3.client.delete_object(Bucket=s3.name, Key=s3.key(f"{url}/part-00001.idx.npy"))
    [remote_report] = tokentape.verify(url, quick)
    [local_report] = tokentape.verify(local, quick)
    assert not remote_report.ok
    _same_findings(remote_report, local_report)
    assert any(p.file == f"{url}/part-00000.bin" for p in remote_report.problems)


def test_verify_a_plan_over_the_bucket_and_the_command_line(tmp_path, s3, capsys):
    from helpers import small_shard_stores

    small_shard_stores(tmp_path)
    s3.upload_tree(tmp_path / "stores", f"{s3.url}/stores")
    text = (
        (tmp_path / "mix.toml").read_text().replace('path = "stores/', f'path = "{s3.url}/stores/')
    )
    plan_of(tmp_path, text).save(tmp_path / "remote.json")
    code, out, err = cli(capsys, "verify", tmp_path / "remote.json", "--json")
    assert code == 0, err
    stores = json.loads(out)["stores"]
    assert [s["path"] for s in stores] == [f"{s3.url}/stores/{n}" for n in ("web", "code", "math")]
    assert all(s["ok"] for s in stores)
    code, out, err = cli(capsys, "verify", f"{s3.url}/stores/nothing")
    assert code == 2 and "no manifest.json" in err and len(err.strip().splitlines()) == 1


def test_convert_a_store_in_the_bucket_to_megatron_as_from_disk(uploaded, tmp_path, capsys):
    local, url = uploaded
    code, out, err = cli(capsys, "convert", "--to", "megatron", url, tmp_path / "remote", "--json")
    assert code == 0, err
    assert json.loads(out)["source"] == url
    from_disk = tokentape.megatron.to_megatron(local, tmp_path / "local")
    assert json.loads(out)["content_hash"] == from_disk.content_hash
    for suffix in (".bin", ".idx"):
        a = (tmp_path / f"remote{suffix}").read_bytes()
        assert a == (tmp_path / f"local{suffix}").read_bytes() and a


def test_a_manifest_nested_too_deep_is_one_line(tmp_path, s3, capsys):
    url = f"{s3.url}/deep"
    s3.put(f"{url}/manifest.json", b"[" * 100_000)
    for store in (url, tmp_path / "deep"):
        if not isinstance(store, str):
            store.mkdir()
            (store / "manifest.json").write_bytes(b"[" * 100_000)
        code, _, err = cli(capsys, "verify", store)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "not valid JSON" in err, err


def test_a_bucket_that_denies_access_is_named_in_one_line(
    s3, s3_server, capsys, tmp_path, monkeypatch
):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "2")
    monkeypatch.setenv("TOKENTAPE_IO_BACKOFF", "0.01")
    write_store(tmp_path / "store", [list(range(1, 40))] * 3, shard_tokens=50)
    store = s3.upload_tree(tmp_path / "store", f"{s3.url}/stores/web")
    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.set(deny=1.0)  # credentials without read access
        options = {"endpoint_url": proxy.endpoint}
        code, _, err = cli(capsys, "verify", store, "--storage-options", json.dumps(options))
        assert code == 2 and len(err.strip().splitlines()) == 1
        assert store in err and "access denied" in err, err
        with pytest.raises(TokentapeError, match="access denied"):
            tokentape.open_source(store, storage_options=options)

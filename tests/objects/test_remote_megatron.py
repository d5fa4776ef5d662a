"""Megatron prefixes in object storage (a real S3 server, moto): identified once by `tokentape
verify`, which records a sidecar object beside them; planned from that sidecar and the objects'
sizes alone, with the index hash of the same prefixes on local disk; streamed and staged with
the batches, replays and locations of the local run; changed objects refused by name.

Expected values come from the local copies of the same files (documents built with numpy by
``helpers.build``), never from the code under test.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import build, check_reads_as, cli, random_docs, tree_bytes, write_store

import tokentape
from tokentape import BatchConfig, Loader
from tokentape._src.megatron import identity as megatron_identity
from tokentape._src.megatron.remote import read_sidecar
from tokentape._src.megatron.source import megatron_at_url
from tokentape._src.objects.client import object_store
from tokentape._src.plan.plan import resolve_plan
from tokentape._src.plan.spec import parse_plan
from tokentape._src.stage.stage import cache_key, stage, stage_sources
from tokentape._src.util.faults import CRASH_ENV
from tokentape.errors import StoreChanged, StoreError

pytestmark = pytest.mark.s3

PLAN = """\
seq_len = 8
seed = 7
total_samples = 400
weight_denominator = 1024
[[source]]
name = "store"
path = "STORE"
weight = 2
max_repeats = 100
[[source]]
name = "mega"
path = "MEGA"
format = "megatron"
vocab_size = 257
eod_id = 256
weight = 1
max_repeats = 100
[[source]]
name = "mega2"
path = "MEGA2"
vocab_size = 257
eod_id = 256
weight = 1
max_repeats = 100
"""


@pytest.fixture(autouse=True)
def trusted_timestamps(monkeypatch):
    monkeypatch.setattr(megatron_identity, "RACY_SECONDS", 0.0)


@pytest.fixture
def data(tmp_path, s3):
    """A store and two Megatron prefixes (bytes vocabulary: 257 ids, EOD 256) on disk, and the
    same files in the bucket (the prefixes' .bin and .idx only: no sidecar)."""
    store_docs = [list(d[0][:-1]) for d in random_docs(5, 60, 257, 256, max_seqs=1)]
    write_store(tmp_path / "store", store_docs, shard_tokens=50)
    (tmp_path / "mega").mkdir()
    docs = {"mega": random_docs(6, 300, 257, 256), "mega2": random_docs(7, 200, 257, 256)}
    local = {"mega": tmp_path / "mega" / "data_text_document", "mega2": tmp_path / "mega2"}
    build(local["mega"], docs["mega"], np.uint16)
    build(local["mega2"], docs["mega2"], np.int32)
    urls = {
        "store": s3.upload_tree(tmp_path / "store", f"{s3.url}/stores/store"),
        "mega": f"{s3.url}/megatron/data_text_document",
        "mega2": f"{s3.url}/megatron/mega2",
    }
    for name in ("mega", "mega2"):
        for suffix in (".bin", ".idx"):
            s3.put(urls[name] + suffix, Path(f"{local[name]}{suffix}").read_bytes())
    return tmp_path, docs, local, urls


def plan_text(paths: dict[str, str]) -> str:
    return (
        PLAN.replace("STORE", paths["store"])
        .replace("MEGA2", paths["mega2"])
        .replace("MEGA", paths["mega"])
    )


def plans(data):
    root, _, local, urls = data
    local_paths = {"store": str(root / "store"), **{k: str(v) for k, v in local.items()}}
    local_plan = resolve_plan(parse_plan(plan_text(local_paths), "mix.toml", str(root)), "mix")
    remote_plan = resolve_plan(parse_plan(plan_text(urls), "mix.toml", str(root)), "mix")
    return local_plan, remote_plan


def verify(capsys, *urls: str) -> None:
    for url in urls:
        code, out, err = cli(capsys, "verify", url, "--vocab-size", "257", "--eod-id", "256")
        assert code == 0, (out, err)


def test_a_prefix_is_planned_only_once_verify_has_identified_it(data, s3, capsys):
    root, _, _, urls = data
    with pytest.raises(StoreError, match=r"source .mega.: Megatron prefix 's3://.*' has no curr"):
        plans(data)
    spec = root / "mix.toml"
    spec.write_text(plan_text(urls))
    code, _, err = cli(capsys, "plan", spec)
    assert code == 2
    assert f"run `tokentape verify {urls['mega']} --vocab-size V --eod-id E` once" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    verify(capsys, urls["mega"], urls["mega2"])
    objects = object_store(urls["mega"])
    for name in ("mega", "mega2"):
        recorded = read_sidecar(objects, urls[name])
        assert recorded is not None
        assert s3.get(urls[name] + ".tokentape.json").startswith(b"{")
    local, remote = plans(data)
    assert remote.index_hash == local.index_hash
    assert [s.format for s in remote.sources] == ["tokentape", "megatron", "megatron"]
    assert [s.path for s in remote.sources] == [urls["store"], urls["mega"], urls["mega2"]]
    assert [s.content_hash for s in remote.sources] == [s.content_hash for s in local.sources]


def test_planning_reads_the_sidecar_and_the_sizes_but_no_token_data(data, s3_server, capsys):
    _, _, _, urls = data
    verify(capsys, urls["mega"], urls["mega2"])
    with FaultProxy(s3_server.endpoint) as proxy:
        options = {"endpoint_url": proxy.endpoint}
        for name in ("mega", "mega2"):
            megatron_at_url(urls[name], 257, 256, storage_options=options)
        log = proxy.stats().log
    gets = [path for method, path, _, _ in log if method == "GET"]
    assert gets and all(p.endswith(".tokentape.json") for p in gets), gets
    assert any(m == "HEAD" and p.endswith(".bin") for m, p, _, _ in log)


def test_a_streamed_prefix_reads_exactly_as_the_local_files(data, capsys):
    _, docs, _, urls = data
    verify(capsys, urls["mega"], urls["mega2"])
    for name, dtype in (("mega", np.uint16), ("mega2", np.int32)):
        src = megatron_at_url(urls[name], 257, 256)
        try:
            check_reads_as(src, docs[name], dtype)
            assert src.stats.requests > 0
        finally:
            src.close()


def _steps(plan, configs, segments: bool) -> list:
    out, consumed = [], 0
    for steps, config in configs:
        for _ in range(steps):
            ranks = []
            for rank in range(config.dp_size):
                state = dataclasses.replace(tokentape.DataState.start(plan), consumed=consumed)
                with Loader(plan, rank, config, state=state, prefetch=2, segments=segments) as ld:
                    step = ld.step()
                    ranks.append(
                        [(b.tokens, b.segment_ids, b.doc_positions) for b in step.micro_batches]
                    )
            out.append(ranks)
            consumed += config.global_batch
    return out


def _assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g_step, w_step in zip(got, want, strict=True):
        for g_rank, w_rank in zip(g_step, w_step, strict=True):
            for g, w in zip(g_rank, w_rank, strict=True):
                for a, b in zip(g, w, strict=True):
                    np.testing.assert_array_equal(a, b)


def test_streamed_and_staged_runs_match_the_local_run_with_a_dp_change(data, capsys, tmp_path):
    _, _, _, urls = data
    verify(capsys, urls["mega"], urls["mega2"])
    local, remote = plans(data)
    configs = [(3, BatchConfig(2, 3, 2)), (3, BatchConfig(3, 2, 1))]
    want = _steps(local, configs, True)
    _assert_same(_steps(remote, configs, True), want)
    staged, results = stage_sources(remote, tmp_path / "cache")
    assert set(results) == {"store", "mega", "mega2"}
    assert staged.index_hash == remote.index_hash
    for name in ("mega", "mega2"):
        prefix = Path(results[name].path)
        assert prefix.parent == tmp_path / "cache" / cache_key(urls[name])
        for suffix in (".bin", ".idx"):
            assert (
                Path(f"{prefix}{suffix}").read_bytes()
                == Path(f"{data[2][name]}{suffix}").read_bytes()
            )
    _assert_same(_steps(staged, configs, True), want)
    again = stage_sources(remote, tmp_path / "cache")[1]
    assert all(r.cached and r.downloaded_bytes == 0 for r in again.values())


def test_replay_and_locate_against_the_bucket(data, capsys):
    _, _, _, urls = data
    verify(capsys, urls["mega"], urls["mega2"])
    local, remote = plans(data)
    for step in (0, 5):
        a = tokentape.replay(remote, step, global_batch=8)
        b = tokentape.replay(local, step, global_batch=8)
        assert a.tokens_hash == b.tokens_hash
        np.testing.assert_array_equal(a.doc_first, b.doc_first)
    a = tokentape.locate(remote, "mega", 3, global_batch=8, until_step=40)
    b = tokentape.locate(local, "mega", 3, global_batch=8, until_step=40)
    assert a.position.tolist() == b.position.tolist() and len(a.position) > 0


def test_a_changed_object_is_refused_and_verify_names_it(data, s3, capsys, tmp_path):
    _, _, _, urls = data
    verify(capsys, urls["mega"], urls["mega2"])
    _, remote = plans(data)
    sidecar = s3.get(urls["mega"] + ".tokentape.json")
    bin_url = urls["mega"] + ".bin"
    body = bytearray(s3.get(bin_url))
    body[10] ^= 0x01  # same size, one id changed
    s3.put(bin_url, bytes(body))
    with pytest.raises(StoreError, match=r"'mega': .* \.bin or \.idx changed since the sidecar"):
        plans(data)
    with pytest.raises(StoreError, match="changed since the sidecar recorded them"):
        Loader(remote, 0, BatchConfig(1, 4, 1)).step()
    with pytest.raises(StoreError, match="changed since the sidecar recorded them"):
        stage_sources(remote, tmp_path / "cache")
    remote.save(tmp_path / "plan.json")
    code, out, _ = cli(capsys, "verify", tmp_path / "plan.json", "--json")
    assert code == 1
    problems = [p for s in json.loads(out)["stores"] for p in s["problems"]]
    assert [p["what"] for p in problems] == ["source 'mega' content_hash"], problems
    # The objects were written again: verify identified them anew, for the plan to compare.
    assert s3.get(urls["mega"] + ".tokentape.json") != sidecar
    with pytest.raises(StoreChanged, match="changed since the plan was made"):
        stage_sources(remote, tmp_path / "cache")
    with pytest.raises(StoreChanged, match=r"\(source 'mega'\) changed since the plan was made"):
        Loader(remote, 0, BatchConfig(1, 4, 1)).step()


def test_stage_of_a_prefix_refuses_a_forged_sidecar_and_resumes_after_a_kill(
    data, s3, capsys, tmp_path
):
    _, _, local, urls = data
    verify(capsys, urls["mega"])
    sidecar_url = urls["mega"] + ".tokentape.json"
    good = s3.get(sidecar_url)
    forged = json.loads(good)
    forged["identity"]["idx_sha256"] = "0" * 64
    s3.put(sidecar_url, json.dumps(forged).encode())  # content hash no longer follows: ignored
    with pytest.raises(StoreError, match="no sidecar records one"):
        stage(urls["mega"], tmp_path / "cache", format="megatron")
    s3.put(sidecar_url, good)
    cache = tmp_path / "cache"
    script = (
        "import sys\nfrom tokentape._src.stage.stage import stage\n"
        "stage(sys.argv[1], sys.argv[2], workers=1, range_bytes=512, format='megatron')\n"
    )
    import os

    env = {**os.environ, CRASH_ENV: "stage.verified.data_text_document.bin"}
    proc = subprocess.run(
        [sys.executable, "-c", script, urls["mega"], str(cache)], env=env, capture_output=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    result = stage(urls["mega"], cache, format="megatron", range_bytes=512)
    assert not result.cached and result.reused_bytes > 0
    assert result.reused_bytes + result.downloaded_bytes == result.total_bytes
    assert tree_bytes(result.path.parent) == {
        **{
            f"data_text_document{s}": Path(f"{local['mega']}{s}").read_bytes()
            for s in (".bin", ".idx")
        },
        "data_text_document.tokentape.json": (
            result.path.parent / "data_text_document.tokentape.json"
        ).read_bytes(),
    }
    assert stage(urls["mega"], cache, format="megatron").cached


def test_a_plan_made_before_the_data_changed_is_refused_when_staged(data, s3, capsys, tmp_path):
    _, _, local, urls = data
    verify(capsys, urls["mega"], urls["mega2"])
    _, remote = plans(data)
    other = random_docs(9, 300, 257, 256)
    build(local["mega"], other, np.uint16)
    for suffix in (".bin", ".idx"):
        s3.put(urls["mega"] + suffix, Path(f"{local['mega']}{suffix}").read_bytes())
    verify(capsys, urls["mega"])  # identified anew: another content hash
    with pytest.raises(StoreChanged, match="changed since the plan was made"):
        stage_sources(remote, tmp_path / "cache")


def test_the_command_line_stages_a_plan_with_a_prefix_and_refuses_converting_one(
    data, capsys, tmp_path
):
    _, _, local, urls = data
    verify(capsys, urls["mega"], urls["mega2"])
    _, remote = plans(data)
    remote.save(tmp_path / "plan.json")
    code, out, err = cli(
        capsys, "stage", tmp_path / "plan.json", "--cache", tmp_path / "c", "--json"
    )
    assert code == 0, err
    staged = {s["name"]: s for s in json.loads(out)["sources"]}
    assert set(staged) == {"store", "mega", "mega2"}
    prefix = Path(staged["mega2"]["path"])
    assert Path(f"{prefix}.bin").read_bytes() == Path(f"{local['mega2']}.bin").read_bytes()
    code, _, err = cli(capsys, "convert", "--from", "megatron", urls["mega"], tmp_path / "o",
                       "--vocab-size", "257", "--eod-id", "256")  # fmt: skip
    assert code == 2 and "reads a prefix on local disk" in err
    assert len(err.strip().splitlines()) == 1


def test_verify_on_a_bucket_one_may_only_read_says_the_identity_is_not_recorded(
    data, s3_server, capsys
):
    _, _, _, urls = data
    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.set(deny=1.0, methods=frozenset({"PUT"}))
        options = json.dumps({"endpoint_url": proxy.endpoint})
        code, out, err = cli(capsys, "verify", urls["mega"], "--vocab-size", "257",
                             "--storage-options", options, "--json")  # fmt: skip
        assert proxy.stats().faults["deny"] >= 1
    assert code == 1, err
    problems = json.loads(out)["stores"][0]["problems"]
    assert [p["what"] for p in problems] == ["identity not recorded"]
    assert problems[0]["file"] == urls["mega"] + ".tokentape.json"
    with pytest.raises(StoreError, match="no sidecar records one"):
        megatron_at_url(urls["mega"], 257, 256)

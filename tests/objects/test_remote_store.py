"""A plan over stores in object storage: planned from their manifests alone with the same index
hash as on local disk, and read in place (exact ranges, fetched ahead) with the same batches,
replays and locations as the local stores give."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from helpers import PLAN, cli, plan_of, small_shard_stores, write_store

import tokentape
from tokentape import BatchConfig, Loader, Plan
from tokentape._src.objects.ranged import merge_ranges
from tokentape._src.plan.load import load_plan
from tokentape._src.store.reader import source_at_url
from tokentape.errors import PlanError, StoreError

pytestmark = pytest.mark.s3


def remote_plan_text(bucket_url: str) -> str:
    return PLAN.replace('path = "stores/', f'path = "{bucket_url}/stores/')


@pytest.fixture
def stores(tmp_path, s3):
    """The three small multi-shard stores, on disk and uploaded to the bucket."""
    small_shard_stores(tmp_path)
    s3.upload_tree(tmp_path / "stores", f"{s3.url}/stores")
    return tmp_path


def test_plan_from_bucket_has_the_local_index_hash(stores, s3):
    local = plan_of(stores)
    remote = plan_of(stores, remote_plan_text(s3.url))
    assert remote.index_hash == local.index_hash
    assert [s.path for s in remote.sources] == [
        f"{s3.url}/stores/{n}" for n in ("web", "code", "math")
    ]
    assert [dataclasses.replace(s, path="", versions=()) for s in remote.sources] == [
        dataclasses.replace(s, path="") for s in local.sources
    ]
    assert all(s.versions for s in remote.sources) and not any(s.versions for s in local.sources)
    saved = stores / "remote.json"
    remote.save(saved)
    assert "storage_options" not in json.loads(saved.read_text())  # none given: as before
    assert load_plan(saved) == remote


def test_plan_reads_only_manifests(stores, s3):
    for key in s3.keys(f"{s3.url}/stores"):
        if not key.endswith("manifest.json"):
            s3.client.delete_object(Bucket=s3.name, Key=key)
    plan = plan_of(stores, remote_plan_text(s3.url))
    assert plan.index_hash == plan_of(stores).index_hash
    with pytest.raises(StoreError, match=r"part-\d+\.bin: shard file is missing"):
        Loader(plan, 0, BatchConfig(1, 4, 1)).step()


def test_plan_storage_options_round_trip_and_refuse_credentials(stores, s3):
    text = remote_plan_text(s3.url) + f'[storage_options]\nendpoint_url = "{s3.endpoint}"\n'
    text = text.replace("[[source]]", "[storage_options]\n", 0)
    plan = plan_of(stores, _with_options(remote_plan_text(s3.url), {"endpoint_url": s3.endpoint}))
    assert plan.storage_options == {"endpoint_url": s3.endpoint}
    saved = stores / "p.json"
    plan.save(saved)
    assert load_plan(saved).storage_options == {"endpoint_url": s3.endpoint}
    secret = {"endpoint_url": s3.endpoint, "secret": "do-not-write-me"}
    with pytest.raises(PlanError, match=r"'storage_options\.secret' looks like a credential"):
        plan_of(stores, _with_options(remote_plan_text(s3.url), secret))
    data = json.loads(saved.read_text())
    data["storage_options"]["key"] = "AKIA"
    saved.write_text(json.dumps(data))
    with pytest.raises(PlanError, match=r"storage_options\.key"):
        load_plan(saved)


def _with_options(text: str, options: dict) -> str:
    table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())
    head, _, rest = text.partition("[[source]]")
    return f"{head}[storage_options]\n{table}[[source]]{rest}"


def _run(plan: Plan, configs: list[tuple[int, BatchConfig]], segments: bool) -> list:
    """Every rank's micro-batches (tokens, segments, positions) of a run whose shape changes:
    ``configs`` is (steps, shape) in order; each step's ranks are read by their own loaders."""
    out, consumed = [], 0
    for steps, config in configs:
        for _ in range(steps):
            ranks = []
            for rank in range(config.dp_size):
                state = tokentape.DataState.start(plan)
                state = dataclasses.replace(state, consumed=consumed)
                with Loader(plan, rank, config, state=state, prefetch=2, segments=segments) as ld:
                    step = ld.step()
                    ranks.append(
                        [
                            (b.positions, b.tokens, b.segment_ids, b.doc_positions)
                            for b in step.micro_batches
                        ]
                    )
            out.append(ranks)
            consumed += config.global_batch
    return out


def test_streamed_loader_matches_local_for_every_step_of_a_run_with_a_dp_change(stores, s3):
    local = plan_of(stores)
    remote = plan_of(stores, remote_plan_text(s3.url))
    configs = [(3, BatchConfig(2, 3, 2)), (3, BatchConfig(3, 2, 1))]
    got, want = _run(remote, configs, True), _run(local, configs, True)
    assert len(got) == len(want) == 6
    for g_step, w_step in zip(got, want, strict=True):
        for g_rank, w_rank in zip(g_step, w_step, strict=True):
            for g, w in zip(g_rank, w_rank, strict=True):
                for a, b in zip(g, w, strict=True):
                    np.testing.assert_array_equal(a, b)


def test_one_streaming_loader_keeps_ahead_and_fetches_about_what_it_trains(stores, s3):
    remote = plan_of(stores, remote_plan_text(s3.url))
    local = plan_of(stores)
    config = BatchConfig(1, 16, 1)
    with Loader(remote, 0, config, prefetch=3) as rl, Loader(local, 0, config, prefetch=3) as ll:
        for _ in range(10):
            a, b = rl.step(), ll.step()
            np.testing.assert_array_equal(a.micro_batches[0].tokens, b.micro_batches[0].tokens)
            rl.commit()
            ll.commit()
        fetched = sum(s.stats.bytes for s in rl.batcher.sources)
    trained = 10 * 16 * (remote.seq_len + 1) * 2
    # Steps 10..13 were fetched ahead; overlapping windows are fetched once.
    assert trained * 0.9 < fetched <= trained * (14 / 10) * 1.01


def test_loader_with_a_cache_dir_stages_and_with_a_small_cache_still_streams_exactly(
    stores, s3, tmp_path
):
    local = plan_of(stores)
    remote = plan_of(stores, remote_plan_text(s3.url))
    config = BatchConfig(2, 4, 2)
    tiny = tokentape.FetchConfig(concurrency=3, cache_mb=0.002)  # 2 KiB: evictions all along
    with (
        Loader(remote, 1, config, cache_dir=tmp_path / "cache", stage="first") as staged,
        Loader(remote, 1, config, fetch=tiny) as streamed,
        Loader(local, 1, config) as ll,
    ):
        assert all(s.path.startswith(str(tmp_path / "cache")) for s in staged.plan.sources)
        assert staged.plan.index_hash == remote.index_hash
        for _ in range(6):
            want = ll.step()
            for loader in (staged, streamed):
                got = loader.step()
                for g, w in zip(got.micro_batches, want.micro_batches, strict=True):
                    np.testing.assert_array_equal(g.tokens, w.tokens)
                loader.commit()
            ll.commit()
        assert staged.fetch_stats.bytes == 0 and streamed.fetch_stats.requests > 0
    with pytest.raises(tokentape.ArgumentError, match="cache_mb must be positive"):
        tokentape.FetchConfig(cache_mb=0)


def test_replay_and_locate_against_the_bucket(stores, s3, capsys):
    local = plan_of(stores)
    remote = plan_of(stores, remote_plan_text(s3.url))
    for step in (0, 7):
        a = tokentape.replay(remote, step, global_batch=8)
        b = tokentape.replay(local, step, global_batch=8)
        assert a.tokens_hash == b.tokens_hash
        np.testing.assert_array_equal(a.batch.tokens, b.batch.tokens)
        np.testing.assert_array_equal(a.doc_first, b.doc_first)
        np.testing.assert_array_equal(a.doc_last, b.doc_last)
    a = tokentape.locate(remote, "math", 3, global_batch=8, until_step=50)
    b = tokentape.locate(local, "math", 3, global_batch=8, until_step=50)
    assert a.span == b.span and a.position.tolist() == b.position.tolist()
    assert len(a.position) > 0
    remote.save(stores / "remote.json")
    local.save(stores / "local.json")
    outputs = []
    for name in ("remote.json", "local.json"):
        code, out, err = cli(
            capsys, "replay", stores / name, "--step", "3", "--global-batch", "8", "--json"
        )
        assert code == 0, err
        outputs.append(json.loads(out))
    assert outputs[0] == outputs[1] and outputs[0]["top"]


def test_whole_blocks_are_checked_and_a_changed_block_is_refused(tmp_path, s3):
    docs = [list(range(1, 40 + i)) for i in range(30)]
    write_store(tmp_path / "s", docs, shard_tokens=400, block_bytes=64)
    url = s3.upload_tree(tmp_path / "s", f"{s3.url}/s")
    source = source_at_url(url)
    window = source.window(3, 64)
    np.testing.assert_array_equal(window, tokentape.open_source(tmp_path / "s").window(3, 64))
    assert source.stats.blocks_checked >= 1
    bin_url = f"{url}/part-00000.bin"
    data = bytearray(s3.get(bin_url))
    data[64 * 6 + 5] ^= 0xFF  # same length, one byte changed inside block 6 (in window 3)
    s3.put(bin_url, bytes(data))
    with pytest.raises(StoreError, match=r"part-00000\.bin: block 6 .* does not match"):
        source_at_url(url).window(3, 64)


def test_a_shard_cut_short_in_the_bucket_is_refused_by_name(tmp_path, s3):
    write_store(tmp_path / "s", [list(range(1, 100))] * 5, shard_tokens=10_000)
    url = s3.upload_tree(tmp_path / "s", f"{s3.url}/s")
    s3.put(f"{url}/part-00000.bin", s3.get(f"{url}/part-00000.bin")[:-10])
    with pytest.raises(StoreError, match=r"part-00000\.bin: size is .* the manifest says"):
        source_at_url(url).window(0, 16)
    with pytest.raises(StoreError, match=r"no manifest\.json; not a complete tokentape store"):
        source_at_url(f"{s3.url}/nothing-here")
    with pytest.raises(StoreError, match=r"^store 's3://[^']+-missing/s': no such bucket"):
        source_at_url(f"{s3.url}-missing/s")


def test_ranges_are_merged_where_they_touch():
    assert merge_ranges([(10, 20), (0, 5), (20, 30), (25, 26), (40, 41)]) == [
        (0, 5),
        (10, 30),
        (40, 41),
    ]


class _CountingTape:
    """The plan's tape, counting the positions it resolves."""

    def __init__(self, tape) -> None:
        self.tape, self.resolved = tape, 0

    def resolve(self, positions):
        self.resolved += np.asarray(positions).size
        return self.tape.resolve(positions)


def test_a_streamed_step_is_resolved_once_for_its_fetches_and_its_build(stores, s3):
    remote = plan_of(stores, remote_plan_text(s3.url))
    local = plan_of(stores)
    config = BatchConfig(2, 4, 2)  # 8 positions per rank and step
    with Loader(remote, 1, config, prefetch=2) as rl, Loader(local, 1, config) as ll:
        counting = rl.batcher.tape = _CountingTape(rl.batcher.tape)
        for _ in range(6):
            got, want = rl.step(), ll.step()
            for g, w in zip(got.micro_batches, want.micro_batches, strict=True):
                np.testing.assert_array_equal(g.tokens, w.tokens)
            rl.commit()
            ll.commit()
        # Steps 0..7 scheduled (6 trained + prefetch 2): 8 positions each, resolved once.
        assert counting.resolved == 8 * 8
        positions = np.arange(5, 13)
        resolved = counting.tape.resolve(positions)
        np.testing.assert_array_equal(
            rl.batcher.batch(positions, resolved).tokens, ll.batcher.batch(positions).tokens
        )
        with pytest.raises(tokentape.ArgumentError, match="resolved holds 8 positions, not 3"):
            rl.batcher.batch(positions[:3], resolved)


def test_open_source_opens_a_bucket_store_in_a_fresh_process(tmp_path, s3, s3_server):
    """The one front door: ``tokentape.open_source(URL)`` in a new Python process (the AWS
    variables pointing at the local S3 server) opens the store in the bucket and reads the
    same tokens and documents as the local copy."""
    import subprocess
    import sys

    from objstore import env_with_s3

    write_store(tmp_path / "s", [list(range(i, i + 40)) for i in range(30)], shard_tokens=500)
    url = s3.upload_tree(tmp_path / "s", f"{s3.url}/s")
    local = tokentape.open_source(tmp_path / "s")
    code = (
        "import json, sys, tokentape\n"
        "src = tokentape.open_source(sys.argv[1])\n"
        "print(json.dumps([type(src).__name__, str(src.directory), src.fetches_ahead,"
        " src.n_docs, src.window(3, 64).tolist(), src.doc(7).tolist()]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, url],
        capture_output=True,
        text=True,
        env=env_with_s3(s3_server.endpoint),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    kind, where, fetches_ahead, n_docs, window, doc = json.loads(done.stdout)
    assert (kind, where, fetches_ahead) == ("Source", url, True)  # read in place, in ranges
    assert n_docs == local.n_docs == 30
    assert window == local.window(3, 64).tolist() and doc == local.doc(7).tolist()


def test_a_bucket_store_names_where_each_document_came_from(tmp_path, s3):
    """Provenance read in place from the bucket: the same origins and inputs table as the
    local copy, the provenance files fetched and checked against the manifest."""
    lines = [json.dumps({"text": f"document {i} " + "x" * i, "id": f"r{i}"}) for i in range(60)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    tokentape.tokenize(tmp_path / "in.jsonl", tmp_path / "s", shard_mb=0.001, unit_mb=0.001)
    local = tokentape.open_source(tmp_path / "s")
    url = s3.upload_tree(tmp_path / "s", f"{s3.url}/prov")
    remote = tokentape.open_source(url)
    assert len(local.manifest.shards) > 1
    assert [remote.provenance(d) for d in range(remote.n_docs)] == [
        local.provenance(d) for d in range(local.n_docs)
    ]
    assert remote.provenance(7).where.endswith("in.jsonl:8") and remote.provenance(7).id == "r7"
    assert remote.inputs() == local.inputs()
    for i in (0, 7, 59):  # found by id and by record, as on disk
        assert remote.find_id(f"r{i}") == local.find_id(f"r{i}") == [i]
        assert remote.find_record("in.jsonl", i + 1) == [i]
    s3.client.put_object(Bucket=s3.name, Key="prov/part-00002.idkeys.npy", Body=b"tampered")
    with pytest.raises(tokentape.ObjectStorageError, match=r"part-00002\.idkeys\.npy"):
        tokentape.open_source(url).find_id("r1")
    s3.client.put_object(Bucket=s3.name, Key="prov/part-00001.ids", Body=b"tampered")
    fresh = tokentape.open_source(url)
    first = local.manifest.shards[0].n_docs
    with pytest.raises(tokentape.ObjectStorageError, match=r"part-00001\.ids"):
        fresh.provenance(first)


def test_info_of_a_store_in_the_bucket(stores, s3, capsys):
    """``tokentape info s3://.../store`` reads the store where it is (its manifest and inputs
    table), and says what ``info`` of the same store on disk says (the URL kept whole)."""
    url = f"{s3.url}/stores/web"
    code, out, err = cli(capsys, "info", url, "--json")
    assert code == 0, err
    code, local, err = cli(capsys, "info", stores / "stores" / "web", "--json")
    assert code == 0, err
    assert json.loads(out) == json.loads(local)
    code, out, err = cli(capsys, "info", url)
    assert code == 0, err
    _, local, _ = cli(capsys, "info", stores / "stores" / "web")
    assert url in out and "s3:/" + url.removeprefix("s3://") not in out
    assert out.replace(url, "STORE") == local.replace(str(stores / "stores" / "web"), "STORE")
    code, out, err = cli(capsys, "info", f"{s3.url}/stores/nothing-here")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"{s3.url}/stores/nothing-here" in err

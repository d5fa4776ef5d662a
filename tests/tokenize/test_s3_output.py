"""``tokentape tokenize --out s3://...``: the store is built locally and uploaded, manifest last,
to a real S3 server (moto on 127.0.0.1). Uploaded objects are byte-identical to a local run's
files; reruns upload only what is missing or different (counted with bucket versioning: every
PUT is a new version); a kill mid-upload leaves no manifest; another job's store is refused
without --overwrite and replaced with it; credentials are written and printed nowhere."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from helpers import jsonl_corpus, run_cli, tree_bytes
from objstore import ACCESS_KEY, SECRET_KEY

from tokentape._src.store.lock import output_lock
from tokentape._src.store.provenance import INPUTS_NAME
from tokentape._src.store.upload import upload_work_dir
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape.errors import OutputError, OutputLocked

pytestmark = [pytest.mark.s3, pytest.mark.slow]

SHARD_MB = 0.01


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return jsonl_corpus(tmp_path_factory.mktemp("corpus"), 300, seed=12)


def config(corpus: Path, out: str | Path, tok: Path, **extra) -> TokenizeConfig:
    settings = {"unit_mb": 0.004, "shard_mb": SHARD_MB} | extra
    return TokenizeConfig(inputs=(str(corpus),), out=str(out), tokenizer=str(tok), **settings)


def cli_args(corpus: Path, url: str, tok: Path, *extra: str) -> list[str]:
    return [
        "tokenize",
        str(corpus),
        "--out",
        url,
        "--tokenizer",
        str(tok),
        "--unit-mb",
        "0.004",
        "--shard-mb",
        str(SHARD_MB),
        *extra,
    ]


@pytest.fixture(scope="module")
def reference(corpus, hf_tokenizer_json, tmp_path_factory) -> Path:
    """The same job tokenized to a local directory."""
    out = tmp_path_factory.mktemp("reference") / "web"
    tokenize(config(corpus, out, hf_tokenizer_json))
    return out


def remote_tree(s3, url: str, tmp_path: Path) -> dict[str, bytes]:
    return tree_bytes(s3.download_tree(url, tmp_path / "downloaded"))


def test_upload_is_byte_identical_to_the_local_store(
    s3, corpus, hf_tokenizer_json, reference, tmp_path
):
    url = s3.url + "/stores/web"
    work = tmp_path / "work"
    reports = []
    cfg = config(corpus, url, hf_tokenizer_json, work_dir=str(work))
    summary = tokenize(cfg, progress=reports.append)
    assert summary.out == url
    assert summary.status == "created"
    uploads = [r for r in reports if r.label == "upload"]
    assert uploads[-1].final
    shard_bytes = sum(len(d) for n, d in tree_bytes(reference).items() if n != "manifest.json")
    assert uploads[-1].done_bytes == uploads[-1].total_bytes == shard_bytes
    assert summary.n_shards >= 3
    local = tree_bytes(reference)
    assert "manifest.json" in local and "tokenizer.json" in local
    assert remote_tree(s3, url, tmp_path) == local
    for key in s3.keys(url):
        head = s3.client.head_object(Bucket=s3.name, Key=key)
        assert head["Metadata"]["sha256"] == hashlib.sha256(s3.get(f"{s3.url}/{key}")).hexdigest()
    assert tree_bytes(work) == local  # a --work-dir given is the user's: the local copy stays


def test_rerun_is_already_complete_and_uploads_nothing(
    s3, corpus, hf_tokenizer_json, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    s3.versioned()
    url = s3.url + "/web"
    first = tokenize(config(corpus, url, hf_tokenizer_json))
    before = s3.puts()
    assert set(before.values()) == {1}
    again = tokenize(config(corpus, url, hf_tokenizer_json))
    assert again.status == "already complete"
    assert again.out == url
    assert again.units == again.units_reused == first.units
    assert again.content_hash == first.content_hash
    assert s3.puts() == before
    assert not (tmp_path / "cache").exists()  # nothing left, nothing built


def test_damaged_upload_reuploads_only_what_is_missing_or_corrupt(
    s3, corpus, hf_tokenizer_json, reference, tmp_path
):
    s3.versioned()
    url = s3.url + "/web"
    tokenize(config(corpus, url, hf_tokenizer_json, work_dir=str(tmp_path / "w")))
    # a kill mid-upload, simulated: no manifest, one shard file missing, one object another
    # upload of tokentape's left (same size, other bytes, tagged with their sha256)
    s3.client.delete_object(Bucket=s3.name, Key="web/manifest.json")
    s3.client.delete_object(Bucket=s3.name, Key="web/part-00001.bin")
    idx = s3.get(url + "/part-00000.idx.npy")
    changed = idx[:-1] + bytes([idx[-1] ^ 1])
    tag = {"sha256": hashlib.sha256(changed).hexdigest()}
    s3.client.put_object(Bucket=s3.name, Key="web/part-00000.idx.npy", Body=changed, Metadata=tag)
    before = s3.puts()
    summary = tokenize(config(corpus, url, hf_tokenizer_json, work_dir=str(tmp_path / "w")))
    assert summary.status == "resumed"
    after = s3.puts()
    changed = {key for key in after if after[key] != before.get(key, 0)}
    assert changed == {"web/manifest.json", "web/part-00001.bin", "web/part-00000.idx.npy"}
    assert all(after[key] == before[key] + 1 for key in changed)
    assert remote_tree(s3, url, tmp_path) == tree_bytes(reference)


def test_kill_mid_upload_leaves_no_manifest_and_resumes(
    s3, corpus, hf_tokenizer_json, reference, tmp_path
):
    s3.versioned()
    url = s3.url + "/stores/web"
    cache = tmp_path / "cache"
    env = {"XDG_CACHE_HOME": str(cache)}
    options = json.dumps({"key": ACCESS_KEY, "secret": SECRET_KEY})
    args = cli_args(corpus, url, hf_tokenizer_json, "--storage-options", options, "--json")
    killed = run_cli(*args, env=env | {"TOKENTAPE_CRASH_AT": "mid-upload"})
    assert killed.returncode == -9, killed.stderr
    keys = s3.keys(url)
    assert keys and "stores/web/manifest.json" not in keys  # uploaded, but not complete
    work = cache / "tokentape" / "uploads" / hashlib.sha256(url.encode()).hexdigest()[:16]
    assert work.is_dir()  # killed with shards up while assembly went on: the build is kept
    done = run_cli(*args, env=env)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["out"] == url
    assert summary["status"] == "resumed"
    assert set(s3.puts().values()) == {1}  # nothing uploaded twice
    assert remote_tree(s3, url, tmp_path) == tree_bytes(reference)
    assert not work.exists()
    for output in (killed, done):
        assert SECRET_KEY not in output.stdout + output.stderr
    assert not any(SECRET_KEY.encode() in data for data in remote_tree(s3, url, tmp_path).values())


def test_kill_after_upload_is_already_complete(s3, corpus, hf_tokenizer_json, tmp_path):
    url = s3.url + "/web"
    work = tmp_path / "work"
    args = cli_args(corpus, url, hf_tokenizer_json, "--work-dir", str(work), "--json")
    killed = run_cli(*args, env={"TOKENTAPE_CRASH_AT": "after-upload"})
    assert killed.returncode == -9, killed.stderr
    assert (work / "manifest.json").is_file()
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "already complete"
    assert (work / "manifest.json").is_file()  # a --work-dir given is kept


def test_another_jobs_store_is_refused_then_replaced(s3, corpus, hf_tokenizer_json, tmp_path):
    s3.versioned()
    url = s3.url + "/web"
    small = tokenize(config(corpus, url, hf_tokenizer_json, shard_mb=0.005))
    before = s3.puts()
    bigger = config(corpus, url, hf_tokenizer_json, shard_mb=0.02)
    with pytest.raises(OutputError, match=rf"^--out '{url}': .*pass --overwrite"):
        tokenize(bigger)
    assert s3.puts() == before
    # replaced: killed mid-upload, the old manifest is already gone (deleted first)
    args = cli_args(corpus, url, hf_tokenizer_json, "--shard-mb", "0.02", "--overwrite")
    killed = run_cli(*args, env={"TOKENTAPE_CRASH_AT": "mid-upload"})
    assert killed.returncode == -9, killed.stderr
    assert "web/manifest.json" not in s3.keys(url)
    local = tmp_path / "local"
    expected = tokenize(config(corpus, local, hf_tokenizer_json, shard_mb=0.02))
    summary = tokenize(TokenizeConfig(**{**bigger.__dict__, "overwrite": True}))
    assert summary.content_hash == expected.content_hash != small.content_hash
    assert summary.n_shards < small.n_shards
    assert remote_tree(s3, url, tmp_path) == tree_bytes(local)  # old shards beyond: deleted


def test_foreign_objects_are_refused(s3, corpus, hf_tokenizer_json, tmp_path):
    url = s3.url + "/data"
    s3.put(url + "/notes.txt", b"mine")
    for overwrite in (False, True):
        cfg = config(corpus, url, hf_tokenizer_json, work_dir=str(tmp_path / "w"))
        with pytest.raises(
            OutputError, match=r"^--out 's3:.* not a tokentape store .*'notes\.txt'"
        ):
            tokenize(TokenizeConfig(**{**cfg.__dict__, "overwrite": overwrite}))
    s3.put(s3.url + "/one", b"x")
    with pytest.raises(OutputError, match="an object, not a prefix"):
        tokenize(config(corpus, s3.url + "/one", hf_tokenizer_json))
    assert s3.keys() == ["data/notes.txt", "one"]
    assert not (tmp_path / "w").exists()


def test_a_foreign_object_at_a_store_name_is_never_replaced(
    s3, corpus, hf_tokenizer_json, tmp_path
):
    """A ``part-00000.bin`` tokentape did not upload (no sha256 metadata) and no readable
    manifest names is another tool's: refused with or without --overwrite, never suggested
    it, left as it was (before, --overwrite uploaded over it; without, a resume did)."""
    url = s3.url + "/data"
    s3.put(url + "/part-00000.bin", b"someone else's shard")
    for manifest in (None, b""):
        if manifest is not None:
            s3.put(url + "/manifest.json", manifest)
        for overwrite in (False, True):
            cfg = config(corpus, url, hf_tokenizer_json, work_dir=str(tmp_path / "w"))
            with pytest.raises(
                OutputError, match=r"holds 'part-00000\.bin'.*tokentape did not"
            ) as e:
                tokenize(TokenizeConfig(**{**cfg.__dict__, "overwrite": overwrite}))
            assert "pass --overwrite" not in str(e.value)
    assert s3.get(url + "/part-00000.bin") == b"someone else's shard"


def test_one_writer_per_work_directory(s3, corpus, hf_tokenizer_json, tmp_path):
    work = tmp_path / "work"
    with output_lock(work, "tokenize"), pytest.raises(OutputLocked):
        tokenize(config(corpus, s3.url + "/web", hf_tokenizer_json, work_dir=str(work)))
    assert s3.keys() == []


def test_default_work_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    digest = hashlib.sha256(b"s3://b/stores/web").hexdigest()[:16]
    assert upload_work_dir("s3://b/stores/web/") == tmp_path / "tokentape" / "uploads" / digest
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    expected = Path.home() / ".cache" / "tokentape" / "uploads" / digest
    assert upload_work_dir("s3://b/stores/web") == expected
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert upload_work_dir("s3://b/stores/web") == expected


def test_unreadable_or_damaged_remote_store(s3, corpus, hf_tokenizer_json, reference, tmp_path):
    url = s3.url + "/web"
    cfg = config(corpus, url, hf_tokenizer_json, work_dir=str(tmp_path / "w"))
    tokenize(cfg)
    s3.client.delete_object(Bucket=s3.name, Key="web/part-00002.idx.npy")
    with pytest.raises(OutputError, match=r"this job's store, but it is damaged \(part-00002"):
        tokenize(cfg)
    s3.put(url + "/manifest.json", b"\xff not json")
    with pytest.raises(OutputError, match=r"manifest\.json: not UTF-8 .*pass --overwrite"):
        tokenize(cfg)
    summary = tokenize(TokenizeConfig(**{**cfg.__dict__, "overwrite": True}))
    assert summary.status == "resumed"  # the intact shard objects were kept
    assert remote_tree(s3, url, tmp_path) == tree_bytes(reference)


def test_a_missing_bucket_is_one_error_naming_the_url(s3, corpus, hf_tokenizer_json, tmp_path):
    url = s3.url + "-missing/web"
    with pytest.raises(OutputError, match=rf"^--out '{url}': listing failed \(.*bucket"):
        tokenize(config(corpus, url, hf_tokenizer_json, work_dir=str(tmp_path / "w")))
    assert not (tmp_path / "w").exists()


def test_the_url_is_looked_at_again_after_the_build(
    s3, corpus, hf_tokenizer_json, reference, tmp_path
):
    """Another machine writes the URL while this one builds (the writer lock is local)."""
    s3.versioned()
    work = tmp_path / "work"

    def meanwhile(write):
        def callback(report):
            if report.label == "tokenize" and report.final:
                write()

        return callback

    url = s3.url + "/a"
    cfg = config(corpus, url, hf_tokenizer_json, work_dir=str(work))
    with pytest.raises(OutputError, match=r"^--out 's3:.* not a tokentape store .*'notes\.txt'"):
        tokenize(cfg, progress=meanwhile(lambda: s3.put(url + "/notes.txt", b"mine")))
    keys = s3.keys(url)  # the shards went up as they were assembled; never the manifest
    assert "a/notes.txt" in keys and "a/manifest.json" not in keys
    assert (work / "manifest.json").is_file()  # the local build is kept for a rerun
    url, work = s3.url + "/b", tmp_path / "other"  # (the first build is complete: no report)
    cfg = config(corpus, url, hf_tokenizer_json, work_dir=str(work))
    summary = tokenize(cfg, progress=meanwhile(lambda: s3.upload_tree(reference, url)))
    assert summary.status == "already complete"
    assert {k: n for k, n in s3.puts().items() if k.startswith("b/")} == {
        f"b/{name}": 1 for name in tree_bytes(reference)
    }
    assert tree_bytes(work) == tree_bytes(reference)  # built here, kept (a --work-dir given)


def test_this_jobs_remote_store_with_bad_summary_counts_is_refused_not_a_traceback(
    s3, corpus, hf_tokenizer_json, reference, tmp_path
):
    url = s3.url + "/web"
    cfg = config(corpus, url, hf_tokenizer_json, work_dir=str(tmp_path / "w"))
    tokenize(cfg)
    manifest = json.loads(s3.get(url + "/manifest.json"))
    del manifest["filters"]["docs_in"]
    s3.put(url + "/manifest.json", json.dumps(manifest).encode())
    with pytest.raises(OutputError, match=r"damaged \(manifest\.json field filters\.docs_in"):
        tokenize(cfg)
    assert tokenize(TokenizeConfig(**{**cfg.__dict__, "overwrite": True})).status == "resumed"
    assert remote_tree(s3, url, tmp_path) == tree_bytes(reference)


@pytest.mark.ray
@pytest.mark.slow
def test_bucket_to_bucket_with_ray_tasks_is_the_local_store(
    s3, corpus, hf_tokenizer_json, reference, tmp_path
):
    """Inputs in the bucket, Ray tasks reading them, the store uploaded: the local bytes."""
    pytest.importorskip("ray")
    raw = s3.upload_tree(corpus, f"{s3.url}/raw")
    url = f"{s3.url}/stores/web"
    cfg = config(corpus, url, hf_tokenizer_json, work_dir=str(tmp_path / "w"))
    cfg = TokenizeConfig(
        **{**cfg.__dict__, "inputs": (raw + "/",), "executor": "ray", "workers": 2}
    )
    summary = tokenize(cfg)
    assert summary.out == url and summary.status == "created"
    want = tree_bytes(reference)
    got = remote_tree(s3, url, tmp_path)
    differ = ("manifest.json", INPUTS_NAME)  # they record the inputs' paths (here URLs)
    assert {k: v for k, v in got.items() if k not in differ} == {
        k: v for k, v in want.items() if k not in differ
    }
    table = json.loads(got[INPUTS_NAME])["inputs"]
    assert [row["path"].removeprefix(raw + "/") for row in table] == [
        row["path"].removeprefix(str(corpus) + "/")
        for row in json.loads(want[INPUTS_NAME])["inputs"]
    ]
    got_m, want_m = json.loads(got["manifest.json"]), json.loads(want["manifest.json"])
    assert got_m["content_hash"] == want_m["content_hash"]
    assert got_m["shards"] == want_m["shards"]


def test_a_work_dir_given_holding_another_store_is_refused_not_replaced(
    s3, corpus, hf_tokenizer_json, tmp_path
):
    """A --work-dir is the user's: another job's store there is never replaced silently."""
    mine = tmp_path / "mine"
    tokenize(config(corpus, mine, hf_tokenizer_json, shard_mb=0.5))  # another job's store
    before = tree_bytes(mine)
    cfg = config(corpus, s3.url + "/web", hf_tokenizer_json, work_dir=str(mine))
    with pytest.raises(OutputError, match=r"^--work-dir '.*mine': holds a store made from other"):
        tokenize(cfg)
    assert tree_bytes(mine) == before and s3.keys(s3.url + "/web") == []
    summary = tokenize(TokenizeConfig(**{**cfg.__dict__, "overwrite": True}))
    assert summary.status == "created" and (mine / "manifest.json").is_file()


def test_a_replacing_build_with_slow_uploads_uploads_the_swapped_in_files(
    s3, s3_server, corpus, hf_tokenizer_json, reference, tmp_path
):
    """--overwrite of another job's store in a --work-dir builds beside it and swaps it in at
    the end: uploads still running then must not look for the files where they were built."""
    from faultproxy import FaultProxy

    mine = tmp_path / "mine"
    tokenize(config(corpus, mine, hf_tokenizer_json, shard_mb=0.5))  # another job's store
    url = s3.url + "/web"
    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.set(delay=0.2)  # uploads slower than the rest of the build
        cfg = config(corpus, url, hf_tokenizer_json, work_dir=str(mine), overwrite=True)
        cfg = TokenizeConfig(
            **{**cfg.__dict__, "storage_options": {"endpoint_url": proxy.endpoint}}
        )
        assert tokenize(cfg).status == "created"
    assert remote_tree(s3, url, tmp_path) == tree_bytes(reference) == tree_bytes(mine)

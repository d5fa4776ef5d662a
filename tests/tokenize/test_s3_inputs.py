"""``tokentape tokenize`` reading its inputs from object storage (a real S3 server, moto, on
127.0.0.1): the same objects in the same order as the same files on local disk, streamed, and a
store byte-identical to the local one (shards and content hash), for every input kind, cut
files, both worker counts, globs, prefixes and explicit URLs; one-line errors naming the URL."""

from __future__ import annotations

import gzip
import json
import os
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import make_documents, run_cli, tree_bytes

from tokentape._src.store.format import MANIFEST_NAME
from tokentape._src.store.provenance import INPUTS_NAME
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.inputs import expand_inputs, plan_units, read_documents
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.util.faults import CRASH_ENV
from tokentape.errors import InputError

pytestmark = pytest.mark.s3

UNIT_MB = 0.02  # about 20 KiB: the big jsonl and the parquet are cut into several units
SHARD_MB = 0.05


def _lines(docs: list[str]) -> str:
    return "".join(json.dumps({"text": t}) + "\n" for t in docs)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Every input kind, nested "directories", a jsonl and a parquet larger than a unit, a
    hidden file and a file of an unsupported kind (ignored), ~300 KB in all."""
    root = tmp_path_factory.mktemp("s3-corpus")
    docs = make_documents(1200, seed=31)
    (root / "a.jsonl").write_text(_lines(docs[:500]))  # ~100 KB: several units
    sub = root / "b"
    (sub / "e").mkdir(parents=True)
    with gzip.open(sub / "c.jsonl.gz", "wt") as f:
        f.write(_lines(docs[500:600]))
    pq.write_table(pa.table({"text": docs[600:900]}), sub / "d.parquet", row_group_size=25)
    (sub / "e" / "f.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(_lines(docs[900:1000]).encode())
    )
    (sub / "e" / "g.txt").write_text(docs[1000])
    (sub / "e" / "h.jsonl").write_text(_lines(docs[1001:1100]))
    (root / "b.jsonl").write_text(_lines(docs[1100:1150]))  # sorts between b/ and its contents
    (root / ".hidden.jsonl").write_text(_lines(docs[1150:1160]))
    (root / "z.txt").write_text(docs[1160])
    (root / "README.md").write_text("not an input\n")
    assert (root / "a.jsonl").stat().st_size > 4 * UNIT_MB * 2**20
    assert (sub / "d.parquet").stat().st_size > UNIT_MB * 2**20
    return root


@pytest.fixture
def bucket_corpus(s3, corpus) -> str:
    """The corpus uploaded under ``s3://BUCKET/raw/web`` (returns that prefix)."""
    return s3.upload_tree(corpus, f"{s3.url}/raw/web")


def run(inputs: list[str], out: Path, **settings) -> dict:
    config = TokenizeConfig(
        inputs=tuple(inputs),
        out=str(out),
        unit_mb=UNIT_MB,
        shard_mb=SHARD_MB,
        **settings,
    )
    return tokenize(config).to_json()


@pytest.fixture(scope="module")
def local_store(corpus, tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("s3-local") / "store"
    summary = run([str(corpus)], out)
    assert summary["units"] > 10 and summary["n_shards"] > 1
    return summary, out


def assert_same_store(remote: Path, local: Path, inputs_renamed: dict[str, str]) -> None:
    """Same files, bytes and content hash; the manifests and the inputs tables differ only in
    the recorded input paths (``inputs_renamed``: URL -> local path) and objects' versions, and
    so in the job hash and the hashes of the inputs table."""
    got, want = tree_bytes(remote), tree_bytes(local)
    assert sorted(got) == sorted(want)
    for name in want:
        if name not in (MANIFEST_NAME, INPUTS_NAME):
            assert got[name] == want[name], name
    table, their_table = json.loads(got[INPUTS_NAME]), json.loads(want[INPUTS_NAME])
    for entry in table["inputs"]:
        entry["path"] = inputs_renamed[entry["path"]]
        assert entry.pop("version")  # an object's ETag
    assert table == their_table
    mine, theirs = json.loads(got[MANIFEST_NAME]), json.loads(want[MANIFEST_NAME])
    assert mine["content_hash"] == theirs["content_hash"]
    for entry in mine["inputs"]["files"]:
        entry["path"] = inputs_renamed[entry["path"]]
    assert mine["job"] != theirs["job"]
    mine.pop("job"), theirs.pop("job")
    for manifest in (mine, theirs):  # what differs with the inputs table's bytes
        manifest["provenance"].pop("inputs"), manifest["provenance"].pop("provenance_hash")
    assert mine == theirs


def renamed(prefix: str, root: Path) -> dict[str, str]:
    files = expand_inputs([str(root)])
    return {f"{prefix}/{Path(f.path).relative_to(root).as_posix()}": f.path for f in files}


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_prefix_is_byte_identical_to_local(
    workers, bucket_corpus, corpus, local_store, tmp_path, monkeypatch, s3
):
    """With 2 workers the endpoint comes from the storage options only (the environment's
    points at a closed port): the options reach the helper processes."""
    summary, local = local_store
    settings: dict = {"workers": workers}
    if workers == 2:
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        settings["storage_options"] = {"endpoint_url": s3.endpoint}
    out = tmp_path / "store"
    got = run([bucket_corpus + "/"], out, **settings)
    assert got["status"] == "created"
    for key in ("units", "n_shards", "n_tokens", "n_docs", "docs_in", "content_hash"):
        assert got[key] == summary[key], key
    assert_same_store(out, local, renamed(bucket_corpus, corpus))


def test_globs_and_explicit_urls_are_byte_identical_to_local(bucket_corpus, corpus, tmp_path, s3):
    """The same specs, spelled once as URLs and once as local paths: same store; an object
    reached twice is read once."""
    specs = ["b/e/h.jsonl", "b/**/*.jsonl*", "*.txt", "b/d.parquet", "a.jsonl", "b/e"]
    local = tmp_path / "local"
    local_summary = run([f"{corpus}/{s}" for s in specs], local)
    out = tmp_path / "remote"
    summary = run([f"{bucket_corpus}/{s}" for s in specs], out)
    assert summary["content_hash"] == local_summary["content_hash"]
    names = {
        f"{bucket_corpus}/{Path(f.path).relative_to(corpus).as_posix()}": f.path
        for f in expand_inputs([f"{corpus}/{s}" for s in specs])
    }
    assert_same_store(out, local, names)


def relative(files, base: str) -> list[str]:
    return [f.path[len(base) :].lstrip("/") for f in files]


@pytest.mark.parametrize(
    "spec",
    ["", "b", "*", "**", "b/**", "**/*.jsonl", "b/*", "b/[cd]*", "?.jsonl", ".*", "*/e/*.t?t"],
)
def test_same_order_as_local(spec, bucket_corpus, corpus):
    """A prefix (or glob) expands to the objects the local directory (or glob) holds, in the
    same order, hidden and cut files included, unsupported ones left out."""
    local = expand_inputs([f"{corpus}/{spec}" if spec else str(corpus)])
    remote = expand_inputs([f"{bucket_corpus}/{spec}" if spec else bucket_corpus])
    assert relative(remote, bucket_corpus) == relative(local, str(corpus))
    assert [(f.kind, f.size) for f in remote] == [(f.kind, f.size) for f in local]
    assert all(f.version and f.mtime_ns > 0 for f in remote)
    # Cut the same way, and every unit reads the same documents.
    units = (plan_units(remote, int(UNIT_MB * 2**20)), plan_units(local, int(UNIT_MB * 2**20)))
    assert [[(p.start, p.stop) for p in u.parts] for u in units[0]] == [
        [(p.start, p.stop) for p in u.parts] for u in units[1]
    ]
    for r, lo in zip(*units, strict=True):
        for part_r, part_l in zip(r.parts, lo.parts, strict=True):
            assert list(read_documents(part_r, "text")) == list(read_documents(part_l, "text"))


def test_prefix_order_is_by_relative_key(bucket_corpus, corpus):
    names = relative(expand_inputs([bucket_corpus]), bucket_corpus)
    assert names == [
        ".hidden.jsonl",
        "a.jsonl",
        "b.jsonl",
        "b/c.jsonl.gz",
        "b/d.parquet",
        "b/e/f.jsonl.zst",
        "b/e/g.txt",
        "b/e/h.jsonl",
        "z.txt",
    ]


def one_line_error(specs: list[str]) -> str:
    with pytest.raises(InputError) as info:
        expand_inputs(specs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_errors_name_the_url(bucket_corpus, s3):
    missing = f"{bucket_corpus}/nope.jsonl"
    assert one_line_error([missing]) == f"input '{missing}': no such object or prefix"
    nothing = f"{bucket_corpus}/*.csv"
    assert one_line_error([nothing]) == f"input '{nothing}': glob matched no objects"
    readme = f"{bucket_corpus}/README.md"
    assert one_line_error([readme]).startswith(f"input '{readme}': unsupported file type")
    only_md = f"{bucket_corpus}/README*"
    assert one_line_error([only_md]).startswith(
        f"input '{only_md}': glob matched 1 object(s) or prefix(es) but no supported object"
    )
    s3.put(f"{s3.url}/docs/notes.md", b"# not an input\n")
    prefix = f"{s3.url}/docs"
    assert one_line_error([prefix]).startswith(f"input '{prefix}': prefix holds no supported")
    bucket = "s3://tt-no-such-bucket-here/raw/"
    assert one_line_error([bucket]).startswith(f"input '{bucket}': no such bucket or object")


def test_an_object_changed_since_planning_is_refused(s3, corpus):
    url = f"{s3.url}/one/a.jsonl"
    data = (corpus / "a.jsonl").read_bytes()
    s3.put(url, data)
    [file] = expand_inputs([url])
    [part, *_] = plan_units([file], int(UNIT_MB * 2**20))[0].parts
    first = next(read_documents(part, "text"))
    assert first == json.loads(data.split(b"\n")[0])["text"]
    s3.put(url, data.replace(b"a", b"b", 1))  # same size, another version
    with pytest.raises(InputError, match=r"changed since the inputs were planned \(version "):
        next(read_documents(part, "text"))
    assert expand_inputs([url])[0].mtime_ns != file.mtime_ns  # so a rerun plans anew
    s3.put(url, data[:-10])
    with pytest.raises(InputError, match=r"size changed since the inputs were planned"):
        next(read_documents(part, "text"))
    s3.client.delete_object(Bucket=s3.name, Key="one/a.jsonl")
    with pytest.raises(InputError, match="no longer exists"):
        next(read_documents(part, "text"))


@pytest.mark.subprocess
@pytest.mark.slow
def test_command_line_reads_a_prefix_resumes_and_reruns(
    bucket_corpus, corpus, local_store, tmp_path
):
    """Killed (SIGKILL) after its first unit, the command resumes from the units it finished;
    run again, it finds the store complete."""
    summary, local = local_store
    out = tmp_path / "store"
    argv = ["tokenize", bucket_corpus + "/", "--out", str(out), "--json"]
    argv += ["--unit-mb", str(UNIT_MB), "--shard-mb", str(SHARD_MB)]
    proc = run_cli(*argv, env={CRASH_ENV: "after-unit"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (out / MANIFEST_NAME).exists()
    proc = run_cli(*argv)
    assert proc.returncode == 0, proc.stderr
    first = json.loads(proc.stdout)
    assert first["status"] == "resumed" and first["units_reused"] == 1
    assert first["content_hash"] == summary["content_hash"]
    assert_same_store(out, local, renamed(bucket_corpus, corpus))
    proc = run_cli(*argv)
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)
    assert again["status"] == "already complete" and again["units_reused"] == again["units"]
    # A missing object: one line naming it, exit 2, nothing written.
    missing = f"{bucket_corpus}/b/nope/"
    proc = run_cli("tokenize", missing, "--out", str(tmp_path / "bad"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"tokentape: error: input '{missing}': no such object or prefix"
    ]
    assert not (tmp_path / "bad").exists()
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in proc.stderr + proc.stdout


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.subprocess
def test_ray_tasks_read_from_the_bucket(bucket_corpus, corpus, local_store, tmp_path):
    pytest.importorskip("ray")
    summary, local = local_store
    out = tmp_path / "store"
    got = run([bucket_corpus], out, executor="ray", workers=2)
    assert got["status"] == "created" and got["content_hash"] == summary["content_hash"]
    assert_same_store(out, local, renamed(bucket_corpus, corpus))


def test_an_object_replaced_while_its_unit_is_read_is_refused(s3):
    """Each read-ahead is its own ranged GET: an object replaced meanwhile (same size, a new
    ETag) could give bytes of two versions; the unit is refused once it has been read."""
    url = f"{s3.url}/in/big.jsonl"

    def body(tag: str) -> bytes:
        return b"".join(
            (json.dumps({"text": f"{tag}{i:07d}" + "x" * 980}) + "\n").encode() for i in range(9000)
        )  # ~9 MB: more than one 8 MiB read-ahead

    s3.put(url, body("OLD"))
    [part] = plan_units(expand_inputs([url]), 64 * 2**20)[0].parts
    docs = read_documents(part, "text")
    assert next(docs).startswith("OLD")
    s3.put(url, body("NEW"))
    with pytest.raises(InputError, match=r"big\.jsonl: changed since the inputs were planned"):
        list(docs)

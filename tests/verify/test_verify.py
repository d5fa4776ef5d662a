"""``tokentape verify``: clean stores and plans pass; each kind of planted damage is reported."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import write_store

from tokentape._src.megatron.format import MegatronWriter
from tokentape._src.program import main
from tokentape._src.store.format import MANIFEST_NAME
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.verify import stores as verify
from tokentape._src.verify.stores import check_store, quick_blocks, verify_store

EOD = 256  # the bytes tokenizer: ids 0..255 are bytes, 256 ends a document
VOCAB = 257
SHARD_MB = 0.002  # about 1,000 uint16 tokens per shard: several shards from a few KB of text


def make_store(root: Path, name: str, n_docs: int, word: str = "doc") -> Path:
    data = root / f"{name}.jsonl"
    lines = [json.dumps({"text": f"{word} {i} " * (5 + i % 13)}) for i in range(n_docs)]
    data.write_text("\n".join(lines) + "\n")
    out = root / name
    config = TokenizeConfig(inputs=(str(data),), out=str(out), shard_mb=SHARD_MB, overwrite=True)
    tokenize(config)
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tmp_path_factory.mktemp("verify"), "web", 60)


@pytest.fixture
def store(pristine: Path, tmp_path: Path) -> Path:
    """A private copy of the pristine store, free to damage."""
    copy = tmp_path / "store"
    shutil.copytree(pristine, copy)
    return copy


def manifest_json(store: Path) -> dict:
    return json.loads((store / MANIFEST_NAME).read_text())


def tokens_of(store: Path, shard: str) -> np.ndarray:
    return np.fromfile(store / f"{shard}.bin", dtype="<u2")


def starts_of(store: Path, shard: str) -> np.ndarray:
    return np.load(store / f"{shard}.idx.npy", allow_pickle=False)


def write_tokens(store: Path, shard: str, tokens: np.ndarray) -> None:
    tokens.astype("<u2").tofile(store / f"{shard}.bin")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["verify", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def problems_with(store: Path, what: str, quick: bool = False, file: str = "") -> list:
    return [p for p in verify_store(store, quick=quick) if p.what == what and p.file.endswith(file)]


# --- clean stores and plans ------------------------------------------------------------------


def test_store_has_several_shards(pristine: Path) -> None:
    assert len(manifest_json(pristine)["shards"]) >= 3


def test_clean_store_passes(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, str(pristine))
    assert rc == 0, out
    assert out.count("\n") == 1 and "ok" in out and "FAILED" not in out
    n_shards = len(manifest_json(pristine)["shards"])
    assert f"{n_shards} shards" in out


def test_clean_store_report_counts_every_byte(pristine: Path) -> None:
    bin_bytes = sum(p.stat().st_size for p in pristine.glob("part-*.bin"))
    seen: list[tuple[int, int]] = []
    report = check_store(pristine, progress=lambda b, t: seen.append((b, t)))
    assert report.ok and report.problems == ()
    assert report.bytes_hashed == bin_bytes
    assert report.n_tokens == bin_bytes // 2
    assert report.n_docs == sum(len(starts_of(pristine, p.stem)) for p in pristine.glob("*.bin"))
    assert sum(b for b, _ in seen) == bin_bytes and sum(t for _, t in seen) == bin_bytes // 2


def test_clean_store_passes_quick(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, str(pristine), "--quick")
    assert rc == 0 and "ok" in out and "quick" in out


def make_plan(root: Path, stores: list[Path], capsys: pytest.CaptureFixture[str]) -> Path:
    toml = root / "mix.toml"
    parts = ["seq_len = 16\nseed = 7\ntotal_samples = 50\n"]
    for i, s in enumerate(stores):
        parts.append(f'[[source]]\nname = "s{i}"\npath = "{s}"\nweight = 1\nmax_repeats = 100\n')
    toml.write_text("".join(parts))
    plan = root / "mix.json"
    assert main(["plan", str(toml), "--out", str(plan)]) == 0
    capsys.readouterr()
    return plan


def test_clean_plan_passes_and_stores_are_deduplicated(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = make_store(tmp_path, "code", 25, word="code")
    plan = make_plan(tmp_path, [pristine, other], capsys)
    rc, out, _ = run(capsys, str(plan), str(pristine), "--json")
    assert rc == 0, out
    report = json.loads(out)
    assert report["ok"] is True
    paths = sorted(Path(s["path"]).resolve() for s in report["stores"])
    assert paths == sorted([pristine.resolve(), other.resolve()])


def test_plan_reports_a_store_rebuilt_since(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = make_store(tmp_path, "a", 20), make_store(tmp_path, "b", 20, word="bee")
    plan = make_plan(tmp_path, [a, b], capsys)
    recorded = json.loads(plan.read_text())["sources"][1]["content_hash"]
    make_store(tmp_path, "b", 21, word="bee")  # same path, other content
    rc, out, _ = run(capsys, str(plan))
    assert rc == 1
    line = next(x for x in out.splitlines() if x.startswith(f"{plan}: source 's1'"))
    assert recorded in line and manifest_json(b)["content_hash"] in line


# --- planted damage --------------------------------------------------------------------------


def test_flipped_byte_is_caught_full_and_quick(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = manifest_json(store)["shards"][1]
    path = store / f"{shard['name']}.bin"
    data = bytearray(path.read_bytes())
    data[2 * 3] ^= 0x20  # low byte of token 3: inside the first document's text
    path.write_bytes(bytes(data))
    rc, out, _ = run(capsys, str(store))
    assert rc == 1
    expected_line = (
        f"{store / path.name}: sha256 mismatch: expected {shard['bin_sha256']}, "
        f"found {hashlib.sha256(data).hexdigest()}"
    )
    assert expected_line in out.splitlines()
    assert "block 0" not in out  # the only block: its hash is the file's, said once
    # One 64 MiB block per shard here, so --quick hashes it and catches the flip too.
    rc, out, _ = run(capsys, str(store), "--quick")
    assert rc == 1 and "block 0 sha256 mismatch" in out and "quick" in out


def test_truncated_shard(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = manifest_json(store)["shards"][2]
    path = store / f"{shard['name']}.bin"
    path.write_bytes(path.read_bytes()[:-2])
    rc = run(capsys, str(store), "--quick")[0]
    assert rc == 1
    expected_bytes = 2 * shard["n_tokens"]
    [size] = problems_with(store, "size", quick=True, file=path.name)
    assert size.expected.startswith(f"{expected_bytes} bytes")
    assert size.found == f"{expected_bytes - 2} bytes"
    assert problems_with(store, "sha256 mismatch", file=path.name)


def test_swapped_shards(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = manifest_json(store)["shards"]
    a, b = shards[0]["name"], shards[1]["name"]
    for ext in (".bin", ".idx.npy"):
        (store / f"{a}{ext}").rename(store / "tmp")
        (store / f"{b}{ext}").rename(store / f"{a}{ext}")
        (store / "tmp").rename(store / f"{b}{ext}")
    rc = run(capsys, str(store))[0]
    assert rc == 1
    [mismatch] = problems_with(store, "sha256 mismatch", file=f"{a}.bin")
    assert mismatch.expected == shards[0]["bin_sha256"]
    assert mismatch.found.startswith(shards[1]["bin_sha256"]) and f"{b}.bin" in mismatch.found
    assert problems_with(store, "sha256 mismatch", file=f"{b}.idx.npy")


@pytest.mark.parametrize("damage", ["swap", "repeat"])
def test_non_monotone_offsets(store: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    name = manifest_json(store)["shards"][1]["name"]
    starts = starts_of(store, name)
    assert len(starts) >= 3
    if damage == "swap":
        starts[[1, 2]] = starts[[2, 1]]
    else:
        starts[2] = starts[1]  # an empty document: not strictly ascending
    np.save(store / f"{name}.idx.npy", starts, allow_pickle=False)
    for flags in ([], ["--quick"]):
        rc, out, _ = run(capsys, str(store), *flags)
        assert rc == 1
        assert f"{store / name}.idx.npy: document starts not strictly ascending" in out
    [problem] = problems_with(store, "document starts not strictly ascending")
    assert f"entry 2 = {starts[2]} after {starts[1]}" in problem.found


@pytest.mark.parametrize("damage", ["first", "range", "count", "dtype"])
def test_bad_document_index(store: Path, damage: str) -> None:
    name = manifest_json(store)["shards"][1]["name"]
    starts, n_tokens = starts_of(store, name), len(tokens_of(store, name))
    what, found = {
        "first": ("first document start", "1"),
        "range": ("document start out of range", f"entry {len(starts) - 1} = {n_tokens}"),
        "count": ("document count", str(len(starts) - 1)),
        "dtype": ("document starts", "int32"),
    }[damage]
    if damage == "first":
        starts[0] = 1
    elif damage == "range":
        starts[-1] = n_tokens
    elif damage == "count":
        starts = starts[:-1]
    else:
        starts = starts.astype(np.int32)
    np.save(store / f"{name}.idx.npy", starts, allow_pickle=False)
    for quick in (False, True):
        [problem] = problems_with(store, what, quick=quick, file=f"{name}.idx.npy")
        assert found in problem.found


def test_out_of_range_token_id(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = manifest_json(store)["shards"][0]["name"]
    tokens = tokens_of(store, name)
    pos = int(starts_of(store, name)[1]) + 2  # inside the second document
    tokens[pos] = 300
    write_tokens(store, name, tokens)
    for quick in (False, True):
        rc = run(capsys, str(store), *(["--quick"] if quick else []))[0]
        assert rc == 1
        [problem] = problems_with(store, "token id out of range", quick=quick)
        assert problem.file.endswith(f"{name}.bin")
        assert problem.expected == f"ids < {manifest_json(store)['vocab_size']}"
        assert problem.found.startswith(f"300 at token {pos} ")
        hash_check = "block 0 sha256 mismatch" if quick else "sha256 mismatch"
        assert problems_with(store, hash_check, quick=quick, file=f"{name}.bin")


@pytest.mark.parametrize("where", ["middle", "last"])
def test_missing_end_of_document(
    store: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    name = manifest_json(store)["shards"][1]["name"]
    tokens, starts = tokens_of(store, name), starts_of(store, name)
    doc = 0 if where == "middle" else len(starts) - 1
    end = (int(starts[doc + 1]) if where == "middle" else len(tokens)) - 1
    assert tokens[end] == EOD
    tokens[end] = ord("x")
    write_tokens(store, name, tokens)
    for quick in (False, True):
        rc, out, _ = run(capsys, str(store), *(["--quick"] if quick else []))
        assert rc == 1 and f"{store / name}.bin: missing end-of-document id" in out
        [problem] = problems_with(store, "missing end-of-document id", quick=quick)
        assert f"document {doc} ends at token {end} with id {ord('x')}" in problem.found


def test_missing_shard_file(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = manifest_json(store)["shards"][2]
    (store / f"{shard['name']}.bin").unlink()
    rc, out, _ = run(capsys, str(store))
    assert rc == 1
    expected = f"{store / shard['name']}.bin: missing: expected {2 * shard['n_tokens']} bytes"
    assert expected in out


def test_unreadable_shard_file(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = manifest_json(store)["shards"][0]["name"]
    (store / f"{name}.bin").unlink()
    (store / f"{name}.bin").mkdir()  # exists, but cannot be read as a file
    rc, out, _ = run(capsys, str(store))
    assert rc == 1 and f"{store / name}.bin: unreadable" in out


def test_manifest_totals_and_content_hash(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = manifest_json(store)
    true_total = data["n_tokens"]
    data["n_tokens"] += 5
    data["shards"][0]["bin_sha256"] = "0" * 64
    (store / MANIFEST_NAME).write_text(json.dumps(data))
    rc = run(capsys, str(store))[0]
    assert rc == 1
    [total] = problems_with(store, "n_tokens total")
    assert total.found == str(true_total + 5) and total.expected.startswith(str(true_total))
    [content] = problems_with(store, "content_hash mismatch")
    assert content.expected == data["content_hash"] != content.found
    assert problems_with(store, "sha256 mismatch", file=f"{data['shards'][0]['name']}.bin")


# --- quick mode on a store with many blocks per shard ---------------------------------------


def write_blocky_store(directory: Path) -> list[str]:
    """Shards of 200 uint16 tokens in 64-byte blocks (7 per shard); returns the shard names."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 40, size=40)
    docs = [rng.integers(0, 256, size=n).tolist() for n in lengths]
    manifest = write_store(directory, docs, shard_tokens=200, block_bytes=64)
    return [s.name for s in manifest.shards]


def test_quick_blocks_choice() -> None:
    for n in range(1, 25):
        for count in range(1, 7):
            chosen = quick_blocks(n, count, "part-00000")
            assert chosen == sorted(set(chosen)) and all(0 <= i < n for i in chosen)
            assert len(chosen) == min(n, count) and chosen[0] == 0
            assert count < 2 or chosen[-1] == n - 1
            assert chosen == quick_blocks(n, count, "part-00000")
    choices = {tuple(quick_blocks(50, 4, f"part-{i:05d}")) for i in range(10)}
    assert len(choices) > 1


def bump_token_in_block(store: Path, name: str, block: int) -> None:
    """Change one non-EOD token of 64-byte block ``block`` to another byte id."""
    tokens = tokens_of(store, name)
    span = np.arange(block * 32, min((block + 1) * 32, len(tokens)))
    pos = int(span[tokens[span] != EOD][0])
    tokens[pos] = (tokens[pos] + 1) % 256
    write_tokens(store, name, tokens)


def test_quick_catches_damage_in_a_checked_block_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "blocky"
    name = write_blocky_store(store)[1]
    n_blocks = len(manifest_json(store)["shards"][1]["block_sha256"])
    assert n_blocks == -(-tokens_of(store, name).nbytes // 64) >= 6
    assert run(capsys, str(store), "--quick")[0] == 0
    chosen = quick_blocks(n_blocks, 4, name)
    inner = next(i for i in chosen if 0 < i < n_blocks - 1)
    skipped = next(i for i in range(n_blocks) if i not in chosen)

    bump_token_in_block(store, name, skipped)
    rc, out, _ = run(capsys, str(store), "--quick")
    per_shard = [len(s["block_sha256"]) for s in manifest_json(store)["shards"]]
    assert rc == 0
    assert f"quick check: {sum(min(4, n) for n in per_shard)} of {sum(per_shard)} blocks" in out
    assert run(capsys, str(store))[0] == 1
    assert f"block {skipped} sha256 mismatch" in run(capsys, str(store))[1]
    # --blocks covering every block finds it in quick mode as well.
    rc, out, _ = run(capsys, str(store), "--quick", "--blocks", str(n_blocks))
    assert rc == 1 and f"{store / name}.bin: block {skipped} sha256 mismatch" in out

    bump_token_in_block(store, name, inner)
    rc, out, _ = run(capsys, str(store), "--quick")
    assert rc == 1
    assert f"{store / name}.bin: block {inner} sha256 mismatch" in out
    assert f"block {skipped} sha256" not in out


@pytest.mark.parametrize("quick", [False, True])
def test_out_of_range_position_with_odd_read_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick: bool
) -> None:
    """Reads in 7-byte chunks split tokens across reads; positions count from the shard."""
    store = tmp_path / "blocky"
    name = write_blocky_store(store)[2]
    n_blocks = len(manifest_json(store)["shards"][2]["block_sha256"])
    block = next(i for i in quick_blocks(n_blocks, 4, name) if 0 < i < n_blocks - 1)
    tokens = tokens_of(store, name)
    pos = block * 32 + 5  # 32 uint16 tokens per 64-byte block
    tokens[pos] = 1000
    write_tokens(store, name, tokens)
    expected = problems_with(store, "token id out of range", quick=quick)
    monkeypatch.setattr(verify, "CHUNK_BYTES", 7)
    [problem] = problems_with(store, "token id out of range", quick=quick)
    assert problem == expected[0] and problem.found.startswith(f"1000 at token {pos} ")


# --- usage errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["empty-dir", "text-file", "nowhere"])
def test_non_store_path_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = tmp_path / kind
    if kind == "empty-dir":
        path.mkdir()
    elif kind == "text-file":
        path.write_text("hello\n")
    rc, out, err = run(capsys, str(path))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tokentape: error: ")
    assert str(path) in err and "Traceback" not in err


def test_unreadable_manifest_exits_2(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (store / MANIFEST_NAME).write_text("{not json")
    rc, out, err = run(capsys, str(store))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and MANIFEST_NAME in err and "Traceback" not in err


def test_blocks_needs_quick(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, str(pristine), "--blocks", "3")
    assert rc == 2 and "--quick" in err


def test_json_output(pristine: Path, store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = manifest_json(store)["shards"][0]["name"]
    (store / f"{name}.idx.npy").unlink()
    rc, out, _ = run(capsys, str(pristine), str(store), "--json")
    assert rc == 1
    report = json.loads(out)
    assert report["ok"] is False and report["quick"] is False
    clean, damaged = report["stores"]
    assert clean["ok"] is True and clean["problems"] == []
    assert clean["n_tokens"] == manifest_json(pristine)["n_tokens"]
    assert damaged["ok"] is False and damaged["path"] == str(store)
    missing = [p for p in damaged["problems"] if p["what"] == "missing"]
    assert missing == [
        {
            "file": str(store / f"{name}.idx.npy"),
            "what": "missing",
            "expected": f"{manifest_json(store)['shards'][0]['idx_bytes']} bytes",
            "found": "no file",
        }
    ]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--vocab-size", "-5", "--eod-id", "3"], "--vocab-size must be positive, got -5"),
        (["--vocab-size", "0"], "--vocab-size must be positive, got 0"),
        (["--eod-id", "-1"], "--eod-id must be a token id (>= 0), got -1"),
        (["--vocab-size", "10", "--eod-id", "10"], "--eod-id 10 is not below --vocab-size 10"),
    ],
)
def test_vocabulary_flags_are_checked_before_anything_is_read(tmp_path, capsys, flags, message):
    """A vocabulary that cannot be one is a usage error (exit 2, one line), not a report of
    every id as out of range; nothing is hashed or recorded."""
    writer = MegatronWriter(tmp_path / "d", "uint16")
    writer.add(np.array([1, 2, 9, 3, 9]), np.array([3, 2]))
    writer.finish()
    before = sorted(p.name for p in tmp_path.iterdir())
    rc, out, err = run(capsys, str(tmp_path / "d"), *flags)
    assert (rc, out, err) == (2, "", f"tokentape: error: {message}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no sidecar written

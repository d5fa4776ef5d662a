"""End-to-end ``tokentape tokenize``: exact tokens, worker-count independence, crash safety,
bad input, dtype choice. The command runs as a real subprocess where the test needs one."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken
import tiktoken.load
import tokenizers
from helpers import make_documents, run_cli, tree_bytes, write_jsonl
from hypothesis import given
from hypothesis import strategies as st

from tokentape import TokentapeError, open_source
from tokentape._src.program import main
from tokentape._src.store.tokenizers import GPT2_SPLIT_PATTERN
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape.errors import ArgumentError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    """Mixed-format inputs and, in reading order, the documents they hold."""
    root = tmp_path_factory.mktemp("corpus")
    docs = make_documents(420, seed=7)
    parts = [docs[0:120], docs[120:240], docs[240:300], docs[300:360], docs[360:410], docs[410:]]
    (root / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in parts[0]))
    (root / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in parts[1]))
    with gzip.open(root / "c.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in parts[2])
    pq.write_table(pa.table({"text": parts[3]}), root / "d.parquet", row_group_size=16)
    (root / "e.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in parts[4]))
    txt = root / "f"
    txt.mkdir()
    for i, t in enumerate(parts[5]):
        (txt / f"{i:02d}.txt").write_text(t)
    return root, docs


def tokenize_args(root: Path, out: Path, *extra: str) -> list[str]:
    return [
        "tokenize",
        str(root),
        "--out",
        str(out),
        "--unit-mb",
        "0.004",
        "--shard-mb",
        "0.01",
        *extra,
    ]


def reference_encoders(kind: str, hf_path: Path | None, gpt2_path: Path | None):
    """The tokenizers' own encode, built directly from the libraries."""
    if kind == "hf":
        tok = tokenizers.Tokenizer.from_file(str(hf_path))
        return (lambda t: tok.encode(t, add_special_tokens=False).ids), tok.token_to_id(
            "<|endoftext|>"
        )
    if kind == "tiktoken":
        ranks = tiktoken.load.load_tiktoken_bpe(str(gpt2_path))
        enc = tiktoken.Encoding(
            "gpt2-test",
            pat_str=GPT2_SPLIT_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={"<|endoftext|>": len(ranks)},
        )
        return (lambda t: enc.encode(t, disallowed_special=())), len(ranks)
    return (lambda t: list(t.encode("utf-8"))), 256


@pytest.mark.parametrize("kind", ["hf", "tiktoken", "bytes"])
def test_store_tokens_equal_the_tokenizers_own_encode(kind, corpus, tmp_path, request):
    root, docs = corpus
    hf = request.getfixturevalue("hf_tokenizer_json") if kind == "hf" else None
    gpt2 = request.getfixturevalue("gpt2_tiktoken") if kind == "tiktoken" else None
    spec = {"hf": str(hf), "tiktoken": f"tiktoken:{gpt2}", "bytes": "bytes"}[kind]
    assert main([*tokenize_args(root, tmp_path / "s"), "--tokenizer", spec, "--json"]) == 0
    encode, eod = reference_encoders(kind, hf, gpt2)
    src = open_source(tmp_path / "s")
    assert src.n_docs == len(docs) and src.eod_id == eod
    assert len(src.manifest.shards) > 1
    for i, text in enumerate(docs):
        start, end = src.doc_span(i)
        assert list(src.tokens(start, end)) == [*encode(text), eod], f"document {i}"
        assert src.decode(src.doc(i)) == text


@pytest.mark.subprocess
def test_output_is_byte_identical_for_1_and_2_workers(corpus, hf_tokenizer_json, tmp_path):
    root, _ = corpus
    trees = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        args = tokenize_args(root, out, "--tokenizer", str(hf_tokenizer_json), "--json")
        result = run_cli(*args, "--workers", workers, "--filter", "max-tokens:150")
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["n_shards"] > 1 and summary["units"] > 4
        assert summary["dropped_docs"]["max-tokens"] > 0
        trees.append(tree_bytes(out))
    assert trees[0] == trees[1]
    assert "manifest.json" in trees[0] and not any(".tokentape-work" in k for k in trees[0])


@pytest.fixture(scope="module")
def reference_store(corpus, tmp_path_factory) -> dict[str, bytes]:
    root, _ = corpus
    out = tmp_path_factory.mktemp("ref") / "s"
    assert main([*tokenize_args(root, out), "--json"]) == 0
    return tree_bytes(out)


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "workers"),
    [
        ("after-unit", "1"),
        ("after-unit", "2"),
        ("mid-assembly", "1"),
        ("mid-assembly", "2"),
        ("before-manifest", "2"),
        ("after-manifest", "1"),
    ],
)
def test_sigkill_then_rerun_is_byte_identical(point, workers, corpus, reference_store, tmp_path):
    root, _ = corpus
    args = [*tokenize_args(root, tmp_path / "s"), "--workers", workers, "--json"]
    killed = run_cli(*args, env={"TOKENTAPE_CRASH_AT": point})
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / "s" / "manifest.json").exists() == (point == "after-manifest")
    if point != "after-manifest":
        with pytest.raises(TokentapeError, match="no manifest"):
            open_source(tmp_path / "s")
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    status = json.loads(rerun.stdout)["status"]
    assert status == ("already complete" if point == "after-manifest" else "resumed")
    if point == "after-unit":
        assert json.loads(rerun.stdout)["units_reused"] >= 1
    assert tree_bytes(tmp_path / "s") == reference_store


@pytest.mark.subprocess
@pytest.mark.slow
def test_sigkill_at_a_random_moment_then_rerun(corpus, reference_store, tmp_path):
    """A kill from outside, whenever the first unit has finished."""
    root, _ = corpus
    args = [*tokenize_args(root, tmp_path / "s"), "--workers", "2", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokentape", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    work = tmp_path / "s" / ".tokentape-work"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if work.is_dir() and any(work.glob("units-*/unit-*.json")):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert tree_bytes(tmp_path / "s") == reference_store


def test_rerun_of_a_complete_store_changes_nothing(corpus, reference_store, tmp_path):
    root, _ = corpus
    args = tokenize_args(root, tmp_path / "s")
    assert main([*args, "--json"]) == 0
    assert main([*args, "--json"]) == 0
    assert tree_bytes(tmp_path / "s") == reference_store
    # Other settings into the same directory are refused without --overwrite ...
    assert main([*args, "--filter", "min-tokens:5"]) == 2
    assert tree_bytes(tmp_path / "s") == reference_store
    # ... and accepted with it.
    assert main([*args, "--filter", "min-tokens:5", "--overwrite"]) == 0
    assert tree_bytes(tmp_path / "s") != reference_store


GOOD = [json.dumps({"text": t}) for t in make_documents(40, seed=1)]


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing-file", r"input '.*nope\.jsonl': no such file"),
        ("bad-json", r"late\.jsonl:3: invalid JSON"),
        ("missing-key", r"late\.jsonl:2: no field 'text'"),
        ("wrong-type", r"late\.jsonl:1: field 'text' is int, expected a string"),
        ("empty-input", r"no document"),
        ("unknown-tokenizer", r"unknown tokenizer spec 'gpt9'"),
        ("foreign-out", r"not empty and not a tokentape store \(found 'notes\.txt'\)"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_left(case, expected, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "early.jsonl", GOOD)  # finishes before the bad unit is reached
    late = {
        "bad-json": [GOOD[0], GOOD[1], '{"text": "unterminated'],
        "missing-key": [GOOD[0], json.dumps({"body": "x"})],
        "wrong-type": [json.dumps({"text": 5})],
    }
    inputs = [str(data / "early.jsonl")]
    if case in late:
        inputs.append(str(write_jsonl(data / "late.jsonl", late[case])))
    if case == "missing-file":
        inputs.append(str(data / "nope.jsonl"))
    if case == "empty-input":
        inputs = [str(write_jsonl(data / "empty.jsonl", []))]
    out = tmp_path / "out"
    if case == "foreign-out":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    tokenizer = "gpt9" if case == "unknown-tokenizer" else "bytes"
    result = run_cli(
        "tokenize",
        *inputs,
        "--out",
        str(out),
        "--tokenizer",
        tokenizer,
        "--unit-mb",
        "0.001",
        "--workers",
        "2",
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokentape: error: "), result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(expected, lines[0]), lines[0]
    assert result.stdout == ""
    if case == "foreign-out":
        assert sorted(os.listdir(out)) == ["notes.txt"]
    else:
        assert not out.exists()


@pytest.mark.subprocess
def test_id_overflow_is_an_error(big_vocab_tokenizer_json, big_vocab_sample, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"text": big_vocab_sample})])
    (tmp_path / "out").mkdir()  # an existing empty directory is left as it was
    result = run_cli(
        "tokenize",
        str(data),
        "--out",
        str(tmp_path / "out"),
        "--tokenizer",
        str(big_vocab_tokenizer_json),
        "--dtype",
        "uint16",
    )
    assert result.returncode == 2
    assert "d.jsonl: token id" in result.stderr and "does not fit" in result.stderr
    assert os.listdir(tmp_path / "out") == []


def test_uint32_above_65536_ids(big_vocab_tokenizer_json, big_vocab_sample, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"text": big_vocab_sample})])
    args = ["tokenize", str(data), "--out", str(tmp_path / "s"), "--json"]
    assert main([*args, "--tokenizer", str(big_vocab_tokenizer_json)]) == 0
    src = open_source(tmp_path / "s")
    assert src.manifest.dtype == "uint32" and src.manifest.vocab_size > 65_536
    ids = (
        tokenizers.Tokenizer.from_file(str(big_vocab_tokenizer_json))
        .encode(big_vocab_sample, add_special_tokens=False)
        .ids
    )
    assert max(ids) > 65_535
    assert list(src.doc(0)) == ids
    raw = np.fromfile(tmp_path / "s" / "part-00000.bin", dtype="<u4")
    assert list(raw[:-1]) == ids


def test_info_shows_the_manifest(corpus, tmp_path, capsys):
    root, docs = corpus
    assert main([*tokenize_args(root, tmp_path / "s"), "--json"]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "s"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_docs"] == len(docs) and info["format"] == "tokentape.store"
    assert main(["info", str(tmp_path / "s")]) == 0
    text = capsys.readouterr().out
    assert f"{len(docs):,}" in text and "part-00001" in text and info["content_hash"] in text
    assert main(["info", str(tmp_path / "nothing")]) == 2


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_worker_killed_mid_run_keeps_finished_units(hf_tokenizer_json, tmp_path):
    # With the crash hook set, the calling process waits until the helper has claimed a unit
    # (see tokentape._src.tokenize.pool.HELPER_CRASH), so the helper dies holding one.
    data = tmp_path / "big.jsonl"
    lines = [json.dumps({"text": t}) for t in make_documents(600, seed=3)]
    write_jsonl(data, lines * 3)
    args = ["tokenize", str(data), "--tokenizer", str(hf_tokenizer_json), "--unit-mb", "0.02"]
    assert main([*args, "--out", str(tmp_path / "ref"), "--json"]) == 0
    broken = run_cli(
        *args,
        "--out",
        str(tmp_path / "s"),
        "--workers",
        "2",
        env={"TOKENTAPE_CRASH_AT": "helper-unit"},
    )
    assert broken.returncode == 2, broken.stdout
    assert "a worker process died (exit codes [-9]" in broken.stderr
    assert "Traceback" not in broken.stderr
    assert (tmp_path / "s" / ".tokentape-work" / "job.json").exists()
    rerun = run_cli(*args, "--out", str(tmp_path / "s"), "--workers", "2", "--json")
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["status"] == "resumed" and 0 < summary["units_reused"] < summary["units"]
    assert tree_bytes(tmp_path / "s") == tree_bytes(tmp_path / "ref")


@pytest.mark.subprocess
def test_bad_input_met_by_a_helper_process(hf_tokenizer_json, tmp_path):
    # Unit 0 keeps the calling process busy for a while, so the helper that comes up meanwhile
    # usually claims unit 1, which is bad; whichever process meets it, one line must reach
    # the user and nothing may be left behind.
    data = tmp_path / "data"
    data.mkdir()
    lines = [json.dumps({"text": t}) for t in make_documents(600, seed=5)]
    write_jsonl(data / "a-big.jsonl", lines * 7)
    write_jsonl(data / "b-bad.jsonl", ['{"text": "fine"}', "{not json"])
    unit_mb = str((data / "a-big.jsonl").stat().st_size / 2**20 + 0.001)
    result = run_cli(
        "tokenize",
        str(data),
        "--out",
        str(tmp_path / "out"),
        "--tokenizer",
        str(hf_tokenizer_json),
        "--workers",
        "2",
        "--unit-mb",
        unit_mb,
    )
    assert result.returncode == 2
    lines_out = result.stderr.strip().splitlines()
    assert len(lines_out) == 1 and re.search(r"b-bad\.jsonl:2: invalid JSON", lines_out[0])
    assert not (tmp_path / "out").exists()


@pytest.mark.subprocess
@pytest.mark.parametrize("foreign", ["part-00000-1a2b.snappy.parquet", "tokenizer_config.json"])
def test_look_alike_foreign_files_are_never_ours(tmp_path, foreign):
    """Names that merely start like ours (Spark's part files, a HF tokenizer config) make the
    directory foreign: refused, even with --overwrite, and left untouched."""
    data = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"text": "hello"})])
    out = tmp_path / "out"
    out.mkdir()
    (out / foreign).write_text("mine")
    for extra in ([], ["--overwrite"]):
        result = run_cli("tokenize", str(data), "--out", str(out), *extra)
        assert result.returncode == 2, result.stderr
        assert f"found '{foreign}'" in result.stderr
        assert sorted(os.listdir(out)) == [foreign]


BAD_FLAGS = [
    # (extra arguments, what the one line must say)
    (["--shard-mb", "inf"], "--shard-mb must be a number of MiB in (0, 1048576], got inf"),
    (["--shard-mb=-inf"], "--shard-mb must be a number of MiB"),
    (["--shard-mb", "nan"], "--shard-mb must be a number of MiB in (0, 1048576], got nan"),
    (["--shard-mb", "0"], "--shard-mb must be a number of MiB"),
    (["--shard-mb", "-1"], "--shard-mb must be a number of MiB"),
    (["--shard-mb", "1e300"], "--shard-mb must be a number of MiB"),
    (["--shard-mb", "2000000"], "--shard-mb must be a number of MiB"),
    (["--unit-mb", "inf"], "--unit-mb must be a number of MiB"),
    (["--unit-mb", "nan"], "--unit-mb must be a number of MiB"),
    (["--unit-mb", "0"], "--unit-mb must be a number of MiB"),
    (["--unit-mb", "-0.5"], "--unit-mb must be a number of MiB"),
    (["--unit-mb", "1e308"], "--unit-mb must be a number of MiB"),
    (["--workers", "0"], "--workers must be between 1 and 65,536, got 0"),
    (["--workers", "-3"], "--workers must be between 1 and 65,536, got -3"),
    (["--workers", "100000000000"], "--workers must be between 1 and 65,536"),
    (["--text-key", ""], "--text-key must not be empty"),
    (["--text-key", "a\nb"], "--text-key 'a\\nb': must not hold NUL or line breaks"),
    (["--tokenizer", ""], "--tokenizer must not be empty"),
    (["--eod-token", ""], "--eod-token must not be empty"),
    (["--ray-address", "head:6379"], "--ray-address needs --executor ray"),
    (["--executor", "ray", "--ray-address", ""], "--ray-address must not be empty"),
    (["--executor", "ray", "--ray-address", "head:99999"], "port 99999 is not in 1-65535"),
    (["--executor", "ray", "--ray-address", ":6379"], "--ray-address :6379: no host"),
    (["--filter", "min-tokens:-1"], "--filter 'min-tokens:-1': N must be a non-negative"),
    (["--filter", "min-tokens:1e3"], "--filter 'min-tokens:1e3': N must be a non-negative"),
    (["--filter", "max-tokens:0"], "--filter 'max-tokens:0': N must be >= 1"),
    (["--filter", "min-tokens:" + "9" * 30], "N must be at most 2**62"),
    (["--filter", "unique-lines:min_lines=" + "9" * 30], "min_lines must be at most 2**62"),
    (["--filter", "unique-lines:min_ratio=nan"], "min_ratio must be a number in (0, 1]"),
    (["--filter", "unique-lines:min_ratio=inf"], "min_ratio must be a number in (0, 1]"),
    (["--filter", "unique-lines:min_ratio=0"], "min_ratio must be a number in (0, 1]"),
    (["--filter", "unique-lines:what=1"], "unknown parameter 'what'"),
    (["--filter", "bloom"], "--filter 'bloom': unknown filter"),
    (["--out", ""], "--out must not be empty"),
]


@pytest.mark.parametrize(("extra", "expected"), BAD_FLAGS, ids=lambda v: repr(v)[:40])
def test_a_bad_flag_is_one_line_naming_it_and_writes_nothing(extra, expected, tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", GOOD)
    before = sorted(os.listdir(tmp_path))
    code = main(["tokenize", str(data), "--out", str(tmp_path / "out" / "s"), *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("tokentape: error: "), err
    assert expected in err, err
    assert sorted(os.listdir(tmp_path)) == before  # not even the parent of --out


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("shard_mb", float("inf"), "--shard-mb must be a number of MiB"),
        ("shard_mb", "8", "--shard-mb must be a number of MiB, got '8'"),
        ("shard_mb", True, "--shard-mb must be a number of MiB, got True"),
        ("unit_mb", float("nan"), "--unit-mb must be a number of MiB"),
        ("workers", 2.5, "--workers must be an integer, got 2.5"),
        ("workers", "4", "--workers must be an integer, got '4'"),
        ("workers", 0, "--workers must be between 1"),
        ("inputs", "data.jsonl", "inputs: expected a tuple of paths, got str"),
        ("inputs", (), "no inputs given"),
        ("inputs", (5,), "input must be a path, got 5"),
        ("out", None, "--out must be a path, got None"),
        ("tokenizer", None, "--tokenizer must be a string, got None"),
        ("text_key", 3, "--text-key must be a string, got 3"),
        ("filters", "min-tokens:3", "filters: expected a tuple of specs"),
        ("filters", (3,), "--filter must be a string, got 3"),
        ("executor", "dask", "--executor 'dask': expected local or ray"),
        ("dtype", "int8", "--dtype 'int8': expected auto, uint16 or uint32"),
        ("overwrite", "yes", "overwrite: expected True or False"),
    ],
)
def test_tokenize_config_refuses_bad_values_naming_them(field, value, expected, tmp_path):
    settings = {"inputs": (str(tmp_path / "d.jsonl"),), "out": str(tmp_path / "s")}
    with pytest.raises(ArgumentError) as caught:
        TokenizeConfig(**(settings | {field: value}))
    assert expected in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "s").exists()


@pytest.mark.subprocess
def test_damaged_unit_files_of_an_interrupted_run_are_made_again(corpus, reference_store, tmp_path):
    """A rerun trusts a finished unit only if its files match its marker: a truncated token
    file, a garbled marker, a garbled documents file or ids that do not fill their file makes
    that unit again."""
    root, _ = corpus
    args = [*tokenize_args(root, tmp_path / "s"), "--json"]
    killed = run_cli(*args, env={"TOKENTAPE_CRASH_AT": "mid-assembly"})
    assert killed.returncode == -signal.SIGKILL
    (work,) = (tmp_path / "s" / ".tokentape-work").glob("units-*")  # this job's unit files
    assert len(list(work.glob("unit-*.json"))) >= 5
    with open(work / "unit-000000.bin", "r+b") as f:
        f.truncate(3)
    (work / "unit-000001.json").write_bytes(b"\xff\xfe garbage")
    (work / "unit-000002.docs.npy").write_bytes(b"\x93NUMPY garbage")
    (work / "unit-000003.json").write_text('{"index": 3, "docs_in": "many"}')
    docs = work / "unit-000004.docs.npy"  # the array, then the ids: ids that do not fill it
    docs.write_bytes(docs.read_bytes() + b"not the ids the documents name")
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["status"] == "resumed"
    assert summary["units_reused"] == summary["units"] - 5
    assert tree_bytes(tmp_path / "s") == reference_store


@given(
    size=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers()),
    workers=st.one_of(st.integers(), st.floats(), st.booleans(), st.text(max_size=3)),
)
def test_any_size_or_worker_count_is_accepted_or_one_argument_error(size, workers):
    """Any number for --shard-mb/--unit-mb and any value for --workers is either accepted,
    and then gives a usable size, or refused with an ArgumentError naming the flag."""
    for field, flag in (("shard_mb", "--shard-mb"), ("unit_mb", "--unit-mb")):
        try:
            config = TokenizeConfig(inputs=("d.jsonl",), out="s", **{field: size})
        except ArgumentError as exc:
            assert str(exc).startswith(flag) and "\n" not in str(exc)
            continue
        assert math.isfinite(size) and size > 0
        assert 1 <= config.unit_bytes(10**9) <= 2**40
    try:
        TokenizeConfig(inputs=("d.jsonl",), out="s", workers=workers)
    except ArgumentError as exc:
        assert str(exc).startswith("--workers") and "\n" not in str(exc)
    else:
        assert isinstance(workers, int) and 1 <= workers <= 65_536

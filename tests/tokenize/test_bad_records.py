"""Dirty records (issue 29, item 1): by default the first one stops the job, naming the way
past it; with ``on_bad_record="skip"`` each is counted per input and reason, with the first
locations, in the manifest and the summary, and skipped, the store byte-identical for any
worker count; past ``max_bad_fraction`` the job is refused with the counts and writes no store.

The expected counts and locations come from how the test builds its inputs (which lines it
spoils, and how), never from the code under test."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import cli

import tokentape
from tokentape.errors import ArgumentError, InputError

GOOD = [f"document number {i} with some words" for i in range(40)]
BAD = {  # line (1-based, among 60) -> (raw line, reason)
    3: (b'{"text": null}', "'text' is null"),
    7: (b"this is not json", "invalid JSON"),
    11: (b'{"text": "caf\xe9"}', "invalid UTF-8"),
    19: (b'["text"]', "not an object"),
    23: (b'{"body": "x"}', "no field 'text'"),
    31: (b'{"text": 5}', "'text' is int"),
    47: (b'{"text": "bad \\ud800"}', "lone surrogate"),
    55: (b'{"text": null}', "'text' is null"),
}


GOOD_DOCS = (60 - len(BAD) - 2) + 3
"""Documents read: the jsonl's lines neither spoiled nor blank, and the parquet's 3 rows."""


def _dirty(path):
    """60 lines: the spoiled ones of BAD, blank lines at 5 and 9, good records elsewhere."""
    good = iter(GOOD)
    lines = []
    for n in range(1, 61):
        if n in BAD:
            lines.append(BAD[n][0])
        elif n in (5, 9):
            lines.append(b"")
        else:
            lines.append(json.dumps({"text": next(good, "tail")}).encode())
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _parquet(path):
    texts = ["row zero", None, "row two", None, "row four"]
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), path)
    return path


@pytest.fixture
def inputs(tmp_path):
    return _dirty(tmp_path / "dirty.jsonl"), _parquet(tmp_path / "nulls.parquet")


def _expected_counts(inputs):
    jsonl, parquet = inputs
    by_reason: dict[str, int] = {}
    for _, reason in BAD.values():
        by_reason[reason] = by_reason.get(reason, 0) + 1
    return {str(jsonl): dict(sorted(by_reason.items())), str(parquet): {"'text' is null": 2}}


def test_by_default_the_first_bad_record_stops_the_job_naming_the_flag(inputs, tmp_path, capsys):
    code, out, err = cli(capsys, "tokenize", *inputs, "--out", tmp_path / "st")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{inputs[0]}:3: field 'text' is null" in err and "--on-bad-record skip" in err
    assert not (tmp_path / "st" / "manifest.json").exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_skip_counts_each_bad_record_per_input_and_reason(inputs, tmp_path, workers):
    out = tmp_path / f"st{workers}"
    summary = tokentape.tokenize(
        [str(p) for p in inputs], out, on_bad_record="skip", max_bad_fraction=0.5,
        workers=workers, unit_mb=0.0005,
    )  # fmt: skip
    bad = summary.bad_records
    assert bad["by_input"] == _expected_counts(inputs)
    assert bad["skipped"] == len(BAD) + 2
    good_docs = GOOD_DOCS
    assert summary.docs_in == good_docs and bad["records"] == good_docs + bad["skipped"]
    jsonl = str(inputs[0])
    assert [w.split(": ")[0] for w in bad["first"]] == [f"{jsonl}:{n}" for n in sorted(BAD)] + [
        f"{inputs[1]}",
        f"{inputs[1]}",
    ]
    assert bad["first"][-2:] == [
        f"{inputs[1]}: row 1: field 'text' is null",
        f"{inputs[1]}: row 3: field 'text' is null",
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["extra"]["bad_records"] == bad
    src = tokentape.open_source(out)
    texts = [src.decode(src.tokens(*src.doc_span(i))[:-1]) for i in range(src.n_docs)]
    assert texts == [*GOOD, *["tail"] * (60 - len(BAD) - 2 - len(GOOD)), "row zero", "row two",
                     "row four"]  # fmt: skip


def test_skip_is_byte_identical_for_any_worker_count(inputs, tmp_path):
    made = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        tokentape.tokenize([str(p) for p in inputs], out, on_bad_record="skip",
                           max_bad_fraction=0.5, workers=workers, unit_mb=0.0005)  # fmt: skip
        made.append((out / "manifest.json").read_bytes())
    assert made[0] == made[1]


def test_past_the_fraction_the_job_is_refused_with_the_counts(inputs, tmp_path, capsys):
    code, out, err = cli(capsys, "tokenize", *inputs, "--out", tmp_path / "st",
                         "--on-bad-record", "skip")  # fmt: skip
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"10 of {GOOD_DOCS + 10} records are bad" in err
    assert "over --max-bad-fraction 0.01" in err
    assert "'text' is null 4" in err  # two lines of the jsonl, two rows of the parquet
    assert not (tmp_path / "st" / "manifest.json").exists()


def test_info_and_the_summary_show_them(inputs, tmp_path, capsys):
    args = ["tokenize", *inputs, "--out", tmp_path / "st", "--on-bad-record", "skip",
            "--max-bad-fraction", "0.5"]  # fmt: skip
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    share = f"{10 / (GOOD_DOCS + 10):.2%}"
    assert f"bad records        10 skipped of {GOOD_DOCS + 10} ({share})" in out
    assert f"{inputs[0]}:3: field 'text' is null" in out
    code, out, err = cli(capsys, "info", tmp_path / "st")
    assert code == 0, err
    assert "bad records" in out and f"10 skipped of {GOOD_DOCS + 10}" in out
    clean = tmp_path / "clean.jsonl"  # the default job (fail) has no such row, nor does info
    clean.write_text("".join(json.dumps({"text": t}) + "\n" for t in GOOD))
    code, out, err = cli(capsys, "tokenize", clean, "--out", tmp_path / "clean")
    assert code == 0 and "documents kept" in out and "bad records" not in out, out + err
    code, out, err = cli(capsys, "info", tmp_path / "clean")
    assert code == 0 and "documents read" in out and "bad records" not in out, out + err


def test_clean_inputs_give_the_same_tokens_either_way(tmp_path):
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(json.dumps({"text": t}) + "\n" for t in GOOD))
    a = tokentape.tokenize(str(clean), tmp_path / "a")
    b = tokentape.tokenize(str(clean), tmp_path / "b", on_bad_record="skip")
    assert a.content_hash == b.content_hash and a.bad_records == {}
    assert b.bad_records["skipped"] == 0


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"on_bad_record": "ignore"}, "on_bad_record must be one of fail, skip"),
        ({"max_bad_fraction": 1.5}, "max_bad_fraction must be a fraction between 0 and 1"),
        ({"max_bad_fraction": True}, "max_bad_fraction must be a fraction"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, kwargs, named):
    with pytest.raises(ArgumentError, match=named):
        tokentape.tokenize("x.jsonl", tmp_path / "st", **kwargs)
    assert issubclass(ArgumentError, InputError)

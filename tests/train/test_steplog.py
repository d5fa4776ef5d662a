"""Reading the step log: bad lines are one-line errors naming file:line and the field, a torn
last line is ignored, the supersede rule holds exactly in the streaming reader (against a naive
reference), and reading keeps memory small."""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path

import pytest
from helpers import HASH, record
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import BatchChange
from tokentape._src.train.steplog import StepRecord, read_step_log, scan_step_log, schedule_of
from tokentape.errors import TokentapeError


def line(rec: dict) -> str:
    return json.dumps(rec, sort_keys=True) + "\n"  # as the loader writes it


def write(path: Path, *recs: dict | str) -> Path:
    path.write_text("".join(r if isinstance(r, str) else line(r) for r in recs))
    return path


# --- bad content: one line naming file:line and the field -----------------------------------

BAD_FIELDS = [
    ({"time": "yesterday"}, "time"),
    ({"time": None}, "time"),
    ({"time": True}, "time"),
    ({"time": [1]}, "time"),
    ({"dp": 0, "global_batch": 0}, "dp"),
    ({"dp": -2, "micro": -2, "global_batch": 4}, "dp"),
    ({"micro": 0, "global_batch": 0}, "micro"),
    ({"accum": -1, "dp": -2, "global_batch": 4}, "dp"),
    ({"accum": 0, "global_batch": 0}, "accum"),
    ({"dp": 2.0}, "dp"),
    ({"dp": True, "global_batch": 2}, "dp"),
    ({"step": -1}, "step"),
    ({"step": 1.0}, "step"),
    ({"step": "1"}, "step"),
    ({"consumed": -4}, "consumed"),
    ({"consumed": None}, "consumed"),
    ({"global_batch": 5}, "global_batch"),
    ({"global_batch": None}, "global_batch"),
    ({"index_hash": 7}, "index_hash"),
    ({"tokens_hash": None}, "tokens_hash"),
    ({"consumed": 2**62 - 2}, "consumed"),  # the step's positions would pass 2**62
]


@pytest.mark.parametrize(("change", "field"), BAD_FIELDS)
def test_a_bad_field_is_one_line_naming_file_line_and_field(tmp_path, change, field) -> None:
    log = write(tmp_path / "steps.jsonl", record(0, 0), record(1, 4) | change, record(2, 8))
    for read in (read_step_log, scan_step_log):
        with pytest.raises(TokentapeError) as err:
            read(log)
        message = str(err.value)
        assert message.startswith(f"{log}:2: ") and f"'{field}'" in message, message
        assert "\n" not in message


@pytest.mark.parametrize("missing", ["step", "consumed", "dp", "micro", "accum", "tokens_hash"])
def test_a_missing_field_is_named(tmp_path, missing) -> None:
    rec = record(1, 4)
    del rec[missing]
    log = write(tmp_path / "steps.jsonl", record(0, 0), rec)
    with pytest.raises(TokentapeError, match=rf"steps.jsonl:2: field '{missing}' missing"):
        read_step_log(log)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]\n", r"steps.jsonl:2: expected a JSON object"),
        ('"step"\n', r"steps.jsonl:2: expected a JSON object"),
        ("{not json\n", r"steps.jsonl:2: not a JSON line"),
        ("[" * 100_000 + "]" * 100_000 + "\n", r"steps.jsonl:2: not a JSON line"),
        (b"\xff\xfe{}\n", r"steps.jsonl:2: not a JSON line"),
    ],
)
def test_a_line_that_is_no_record_is_named(tmp_path, text, message) -> None:
    log = tmp_path / "steps.jsonl"
    raw = text if isinstance(text, bytes) else text.encode()
    log.write_bytes(line(record(0, 0)).encode() + raw + line(record(1, 4)).encode())
    with pytest.raises(TokentapeError, match=message):
        read_step_log(log)


ANY_JSON = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)
FIELDS = ["step", "consumed", "global_batch", "dp", "micro", "accum", "index_hash", "tokens_hash"]


@settings(max_examples=300, deadline=None)
@given(changes=st.dictionaries(st.sampled_from([*FIELDS, "time"]), ANY_JSON, max_size=3))
def test_any_field_values_give_records_or_a_one_line_error(tmp_path_factory, changes) -> None:
    """Whatever the values, no other exception escapes: a record, or a one-line error about
    line 2 (the changed one); and an accepted record has exactly the stated types and ranges."""
    log = write(
        tmp_path_factory.mktemp("log") / "steps.jsonl", record(0, 0), record(1, 4) | changes
    )
    try:
        records = read_step_log(log)
    except TokentapeError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{log}:2: "), message
        assert "not a step record" not in message  # the fast and slow checks agree
        bad_type = any(f"field '{f}'" in message for f in changes)
        assert bad_type or "step" in message or "index hashes" in message, message
        return
    r = records[-1]
    for name in ("step", "consumed", "dp", "micro", "accum", "global_batch"):
        assert type(getattr(r, name)) is int
    assert min(r.dp, r.micro, r.accum) >= 1 and r.global_batch == r.dp * r.micro * r.accum
    assert type(r.time) is float and math.isfinite(r.time)
    if (r.step, r.consumed) == (0, 0):  # line 2 made a run restarted from scratch: it replaces 1
        assert len(records) == 1
    else:
        assert (r.step, r.consumed) == (1, 4) and len(records) == 2


def test_time_may_be_an_integer_or_absent(tmp_path) -> None:
    rec = record(1, 4)
    del rec["time"]
    log = write(tmp_path / "steps.jsonl", record(0, 0, time=1_700_000_000), rec)
    assert [r.time for r in read_step_log(log)] == [1_700_000_000.0, 0.0]


# --- a torn last line -----------------------------------------------------------------------


def test_a_torn_last_line_is_ignored_at_every_cut(tmp_path) -> None:
    """The writer died after writing part of step 3's line: whatever prefix of it reached the
    file, the log reads as steps 0..2 — or 0..3 when the object itself is whole."""
    head = "".join(line(record(s, 4 * s)) for s in range(3))
    last = line(record(3, 12, dp=1))
    log = tmp_path / "steps.jsonl"
    for cut in range(1, len(last)):  # never the whole line: the newline is missing
        log.write_text(head + last[:cut])
        whole = cut == len(last) - 1  # only the newline is missing
        records = read_step_log(log)
        assert [r.step for r in records] == ([0, 1, 2, 3] if whole else [0, 1, 2]), cut
        scanned = scan_step_log(log, steps=[2, 3])
        assert scanned.steps == len(records)
        assert set(scanned.records) == ({2, 3} if whole else {2})


def test_a_torn_line_of_bytes_that_are_not_utf8_is_ignored(tmp_path) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_bytes(line(record(0, 0)).encode() + b'{"step": 1, "x": "\xe2\x82')
    assert len(read_step_log(log)) == 1


def test_a_log_of_only_a_torn_line_is_empty(tmp_path) -> None:
    log = write(tmp_path / "steps.jsonl", line(record(0, 0))[:40])
    with pytest.raises(TokentapeError, match="empty"):
        read_step_log(log)


def test_a_torn_line_in_the_middle_is_an_error(tmp_path) -> None:
    """The next append continued right after the partial line: line 2 is not JSON."""
    torn = line(record(1, 4))[:50]
    log = write(tmp_path / "steps.jsonl", record(0, 0), torn + line(record(1, 4)), record(2, 8))
    with pytest.raises(TokentapeError, match=r"steps.jsonl:2: not a JSON line"):
        read_step_log(log)
    log = write(tmp_path / "steps.jsonl", record(0, 0), torn + "\n", record(1, 4))
    with pytest.raises(TokentapeError, match=r"steps.jsonl:2: not a JSON line"):
        read_step_log(log)


# --- the supersede rule, streamed, against a naive reference ---------------------------------

SHAPES = [BatchConfig(2, 2, 1), BatchConfig(1, 3, 1), BatchConfig(4, 1, 2), BatchConfig(1, 1, 1)]


def reference(lines: list[dict]) -> list[dict]:
    """The rule as stated: a line for step s drops every earlier line of step s or later."""
    kept: list[dict] = []
    for rec in lines:
        kept = [r for r in kept if r["step"] < rec["step"]] + [rec]
    return kept


def reference_changes(kept: list[dict]) -> list[BatchChange]:
    changes: list[BatchChange] = []
    for r in kept:
        shape = (r["dp"], r["micro"], r["accum"])
        if not changes or (changes[-1].dp_size, changes[-1].micro, changes[-1].accum) != shape:
            changes.append(BatchChange(r["step"], r["consumed"], *shape))
    return changes


@st.composite
def crashing_runs(draw: st.DrawFn) -> list[dict]:
    """A log written by a run that crashes and resumes from an earlier step (with any shape),
    several times: each resume rewrites the steps after its checkpoint."""
    lines: list[dict] = []
    applied: list[dict] = []  # the effective steps so far (what a resume can return to)
    for _ in range(draw(st.integers(1, 6))):
        resume = draw(st.integers(0, len(applied)), label="resume at")
        applied = applied[:resume]
        consumed = applied[-1]["consumed"] + applied[-1]["global_batch"] if applied else 0
        for _ in range(draw(st.integers(1, 8), label="steps")):
            c = draw(st.sampled_from(SHAPES), label="shape")
            rec = record(len(applied), consumed, c.dp_size, c.micro, c.accum)
            rec["tokens_hash"] += f"-{len(lines)}"  # which line it was: superseded ones differ
            lines.append(rec)
            applied.append(rec)
            consumed += c.global_batch
    return lines


def as_record(r: dict) -> StepRecord:
    return StepRecord(**{k: r[k] for k in StepRecord.__dataclass_fields__})


@settings(max_examples=200, deadline=None)
@given(lines=crashing_runs(), wanted=st.sets(st.integers(0, 60), max_size=6))
def test_streaming_equals_the_stated_rule(tmp_path_factory, lines, wanted) -> None:
    log = write(tmp_path_factory.mktemp("log") / "steps.jsonl", *lines)
    kept = reference(lines)
    assert [r["step"] for r in kept] == list(range(len(kept)))  # the generator's invariant
    records = read_step_log(log)
    assert records == [as_record(r) for r in kept]
    scanned = scan_step_log(log, steps=wanted)
    assert list(scanned.schedule.changes) == reference_changes(kept)
    assert schedule_of(records) == scanned.schedule
    assert scanned.steps == len(kept) and scanned.index_hash == HASH
    assert scanned.end == kept[-1]["consumed"] + kept[-1]["global_batch"]
    assert scanned.records == {s: as_record(kept[s]) for s in wanted if s < len(kept)}


def test_a_resume_must_continue_from_the_step_before(tmp_path) -> None:
    """Step 2 redone after steps 0..3, but starting at the wrong consumed: named by its line."""
    recs = [record(s, 4 * s) for s in range(4)]
    log = write(tmp_path / "steps.jsonl", *recs, record(2, 7, dp=1))
    with pytest.raises(TokentapeError, match=r"steps.jsonl:5: step 2 starts at consumed 7, "):
        scan_step_log(log)
    log = write(tmp_path / "steps.jsonl", *recs, record(5, 16))
    with pytest.raises(TokentapeError, match=r"steps.jsonl:5: step 5 follows step 3"):
        scan_step_log(log)


def test_a_log_that_changed_plans_lists_them_and_ends_under_the_last(tmp_path) -> None:
    """A run that went on under another plan (a compatible plan change) logs its steps under
    each plan in turn: the log names the stretches, and its index hash is the last plan's."""
    other = "sha256:" + "cd" * 32
    recs = [
        record(0, 0),
        record(1, 4),
        record(2, 8, index_hash=other),
        record(3, 12, index_hash=other),
    ]
    log = scan_step_log(write(tmp_path / "steps.jsonl", *recs))
    assert log.plans == ((0, HASH), (2, other))
    assert log.index_hash == other and log.steps == 4
    # A superseded line of another hash does not count: what remains is one plan's.
    log = write(tmp_path / "steps.jsonl", record(0, 0, index_hash=other), record(0, 0))
    assert scan_step_log(log).index_hash == HASH
    assert scan_step_log(log).plans == ((0, HASH),)


# --- memory ---------------------------------------------------------------------------------


def test_scanning_keeps_neither_the_text_nor_the_steps(tmp_path) -> None:
    n = 20_000
    log = tmp_path / "steps.jsonl"
    with log.open("w") as f:
        consumed = 0
        for s in range(n):
            c = SHAPES[(s * 4) // n]  # four shapes
            f.write(line(record(s, consumed, c.dp_size, c.micro, c.accum)))
            consumed += c.global_batch
    size = log.stat().st_size
    tracemalloc.start()
    try:
        scanned = scan_step_log(log, steps=[0, n - 1])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert scanned.steps == n and len(scanned.schedule.changes) == 4
    assert scanned.records[n - 1].consumed == consumed - SHAPES[3].global_batch
    assert peak < size / 20, (peak, size)


@pytest.mark.parametrize("time", [10**400, -(10**400), 2**1023])
def test_a_time_no_float_can_hold_is_named_not_a_crash(tmp_path, time) -> None:
    """An integer time beyond a float's range (json.loads reads any integer) was converted to
    float on the way and crashed with OverflowError; it is a bad field like NaN."""
    log = write(tmp_path / "steps.jsonl", record(0, 0, time=time))
    with pytest.raises(TokentapeError, match=r"steps.jsonl:1: field 'time': expected a number"):
        scan_step_log(log)

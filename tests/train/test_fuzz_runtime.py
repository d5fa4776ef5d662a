"""Fuzzing the runtime's readers of untrusted bytes: PLAN.json, a saved state_dict and step-log
lines. Random mutations of valid files (byte flips, truncations, values replaced by other types,
huge and negative numbers, missing and extra keys) give a ``TokentapeError`` or a correct result,
never another exception. ``make fuzz`` runs them with many more examples."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import PLAN, small_plan_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan, index_hash
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState, identity_hash
from tokentape._src.train.steplog import read_step_log, scan_step_log
from tokentape.errors import TokentapeError

pytestmark = pytest.mark.fuzz
FUZZ = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> dict[str, Any]:
    """A valid PLAN.json, a state_dict and a step log with a shape change, and where to write."""
    root = tmp_path_factory.mktemp("fuzz-runtime")
    plan_path = small_plan_json(root)
    plan = load_plan(plan_path)
    log = root / "steps.jsonl"
    state = None
    for config in (BatchConfig(2, 2, 1), BatchConfig(1, 3, 2)):
        with Loader(plan, 0, config, step_log=log) as loader:
            if state is not None:
                loader.load_state_dict(state)
            for _ in range(3):
                loader.step()
                loader.commit()
            state = loader.state_dict()
    return {
        "plan": plan,
        "plan_text": plan_path.read_text(),
        "state": state,
        "log_lines": log.read_text().splitlines(keepends=True),
        "scratch": root / "scratch",
    }


# --- mutations ------------------------------------------------------------------------------

ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 1, 2**31, 2**62 - 1, 2**62, 2**63, 2**64, -(2**63), 10**30]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "x", "1", "sha256:", "uint16", "tokentape", "megatron", "web"]),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.just([[[[]]]]),
).map(copy.deepcopy)  # later edits may go inside a drawn value: never into a shared one


def _containers(data: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every dict and list inside ``data`` (itself included)."""
    found = []
    if isinstance(data, dict):
        found.append(path)
        for k, v in data.items():
            found += _containers(v, (*path, k))
    elif isinstance(data, list):
        found.append(path)
        for i, v in enumerate(data):
            found += _containers(v, (*path, i))
    return found


def _at(data: Any, path: tuple) -> Any:
    for key in path:
        data = data[key]
    return data


@st.composite
def mutated_json(draw: st.DrawFn, original: Any, rounds: int = 3) -> Any:
    """``original`` with 1..rounds structural edits: a value replaced by another type or an
    extreme number, a key dropped, an unknown key added, a list element dropped or repeated."""
    data = copy.deepcopy(original)
    for _ in range(draw(st.integers(1, rounds))):
        places = _containers(data)
        if not places:
            break
        where = draw(st.sampled_from(places))
        box = _at(data, where)
        kind = draw(st.sampled_from(["replace", "drop", "add", "repeat"]))
        if isinstance(box, dict):
            keys = list(box)
            if kind == "add" or not keys:
                box[draw(st.text(min_size=1, max_size=8))] = draw(ODD_VALUES)
            elif kind == "drop":
                del box[draw(st.sampled_from(keys))]
            else:
                box[draw(st.sampled_from(keys))] = draw(ODD_VALUES)
        elif box:
            i = draw(st.integers(0, len(box) - 1))
            if kind == "drop":
                del box[i]
            elif kind == "repeat":
                box.insert(i, copy.deepcopy(box[i]))
            else:
                box[i] = draw(ODD_VALUES)
        else:
            box.append(draw(ODD_VALUES))
    return data


@st.composite
def mutated_bytes(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` with a few bytes flipped, inserted or deleted, or cut short."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            del data[i]
        else:
            del data[i:]
    return bytes(data)


def _rehash(data: Any) -> None:
    """Recompute a plan's index hash from its (possibly mutated) fields, where they allow it:
    the mutation then reaches the checks behind the hash."""
    try:
        rows = [
            (s["name"], s["weight_units"], s["n_tokens"], s["dtype"], s["content_hash"])
            for s in data["sources"]
        ]
        data["index_hash"] = index_hash(data["seq_len"], data["seed"], data["denominator"], rows)
    except (KeyError, TypeError, IndexError, ValueError):
        pass


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# --- PLAN.json ------------------------------------------------------------------------------


def _check_plan(plan: Plan) -> None:
    """A plan that loads is usable: its tape resolves the ends of its horizon."""
    assert isinstance(plan, Plan)
    tape = plan.tape()
    ends = np.array([0, plan.horizon_samples - 1], dtype=np.int64)
    r = tape.resolve(ends)
    for d, k in zip(r.source.tolist(), r.sample.tolist(), strict=True):
        assert 0 <= k < plan.sources[d].n_samples


def _load_plan_or_error(path: Path) -> None:
    try:
        plan = load_plan(path)
    except TokentapeError as exc:
        assert "\n" not in str(exc)
        return
    _check_plan(plan)


@FUZZ
@given(data=st.data())
def test_plan_json_with_edited_values(valid, data):
    original = json.loads(valid["plan_text"])
    edited = data.draw(mutated_json(original))
    if data.draw(st.booleans()):
        _rehash(edited)
    text = json.dumps(edited)  # NaN and Infinity as Python's json writes them
    _load_plan_or_error(_write(valid["scratch"] / "plan.json", text.encode()))


@FUZZ
@given(data=st.data())
def test_plan_json_with_damaged_bytes(valid, data):
    damaged = data.draw(mutated_bytes(valid["plan_text"].encode()))
    _load_plan_or_error(_write(valid["scratch"] / "plan.json", damaged))


def test_the_unedited_plan_json_loads(valid):
    _load_plan_or_error(_write(valid["scratch"] / "plan.json", valid["plan_text"].encode()))


# --- a saved state_dict ---------------------------------------------------------------------


def _from_dict_or_error(valid: dict[str, Any], saved: Any) -> None:
    try:
        state = DataState.from_dict(saved)
        state.check_plan(valid["plan"])
    except TokentapeError as exc:
        assert "\n" not in str(exc)
        return
    # Accepted: a consistent state of this plan, its history mapping every step back.
    assert 0 <= state.consumed < MAX_POSITION
    assert identity_hash(state.identity) == state.index_hash  # the identity it would report
    assert DataState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    if state.step:
        consumed, config = state.consumed_before(state.step - 1)
        assert consumed + config.global_batch == state.consumed


@FUZZ
@given(data=st.data())
def test_state_dict_with_edited_values(valid, data):
    _from_dict_or_error(valid, data.draw(mutated_json(valid["state"])))


@FUZZ
@given(data=st.data())
def test_state_dict_json_with_damaged_bytes(valid, data):
    damaged = data.draw(mutated_bytes(json.dumps(valid["state"]).encode()))
    try:
        saved = json.loads(damaged)
    except (ValueError, RecursionError):
        return  # not JSON: the caller's json.load refuses it before tokentape sees it
    _from_dict_or_error(valid, saved)


def test_the_unedited_state_resumes(valid):
    _from_dict_or_error(valid, copy.deepcopy(valid["state"]))
    assert DataState.from_dict(valid["state"]).consumed == 3 * 4 + 3 * 6


# --- step-log lines -------------------------------------------------------------------------


def _read_log_or_error(path: Path) -> None:
    try:
        records = read_step_log(path)
        scanned = scan_step_log(path, steps=range(len(records)))
    except TokentapeError as exc:
        assert "\n" not in str(exc)
        return
    # Accepted: the effective steps run 0..n-1, each starting where the one before ended.
    assert [r.step for r in records] == list(range(len(records)))
    end = 0
    for r in records:
        assert r.consumed == end and r.global_batch == r.dp * r.micro * r.accum
        end += r.global_batch
    assert scanned.steps == len(records) and scanned.end == end <= MAX_POSITION
    assert {s: scanned.records[s] for s in scanned.records} == {r.step: r for r in records}
    for r in records:
        assert scanned.schedule.start(r.step) == (r.consumed, r.config)


@FUZZ
@given(data=st.data())
def test_step_log_with_an_edited_line(valid, data):
    lines = list(valid["log_lines"])
    i = data.draw(st.integers(0, len(lines) - 1))
    edited = data.draw(mutated_json(json.loads(lines[i]), rounds=2))
    lines[i] = json.dumps(edited) + "\n"
    _read_log_or_error(_write(valid["scratch"] / "steps.jsonl", "".join(lines).encode()))


@FUZZ
@given(data=st.data())
def test_step_log_with_damaged_bytes(valid, data):
    damaged = data.draw(mutated_bytes("".join(valid["log_lines"]).encode()))
    _read_log_or_error(_write(valid["scratch"] / "steps.jsonl", damaged))


@FUZZ
@given(data=st.data())
def test_step_log_with_lines_dropped_repeated_or_reordered(valid, data):
    lines = list(valid["log_lines"])
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        kind = data.draw(st.sampled_from(["drop", "repeat", "swap", "torn"]))
        if kind == "drop" and len(lines) > 1:
            del lines[i]
        elif kind == "repeat":
            lines.insert(i, lines[i])
        elif kind == "swap":
            j = data.draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "torn" and lines[-1]:
            lines[-1] = lines[-1][: data.draw(st.integers(0, len(lines[-1]) - 1))]
    _read_log_or_error(_write(valid["scratch"] / "steps.jsonl", "".join(lines).encode()))


def test_the_unedited_step_log_reads(valid):
    path = _write(valid["scratch"] / "steps.jsonl", "".join(valid["log_lines"]).encode())
    _read_log_or_error(path)
    assert len(read_step_log(path)) == 6


# --- the plan file (TOML) -------------------------------------------------------------------

TOML_VALUES = [
    "0", "-1", "1.5", "inf", "-inf", "nan", "1e308", str(2**63), str(2**64), "9" * 30, "true",
    '""', '"x"', '"2T"', '"1.5"', '"-5M"', '"0"', "[]", "[1, 2]", "{}", "{a = 1}", "1979-05-27",
]  # fmt: skip


def _parse_plan_or_error(text: str) -> None:
    from tokentape._src.plan.spec import PlanSpec, parse_plan

    try:
        spec = parse_plan(text, "mix.toml")
    except TokentapeError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(spec, PlanSpec)
    assert spec.seq_len >= 1 and 0 <= spec.seed < 2**63 and 1 <= spec.horizon_samples < 2**62
    assert spec.sources and all(s.weight > 0 and s.max_repeats > 0 for s in spec.sources)


@FUZZ
@given(data=st.data())
def test_plan_toml_with_edited_values(data):
    lines = PLAN.splitlines()
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        if " = " in lines[i]:
            key = lines[i].split(" = ")[0]
            lines[i] = f"{key} = {data.draw(st.sampled_from(TOML_VALUES))}"
        elif data.draw(st.booleans()):
            lines[i] = data.draw(st.sampled_from(["[[source]]", "[source]", "", "x = 1"]))
    _parse_plan_or_error("\n".join(lines) + "\n")


@FUZZ
@given(data=st.data())
def test_plan_toml_with_damaged_bytes(data):
    damaged = data.draw(mutated_bytes(PLAN.encode()))
    try:
        text = damaged.decode()
    except UnicodeDecodeError:
        return  # load_plan_spec refuses it as text (a catalogue case)
    _parse_plan_or_error(text)

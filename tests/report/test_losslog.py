"""The loss log reader: the redo rule against a plain reference, and one clear line for every
kind of bad line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.audit.losschild import LossReader
from tokentape._src.audit.losslog import read_loss_lines, read_loss_log
from tokentape.errors import InputError

NAMES = ["web", "code"]


def _reference(lines: list[dict], steps: int) -> dict[int, dict]:
    """A later line for step s drops every earlier line of step s or after."""
    kept: dict[int, dict] = {}
    for line in lines:
        for later in [s for s in kept if s >= line["step"]]:
            del kept[later]
        kept[line["step"]] = line
    return {s: v for s, v in kept.items() if s < steps}


lines_strategy = st.lists(
    st.fixed_dictionaries(
        {"step": st.integers(0, 30), "loss": st.floats(0, 10)},
        optional={
            "loss_by_source": st.dictionaries(st.sampled_from(NAMES), st.floats(0, 10)),
            "tokens_by_source": st.dictionaries(st.sampled_from(NAMES), st.integers(0, 10**6)),
        },
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(lines_strategy, st.integers(1, 35))
def test_the_effective_lines_are_the_references(tmp_path_factory, lines, steps):
    path = tmp_path_factory.mktemp("loss") / "loss.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    log = read_loss_log(path, NAMES, steps)
    kept = _reference(lines, steps)
    assert np.flatnonzero(log.has).tolist() == sorted(kept)
    for s in range(steps):
        if s in kept:
            assert log.loss[s] == kept[s]["loss"]
        else:
            assert math.isnan(log.loss[s])
    for field, table in (("loss_by_source", log.by_source), ("tokens_by_source", log.tokens)):
        if not any(line.get(field) for line in lines):
            assert table is None
            continue
        assert table is not None
        for s in range(steps):
            for d, n in enumerate(NAMES):
                want = kept.get(s, {}).get(field, {}).get(n)
                assert math.isnan(table[s, d]) if want is None else table[s, d] == want
    assert log.lines == len(lines)


def test_a_torn_last_line_is_ignored_and_a_nan_loss_kept(tmp_path):
    path = tmp_path / "loss.jsonl"
    path.write_text('{"step": 0, "loss": NaN}\n{"step": 1, "loss": 2.5}\n{"step": 2, "lo')
    log = read_loss_log(path, NAMES, 5)
    assert log.has.tolist() == [True, True, False, False, False]
    assert math.isnan(log.loss[0]) and log.loss[1] == 2.5


def test_steps_past_the_run_are_counted_and_left_out(tmp_path):
    path = tmp_path / "loss.jsonl"
    path.write_text('{"step": 0, "loss": 1}\n{"step": 4611686018427387000, "loss": 1}\n')
    log = read_loss_log(path, NAMES, 3)
    assert log.beyond == 1 and log.has.tolist() == [True, False, False]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"step": 0, "loss": 1}\nnot json\n', "loss.jsonl:2: not a JSON line"),
        ('[1, 2]\n', "loss.jsonl:1: expected a JSON object, found [1, 2]"),
        ('{"loss": 1}\n', "loss.jsonl:1: field 'step': expected an integer >= 0, found null"),
        ('{"step": -1, "loss": 1}\n', "field 'step': expected an integer >= 0, found -1"),
        ('{"step": 0, "loss": "1.5"}\n', "field 'loss': expected a number, found \"1.5\""),
        ('{"step": 0, "loss": true}\n', "field 'loss': expected a number, found true"),
        ('{"step": 0, "loss": 1, "loss_by_source": {"books": 1}}\n',
         "field 'loss_by_source': \"books\" is not a source of the plan (it has: web, code)"),
        ('{"step": 0, "loss": 1, "loss_by_source": [1]}\n',
         "field 'loss_by_source': expected an object of source names, found [1]"),
        ('{"step": 0, "loss": 1, "tokens_by_source": {"web": -3}}\n',
         "field 'tokens_by_source': web: expected an integer >= 0, found -3"),
        ('{"step": 0, "loss": 1, "tokens_by_source": {"web": 1.5}}\n',
         "field 'tokens_by_source': web: expected an integer >= 0, found 1.5"),
        ('{"step": 0, "loss": 1, "loss_by_source": {"web": null}}\n',
         "field 'loss_by_source': web: expected a number, found null"),
    ],
)  # fmt: skip
def test_a_bad_line_is_named_by_file_line_and_field(tmp_path, text, said):
    path = tmp_path / "loss.jsonl"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        read_loss_log(path, NAMES, 10)
    message = str(exc.value)
    assert said in message and "\n" not in message, message
    assert message.startswith(str(path))


def test_a_missing_loss_log_is_one_line(tmp_path):
    with pytest.raises(InputError, match="cannot read the loss log"):
        read_loss_log(tmp_path / "nope.jsonl", NAMES, 3)


# --- a big log, read in a second process ---------------------------------------------------------


def _log(tmp_path, lines: list[str]):
    path = tmp_path / "loss.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _same(a, b) -> None:
    for name in ("step", "loss", "by_source", "tokens"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert np.array_equal(x, y, equal_nan=True), name
    assert a.lines == b.lines


def test_a_log_read_in_a_second_process_is_the_same(tmp_path):
    lines = [json.dumps({"step": s % 7 if i > 20 else s, "loss": 1.0 / (i + 1),
                         "loss_by_source": {"web": float(i)}, "tokens_by_source": {"code": i}})
             for i, s in enumerate(range(40))]  # fmt: skip
    path = _log(tmp_path, lines)
    reader = LossReader(str(path), NAMES, background=0)
    assert reader.child is not None  # it did start
    _same(reader.lines(), read_loss_lines(path, NAMES))


def test_a_refusal_from_the_second_process_is_the_same_line(tmp_path):
    path = _log(tmp_path, ['{"step": 0, "loss": 1}', '{"step": 1, "loss": "x"}'])
    with pytest.raises(InputError) as here:
        read_loss_lines(path, NAMES)
    reader = LossReader(str(path), NAMES, background=0)
    with pytest.raises(InputError) as there:
        reader.lines()
    assert str(there.value) == str(here.value)


def test_a_second_process_that_dies_is_not_trusted(tmp_path):
    path = _log(tmp_path, [json.dumps({"step": s, "loss": float(s)}) for s in range(50)])
    reader = LossReader(str(path), NAMES, background=0)
    assert reader.child is not None
    reader.child.kill()  # whatever it wrote, its exit says it did not finish: read here
    _same(reader.lines(), read_loss_lines(path, NAMES))


def test_close_stops_a_second_process_still_reading(tmp_path):
    path = _log(tmp_path, [json.dumps({"step": s, "loss": float(s)}) for s in range(50)])
    reader = LossReader(str(path), NAMES, background=0)
    child = reader.child
    reader.close()
    assert child is not None and child.poll() is not None and reader.child is None

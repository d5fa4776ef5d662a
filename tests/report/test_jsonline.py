"""``loads_line`` is ``json.loads``: the same value, or the same error, for any text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.util.jsonline import loads_line

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)


def _same(text: str) -> None:
    try:
        want = ("value", json.loads(text))
    except (ValueError, RecursionError) as exc:
        want = ("error", type(exc), str(exc))
    try:
        got = ("value", loads_line(text))
    except (ValueError, RecursionError) as exc:
        got = ("error", type(exc), str(exc))
    assert repr(got) == repr(want), text  # repr: NaN equals itself


@settings(max_examples=300)
@given(values, st.sampled_from(["", "\n", " \n", "\r\n", " x\n", "}\n", ",1\n"]),
       st.sampled_from(["", " ", "\ufeff"]))  # fmt: skip
def test_a_line_reads_as_json_loads_reads_it(value, tail, head):
    _same(head + json.dumps(value) + tail)


@settings(max_examples=300)
@given(st.text(max_size=40))
def test_any_text_reads_as_json_loads_reads_it(text):
    _same(text)


@pytest.mark.parametrize("text", ["", "\n", "{", '{"a": 1}{"b": 2}', "NaN\n", "[" * 100_000])
def test_edge_lines(text):
    _same(text)

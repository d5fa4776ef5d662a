"""Document filters: parsing, error messages and the unique-line rule at its boundaries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.tokenize.filters import (
    FilterSet,
    MaxTokens,
    MinTokens,
    UniqueLines,
    parse_filter,
    parse_filters,
)
from tokentape.errors import TokentapeError

USAGE = "expected unique-lines[:min_lines=N,min_ratio=R], min-tokens:N or max-tokens:N"


def reference_drops(text: str, min_lines: int, min_ratio: float) -> bool:
    """The unique-line rule, written out plainly."""
    lines = []
    for raw in text.split("\n"):
        line = raw.strip()
        if line != "":
            lines.append(line)
    if len(lines) < min_lines:
        return False
    distinct = []
    for line in lines:
        if line not in distinct:
            distinct.append(line)
    return len(distinct) / len(lines) < min_ratio


def doc(*lines: str) -> str:
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# parsing


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("unique-lines", UniqueLines(20, 0.3)),
        ("unique-lines:min_lines=8,min_ratio=0.5", UniqueLines(8, 0.5)),
        ("unique-lines:min_ratio=0.5,min_lines=8", UniqueLines(8, 0.5)),
        ("unique-lines:min_ratio=1", UniqueLines(20, 1.0)),
        ("unique-lines:min_lines=3", UniqueLines(3, 0.3)),
        ("unique-lines: min_lines = 3 , min_ratio = .25", UniqueLines(3, 0.25)),
        ("min-tokens:16", MinTokens(16)),
        ("min-tokens:0", MinTokens(0)),
        ("max-tokens:100000", MaxTokens(100_000)),
    ],
)
def test_parse_filter(spec: str, expected: object) -> None:
    assert parse_filter(spec) == expected


def test_parse_filters_and_json() -> None:
    fs = parse_filters(["max-tokens:100", "unique-lines:min_lines=8,min_ratio=0.5", "min-tokens:2"])
    assert fs.names == ["max-tokens", "unique-lines", "min-tokens"]
    assert fs.to_json() == [
        {"name": "max-tokens", "n": 100},
        {"name": "unique-lines", "min_lines": 8, "min_ratio": 0.5},
        {"name": "min-tokens", "n": 2},
    ]
    assert FilterSet.from_json(fs.to_json()) == fs
    assert parse_filters([]) == FilterSet(())
    assert parse_filters([]).names == []
    assert parse_filters(["unique-lines"]).to_json() == [
        {"name": "unique-lines", "min_lines": 20, "min_ratio": 0.3}
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("dedup", f"--filter 'dedup': unknown filter; {USAGE}"),
        ("", f"--filter '': unknown filter; {USAGE}"),
        ("unique_lines", f"--filter 'unique_lines': unknown filter; {USAGE}"),
        ("min-tokens", "--filter 'min-tokens': expected min-tokens:N"),
        ("max-tokens", "--filter 'max-tokens': expected max-tokens:N"),
        ("min-tokens:", "--filter 'min-tokens:': N must be a non-negative integer"),
        ("min-tokens:abc", "--filter 'min-tokens:abc': N must be a non-negative integer"),
        ("min-tokens:-1", "--filter 'min-tokens:-1': N must be a non-negative integer"),
        ("min-tokens:1.5", "--filter 'min-tokens:1.5': N must be a non-negative integer"),
        ("min-tokens:1_000", "--filter 'min-tokens:1_000': N must be a non-negative integer"),
        ("max-tokens:0", "--filter 'max-tokens:0': N must be >= 1, got 0"),
        (
            "unique-lines:",
            "--filter 'unique-lines:': expected unique-lines:min_lines=N,min_ratio=R",
        ),
        (
            "unique-lines:min_lines",
            "--filter 'unique-lines:min_lines': expected unique-lines:min_lines=N,min_ratio=R",
        ),
        (
            "unique-lines:min_lines=x",
            "--filter 'unique-lines:min_lines=x': min_lines must be a non-negative integer",
        ),
        (
            "unique-lines:min_lines=0",
            "--filter 'unique-lines:min_lines=0': min_lines must be >= 1, got 0",
        ),
        (
            "unique-lines:min_ratio=0",
            "--filter 'unique-lines:min_ratio=0': min_ratio must be a number in (0, 1]",
        ),
        (
            "unique-lines:min_ratio=1.5",
            "--filter 'unique-lines:min_ratio=1.5': min_ratio must be a number in (0, 1]",
        ),
        (
            "unique-lines:min_ratio=nan",
            "--filter 'unique-lines:min_ratio=nan': min_ratio must be a number in (0, 1]",
        ),
        (
            "unique-lines:min_ratio=-0.1",
            "--filter 'unique-lines:min_ratio=-0.1': min_ratio must be a number in (0, 1]",
        ),
        (
            "unique-lines:min_ratio=half",
            "--filter 'unique-lines:min_ratio=half': min_ratio must be a number in (0, 1]",
        ),
        (
            "unique-lines:ratio=0.5",
            "--filter 'unique-lines:ratio=0.5': unknown parameter 'ratio'; "
            "expected min_lines or min_ratio",
        ),
        (
            "unique-lines:min_lines=3,min_lines=4",
            "--filter 'unique-lines:min_lines=3,min_lines=4': parameter 'min_lines' given twice",
        ),
    ],
)
def test_parse_filter_errors(spec: str, message: str) -> None:
    with pytest.raises(TokentapeError) as excinfo:
        parse_filter(spec)
    assert str(excinfo.value) == message


def test_parse_filters_errors() -> None:
    with pytest.raises(TokentapeError) as excinfo:
        parse_filters(["min-tokens:3", "unique-lines", "min-tokens:5"])
    assert str(excinfo.value) == (
        "--filter 'min-tokens:5': min-tokens is already given by --filter 'min-tokens:3'"
    )
    with pytest.raises(TokentapeError) as excinfo:
        parse_filters(["min-tokens:50", "max-tokens:10"])
    assert str(excinfo.value) == (
        "--filter: min-tokens:50 is above max-tokens:10; every document would be dropped"
    )
    parse_filters(["min-tokens:10", "max-tokens:10"])  # a single length is allowed


def test_direct_construction_is_validated() -> None:
    with pytest.raises(TokentapeError, match="min_ratio must be in"):
        UniqueLines(min_ratio=0.0)
    with pytest.raises(TokentapeError, match="min_lines must be an integer"):
        UniqueLines(min_lines=2.5)  # type: ignore[arg-type]
    with pytest.raises(TokentapeError, match="N must be >= 0"):
        MinTokens(-1)
    with pytest.raises(TokentapeError, match="given more than once"):
        FilterSet((MinTokens(1), MinTokens(2)))
    with pytest.raises(TokentapeError, match="unknown filter"):
        FilterSet.from_json([{"name": "dedup"}])
    with pytest.raises(TokentapeError, match="unexpected parameters"):
        FilterSet.from_json([{"name": "min-tokens", "m": 3}])
    with pytest.raises(TokentapeError, match="N must be >= 1"):
        FilterSet.from_json([{"name": "max-tokens", "n": 0}])


# --------------------------------------------------------------------------------------------
# the unique-line rule


def test_unique_lines_boundaries() -> None:
    f = FilterSet((UniqueLines(min_lines=10, min_ratio=0.3),))
    # Exactly min_lines non-empty lines, 3 distinct: ratio 0.3 is not below 0.3 -> kept.
    at = doc(*["a"] * 8, "b", "c")
    assert f.text_reason(at) is None
    # 2 distinct of 10: 0.2 < 0.3 -> dropped.
    below = doc(*["a"] * 9, "b")
    assert f.text_reason(below) == "unique-lines"
    # 9 non-empty lines: fewer than min_lines -> kept however repetitive.
    assert f.text_reason(doc(*["a"] * 9)) is None
    # Empty and whitespace-only lines do not count.
    assert f.text_reason(doc(*["a"] * 9, "", "   ", "\t")) is None
    assert f.text_reason(doc(*["a"] * 9, "", "a")) == "unique-lines"
    # Lines are compared stripped; "\r" line ends and indentation do not make lines distinct.
    assert f.text_reason(doc(*["  a\r"] * 9, "a")) == "unique-lines"
    # Lines are only split on "\n".
    assert f.text_reason("a\r" * 20) is None


def test_unique_lines_other_thresholds() -> None:
    half = UniqueLines(min_lines=4, min_ratio=0.5)
    assert not half.drops(doc("a", "a", "b", "b"))  # 2/4 == 0.5
    assert half.drops(doc("a", "a", "a", "a"))  # 1/4 < 0.5
    assert half.drops(doc("a", "a", "a", "b", "a"))  # 2/5 < 0.5
    assert half.drops(doc("a", "a", "a", "a", "b", "b", "b", "c"))  # 3/8 < 0.5
    one = UniqueLines(min_lines=2, min_ratio=1.0)
    assert not one.drops(doc("a", "b"))
    assert one.drops(doc("a", "b", "a"))
    assert not one.drops("a")
    single = UniqueLines(min_lines=1, min_ratio=1.0)
    assert not single.drops("")
    assert not single.drops("only line")
    assert not UniqueLines().drops("")
    assert UniqueLines().drops("same\n" * 40)


def test_no_text_filter_keeps_all() -> None:
    fs = parse_filters(["min-tokens:1"])
    assert fs.text_reason("same\n" * 1000) is None


def test_token_reason() -> None:
    fs = parse_filters(["max-tokens:100", "min-tokens:16"])
    assert fs.token_reason(15) == "min-tokens"
    assert fs.token_reason(16) is None
    assert fs.token_reason(100) is None
    assert fs.token_reason(101) == "max-tokens"
    assert fs.token_reason(0) == "min-tokens"
    assert parse_filters(["unique-lines"]).token_reason(0) is None
    assert parse_filters(["min-tokens:0"]).token_reason(0) is None


LINES = st.sampled_from(["a", "b", "c", " a", "a ", "\ta\r", "", " ", "\r", "longer line", "é"])


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(LINES | st.text(max_size=6), max_size=40),
    min_lines=st.integers(1, 12),
    min_ratio=st.sampled_from([0.1, 0.25, 0.3, 1 / 3, 0.5, 2 / 3, 0.75, 0.9, 1.0]),
)
def test_unique_lines_matches_reference(parts: list[str], min_lines: int, min_ratio: float) -> None:
    text = "\n".join(parts)
    fs = FilterSet((UniqueLines(min_lines=min_lines, min_ratio=min_ratio),))
    expected = "unique-lines" if reference_drops(text, min_lines, min_ratio) else None
    assert fs.text_reason(text) == expected


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: MinTokens(2**62 + 1), "min-tokens: N must be at most 2**62"),
        (lambda: MaxTokens(10**30), "max-tokens: N must be at most 2**62"),
        (lambda: UniqueLines(min_lines=2**63), "min_lines must be at most 2**62"),
        (lambda: parse_filter(5), "--filter 5: expected a string such as 'min-tokens:16'"),
        (lambda: parse_filter(None), "--filter None: expected a string"),
        (lambda: parse_filters(["min-tokens:" + "9" * 40]), "N must be at most 2**62"),
    ],
)
def test_huge_counts_and_non_string_specs_are_one_line(make, expected):
    with pytest.raises(TokentapeError) as caught:
        make()
    assert expected in str(caught.value) and "\n" not in str(caught.value)

"""The built-in corpora: deterministic, sized as documented, readable, one planted bad doc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokentape._src.corpora import LOG_REPEATS, describe_builtin_corpora, write_builtin_corpora
from tokentape._src.program import main
from tokentape._src.tokenize.inputs import expand_inputs, plan_units, read_documents

MB = 1_000_000


def unique_line_ratio(text: str) -> tuple[int, float]:
    """(number of non-empty stripped lines, unique / total) — the filter rule, restated here."""
    lines = [line.strip() for line in text.split("\n")]
    lines = [line for line in lines if line]
    return len(lines), (len(set(lines)) / len(lines) if lines else 1.0)


def caught_by_repeat_filter(text: str) -> bool:
    n, ratio = unique_line_ratio(text)
    return n >= 20 and ratio < 0.3


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_builtin_corpora(tmp_path_factory.mktemp("corpora"))


@pytest.fixture(scope="module")
def documents(corpora: dict[str, Path]) -> dict[str, list[tuple[str, str]]]:
    """{source: [(file path, text), ...]} read back through the tokenizer's input readers."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, directory in corpora.items():
        files = expand_inputs([str(directory)])
        out[name] = [
            (part.file.path, text)
            for unit in plan_units(files, 1 << 20)
            for part in unit.parts
            for text in read_documents(part, "text")
        ]
    return out


def tree_bytes(root: Path) -> dict[str, bytes]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in files}


def test_sources_and_layout(corpora: dict[str, Path]) -> None:
    assert sorted(corpora) == ["code", "notes", "prose"]
    prose = sorted(p.name for p in corpora["prose"].iterdir())
    assert prose[0] == "docstrings-000.jsonl"
    assert "topics.jsonl" in prose and prose[-1] == "zz-logdump.jsonl"
    code = sorted(p.name for p in corpora["code"].iterdir())
    assert code[0] == "part-000.jsonl" and all(n.endswith(".jsonl") for n in code)
    notes = sorted(p.name for p in corpora["notes"].iterdir())
    assert len(notes) == 20 and all(n.endswith(".txt") for n in notes)
    assert not [p for p in corpora["code"].parent.rglob(".*")]  # no temporary files left


@pytest.mark.slow
def test_rewrite_is_byte_identical(corpora: dict[str, Path], tmp_path: Path) -> None:
    again = write_builtin_corpora(tmp_path / "again")
    first_root = corpora["prose"].parent
    assert tree_bytes(again["prose"].parent) == tree_bytes(first_root)
    # and writing over an existing copy changes nothing
    write_builtin_corpora(first_root)
    assert tree_bytes(first_root) == tree_bytes(again["prose"].parent)


def test_sizes_in_range(corpora: dict[str, Path], documents: dict[str, list]) -> None:
    def text_mb(name: str) -> float:
        return sum(len(t.encode()) for _, t in documents[name]) / MB

    prose_without_dump = [t for p, t in documents["prose"] if not p.endswith("zz-logdump.jsonl")]
    assert 1.0 <= sum(len(t.encode()) for t in prose_without_dump) / MB <= 3.0
    assert 4.5 <= text_mb("code") <= 7.0
    assert 0.01 <= text_mb("notes") <= 0.5
    assert len(documents["code"]) >= 100
    assert len(documents["notes"]) == 20
    for path in corpora["prose"].glob("docstrings-*.jsonl"):
        assert 0.2 * MB <= path.stat().st_size <= 1.0 * MB
    for path in sorted(corpora["code"].glob("part-*.jsonl"))[:-1]:
        assert 0.8 * MB <= path.stat().st_size <= 1.5 * MB


def test_planted_document_is_the_only_one_caught(documents: dict[str, list]) -> None:
    caught = [
        (name, path)
        for name, docs in documents.items()
        for path, text in docs
        if caught_by_repeat_filter(text)
    ]
    assert len(caught) == 1
    name, path = caught[0]
    assert name == "prose" and path.endswith("zz-logdump.jsonl")
    [dump] = [t for p, t in documents["prose"] if p == path]
    n, ratio = unique_line_ratio(dump)
    assert n == LOG_REPEATS and ratio == 1 / LOG_REPEATS
    # Big enough to matter (about a tenth of the prose source), small enough to be a needle.
    prose_bytes = sum(len(t.encode()) for _, t in documents["prose"])
    assert 0.05 <= len(dump.encode()) / prose_bytes <= 0.2


def test_documents_are_nonempty_with_ids(corpora: dict[str, Path], documents: dict) -> None:
    assert all(text.strip() for docs in documents.values() for _, text in docs)
    ids = [
        json.loads(line)["id"]
        for path in sorted(corpora["code"].glob("*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
    ]
    assert ids == sorted(ids) and len(ids) == len(set(ids)) == len(documents["code"])
    assert all(i.endswith(".py") and "/test/" not in f"/{i}" for i in ids)


def test_description_mentions_every_source() -> None:
    text = describe_builtin_corpora()
    assert all(name in text for name in ("prose/", "code/", "notes/", "pydoc_data", "ast"))


def test_a_file_system_error_is_one_line(tmp_path: Path, capsys) -> None:
    """An OSError no command anticipated still ends as one line and exit 2, not a traceback."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["corpora", "--out", str(blocker / "corpora")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Not a directory" in err and "Traceback" not in err

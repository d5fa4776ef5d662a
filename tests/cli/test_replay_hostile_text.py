"""The text views of `tokentape replay` (``--show-text``, the preview column) on documents of
hostile text: control characters and bidi overrides are escaped, a document's own literal
end-of-document marker is escaped so that every marker is a real boundary, and a window that
starts on an end of document or is cut inside a character or a marker is shown as such (the
JSON text an exact prefix). One-source plans over byte stores built here."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import byte_plan
from helpers import cli

EOD_MARK = "⟦EOD⟧"


ESCAPED = "\\u27e6EOD\\u27e7"


HOSTILE = ["abc", "x\x1b[31mred\x07\rZ", "é€😀", "spoof ⟦EOD⟧ here", "\u202egnp.exe", "tail"]


def shown_text(capsys, plan: Path, chars: int) -> str:
    """The text view's one window: its indented text lines, without the cut note."""
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1, "--show-text",
                         "--text-chars", chars)  # fmt: skip
    assert code == 0, err
    block = out.rstrip("\n").split("windows trained on", 1)[1].split("\n")[3:]
    text = [line for line in block if line.startswith("    ")]  # not the header's origin lines
    return "\n".join(line[4:] for line in text if not line.startswith("    … (more"))


def json_row(capsys, plan: Path, chars: int) -> dict:
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1, "--json",
                         "--show-text", "--text-chars", chars)  # fmt: skip
    assert code == 0, err
    (row,) = json.loads(out)["positions"]
    return row


def test_show_text_escapes_control_characters_and_marks_each_eod(tmp_path, capsys):
    docs = ["abc", "x\x1b[31mred\x07\rZ", "é€😀", "\u202egnp.exe", "tail"]
    plan = byte_plan(tmp_path, capsys, docs)
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1, "--show-text",
                         "--text-chars", 0)  # fmt: skip
    assert code == 0, err
    text = out.split("windows trained on", 1)[1].split("\n", 1)[1]
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "\u202e" not in text
    assert "x\\x1b[31mred\\x07\\rZ" in text and "\\u202egnp.exe" in text
    assert text.count(EOD_MARK) == len(docs)
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1, "--json",
                         "--show-text", "--tokens")  # fmt: skip
    (row,) = json.loads(out)["positions"]
    assert row["text"] == EOD_MARK.join(docs) + EOD_MARK
    assert len(row["eod_at"]) == len(docs) and row["tokens"][row["eod_at"][0]] == 256


def test_a_window_that_starts_on_an_eod_and_one_cut_inside_a_character(tmp_path, capsys):
    """seq_len 3 over 'abc' + EOD + 'é€…': sample 1 starts on doc 0's EOD; sample 2 cuts é."""
    plan = byte_plan(tmp_path, capsys, ["abc", "xy", "é€😀 end"], seq_len=3)
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 5, "--json",
                         "--show-text", "--tokens")  # fmt: skip
    assert code == 0, err
    rows = {r["sample"]: r for r in json.loads(out)["positions"]}
    assert rows[1]["tokens"][0] == 256 and rows[1]["text"].startswith(EOD_MARK)
    assert rows[1]["eod_at"][0] == 0 and rows[1]["docs"][0] == 0
    cut = [r for r in rows.values() if "\ufffd" in r["text"]]
    assert cut, rows  # a window cut inside a UTF-8 character decodes to U+FFFD, not an error


def test_show_text_marks_only_real_document_boundaries(tmp_path, capsys):
    plan = byte_plan(tmp_path, capsys, HOSTILE)
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1, "--show-text",
                         "--text-chars", 0)  # fmt: skip
    assert code == 0, err
    text = out.split("windows trained on", 1)[1].split("\n", 1)[1]
    assert text.count(EOD_MARK) == len(HOSTILE)


def test_a_literal_marker_is_escaped_and_every_marker_is_a_boundary(tmp_path, capsys):
    docs = ["abc", "spoof ⟦EOD⟧ here", "⟦EOD⟧", "tail"]
    plan = byte_plan(tmp_path, capsys, docs)
    row = json_row(capsys, plan, 0)
    assert row["text"] == EOD_MARK.join(d.replace(EOD_MARK, ESCAPED) for d in docs) + EOD_MARK
    assert row["text"].count(EOD_MARK) == len(row["eod_at"]) == len(docs)
    text = shown_text(capsys, plan, 0)
    assert text.count(EOD_MARK) == len(docs) and text.count(ESCAPED) == 2
    # the JSON text is an exact prefix at every cap (escaped literals included)
    for chars in range(1, len(row["text"]) + 2):
        capped = json_row(capsys, plan, chars)
        assert capped["text"] == row["text"][:chars], chars
        assert capped["text_truncated"] is (chars < len(row["text"]))


def test_the_text_view_never_cuts_a_marker(tmp_path, capsys):
    plan = byte_plan(tmp_path, capsys, ["abc", "de"])
    full = "abc" + EOD_MARK + "de" + EOD_MARK
    for chars in range(1, len(full) + 1):
        text = shown_text(capsys, plan, chars)
        assert len(text) <= chars and full.startswith(text), (chars, text)
        assert text.count("⟦") == text.count("⟧") == text.count(EOD_MARK), (chars, text)
    assert shown_text(capsys, plan, 5) == "abc"
    assert shown_text(capsys, plan, 8) == "abc" + EOD_MARK
    assert json_row(capsys, plan, 5)["text"] == "abc⟦E"  # JSON: the exact prefix


def test_replay_preview_column_escapes_control_characters(tmp_path, capsys):
    plan = byte_plan(tmp_path, capsys, HOSTILE)
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1)
    assert code == 0, err
    assert "x" in out and "\x1b" not in out and "\x07" not in out and "\u202e" not in out


def test_the_preview_column_escapes_control_characters(tmp_path, capsys):
    plan = byte_plan(tmp_path, capsys, ["x\x1b[31mred\x07", "\u202egnp.exe"])
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1)
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "x\\x1b[31mred\\x07" in out and "\\u202egnp.exe" in out
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1, "--json")
    previews = [h["preview"] for h in json.loads(out)["top"]]
    assert sorted(previews) == sorted(["x\x1b[31mred\x07", "\u202egnp.exe"])  # JSON: as is


def test_hostile_ids_are_escaped_in_each_windows_header(tmp_path, capsys):
    """The user's ids are text from the input: control characters, a newline and a bidi
    override in them are escaped in the header line naming each document's origin."""
    ids = ["a\x1b[31mred\x07", "two\nlines\r", "\u202egnp.exe"]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": f"doc {n}"}) + "\n"
                            for n, i in enumerate(ids)))  # fmt: skip
    code, _, err = cli(capsys, "tokenize", data, "--out", tmp_path / "s", "--tokenizer", "bytes")
    assert code == 0, err
    n_tokens = sum(len(f"doc {n}") + 1 for n in range(len(ids)))
    (tmp_path / "p.toml").write_text(
        f"seq_len = {n_tokens - 1}\nseed = 1\ntotal_tokens = {n_tokens - 1}\n"
        f'[[source]]\nname = "b"\npath = "{tmp_path / "s"}"\nweight = 1\n'
    )
    assert cli(capsys, "plan", tmp_path / "p.toml", "--out", tmp_path / "p.json")[0] == 0
    code, out, err = cli(capsys, "replay", tmp_path / "p.json", "--step", 0, "--global-batch", 1,
                         "--show-text")  # fmt: skip
    assert code == 0, err
    head = out.split("windows trained on", 1)[1].split("\n")[3:6]
    assert head == [
        f"  doc 0: {data}:1, id a\\x1b[31mred\\x07",
        f"  doc 1: {data}:2, id two\\nlines\\r",
        f"  doc 2: {data}:3, id \\u202egnp.exe",
    ]

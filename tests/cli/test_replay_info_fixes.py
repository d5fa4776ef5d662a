"""replay --show-text and info --log, fixed after the issue 14 review: a document's literal
end-of-document marker, a --text-chars cut inside a marker, the preview column's control
characters, a step log's out-of-range or backward times, and info of a store's manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import record

from tokentape._src.program import main

EOD_MARK = "⟦EOD⟧"
ESCAPED = "\\u27e6EOD\\u27e7"


def cli(capsys, *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def byte_plan(root: Path, capsys, docs: list[str]) -> Path:
    """A one-source plan over a byte store of ``docs``: one window holds them all."""
    (root / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    code, _, err = cli(capsys, "tokenize", root / "d.jsonl", "--out", root / "store",
                       "--tokenizer", "bytes")  # fmt: skip
    assert code == 0, err
    seq_len = sum(len(d.encode()) + 1 for d in docs) - 1
    (root / "p.toml").write_text(
        f"seq_len = {seq_len}\nseed = 1\ntotal_tokens = {seq_len}\n"
        f'[[source]]\nname = "b"\npath = "{root / "store"}"\nweight = 1\n'
    )
    code, _, err = cli(capsys, "plan", root / "p.toml", "--out", root / "p.json")
    assert code == 0, err
    return root / "p.json"


def shown_text(capsys, plan: Path, chars: int) -> str:
    """The text view's one window: its indented text lines, without the cut note."""
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1, "--show-text",
                         "--text-chars", chars)  # fmt: skip
    assert code == 0, err
    block = out.rstrip("\n").split("windows trained on", 1)[1].split("\n")[3:]
    return "\n".join(line[4:] for line in block if not line.startswith("    … (more"))


def json_row(capsys, plan: Path, chars: int) -> dict:
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1, "--json",
                         "--show-text", "--text-chars", chars)  # fmt: skip
    assert code == 0, err
    (row,) = json.loads(out)["positions"]
    return row


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


def test_the_preview_column_escapes_control_characters(tmp_path, capsys):
    plan = byte_plan(tmp_path, capsys, ["x\x1b[31mred\x07", "\u202egnp.exe"])
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1)
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "x\\x1b[31mred\\x07" in out and "\\u202egnp.exe" in out
    code, out, err = cli(capsys, "replay", plan, "--step", 0, "--global-batch", 1, "--json")
    previews = [h["preview"] for h in json.loads(out)["top"]]
    assert sorted(previews) == sorted(["x\x1b[31mred\x07", "\u202egnp.exe"])  # JSON: as is


def write_log(path: Path, times: list[object]) -> Path:
    lines = [record(i, 4 * i, time=t) for i, t in enumerate(times)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


@pytest.mark.parametrize(
    ("times", "shown"),
    [
        ([1e300, 1e300], "1e+300 s (not a date)"),
        ([1_700_000_000, -1e20], "-1e+20 s (not a date)"),
        ([-1e20, 1e300], "-1e+20 s (not a date) .. 1e+300 s (not a date) (1e+300 s)"),
    ],
)
def test_a_time_no_date_holds_is_shown_as_a_number(tmp_path, capsys, times, shown):
    log = write_log(tmp_path / "steps.jsonl", times)
    code, out, err = cli(capsys, "info", "--log", log)
    assert code == 0 and err == "", err
    assert shown in out, out
    code, out, err = cli(capsys, "info", "--log", log, "--json")
    assert code == 0 and json.loads(out)["steps"] == len(times), err


def test_a_time_going_backwards_says_so(tmp_path, capsys):
    log = write_log(tmp_path / "steps.jsonl", [1_700_000_100, 1_700_000_050])
    code, out, err = cli(capsys, "info", "--log", log)
    assert code == 0, err
    assert "(50 s backwards: the last line's time is before the first's)" in out
    assert "-50" not in out


def test_info_of_a_store_manifest_points_to_the_store(tmp_path, capsys):
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    store = tmp_path / "store"
    code, _, err = cli(capsys, "tokenize", tmp_path / "d.jsonl", "--out", store,
                       "--tokenizer", "bytes")  # fmt: skip
    assert code == 0, err
    code, out, err = cli(capsys, "info", store / "manifest.json")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("tokentape: error: ") and f"`tokentape info {store}`" in err
    code, out, err = cli(capsys, "info", store)
    assert code == 0, err
    # any other JSON that is no plan is still refused as such
    (tmp_path / "x.json").write_text("{}")
    code, out, err = cli(capsys, "info", tmp_path / "x.json")
    assert code == 2 and "tokentape info" not in err, err

"""Progress where there is no terminal (issue 29, item 3): a plain line every so often of the
job's own clock (the reports' ``elapsed``, never the wall clock of the test), the bar on a
terminal, nothing when asked; chosen by ``--progress`` or ``TOKENTAPE_PROGRESS``."""

from __future__ import annotations

import io

import pytest
from helpers import cli

from tokentape._src.cli.progress import ProgressLines, TerminalBar, progress_callback
from tokentape._src.util.progress import Progress
from tokentape.errors import InputError


def _reports(label: str, until: float, step: float = 0.5) -> list[Progress]:
    n = int(until / step)
    out = [Progress(label, k, n, k * step) for k in range(1, n + 1)]
    return [*out, Progress(label, n, n, until, final=True)]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_line_every_interval_then_the_last():
    stream = io.StringIO()
    lines = ProgressLines(stream, 10.0)
    for p in _reports("tokenize", 35.0):
        lines(p)
    written = stream.getvalue().splitlines()
    assert len(written) == 4  # at 10, 20 and 30 s of the job, and the end
    assert all(w.startswith("tokenize [") for w in written)
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
    assert "100.0%" in written[-1]


def test_a_short_job_writes_nothing_and_a_next_job_starts_its_own_clock():
    stream = io.StringIO()
    lines = ProgressLines(stream, 10.0)
    for p in _reports("hashing web", 5.0):
        lines(p)
    assert stream.getvalue() == ""
    for p in _reports("hashing code", 12.0):
        lines(p)
    assert [w.split(" [")[0] for w in stream.getvalue().splitlines()] == ["hashing code"] * 2


def test_zero_seconds_writes_every_report_and_the_last_always():
    stream = io.StringIO()
    lines = ProgressLines(stream, 0.0)
    lines(Progress("verify", 1, 1, 0.01, final=True))
    assert len(stream.getvalue().splitlines()) == 1


@pytest.mark.parametrize(
    ("mode", "quiet", "tty", "kind"),
    [
        (None, False, False, ProgressLines),
        (None, False, True, TerminalBar),
        (None, True, False, type(None)),
        ("lines", True, True, ProgressLines),
        ("bar", False, False, TerminalBar),
        ("none", False, True, type(None)),
    ],
)
def test_the_mode_chosen(monkeypatch, mode, quiet, tty, kind):
    monkeypatch.delenv("TOKENTAPE_PROGRESS", raising=False)
    stream = _Tty() if tty else io.StringIO()
    assert type(progress_callback(mode, quiet, stream)) is kind


def test_the_environment_chooses_and_is_checked(monkeypatch):
    monkeypatch.setenv("TOKENTAPE_PROGRESS", "none")
    assert progress_callback(None, False, io.StringIO()) is None
    monkeypatch.setenv("TOKENTAPE_PROGRESS", "sometimes")
    with pytest.raises(InputError, match="TOKENTAPE_PROGRESS='sometimes'"):
        progress_callback(None, False, io.StringIO())
    monkeypatch.setenv("TOKENTAPE_PROGRESS", "lines")
    monkeypatch.setenv("TOKENTAPE_PROGRESS_SECONDS", "-3")
    with pytest.raises(InputError, match="TOKENTAPE_PROGRESS_SECONDS='-3'"):
        progress_callback(None, False, io.StringIO())


def test_tokenize_writes_plain_lines_when_not_on_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TOKENTAPE_PROGRESS_SECONDS", "0")
    (tmp_path / "a.jsonl").write_text('{"text": "some words"}\n' * 50)
    code, out, err = cli(capsys, "tokenize", tmp_path / "a.jsonl", "--out", tmp_path / "st")
    assert code == 0 and "content hash" in out
    assert err and all(line.startswith("tokenize [") for line in err.splitlines())
    assert "\r" not in err and "\x1b" not in err
    code, out, err = cli(capsys, "tokenize", tmp_path / "a.jsonl", "--out", tmp_path / "s2",
                         "--progress", "none")  # fmt: skip
    assert code == 0 and err == ""

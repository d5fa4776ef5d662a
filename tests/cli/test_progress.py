"""Progress is data: the library reports ``Progress`` to a callback and draws nothing; only the
command line turns it into a bar, and only on a terminal."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from helpers import wait_for

from tokentape._src.cli.progress import TerminalBar, bar_line, terminal_bar
from tokentape._src.megatron.convert import to_megatron
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.util.progress import Counters, Progress, tally, watch
from tokentape.errors import ArgumentError


def _corpus(tmp_path, n_docs=400):
    rng = np.random.default_rng(7)
    path = tmp_path / "docs.jsonl"
    lines = [
        json.dumps({"text": " ".join(map(str, rng.integers(0, 999, 30)))}) for _ in range(n_docs)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.subprocess
def test_tokenize_reports_to_the_callback_and_writes_nothing(tmp_path, capfd):
    corpus = _corpus(tmp_path)
    seen: list[Progress] = []
    config = TokenizeConfig(inputs=(str(corpus),), out=str(tmp_path / "s"), workers=2, unit_mb=0.01)
    summary = tokenize(config, progress=seen.append)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")  # the library drew nothing
    assert seen and seen[-1].final and not any(p.final for p in seen[:-1])
    last = seen[-1]
    assert last.label == "tokenize"
    assert last.done_bytes == last.total_bytes == corpus.stat().st_size
    assert (last.docs, last.tokens, last.text_bytes) == (
        summary.docs_in,
        summary.n_tokens,
        summary.text_bytes,
    )
    done = [p.done_bytes for p in seen]
    assert done == sorted(done)  # never goes back


def test_conversion_reports_every_byte(tmp_path, capfd):
    corpus = _corpus(tmp_path)
    store = tmp_path / "s"
    tokenize(TokenizeConfig(inputs=(str(corpus),), out=str(store)))
    seen: list[Progress] = []
    summary = to_megatron(store, tmp_path / "m" / "p", progress=seen.append)
    assert capfd.readouterr() == ("", "")
    assert seen[-1].final and seen[-1].label == "convert"
    assert seen[-1].done_bytes == seen[-1].total_bytes == summary.n_tokens * 2  # uint16 store


def test_tally_throttles_and_always_ends_with_a_final_report():
    seen: list[Progress] = []
    with tally(1000, "verify", seen.append) as counting:
        assert counting is not None
        for _ in range(100):
            counting.add(10, 5)
    assert len(seen) < 100  # throttled: a report at most every half second
    assert seen[-1] == Progress("verify", 1000, 1000, seen[-1].elapsed, tokens=500, final=True)
    with tally(10, "x", None) as nothing:
        assert nothing is None


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_is_drawn_on_a_terminal_only():
    assert terminal_bar(stream=io.StringIO()) is None  # a pipe or a file: nothing drawn
    assert terminal_bar(quiet=True, stream=_Terminal()) is None  # --json
    screen = _Terminal()
    bar = terminal_bar(stream=screen)
    assert isinstance(bar, TerminalBar)
    bar(Progress("convert", 50, 100, 2.0))
    bar(Progress("convert", 100, 100, 4.0, final=True))
    text = screen.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "convert [" in text and "100.0%" in text and " 50.0%" in text


def test_bar_line_shows_the_rates_of_each_kind_of_job():
    tokenizing = bar_line(Progress("tokenize", 10, 20, 1.0, docs=3000, tokens=2e6, text_bytes=5e6))
    assert "3.0k docs/s" in tokenizing and "2.0M tok/s" in tokenizing and "5.0 MB/s" in tokenizing
    verifying = bar_line(Progress("verify", 10**6, 2 * 10**6, 1.0, tokens=10**6))
    assert "1.0MB/s" in verifying and "1.0M tok/s" in verifying and "50.0%" in verifying
    hashing = bar_line(Progress("hashing p", 0, 100, 1.0))
    assert "0.0%" in hashing and "ETA ?:??:??" in hashing


def test_an_exception_in_a_callback_on_the_monitor_thread_reaches_the_job():
    """tokenize's reports come from a monitor thread: an exception there used to be printed by
    the thread and lost, and the job went on without reports."""

    class Stop(Exception):
        pass

    calls: list[Progress] = []

    def stop_midway(progress: Progress) -> None:
        calls.append(progress)
        if not progress.final:
            raise Stop

    counters = Counters()
    with pytest.raises(Stop), watch(counters, 100, "tokenize", stop_midway, interval=0.01):
        wait_for(lambda: calls, "the monitor's first report")  # the job's work meanwhile
    assert len(calls) == 1 and not calls[0].final  # no report after the failure


def test_a_callback_that_is_not_callable_is_refused_before_any_work():
    ran = []
    with pytest.raises(ArgumentError, match="progress must be a callable"):  # noqa: SIM117
        with watch(Counters(), 100, "tokenize", 5):  # type: ignore[arg-type]
            ran.append(True)
    assert not ran  # refused before the block

"""`tokentape plan --plot` of a plan refused for its repeat budgets: the plot is written (it
shows why), the refusal is one line that names it (or the plot that could not be written), and
--out is never written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_helpers import byte_plan
from helpers import PLAN, cli, one_line_refusal, run_cli

from tokentape._src.program import main

PNG = b"\x89PNG\r\n\x1a\n"
OVER = PLAN.replace("max_repeats = 40", "max_repeats = 1.5")
"""math is read 6.667 times over the horizon: refused."""


@pytest.fixture
def refused(mixture_stores, tmp_path) -> Path:
    pytest.importorskip("matplotlib")
    (tmp_path / "stores").symlink_to(mixture_stores / "stores")
    (tmp_path / "mix.toml").write_text(OVER)
    return tmp_path


def test_a_refused_plan_writes_its_plot_and_not_its_out(refused, capsys):
    out, plot = refused / "p.json", refused / "p.png"
    argv = ["plan", str(refused / "mix.toml"), "--out", str(out), "--plot", str(plot)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokentape: error: ")
    assert "source 'math' would be read" in lines[0] and "max_repeats = 1.5" in lines[0]
    assert lines[0].endswith(f"; the refused plan's plot is in '{plot}'")
    assert plot.read_bytes()[:8] == PNG
    assert not out.exists()
    assert sorted(p.name for p in refused.iterdir()) == ["mix.toml", "p.png", "stores"]


def test_without_plot_a_refused_plan_writes_nothing(refused, capsys):
    out = refused / "p.json"
    assert main(["plan", str(refused / "mix.toml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "source 'math' would be read" in err and "plot is in" not in err
    assert sorted(p.name for p in refused.iterdir()) == ["mix.toml", "stores"]


def test_a_refused_plan_with_a_bad_out_writes_no_plot(refused, capsys):
    plot = refused / "p.png"
    argv = ["plan", str(refused / "mix.toml"), "--out", str(refused / "no" / "p.json")]
    assert main([*argv, "--plot", str(plot)]) == 2
    assert "No such file or directory" in capsys.readouterr().err
    assert not plot.exists()


def test_the_plot_of_a_refused_plan_is_the_plot_of_the_same_plan_accepted(refused):
    """The refused plan's plot is the plan's own (the budget it breaks is drawn): raised until
    the plan passes, the budget draws another plot."""
    plot = refused / "p.png"
    assert main(["plan", str(refused / "mix.toml"), "--plot", str(plot)]) == 2
    refused_png = plot.read_bytes()
    (refused / "mix.toml").write_text(OVER.replace("max_repeats = 1.5", "max_repeats = 40"))
    assert main(["plan", str(refused / "mix.toml"), "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == refused_png[:8] == PNG
    assert plot.read_bytes() != refused_png


def test_as_a_process_one_line_no_traceback(refused):
    plot = refused / "p.png"
    done = run_cli("plan", str(refused / "mix.toml"), "--plot", str(plot), "--out", "p.json")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "would be read" in done.stderr and plot.read_bytes()[:8] == PNG
    assert not (refused / "p.json").exists() and not Path("p.json").exists()


# --- a byte store's plan, its horizon raised beyond what max_repeats allows -------------------


@pytest.fixture
def refused_toml(tmp_path, capsys) -> Path:
    plan = byte_plan(tmp_path, capsys, ["abc", "defg"], seq_len=3)
    toml = tmp_path / "p.toml"
    toml.write_text(re.sub(r"total_tokens = \d+", "total_tokens = 3000", toml.read_text()))
    return plan.parent / "p.toml"


def test_a_refused_plan_writes_its_plot_and_no_out(tmp_path, capsys, refused_toml):
    pytest.importorskip("matplotlib")
    err = one_line_refusal(
        *cli(
            capsys, "plan", refused_toml, "--out", tmp_path / "r.json", "--plot", tmp_path / "r.png"
        )
    )
    assert "max_repeats" in err and f"plot is in '{tmp_path / 'r.png'}'" in err
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "r.json").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (unwritable)")
def test_a_refused_plan_with_an_unwritable_plot_is_one_line(tmp_path, capsys, refused_toml):
    pytest.importorskip("matplotlib")
    err = one_line_refusal(
        *cli(capsys, "plan", refused_toml, "--out", tmp_path / "r.json", "--plot", "/proc/r.png")
    )
    assert "/proc/r.png" in err
    assert not (tmp_path / "r.json").exists()

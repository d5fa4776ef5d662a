"""`tokentape plan --out/--plot`: an output that names the plan file, or both naming one file
(under any spelling or link), is refused; when both can be written both are; a failed output
leaves the other unwritten (and an old one as it was)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_helpers import byte_plan, refusal
from helpers import PLAN, cli, one_line_refusal

PNG = b"\x89PNG\r\n\x1a\n"


needs_proc = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")


@pytest.fixture
def mix(mixture_stores, tmp_path) -> Path:
    """A plan file (mix.toml) beside a link to the shared stores."""
    (tmp_path / "stores").symlink_to(mixture_stores / "stores")
    (tmp_path / "mix.toml").write_text(PLAN)
    return tmp_path / "mix.toml"


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("flag", ["--out", "--plot"])
def test_an_output_over_the_plan_file_is_refused(mix, capsys, flag):
    before = mix.read_bytes()
    err = refusal(*cli(capsys, "plan", mix, flag, mix))
    assert f"{flag} '{mix}' is the plan file" in err
    assert mix.read_bytes() == before
    assert listing(mix.parent) == ["mix.toml", "stores"]


def test_an_out_linked_to_the_plan_file_is_refused(mix, capsys):
    (mix.parent / "soft.json").symlink_to(mix)
    os.link(mix, mix.parent / "hard.json")
    before = mix.read_bytes()
    for name in ("soft.json", "hard.json"):
        err = refusal(*cli(capsys, "plan", mix, "--out", mix.parent / name))
        assert "is the plan file" in err
    assert mix.read_bytes() == before


def test_out_and_plot_one_file_under_two_spellings_is_refused(mix, capsys, monkeypatch):
    monkeypatch.chdir(mix.parent)
    err = refusal(*cli(capsys, "plan", "mix.toml", "--out", "same.png", "--plot", "./same.png"))
    assert "--plot './same.png' is the file of --out too" in err
    assert listing(mix.parent) == ["mix.toml", "stores"]


def test_both_outputs_are_written_when_both_can_be(mix, capsys):
    pytest.importorskip("matplotlib")
    code, _, err = cli(capsys, "plan", mix, "--out", mix.parent / "p.json", "--plot",
                       mix.parent / "p.png")  # fmt: skip
    assert code == 0, err
    assert json.loads((mix.parent / "p.json").read_text())["sources"][0]["name"] == "web"
    assert (mix.parent / "p.png").read_bytes()[:8] == PNG
    assert listing(mix.parent) == ["mix.toml", "p.json", "p.png", "stores"]


@needs_proc
def test_an_unwritable_out_leaves_no_plot(mix, capsys):
    pytest.importorskip("matplotlib")
    plot = mix.parent / "p.png"
    err = refusal(*cli(capsys, "plan", mix, "--out", "/proc/p.json", "--plot", plot))
    assert "'/proc/p.json'" in err
    assert listing(mix.parent) == ["mix.toml", "stores"]  # no plot, no temporary file


@needs_proc
def test_an_unwritable_plot_keeps_an_old_out_as_it_was(mix, capsys):
    pytest.importorskip("matplotlib")
    out = mix.parent / "p.json"
    out.write_text("old")
    err = refusal(*cli(capsys, "plan", mix, "--out", out, "--plot", "/proc/p.png"))
    assert "'/proc/p.png'" in err
    assert out.read_text() == "old"
    assert listing(mix.parent) == ["mix.toml", "p.json", "stores"]


# --- the same, on a byte store's one-source plan ----------------------------------------------


def test_out_over_the_plan_file_is_refused(tmp_path, capsys):
    plan = byte_plan(tmp_path, capsys, ["abc", "defg"], seq_len=3)
    toml = plan.parent / "p.toml"
    before = toml.read_bytes()
    one_line_refusal(*cli(capsys, "plan", toml, "--out", toml))
    assert toml.read_bytes() == before


def test_out_and_plot_naming_one_file_is_refused(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plan = byte_plan(tmp_path, capsys, ["abc", "defg"], seq_len=3)
    same = tmp_path / "same.png"
    one_line_refusal(*cli(capsys, "plan", plan.parent / "p.toml", "--out", same, "--plot", same))
    assert not same.exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (unwritable)")
def test_an_unwritable_plot_leaves_no_out(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plan = byte_plan(tmp_path, capsys, ["abc", "defg"], seq_len=3)
    out = tmp_path / "again.json"
    one_line_refusal(
        *cli(capsys, "plan", plan.parent / "p.toml", "--out", out, "--plot", "/proc/x.png")
    )
    assert not out.exists()

"""`tokentape plan --out/--plot`: an output that names the plan file, or both naming one file,
is refused; a failed output leaves the other unwritten (and an old one as it was). The
tokenizer-mismatch message names each store's EOD and escapes what a manifest gives it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import PLAN, cli, write_docs

from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig

PNG = b"\x89PNG\r\n\x1a\n"
needs_proc = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")


@pytest.fixture
def mix(mixture_stores, tmp_path) -> Path:
    """A plan file (mix.toml) beside a link to the shared stores."""
    (tmp_path / "stores").symlink_to(mixture_stores / "stores")
    (tmp_path / "mix.toml").write_text(PLAN)
    return tmp_path / "mix.toml"


def refusal(code: int, out: str, err: str) -> str:
    """The refusal's one line: exit 2, nothing on stdout, no traceback."""
    assert code == 2, (code, out, err)
    assert out == ""
    assert err.startswith("tokentape: error: ") and err.count("\n") == 1, err
    return err


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


@pytest.fixture
def mismatched(mixture_stores, tmp_path, hf_tokenizer_json) -> Path:
    """The shared stores, with 'math' re-tokenized by a BPE (EOD 0 '<|endoftext|>'): the plan
    file of a mixture of two tokenizers."""
    shutil.copytree(mixture_stores / "stores", tmp_path / "stores")
    shutil.rmtree(tmp_path / "stores" / "math")
    write_docs(tmp_path / "math.jsonl", "math", 15)
    tokenize(
        TokenizeConfig(
            inputs=(str(tmp_path / "math.jsonl"),),
            out=str(tmp_path / "stores" / "math"),
            tokenizer=str(hf_tokenizer_json),
        )
    )
    (tmp_path / "mix.toml").write_text(PLAN)
    return tmp_path / "mix.toml"


def test_the_tokenizer_mismatch_names_each_eod(mismatched, capsys):
    err = refusal(*cli(capsys, "plan", mismatched))
    assert "'math' with hf 'tokenizer.json' (vocabulary 4000) and EOD 0 '<|endoftext|>'" in err
    assert "'web' with bytes (vocabulary 257) and EOD 256" in err


def test_the_tokenizer_mismatch_escapes_a_crafted_eod_token_and_fingerprint(mismatched, capsys):
    manifest_file = mismatched.parent / "stores" / "math" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["tokenizer"]["eod_token"] = "x\n\x1b[2J"
    manifest["tokenizer"]["fingerprint"] = "sha256:\x1b]0;t\x07"
    manifest_file.write_text(json.dumps(manifest))
    err = refusal(*cli(capsys, "plan", mismatched))
    assert "another tokenizer" in err
    assert "EOD 0 'x\\n\\x1b[2J'" in err and "sha256:\\x1b]0;t\\x07" in err
    assert "\x1b" not in err and "\x07" not in err

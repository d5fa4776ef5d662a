"""Errors that point at the fix: a misspelled plan key or command-line flag names the likely one
("did you mean"), and stores made by different tokenizers name each tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import PLAN, cli, one_line_refusal, plan_of, run_cli, write_docs

from tokentape._src.plan.plan import Plan
from tokentape._src.program import main
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape.errors import PlanError

PHASE = "[[phase]]\nstart_samples = 1500\nweights = { math = 3 }\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            PLAN.replace("weight = 60", "wieght = 60"),
            "source[0] ('web'): unknown key 'wieght' (did you mean 'weight'?); expected one of",
        ),
        (
            PLAN.replace("max_repeats = 6", "max_repeat = 6"),
            "source[1] ('code'): unknown key 'max_repeat' (did you mean 'max_repeats'?)",
        ),
        (
            PLAN.replace("seq_len = 64", "seqlen = 64"),
            "mix.toml: unknown key 'seqlen' (did you mean 'seq_len'?)",
        ),
        (
            PLAN.replace("total_samples", "total_sample"),
            "unknown key 'total_sample' (did you mean 'total_samples'?)",
        ),
        (
            PLAN + PHASE.replace("weights", "wieghts"),
            "phase[0] (phase 2): unknown key 'wieghts' (did you mean 'weights'?)",
        ),
        (
            PLAN + PHASE.replace("start_samples", "start_sample"),
            "phase[0] (phase 2): unknown key 'start_sample' (did you mean 'start_samples'?)",
        ),
    ],
)
def test_a_misspelled_plan_key_names_the_likely_one(tmp_path, text, message):
    with pytest.raises(PlanError) as info:
        plan_of(tmp_path, text)  # refused while parsing, before any store is opened
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_key_like_no_valid_one_gets_no_guess(tmp_path):
    with pytest.raises(PlanError) as info:
        plan_of(tmp_path, PLAN.replace("[[source]]", "colour = 1\n[[source]]", 1))
    assert "unknown key 'colour'; expected one of mixed_bos, phase, seed, seq_len" in str(
        info.value
    )
    assert "did you mean" not in str(info.value)


def test_plan_build_suggests_too(tmp_path):
    with pytest.raises(PlanError, match=r"unknown key 'wieght' \(did you mean 'weight'\?\)"):
        Plan.build(
            {"web": {"path": "stores/web", "wieght": 1}},
            seq_len=64,
            seed=1,
            total_samples=10,
            base_dir=tmp_path,
        )


def _error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokentape: error: "), captured.err
    return lines[0]


def test_a_misspelled_flag_names_the_likely_one(tmp_path, capsys):
    (tmp_path / "mix.toml").write_text(PLAN)
    err = _error(capsys, "plan", str(tmp_path / "mix.toml"), "--plto", "p.png")
    assert "unrecognized arguments: --plto p.png; --plto: did you mean --plot?" in err
    err = _error(capsys, "plan", str(tmp_path / "mix.toml"), "--outt=p.json")
    assert "--outt: did you mean --out?" in err
    # a required flag misspelled: argparse reports the missing one; the typo is named
    err = _error(capsys, "tokenize", "data", "--ouut", "stores/web")
    assert "the following arguments are required: --out; --ouut: did you mean --out?" in err
    assert "(see tokentape tokenize --help)" in err


def test_a_misspelled_command_names_the_likely_one(capsys):
    err = _error(capsys, "tokenise", "data", "--out", "stores/web")
    assert "invalid choice: 'tokenise'" in err and "; did you mean 'tokenize'?" in err


def test_no_guess_where_nothing_is_close(tmp_path, capsys):
    (tmp_path / "mix.toml").write_text(PLAN)
    err = _error(capsys, "plan", str(tmp_path / "mix.toml"), "--zzzzzz")
    assert "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err
    # a missing required flag with no misspelling of it: the usual message alone
    err = _error(capsys, "tokenize", "data", "--workres", "2")
    assert "required: --out (see" in err and "did you mean" not in err
    # what follows `--` is positional, never a flag to correct
    err = _error(capsys, "tokenise", "--", "--ot")
    assert "did you mean 'tokenize'?" in err and "--ot:" not in err


def test_the_suggestion_is_one_line_exit_2_from_the_program(tmp_path):
    (tmp_path / "mix.toml").write_text(PLAN)
    done = run_cli("plan", str(tmp_path / "mix.toml"), "--jsno")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "--jsno: did you mean --json?" in done.stderr


def test_stores_of_different_tokenizers_name_each_tokenizer(
    mixture_stores, tmp_path, hf_tokenizer_json
):
    shutil.copytree(mixture_stores / "stores", tmp_path / "stores")
    shutil.rmtree(tmp_path / "stores" / "math")
    write_docs(tmp_path / "math.jsonl", "math", 15)
    tokenizer = tmp_path / "my-bpe.json"
    shutil.copy(hf_tokenizer_json, tokenizer)
    config = TokenizeConfig(
        inputs=(str(tmp_path / "math.jsonl"),),
        out=str(tmp_path / "stores" / "math"),
        tokenizer=str(tokenizer),
    )
    tokenize(config)
    with pytest.raises(PlanError) as info:
        plan_of(Path(tmp_path))
    message = str(info.value)
    assert "source 'math' was tokenized with another tokenizer than 'web' (sha256:" in message
    assert "'math' with hf 'my-bpe.json' (vocabulary 4000)" in message
    assert "'web' with bytes (vocabulary 257)" in message
    assert message.endswith("; re-tokenize it") and "\n" not in message


# --- each key and flag of the command line, as a hostile user would mistype them -------------


@pytest.mark.parametrize(
    ("body", "hint"),
    [
        ('[[source]]\nname = "b"\npath = "s"\nweigth = 1\n', "did you mean 'weight'?"),
        ('[[source]]\nname = "b"\npath = "s"\nWeight = 1\n', "did you mean 'weight'?"),
        ('[[sources]]\nname = "b"\npath = "s"\nweight = 1\n', "did you mean 'source'?"),
        ("total_token = 3\n", "did you mean 'total_tokens'?"),
        ("[[phase]]\nstart_sample = 4\n", "did you mean 'start_samples'?"),
        ("[[phase]]\nstart_token = 4\n", "did you mean 'start_tokens'?"),
        # too far from either: no guess, the valid keys listed
        ("[[phase]]\nstart = 4\n", "expected one of start_samples, start_tokens, weights"),
    ],
)
def test_plan_key_did_you_mean(tmp_path, capsys, body, hint):
    head = "seq_len = 3\nseed = 1\n" + ("" if "total_token " in body else "total_tokens = 30\n")
    if body.startswith("[[phase]]"):
        head += '[[source]]\nname = "b"\npath = "s"\nweight = 1\n'
    (tmp_path / "p.toml").write_text(head + body)
    err = one_line_refusal(*cli(capsys, "plan", tmp_path / "p.toml"))
    assert hint in err and "unknown key" in err


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["replay", "p.json", "--stpe", "1"], "--stpe: did you mean --step?"),
        (["replay", "p.json", "--step", "1", "--show-txt"], "did you mean --show-text?"),
        (["replay", "p.json", "--step", "1", "--micro-stp", "1"], "did you mean --micro-step?"),
        (["tokenize", "d", "--out", "o", "--tokeniser", "bytes"], "did you mean --tokenizer?"),
        (["relpay", "p.json"], "did you mean 'replay'?"),
        (["tokenize", "d", "--out", "o", "--executor", "rey"], "did you mean 'ray'?"),
        (["info", "--lgo", "x"], "did you mean --log?"),
    ],
)
def test_flag_did_you_mean(capsys, args, hint):
    err = one_line_refusal(*cli(capsys, *args))
    assert hint in err


def test_a_hostile_flag_gets_one_short_line(capsys):
    err = one_line_refusal(*cli(capsys, "replay", "p.json", "--step", "1", "--" + "x" * 100_000))
    assert len(err) < 100_000 + 400

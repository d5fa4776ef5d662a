"""Errors name the command-line flag the user typed (issue 29, item 6): every integer or number
option of every command, given a value out of its range, is refused in one line that names it
as ``--flag``, never as the Python parameter behind it (``from_consumed``)."""

from __future__ import annotations

import pytest
from helpers import cli

from tokentape._src.cli.app import build_parser


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, mixture_stores):
    """A store, a plan over it and a run of 4 steps, as the commands' base arguments name."""
    import tokentape

    root = tmp_path_factory.mktemp("flags")
    plan = tokentape.Plan.build(
        {"web": {"path": str(mixture_stores / "stores" / "web"), "weight": 1}},
        seq_len=16, seed=1, total_samples=200,
    )  # fmt: skip
    plan.save(root / "PLAN.json")
    (root / "run").mkdir()
    with tokentape.Loader(plan, 0, tokentape.BatchConfig(1, 4, 1),
                          step_log=root / "run" / "steps.jsonl") as loader:  # fmt: skip
        for _ in range(4):
            loader.step()
            loader.commit()
    (root / "mix.toml").write_text(
        f'seq_len = 16\nseed = 1\ntotal_samples = 200\n[[source]]\nname = "web"\n'
        f'path = "{mixture_stores / "stores" / "web"}"\nweight = 1\n'
    )
    (root / "in.jsonl").write_text('{"text": "a small document"}\n')
    return root, mixture_stores / "stores" / "web"


BASE = {  # a valid command line for each command, to which one bad option is added
    "tokenize": ["in.jsonl", "--out", "new"],
    "info": ["{store}"],
    "plan": ["mix.toml"],
    "stage": ["PLAN.json", "--cache", "cache"],
    "smoke": ["PLAN.json"],
    "replay": ["PLAN.json", "--step", "1", "--global-batch", "4"],
    "report": ["run", "--plan", "PLAN.json", "--json"],
    "verify": ["{store}", "--quick"],
    "locate": ["PLAN.json", "web", "1", "--global-batch", "4"],
    "excise": ["PLAN.json", "--from-consumed", "8", "--doc", "web:1", "--out", "e.json"],
    "convert": ["--to", "megatron", "{store}", "out/x", "--overwrite"],
}


def _numeric_options():
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in sorted(commands.items()):
        for action in sub._actions:
            if action.type in (int, float) and action.option_strings and name in BASE:
                yield name, action.option_strings[-1], action.dest


CASES = list(_numeric_options())


def test_every_command_with_numeric_options_is_covered():
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    numeric = {
        name for name, sub in commands.items()
        if any(a.type in (int, float) and a.option_strings for a in sub._actions)
    }  # fmt: skip
    assert numeric - {"megatron"} <= set(BASE)  # megatron: tests/megatron check its own flags
    assert len(CASES) > 20


@pytest.mark.parametrize(("command", "flag", "dest"), CASES)
def test_a_bad_value_is_refused_by_its_flag(workdir, monkeypatch, capsys, command, flag, dest):
    root, store = workdir
    monkeypatch.chdir(root)
    base = [a.format(store=store) for a in BASE[command]]
    if flag in base:  # the base line gives it: replace its value
        at = base.index(flag)
        base = base[:at] + base[at + 2 :]
    for bad in ("-7", "0"):
        code, _, err = cli(capsys, command, *base, flag, bad)
        if code == 0:
            continue  # accepted: a count of 0 (or below) means something for this option
        line = err.strip().splitlines()[-1] if err.strip() else ""
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert flag in line, (command, flag, bad, line)
        if "--" + dest.replace("_", "-") != flag or dest.replace("_", "-") == dest:
            continue  # a flag spelled like its parameter cannot be told from it
        assert dest not in line.replace(flag, ""), (command, flag, bad, line)

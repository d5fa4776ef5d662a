"""A plan spec (TOML) given where a resolved plan (PLAN.json) is read: every command and the
API refuse it in the same one line, naming the command that resolves it. (Resolving it in
memory instead would hash its stores on every rank of a run, and give each rank its own
unsaved plan: the rule is to refuse, everywhere.)"""

from __future__ import annotations

import re

import pytest
from helpers import cli

import tokentape
from tokentape.errors import PlanError

SPEC = """\
seq_len = 32
seed = 1
total_samples = 100

[[source]]
name = "web"
path = "stores/web"
weight = 1
"""


def _expected(path) -> str:
    return (
        rf"plan '{re.escape(str(path))}': a plan spec \(TOML\), not a resolved plan: "
        rf"`tokentape plan {re.escape(str(path))} --out PLAN\.json` resolves it"
    )


@pytest.fixture(params=["mix.toml", "mix.json"], ids=["toml-name", "json-name"])
def spec(request, tmp_path):
    """The spec under a .toml name, and under a .json name (it is recognised by content)."""
    path = tmp_path / request.param
    path.write_text(SPEC)
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["replay", "{p}", "--step", "1", "--global-batch", "4"],
        ["locate", "{p}", "web", "3", "--global-batch", "4"],
        ["verify", "{p}"],
        ["stage", "{p}", "--cache", "{d}/cache"],
        ["info", "{p}"],
        ["excise", "{p}", "--from-consumed", "0", "--doc", "web:1", "--out", "{d}/x.json"],
        ["smoke", "{p}"],
        ["report", "{d}", "--plan", "{p}", "--out", "{d}/r.html"],
    ],
    ids=lambda c: c[0],
)
def test_every_command_refuses_a_spec_in_one_line(spec, capsys, command):
    (spec.parent / "steps.jsonl").write_text("")  # a run directory for `report`
    args = [a.format(p=spec, d=spec.parent) for a in command]
    code, out, err = cli(capsys, *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(_expected(spec), err), err
    assert not (spec.parent / "x.json").exists() and not (spec.parent / "r.html").exists()


def test_the_api_refuses_it_too(spec):
    with pytest.raises(PlanError, match=_expected(spec)):
        tokentape.load_plan(spec)
    with pytest.raises(PlanError, match=_expected(spec)):
        tokentape.replay(str(spec), 1, global_batch=4)


def test_other_text_is_still_not_a_plan(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello = 1\n")  # TOML, but no sources: not a spec either
    with pytest.raises(PlanError, match="not a readable JSON plan"):
        tokentape.load_plan(path)

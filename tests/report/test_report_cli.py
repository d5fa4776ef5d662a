"""`tokentape report` as a user runs it: the page and its data from a run directory, one clear
line for every bad input with nothing written, and a page that cannot load or run anything
whatever the files it names hold."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from helpers import cli, one_line_refusal, plan_of, report_run

import tokentape


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("report_cli")
    plan, _ = report_run(root)
    return root, plan


def test_a_run_directory_gives_the_page_and_the_same_data_as_the_api(run, tmp_path, capsys):
    root, _ = run
    page = tmp_path / "report.html"
    code, out, err = cli(capsys, "report", root, "--out", page)  # plan.json, loss.jsonl found
    assert code == 0 and err == "", err
    assert out == f"wrote {page}: 26 steps, 1 step flagged as loss spikes\n"
    code, out, _ = cli(capsys, "report", root, "--json")
    data = json.loads(out)
    same = tokentape.report(root / "steps.jsonl", root / "plan.json", loss_log=root / "loss.jsonl")
    assert data == json.loads(json.dumps(same))
    assert data["run"]["loss_log"] == str(root / "loss.jsonl")
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    for section in ("identity", "timeline", "mixture", "repetition", "loss", "commands"):
        assert f'id="{section}"' in text


def test_the_page_loads_nothing_and_runs_nothing(run, tmp_path, capsys):
    root, _ = run
    page = tmp_path / "report.html"
    assert cli(capsys, "report", root, "--out", page)[0] == 0
    text = page.read_text()
    assert "<script" not in text.lower()
    assert re.search(r"\s(src|srcset|action|formaction|poster|data)=", text) is None
    assert re.findall(r'href="([^"]*)"', text) and all(
        h.startswith("#") for h in re.findall(r'href="([^"]*)"', text)
    )
    assert "url(" not in text and "@import" not in text
    assert "Content-Security-Policy" in text and "default-src 'none'" in text


def test_text_from_files_is_escaped(run, tmp_path, capsys):
    root, _ = run
    odd = tmp_path / '<img src=x onerror="alert(1)">'
    odd.mkdir()
    for name in ("steps.jsonl", "loss.jsonl", "plan.json"):
        shutil.copyfile(root / name, odd / name)
    page = tmp_path / "report.html"
    assert cli(capsys, "report", odd, "--out", page)[0] == 0
    text = page.read_text()
    assert "<img" not in text
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in text


def test_no_output_asked_for_is_refused(run, capsys):
    root, _ = run
    err = one_line_refusal(*cli(capsys, "report", root))
    assert "give --out REPORT.html (the page) or --json (its data)" in err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--spike-window", "4"], "--spike-window must be an integer in [5, 1001], got 4"),
        (["--spike-window", "12"], "--spike-window must be odd, got 12"),
        (["--spike-z", "0"], "--spike-z must be a finite number > 0, got 0.0"),
        (["--spike-z", "nan"], "--spike-z must be a finite number > 0, got nan"),
        (["--top", "0"], "--top must be an integer in [1, 1000], got 0"),
    ],
)
def test_bad_settings_are_refused_in_one_line(run, tmp_path, capsys, flags, said):
    root, _ = run
    page = tmp_path / "report.html"
    err = one_line_refusal(*cli(capsys, "report", root, "--out", page, *flags))
    assert said in err
    assert not page.exists()


def test_a_bad_loss_log_is_named_and_nothing_is_written(run, tmp_path, capsys):
    root, _ = run
    bad = tmp_path / "loss.jsonl"
    lines = (root / "loss.jsonl").read_text().splitlines()
    lines[4] = '{"step": 4, "loss": 1.0, "loss_by_source": {"books": 2.0}}'
    bad.write_text("\n".join(lines) + "\n")
    page = tmp_path / "report.html"
    err = one_line_refusal(*cli(capsys, "report", root, "--loss", bad, "--out", page))
    assert f"{bad}:5: field 'loss_by_source': \"books\" is not a source of the plan" in err
    assert not page.exists()


def test_a_run_directory_without_a_plan_asks_for_one(run, tmp_path, capsys):
    root, _ = run
    shutil.copyfile(root / "steps.jsonl", tmp_path / "steps.jsonl")
    err = one_line_refusal(*cli(capsys, "report", tmp_path, "--json"))
    assert "--plan PLAN.json needed" in err and "holds no plan.json" in err


def test_a_plan_the_run_did_not_end_under_is_refused(run, tmp_path, capsys):
    root, _ = run
    plan_of(root).save(tmp_path / "first.json")  # the run's first plan: steps 7 on differ
    page = tmp_path / "report.html"
    err = one_line_refusal(*cli(capsys, "report", root, "--plan", tmp_path / "first.json",
                                "--out", page))  # fmt: skip
    assert "went on under a later plan" in err and "give the plan it ended under" in err
    assert not page.exists()


def test_an_unwritable_page_is_one_line(run, tmp_path, capsys):
    root, _ = run
    err = one_line_refusal(*cli(capsys, "report", root, "--out", tmp_path))
    assert "a directory; name the page's file" in err
    err = one_line_refusal(*cli(capsys, "report", root, "--out", tmp_path / "no" / "r.html"))
    assert f"--out {tmp_path / 'no' / 'r.html'}" in err


def test_a_nan_loss_is_listed_and_the_json_stays_strict(run, tmp_path, capsys):
    root, _ = run
    losses = (root / "loss.jsonl").read_text().splitlines()
    losses[2] = '{"step": 2, "loss": NaN}'
    (tmp_path / "loss.jsonl").write_text("\n".join(losses) + "\n")
    code, out, _ = cli(capsys, "report", root, "--loss", tmp_path / "loss.jsonl", "--json")
    assert code == 0

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in --json: not strict JSON")

    data = json.loads(out, parse_constant=refuse)
    assert data["loss"]["non_finite"] == {"count": 1, "steps": [2]}

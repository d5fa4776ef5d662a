"""Every reader takes an object URL (issue 29, item 2): ``info`` of a store, a resolved plan, a
Megatron prefix and a run in a bucket says what ``info`` of the same thing on disk says; plans,
plan files and step logs are read from the bucket by every command that reads them; and every
command of the program, run with URLs for its paths, either works or refuses in one line that
names the URL whole: none mangles ``s3://`` into ``s3:/`` (what a ``pathlib.Path`` does).

The expected outputs are those of the same commands on the local copies of the same files."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from helpers import cli

import tokentape
from tokentape._src.cli.app import build_parser
from tokentape._src.demo import command as demo_command
from tokentape._src.program import main

pytestmark = pytest.mark.s3

MANGLED = re.compile(r"s3:/(?!/)")


@pytest.fixture(scope="module")
def world(s3_server, tmp_path_factory):
    """On disk and in one bucket at the same relative keys, built once for the module's tests
    (they only add to it): a store, a Megatron prefix made from it, a plan over the bucket's
    store (and its TOML, with a relative source path), and a run directory (a step log of 6
    steps and its plan.json)."""
    import objstore

    root = tmp_path_factory.mktemp("urls")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in objstore.s3_environment(s3_server.endpoint).items():
            mp.setenv(key, value)
        mp.chdir(root)
        s3 = objstore.new_bucket(s3_server.endpoint)
        docs = "".join(json.dumps({"text": f"document {i} " * (5 + i % 7)}) + "\n"
                       for i in range(120))  # fmt: skip
        (root / "d.jsonl").write_text(docs)
        assert main(["tokenize", "d.jsonl", "--out", "stores/web"]) == 0
        assert main(["convert", "--to", "megatron", "stores/web", "meg/web_text_document"]) == 0
        s3.upload_tree(root / "stores", f"{s3.url}/stores")
        for suffix in (".bin", ".idx"):
            s3.put(f"{s3.url}/meg/web_text_document{suffix}",
                   (root / f"meg/web_text_document{suffix}").read_bytes())  # fmt: skip
        (root / "plans").mkdir()
        toml = 'seq_len = 16\nseed = 1\ntotal_samples = 96\n[[source]]\nname = "web"\n'
        toml += 'path = "../stores/web"\nweight = 1\nmax_repeats = 10\n'
        (root / "plans" / "p.toml").write_text(toml)
        s3.put(f"{s3.url}/plans/p.toml", toml.encode())
        assert main(["plan", f"{s3.url}/plans/p.toml", "--out", "plans/PLAN.json"]) == 0
        s3.put(f"{s3.url}/plans/PLAN.json", (root / "plans" / "PLAN.json").read_bytes())
        (root / "runs" / "r1").mkdir(parents=True)
        plan = tokentape.load_plan(root / "plans" / "PLAN.json")
        loader = tokentape.Loader(plan, 0, tokentape.BatchConfig(1, 4, 1),
                                  step_log=root / "runs" / "r1" / "steps.jsonl")  # fmt: skip
        for _ in range(6):
            loader.step()
            loader.commit()
        loader.close()
        shutil.copy(root / "plans" / "PLAN.json", root / "runs" / "r1" / "plan.json")
        s3.upload_tree(root / "runs", f"{s3.url}/runs")
    return root, s3


@pytest.fixture
def s3(world, s3_server, monkeypatch):
    """The module's bucket, with the AWS variables pointing at its server."""
    import objstore

    for key, value in objstore.s3_environment(s3_server.endpoint).items():
        monkeypatch.setenv(key, value)
    return world[1]


@pytest.fixture
def bucket(world, s3, monkeypatch):
    """The module's local directory (the working directory of the test)."""
    monkeypatch.chdir(world[0])
    return world[0]


def _later_doc(root) -> str:
    """``web:N``, a document trained at step 10 (after consumed 8) of the bucket fixture's plan."""
    step = tokentape.replay(tokentape.load_plan(root / "plans" / "PLAN.json"), 10, global_batch=4)
    return f"web:{int(step.doc_first[0])}"


def _same(capsys, url: str, local: str, *args: str) -> str:
    """``info`` of ``url`` and of ``local``: both succeed and say the same (names aside)."""
    code, out, err = cli(capsys, "info", url, *args)
    assert code == 0, err
    code, here, err = cli(capsys, "info", local, *args)
    assert code == 0, err
    assert not MANGLED.search(out), out
    words = " ".join(out.replace(url, "X").split()), " ".join(here.replace(local, "X").split())
    assert words[0] == words[1], (out, here)
    return out


def test_info_of_a_plan_a_megatron_prefix_and_a_run_in_the_bucket(bucket, s3, capsys):
    u = s3.url
    out = _same(capsys, f"{u}/plans/PLAN.json", "plans/PLAN.json")
    assert "index hash" in out
    code, out, err = cli(capsys, "info", f"{u}/meg/web_text_document")
    hint = f"not recorded yet: `tokentape verify {u}/meg/web_text_document --vocab-size V"
    assert code == 0 and hint in out, out + err
    code, _, err = cli(capsys, "verify", f"{u}/meg/web_text_document", "--vocab-size", "257",
                       "--eod-id", "256")  # fmt: skip
    assert code == 0, err  # records the identity beside it, as convert did on disk
    out = _same(capsys, f"{u}/meg/web_text_document", "meg/web_text_document")
    assert "megatron prefix" in out and "documents" in out and "120" in out
    data = json.loads(_same(capsys, f"{u}/meg/web_text_document", "meg/web_text_document",
                            "--json"))  # fmt: skip
    assert (data["format"], data["n_docs"]) == ("megatron", 120)
    assert data["content_hash"] is not None  # convert recorded the identity; the copy is the same
    # The run: as a directory (its steps.jsonl), as the log itself, and through --log.
    for url in (f"{u}/runs/r1", f"{u}/runs/r1/", f"{u}/runs/r1/steps.jsonl"):
        code, out, err = cli(capsys, "info", url, "--json")
        assert code == 0, err
        code, here, _ = cli(capsys, "info", "runs/r1", "--json")
        run, local = json.loads(out), json.loads(here)
        assert run.pop("step_log") == url  # as given, not the local copy read
        local.pop("step_log")
        assert run == local and run["steps"] == 6
    code, out, err = cli(capsys, "info", "--log", f"{u}/runs/r1/steps.jsonl")
    assert code == 0 and "6" in out and not MANGLED.search(out + err), err


def test_plans_and_step_logs_are_read_from_the_bucket(bucket, s3, capsys):
    u = s3.url
    for args in (
        ["replay", "{p}", "--step", "3", "--global-batch", "4", "--json"],
        ["replay", "{p}", "--step", "3", "--log", "{log}", "--json"],
        ["locate", "{p}", "web", "7", "--log", "{log}", "--json"],
        ["report", "{run}", "--plan", "{p}", "--json"],
    ):
        remote = [a.format(p=f"{u}/plans/PLAN.json", log=f"{u}/runs/r1/steps.jsonl",
                           run=f"{u}/runs/r1") for a in args]  # fmt: skip
        local = [a.format(p="plans/PLAN.json", log="runs/r1/steps.jsonl", run="runs/r1")
                 for a in args]  # fmt: skip
        code, out, err = cli(capsys, *remote)
        assert code == 0, (remote, err)
        code, here, err = cli(capsys, *local)
        assert code == 0, (local, err)
        for name, there in zip(local, remote, strict=True):  # the names given, as given
            out = out.replace(json.dumps(there)[1:-1], json.dumps(name)[1:-1])
        assert json.loads(out) == json.loads(here), args
    code, out, err = cli(capsys, "verify", f"{u}/plans/PLAN.json")
    assert code == 0 and f"{u}/stores/web: ok" in out, out + err
    # outputs that are one file may go to the bucket (a plan, a new plan, a staged plan): the
    # object holds the bytes the same command writes to a local file
    doc = _later_doc(bucket)
    for args in (
        ["plan", "plans/p.toml", "--out", "{out}"],
        ["excise", f"{u}/plans/PLAN.json", "--from-consumed", "8", "--doc", doc, "--out", "{out}"],
        ["stage", f"{u}/plans/PLAN.json", "--cache", "cache", "--out", "{out}"],
    ):
        code, _, err = cli(capsys, *[a.format(out=f"{u}/out/{args[0]}.json") for a in args])
        assert code == 0, (args, err)
        code, _, err = cli(capsys, *[a.format(out=f"{args[0]}.json") for a in args])
        assert code == 0, (args, err)
        assert s3.get(f"{u}/out/{args[0]}.json") == (bucket / f"{args[0]}.json").read_bytes()
        assert tokentape.load_plan(f"{u}/out/{args[0]}.json") == tokentape.load_plan(
            f"{args[0]}.json"
        )
    code, _, err = cli(capsys, "report", f"{u}/runs/r1", "--out", f"{u}/out/report.html")
    assert code == 0, err
    page = s3.get(f"{u}/out/report.html")
    assert page.startswith(b"<!DOCTYPE html>") or page.lower().startswith(b"<!doctype html>")
    # the plan file at a URL: its relative source path is taken from the URL's "directory"
    code, out, err = cli(capsys, "plan", f"{u}/plans/p.toml", "--out", "again.json", "--json")
    assert code == 0, err
    assert tokentape.load_plan("again.json") == tokentape.load_plan("plans/PLAN.json")


COMMANDS = {
    # command -> argument lists, each with URLs (existing or not) for its paths
    "tokenize": [["{u}/raw/*.jsonl", "--out", "{u}/stores/new"],
                 ["d.jsonl", "--out", "{u}/stores/web", "--tokenizer", "{u}/tok.json"],
                 ["d.jsonl", "--out", "{u}/stores/other", "--work-dir", "{u}/work"]],
    "info": [["{u}/stores/none"], ["{u}/plans/none.json"], ["--log", "{u}/runs/none"]],
    "plan": [["{u}/plans/none.toml", "--out", "x.json"],
             ["{u}/plans/p.toml", "--out", "{u}/plans/out.json"]],
    "stage": [["{u}/plans/PLAN.json", "--cache", "cache"], ["{u}/plans/none.json", "--cache",
              "cache"], ["plans/PLAN.json", "--cache", "{u}/cache"]],
    "smoke": [["{u}/plans/none.json"]],
    "replay": [["{u}/plans/none.json", "--step", "1", "--global-batch", "4"],
               ["{u}/plans/PLAN.json", "--step", "1", "--log", "{u}/runs/none/steps.jsonl"]],
    "report": [["{u}/runs/none", "--json"], ["{u}/runs/r1", "--plan", "{u}/plans/none.json",
               "--json"], ["{u}/runs/r1", "--out", "{u}/report.html"]],
    "verify": [["{u}/stores/none"], ["{u}/plans/none.json"], ["{u}/meg/none"]],
    "locate": [["{u}/plans/none.json", "web", "1", "--global-batch", "4"],
               ["{u}/plans/PLAN.json", "web", "1", "--log", "{u}/runs/none"]],
    "excise": [["{u}/plans/none.json", "--from-consumed", "8", "--doc", "{doc}", "--out", "e.json"],
               ["plans/PLAN.json", "--from-consumed", "8", "--doc", "{doc}", "--out",
                "{u}/e.json"]],
    "convert": [["--to", "megatron", "{u}/stores/none", "m/x"],
                ["--to", "megatron", "stores/web", "{u}/m/x"],
                ["--from", "megatron", "meg/web_text_document", "{u}/st", "--vocab-size", "257",
                 "--eod-id", "256"],
                ["--from", "megatron", "{u}/meg/web_text_document", "st", "--vocab-size", "257",
                 "--eod-id", "256"]],
    "megatron": [["replay", "{u}/cache", "--prefix", "{u}/meg/web_text_document", "--iteration",
                  "1", "--global-batch", "4"],
                 ["locate", "cache", "--prefix", "{u}/meg/web_text_document", "--doc",
                  "web_text_document:1", "--global-batch", "4"],
                 ["locate", "cache", "--prefix", "meg/web_text_document", "--doc",
                  "web_text_document:1", "--global-batch", "4", "--map-dir", "{u}/maps"]],
    "corpora": [["--out", "{u}/corpora"]],
    "demo": [["--out", "{u}/demo"]],
}  # fmt: skip


def test_the_table_covers_every_command():
    parser = build_parser(extra=(demo_command,))
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert set(commands) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_command_mangles_a_url(bucket, s3, capsys, command):
    """Each works (exit 0) or refuses in one line naming the URL whole (exit 2); none prints
    ``s3:/`` for ``s3://``, none leaves a traceback."""
    for args in COMMANDS[command]:
        given = [a.format(u=s3.url, doc=_later_doc(bucket)) for a in args]
        code, out, err = cli(capsys, command, *given)
        assert "Traceback" not in err and not MANGLED.search(out + err), (given, out, err)
        assert not (bucket / "s3:").exists(), given  # nothing written at a local "s3:/..."
        assert code in (0, 2), (given, code, err)
        if code == 2:
            assert len(err.strip().splitlines()) == 1, (given, err)
            urls = [a for a in given if a.startswith("s3://")]
            assert any(u.rstrip("/") in err for u in urls), (given, err)

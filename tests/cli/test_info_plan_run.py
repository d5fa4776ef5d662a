"""tokentape info of a resolved plan and of a run: the plan's sources, shares, phases and stores;
the run's steps, shapes, plans, redone steps and gaps, from a step log a real Loader wrote
(expectations from the configs the test ran and the file's own lines)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import PLAN, plan_of

from tokentape._src.api import replay
from tokentape._src.program import main
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState

ANNEAL = "\n[[phase]]\nstart_samples = 28\nweights = { math = 3, code = 1 }\n"
FIRST, SECOND = BatchConfig(2, 4), BatchConfig(1, 4)  # 8, then 4 samples a step


def _run(plan, state, config: BatchConfig, steps: int, log: Path) -> DataState:
    with Loader(plan, 0, config, state=state, prefetch=0, step_log=log) as loader:
        for _ in range(steps):
            loader.step()
            loader.commit()
        return DataState.from_dict(json.loads(json.dumps(loader.state_dict())))


@pytest.fixture(scope="module")
def run(mixture_stores: Path, tmp_path_factory):
    """Steps 0-2 at B = 8; a restart from step 2's checkpoint redoes step 2 at B = 4; steps
    2-4 at B = 4; the plan gains a phase at consumed 28; steps 5-6 under it."""
    root = tmp_path_factory.mktemp("info_run")
    log = root / "steps.jsonl"
    first = plan_of(mixture_stores)
    at_2 = _run(first, None, FIRST, 2, log)
    _run(first, at_2, FIRST, 1, log)  # step 2, then "lost" with its checkpoint
    state = _run(first, at_2, SECOND, 3, log)  # redoes step 2, then 3 and 4
    annealed = plan_of(mixture_stores, PLAN + ANNEAL)
    _run(annealed, state, SECOND, 2, log)
    plans = {}
    for name, plan in (("first", first), ("annealed", annealed)):
        plans[name] = root / f"{name}.json"
        plan.save(plans[name])
    return root, log, first, annealed, plans


def info(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["info", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_run_json_from_a_real_loader_log(run, capsys):
    root, log, first, annealed, _plans = run
    rc, out, _ = info(capsys, "--log", str(log), "--json")
    assert rc == 0
    data = json.loads(out)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 2 + 1 + 3 + 2 and data["lines"] == len(lines)
    assert data["steps"] == 7
    assert data["consumed"] == 2 * 8 + 5 * 4
    assert data["readable"] is True and data["gaps"] == []
    shapes = [(s["step"], s["consumed"], s["dp"], s["micro"], s["accum"], s["global_batch"])
              for s in data["batch_shapes"]]  # fmt: skip
    assert shapes == [(0, 0, 2, 4, 1, 8), (2, 16, 1, 4, 1, 4)]
    plans = [(p["first_step"], p["index_hash"]) for p in data["plans"]]
    assert plans == [(0, first.index_hash), (5, annealed.index_hash)]
    assert data["redone"] == {
        "lines": 1,
        "superseded_steps": 1,
        "at": [{"line": 4, "step": 2, "superseded": 1}],
    }
    last = data["last_step"]
    assert last["step"] == 6 and last["consumed"] == 32 and last["global_batch"] == 4
    assert last["tokens_hash"] == lines[-1]["tokens_hash"]
    assert last["tokens_hash"] == replay(annealed, 6, step_log=log).tokens_hash
    assert last["index_hash"] == annealed.index_hash
    assert data["first_time"] == lines[0]["time"] and data["last_time"] == lines[-1]["time"]
    # a run directory is read the same way
    rc, out_dir, _ = info(capsys, str(root), "--json")
    assert rc == 0 and json.loads(out_dir) == data
    rc, out_pos, _ = info(capsys, str(log), "--json")
    assert rc == 0 and json.loads(out_pos) == data


def test_run_text(run, capsys):
    _root, log, first, annealed, _plans = run
    rc, out, _ = info(capsys, "--log", str(log))
    assert rc == 0
    assert "steps         7 (0..6)" in out
    assert "consumed      36 samples" in out
    assert "redone steps  1 (1 restart)" in out
    assert "gaps          none" in out
    assert "batch shapes (1 change)" in out and "plans (1 change)" in out
    assert first.index_hash in out and annealed.index_hash in out
    assert json.loads(log.read_text().splitlines()[-1])["tokens_hash"] in out


def test_a_torn_last_line_is_noted_and_ignored(run, tmp_path, capsys):
    _root, log, *_ = run
    torn = tmp_path / "steps.jsonl"
    torn.write_text(log.read_text() + '{"step": 7, "consu')
    rc, out, _ = info(capsys, "--log", str(torn), "--json")
    data = json.loads(out)
    assert rc == 0 and data["torn_last_line"] is True and data["steps"] == 7
    assert "a torn last line ignored" in info(capsys, "--log", str(torn))[1]


def test_steps_missing_are_listed_and_exit_1(run, tmp_path, capsys):
    _root, log, *_ = run
    lines = log.read_text().splitlines(keepends=True)
    gap = tmp_path / "steps.jsonl"
    gap.write_text("".join(lines[:1] + lines[2:]))  # step 1 dropped
    rc, out, _ = info(capsys, "--log", str(gap), "--json")
    data = json.loads(out)
    assert rc == 1 and data["readable"] is False and "steps missing" in data["refused"]
    assert data["gaps"] == [{"line": 2, "step": 2, "expected": 1}]
    rc, out, _ = info(capsys, "--log", str(gap))
    assert rc == 1 and "gaps          1: steps missing (below)" in out


def test_plan_json_and_text(run, capsys):
    _root, _log, _first, annealed, plans = run
    rc, out, _ = info(capsys, str(plans["annealed"]), "--json")
    assert rc == 0
    data = json.loads(out)
    saved = json.loads(plans["annealed"].read_text())
    assert data["index_hash"] == saved["index_hash"] == annealed.index_hash
    assert data["horizon_samples"] == 2000 and data["horizon_tokens"] == 2000 * 64
    assert [s["name"] for s in data["sources"]] == ["web", "code", "math"]
    assert [s["share"] for s in data["sources"]] == [0.6, 0.3, 0.1]
    assert [s["path"] for s in data["sources"]] == [s["path"] for s in saved["sources"]]
    assert all(s["location"] == "local" and s["present"] for s in data["sources"])
    assert [(p["start_samples"], p["end_samples"]) for p in data["phases"]] == [
        (0, 28),
        (28, 2000),
    ]
    assert data["phases"][1]["shares"] == {"web": 0.0, "code": 0.25, "math": 0.75}
    rc, text, _ = info(capsys, str(plans["annealed"]))
    assert rc == 0 and annealed.index_hash in text and "phase 2" in text
    for s in saved["sources"]:
        assert s["path"] in text
    rc, one = info(capsys, str(plans["first"]), "--json")[:2]
    assert rc == 0 and len(json.loads(one)["phases"]) == 1


def test_where_stores_live_missing_and_object_urls(run, tmp_path, capsys):
    _root, _log, _first, _annealed, plans = run
    data = json.loads(plans["first"].read_text())
    data["sources"][0]["path"] = str(tmp_path / "gone")
    data["sources"][1]["path"] = "s3://bucket/stores/code"
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(data))
    rc, out, _ = info(capsys, str(moved), "--json")
    assert rc == 0
    where = [(s["location"], s["present"]) for s in json.loads(out)["sources"]]
    assert where == [("local", False), ("object", None), ("local", True)]
    text = info(capsys, str(moved))[1]
    assert "MISSING" in text and "object storage" in text and "s3://bucket/stores/code" in text


def test_a_store_is_still_shown(mixture_stores, capsys):
    rc, out, _ = info(capsys, str(mixture_stores / "stores" / "web"))
    assert rc == 0 and "content hash" in out and "shard" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["{root}/nope.json"], "no such file"),
        (["--log", "{root}/nope.jsonl"], "no such step log"),
        (["{root}/mix.toml"], "tokentape plan"),
        (["{root}/first.json", "--log", "{root}/steps.jsonl"], "give one of PATH"),
        ([], "give one of PATH"),
        (["{root}/bad.json"], "not a resolved tokentape plan"),
        (["--log", "{root}/bad.jsonl"], "bad.jsonl:2"),
        (["--log", "{root}/empty"], "without steps.jsonl"),
    ],
)
def test_bad_input_is_one_line_exit_2(run, capsys, args, message):
    root = run[0]
    (root / "mix.toml").write_text(PLAN)
    (root / "bad.json").write_text('{"hello": 1}')
    first_line = (root / "steps.jsonl").read_text().splitlines()[0]
    (root / "bad.jsonl").write_text(first_line + '\n{"step": "x"}\n')
    (root / "empty").mkdir(exist_ok=True)
    rc, out, err = info(capsys, *[a.format(root=root) for a in args])
    assert rc == 2 and out == ""
    assert message in err and err.count("\n") == 1

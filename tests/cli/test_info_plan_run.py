"""tokentape info of a resolved plan and of a run: the plan's sources, shares, phases and stores;
the run's steps, shapes, plans, redone steps and gaps, from a step log a real Loader wrote
(expectations from the configs the test ran and the file's own lines) and from logs written
by hand (torn, redone, with gaps, two plans, times no date holds or going backwards); bad
input, a crafted plan and a store's manifest given for its store are one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import CORPUS, byte_plan, docs_jsonl
from helpers import PLAN, cli, one_line_refusal, plan_of, record

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


# --- info --log on hand-written step logs: torn, redone, gaps, plans, times --------------------


def write_log(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def timed_log(path: Path, times: list[object]) -> Path:
    lines = [record(i, 4 * i, time=t) for i, t in enumerate(times)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def info_json(capsys, *args: object) -> tuple[int, dict]:
    code, out, err = cli(capsys, "info", *args, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


def test_info_log_torn_superseded_gaps_and_two_plans(tmp_path, capsys):
    torn = write_log(tmp_path / "torn.jsonl", [record(0, 0), record(1, 4)], '{"step": 2, "con')
    code, data = info_json(capsys, "--log", torn)
    assert code == 0 and data["steps"] == 2 and data["torn_last_line"] is True

    redo = [record(0, 0), record(1, 4), record(2, 8), record(1, 4), record(2, 8)]
    code, data = info_json(capsys, "--log", write_log(tmp_path / "redo.jsonl", redo))
    assert code == 0 and data["steps"] == 3 and data["consumed"] == 12
    assert data["redone"] == {
        "lines": 1, "superseded_steps": 2, "at": [{"line": 4, "step": 1, "superseded": 2}]
    }  # fmt: skip

    gap = write_log(tmp_path / "gap.jsonl", [record(0, 0), record(1, 4), record(3, 12)])
    code, data = info_json(capsys, "--log", gap)
    assert code == 1 and data["readable"] is False
    assert data["gaps"] == [{"line": 3, "step": 3, "expected": 2}]
    code, out, err = cli(capsys, "info", "--log", gap)
    assert code == 1 and "step 3 follows step 1" in out, err

    other = "sha256:" + "cd" * 32
    two = [
        record(0, 0),
        record(1, 4),
        record(2, 8, index_hash=other),
        record(3, 12, index_hash=other),
    ]
    code, data = info_json(capsys, "--log", write_log(tmp_path / "two.jsonl", two))
    assert [p["first_step"] for p in data["plans"]] == [0, 2]
    assert data["last_step"]["index_hash"] == other

    # a restart from before a plan change takes the change back
    back = [record(0, 0), record(1, 4), record(2, 8, index_hash=other), record(1, 4)]
    code, data = info_json(capsys, "--log", write_log(tmp_path / "back.jsonl", back))
    assert [p["first_step"] for p in data["plans"]] == [0] and data["steps"] == 2


@pytest.mark.parametrize("bad", ["empty", "not-json", "/dev/zero"])
def test_info_log_bad_input_is_one_line(tmp_path, capsys, bad):
    path = Path(bad) if bad.startswith("/") else tmp_path / f"{bad}.jsonl"
    if bad == "empty":
        path.write_text("")
    elif bad == "not-json":
        write_log(path, [record(0, 0)], "\xff{\n" + json.dumps(record(1, 4)) + "\n")
    one_line_refusal(*cli(capsys, "info", "--log", path))


@pytest.mark.parametrize("time", [1e300, -1e20])
def test_info_log_with_an_out_of_range_time_is_no_traceback(tmp_path, capsys, time):
    log = write_log(tmp_path / "t.jsonl", [record(0, 0), record(1, 4, time=time)])
    code, _out, err = cli(capsys, "info", "--log", log)
    assert code in (0, 2), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("times", "shown"),
    [
        ([1e300, 1e300], "1e+300 s (not a date)"),
        ([1_700_000_000, -1e20], "-1e+20 s (not a date)"),
        ([-1e20, 1e300], "-1e+20 s (not a date) .. 1e+300 s (not a date) (1e+300 s)"),
    ],
)
def test_a_time_no_date_holds_is_shown_as_a_number(tmp_path, capsys, times, shown):
    log = timed_log(tmp_path / "steps.jsonl", times)
    code, out, err = cli(capsys, "info", "--log", log)
    assert code == 0 and err == "", err
    assert shown in out, out
    code, out, err = cli(capsys, "info", "--log", log, "--json")
    assert code == 0 and json.loads(out)["steps"] == len(times), err


def test_a_time_going_backwards_says_so(tmp_path, capsys):
    log = timed_log(tmp_path / "steps.jsonl", [1_700_000_100, 1_700_000_050])
    code, out, err = cli(capsys, "info", "--log", log)
    assert code == 0, err
    assert "(50 s backwards: the last line's time is before the first's)" in out
    assert "-50" not in out


# --- info of a plan and of a store, from their files ------------------------------------------


def test_info_plan_with_phases_and_object_storage_and_missing_stores(tmp_path, capsys):
    store = tmp_path / "store"
    docs = docs_jsonl(tmp_path / "d.jsonl", CORPUS)
    assert cli(capsys, "tokenize", docs, "--out", store)[0] == 0
    (tmp_path / "p.toml").write_text(
        "seq_len = 16\nseed = 1\ntotal_samples = 40\n"
        f'[[source]]\nname = "a"\npath = "{store}"\nweight = 1\n'
        f'[[source]]\nname = "b"\npath = "{store}"\nweight = 2\n'
        "[[phase]]\nstart_samples = 10\nweights = { a = 0, b = 1 }\n"
    )
    code, _, err = cli(capsys, "plan", tmp_path / "p.toml", "--out", tmp_path / "p.json")
    assert code == 0, err
    data = json.loads((tmp_path / "p.json").read_text())
    data["sources"][0]["path"] = "s3://bucket/stores/a"
    data["sources"][1]["path"] = str(tmp_path / "gone")
    (tmp_path / "q.json").write_text(json.dumps(data))
    code, out, err = cli(capsys, "info", tmp_path / "q.json")
    assert code == 0, err
    assert "object storage" in out and "MISSING" in out and "phases      2" in out
    code, info = info_json(capsys, tmp_path / "q.json")
    where = [(s["location"], s["present"]) for s in info["sources"]]
    assert where == [("object", None), ("local", False)]
    assert [p["start_samples"] for p in info["phases"]] == [0, 10]
    assert info["phases"][1]["shares"] == {"a": 0.0, "b": 1.0}


@pytest.mark.parametrize("field", ["path", "name"])
def test_info_of_a_plan_refuses_control_characters_in_it(tmp_path, capsys, field):
    plan = byte_plan(tmp_path, capsys, ["abc", "defg"], seq_len=3)
    data = json.loads(plan.read_text())
    data["sources"][0][field] = "x\x1b]0;pwned\x07"
    crafted = tmp_path / "crafted.json"
    crafted.write_text(json.dumps(data))
    err = one_line_refusal(*cli(capsys, "info", crafted))
    assert f"field '{field}'" in err and "\x1b" not in err


def test_info_of_a_store_manifest_points_to_the_store(tmp_path, capsys):
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    store = tmp_path / "store"
    code, _, err = cli(capsys, "tokenize", tmp_path / "d.jsonl", "--out", store,
                       "--tokenizer", "bytes")  # fmt: skip
    assert code == 0, err
    code, out, err = cli(capsys, "info", store / "manifest.json")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("tokentape: error: ") and f"`tokentape info {store}`" in err
    code, out, err = cli(capsys, "info", store)
    assert code == 0, err
    # any other JSON that is no plan is still refused as such
    (tmp_path / "x.json").write_text("{}")
    code, out, err = cli(capsys, "info", tmp_path / "x.json")
    assert code == 2 and "tokentape info" not in err, err

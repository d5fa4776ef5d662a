"""tokentape.tokenize, replay, locate and verify give what the commands print with --json,
draw nothing on the terminal, and refuse bad arguments with the error types."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import cli, small_plan_json, write_docs

import tokentape


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    return small_plan_json(tmp_path_factory.mktemp("api"))


def test_tokenize_is_the_command(tmp_path, capsys):
    write_docs(tmp_path / "docs.jsonl", "web", 40)
    summary = tokentape.tokenize(tmp_path / "docs.jsonl", tmp_path / "py", filters=["min-tokens:5"])
    assert capsys.readouterr() == ("", "")  # nothing drawn, nothing printed
    code, out, _ = cli(
        capsys, "tokenize", tmp_path / "docs.jsonl", "--out", tmp_path / "cli",
        "--filter", "min-tokens:5", "--json",
    )  # fmt: skip
    assert code == 0
    printed = json.loads(out)
    for key in ("n_docs", "n_tokens", "content_hash", "dropped_docs", "vocab_size", "eod_id"):
        assert getattr(summary, key) == printed[key], key
    assert summary.status == "created"
    again = tokentape.tokenize([tmp_path / "docs.jsonl"], tmp_path / "py", filters=["min-tokens:5"])
    assert again.status == "already complete" and again.content_hash == summary.content_hash
    seen: list = []
    tokentape.tokenize(tmp_path / "docs.jsonl", tmp_path / "watched", progress=seen.append)
    assert seen and seen[-1].final and seen[-1].done_bytes == seen[-1].total_bytes > 0
    assert capsys.readouterr() == ("", "")
    with pytest.raises(tokentape.InputError):
        tokentape.tokenize([], tmp_path / "none")


def test_replay_is_the_command(plan_path, capsys):
    r = tokentape.replay(plan_path, 5, dp=2, micro=2, accum=2)
    code, out, _ = cli(
        capsys, "replay", plan_path, "--step", 5, "--dp", 2, "--micro", 2, "--accum", 2, "--json"
    )
    assert code == 0
    printed = json.loads(out)
    assert r.step == 5 and r.consumed == 40
    assert [p["position"] for p in printed["positions"]] == r.batch.positions.tolist()
    assert np.array_equal(r.batch.positions, np.arange(40, 48))
    plan = tokentape.load_plan(plan_path)
    same = tokentape.replay(plan, 5, global_batch=8)
    assert np.array_equal(same.batch.tokens, r.batch.tokens)
    with pytest.raises(tokentape.ArgumentError, match="one of"):
        tokentape.replay(plan, 5, global_batch=8, dp=2, micro=2)
    with pytest.raises(tokentape.ArgumentError, match="batch shape"):
        tokentape.replay(plan, 5)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"dp": 0, "micro": 2}, "dp must be a positive integer, got 0"),
        ({"dp": True, "micro": 2}, "dp must be a positive integer, got True"),
        ({"global_batch": "8"}, "global_batch must be a positive integer, got '8'"),
        ({"micro": 2}, "micro given: dp and micro go together"),
        ({"dp": 2**62, "micro": 2}, "dp 4611686018427387904 x micro 2 x accum 1: a step of"),
        ({"dp": 2**63, "micro": 1}, "dp must be at most 2**62"),
        ({"global_batch": 8, "step_log": "x"}, "not global_batch and step_log"),
    ],
)
def test_replay_and_locate_check_the_batch_shape_as_the_commands_do(plan_path, shape, message):
    """The same checks as the commands' flags (one function), in the parameters' names."""
    for call in (lambda: tokentape.replay(plan_path, 0, **shape),
                 lambda: tokentape.locate(plan_path, "math", 3, **shape)):  # fmt: skip
        with pytest.raises(tokentape.ArgumentError) as caught:
            call()
        assert message in str(caught.value)


def test_locate_is_the_command(plan_path, capsys):
    found = tokentape.locate(plan_path, "math", 3, dp=2, micro=2, accum=2)
    code, out, _ = cli(
        capsys, "locate", plan_path, "math", 3, "--dp", 2, "--micro", 2, "--accum", 2,
        "--json", "--limit", 0,
    )  # fmt: skip
    assert code == 0
    printed = json.loads(out)
    assert found.position.size == printed["count"] > 0
    assert [r["position"] for r in printed["rows"]] == found.position.tolist()
    assert found.placement is not None
    assert [r["step"] for r in printed["rows"]] == found.placement.step.tolist()
    assert [r["dp_rank"] for r in printed["rows"]] == found.placement.dp_rank.tolist()
    assert np.array_equal(found.placement.step, found.position // 8)
    unplaced = tokentape.locate(plan_path, "math", 3)
    assert np.array_equal(unplaced.position, found.position) and unplaced.placement is None
    with pytest.raises(tokentape.OutOfRangeError):
        tokentape.locate(plan_path, "math", 10**6)
    with pytest.raises(tokentape.ArgumentError, match="until_step"):
        tokentape.locate(plan_path, "math", 3, until_step=3)


def test_verify_reports_damage_as_data(plan_path, tmp_path, capsys):
    reports = tokentape.verify(plan_path)
    assert [r.ok for r in reports] == [True, True, True]
    assert capsys.readouterr() == ("", "")
    store = Path(tokentape.load_plan(plan_path).sources[0].path)
    damaged = tmp_path / "web"
    damaged.mkdir()
    for f in store.iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    shard = sorted(damaged.glob("*.bin"))[0]
    data = bytearray(shard.read_bytes())
    data[0] ^= 1
    shard.write_bytes(bytes(data))
    (report,) = tokentape.verify(damaged, quick=True, blocks=2)
    assert not report.ok and report.problems
    with pytest.raises(tokentape.ArgumentError):
        tokentape.verify(damaged, quick=True, blocks=0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"blocks": 2}, "blocks applies to quick only"),
        ({"quick": True, "blocks": 0}, "blocks must be at least 1, got 0"),
        ({"quick": True, "blocks": 2.5}, "blocks must be an integer, got 2.5"),
        ({"vocab_size": True}, "vocab_size must be an integer, got True"),
        ({"vocab_size": 0}, "vocab_size must be positive, got 0"),
        ({"eod_id": -1}, "eod_id must be a token id (>= 0), got -1"),
        ({"vocab_size": 10, "eod_id": 10}, "eod_id 10 is not below vocab_size 10"),
    ],
)
def test_verify_checks_its_options_as_the_command_does(plan_path, options, message):
    """The command's checks (one function), in the parameters' names, before any hashing."""
    with pytest.raises(tokentape.ArgumentError) as caught:
        tokentape.verify(plan_path, **options)
    assert str(caught.value) == message


# --- what a hostile or hurried caller passes: one clear error, nothing written ---------------


@pytest.mark.parametrize("step", [1.5, 1.9999, True, "3", None])
def test_replay_refuses_a_step_that_is_not_an_integer(plan_path, step):
    """A float step used to give the windows of no real step (consumed 12.0), silently."""
    with pytest.raises(tokentape.ArgumentError, match="step must be an integer"):
        tokentape.replay(plan_path, step, dp=1, micro=4, accum=2)


@pytest.mark.parametrize(("doc", "until"), [(3.0, None), ("3", None), (None, None), (3, 2.5)])
def test_locate_refuses_a_doc_or_until_step_that_is_not_an_integer(plan_path, doc, until):
    with pytest.raises(tokentape.ArgumentError, match="must be an integer"):
        tokentape.locate(plan_path, "math", doc, dp=1, micro=4, until_step=until)


def test_numpy_integers_are_integers(plan_path):
    a = tokentape.replay(plan_path, np.int64(3), global_batch=8)
    b = tokentape.replay(plan_path, 3, global_batch=8)
    assert a.step == 3 and type(a.step) is int and np.array_equal(a.batch.tokens, b.batch.tokens)


@pytest.mark.parametrize(
    "inputs", [{"a.jsonl", "b.jsonl"}, (p for p in ["a.jsonl"]), b"a.jsonl", None, 5, []]
)
def test_tokenize_takes_a_path_or_an_ordered_list(tmp_path, inputs):
    """A set's order depends on the hash seed: the store would too. Refused before anything."""
    with pytest.raises(tokentape.ArgumentError, match="inputs"):
        tokentape.tokenize(inputs, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"out": None}, "out must be a path"),
        ({"filters": "min-tokens:1"}, "filters must be a list"),
        ({"progress": 5}, "progress must be a callable"),
    ],
)
def test_tokenize_refuses_bad_arguments_before_writing(tmp_path, kwargs, message):
    write_docs(tmp_path / "docs.jsonl", "web", 5)
    args = {"out": tmp_path / "out"} | kwargs
    with pytest.raises(tokentape.ArgumentError, match=message):
        tokentape.tokenize(tmp_path / "docs.jsonl", **args)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("paths", "options", "message"),
    [
        ([], {}, "paths: no paths given"),
        (None, {}, "paths must be a path"),
        (b"x", {}, "paths must be a path"),
        ({"a"}, {}, "paths must be a path"),
        ("x", {"quick": "no"}, "quick must be True or False"),
    ],
)
def test_verify_refuses_nothing_to_check(paths, options, message):
    """verify([]) returned [] (so all(r.ok ...) was True with nothing checked)."""
    with pytest.raises(tokentape.ArgumentError, match=message):
        tokentape.verify(paths, **options)


def test_a_fifo_is_refused_not_waited_on(tmp_path, plan_path):
    """A FIFO named as a plan, a plan file or a step log blocked the open forever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(tokentape.PlanError, match="not a regular file"):
        tokentape.load_plan(fifo)
    with pytest.raises(tokentape.PlanError, match="not a regular file"):
        tokentape.replay(plan_path, 0, step_log=fifo)
    with pytest.raises(tokentape.InputError, match="not a regular file"):
        tokentape.verify(fifo)


def test_paths_that_are_not_paths(plan_path, tmp_path):
    plan = tokentape.load_plan(plan_path)
    for call in (
        lambda: tokentape.load_plan(None),
        lambda: plan.save(None),
        lambda: tokentape.replay(None, 0, global_batch=8),
        lambda: tokentape.Plan.build({"a": {"path": "x", "weight": 1}}, seq_len=8, seed=1,
                                     total_samples=10, base_dir=None),
        lambda: tokentape.Loader(None, 0, tokentape.BatchConfig(1, 2, 1)),
    ):  # fmt: skip
        with pytest.raises(tokentape.ArgumentError):
            call()


def test_loader_takes_a_plan_or_its_path(plan_path):
    by_path = tokentape.Loader(plan_path, 0, tokentape.BatchConfig(1, 2, 1), prefetch=0)
    by_plan = tokentape.Loader(
        tokentape.load_plan(plan_path), 0, tokentape.BatchConfig(1, 2, 1), prefetch=0
    )
    a, b = by_path.step(), by_plan.step()
    assert np.array_equal(a.micro_batches[0].tokens, b.micro_batches[0].tokens)
    by_path.close()
    by_plan.close()


def test_a_weight_beyond_any_float_is_a_plan_error(tmp_path):
    with pytest.raises(tokentape.PlanError, match="an integer of 401 digits"):
        tokentape.Plan.build(
            {"a": {"path": "x", "weight": 10**400}}, seq_len=8, seed=1, total_samples=10
        )


def test_a_step_log_of_another_plan_is_refused_not_appended_to(tmp_path, plan_path):
    """Appending this plan's steps to another plan's log made it unreadable for both."""
    log = tmp_path / "steps.jsonl"
    first = tokentape.Loader(plan_path, 0, tokentape.BatchConfig(1, 2, 1), step_log=log)
    first.step()
    first.commit()
    first.close()
    before = log.read_bytes()
    again = tokentape.Loader(plan_path, 0, tokentape.BatchConfig(1, 2, 1), step_log=log)
    again.close()  # the same plan: accepted
    other = tokentape.load_plan(plan_path)
    other = dataclasses.replace(other, seed=other.seed + 1)  # another plan: its own hash
    # Without a state, a checkpoint loaded next may still bring the plan change that explains
    # the log: the check waits for it, and the first step refuses.
    loader = tokentape.Loader(other, 0, tokentape.BatchConfig(1, 2, 1), step_log=log)
    with pytest.raises(tokentape.PlanError, match="written for another plan"):
        loader.step()
    loader.close()
    # With a state, at once.
    state = tokentape.DataState.start(other)
    with pytest.raises(tokentape.PlanError, match="written for another plan"):
        tokentape.Loader(other, 0, tokentape.BatchConfig(1, 2, 1), step_log=log, state=state)
    assert log.read_bytes() == before

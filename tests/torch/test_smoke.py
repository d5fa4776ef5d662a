"""Rank checks in real gloo processes, and the verifier's own ability to catch violations."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("torch")

import torch.distributed as dist
from helpers import small_plan_json

from tokentape._src.plan.load import load_plan
from tokentape._src.program import main
from tokentape._src.torch import smoke
from tokentape._src.torch.smoke import RankReport, check_step, launch, verify
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import Loader, Step
from tokentape._src.train.partition import BatchConfig, positions_for
from tokentape.errors import TokentapeError

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    path = small_plan_json(root)
    return path


@pytest.mark.subprocess
@pytest.mark.slow
def test_smoke_in_real_processes(plan_json, capsys):
    assert main(["smoke", str(plan_json), "--dp", "2", "--tp", "2", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "OK: dp=2 tp=2 (gloo), 2 steps, 0 problems" in out
    rows = [line.split("\t") for line in out.splitlines() if line[:1].isdigit()]
    assert len(rows) == 2 * 4  # steps x ranks
    for step in ("0", "1"):
        mine = {r[2]: r for r in rows if r[0] == step}
        assert mine["0"][5:] == mine["1"][5:]  # tp peers of dp rank 0: same positions and hash
        assert mine["2"][5:] == mine["3"][5:]
        assert mine["0"][5] != mine["2"][5]
    assert [mine[r][5] for r in "0123"] == ["[8, 11]", "[8, 11]", "[12, 15]", "[12, 15]"]


# --- check_step in a real gloo group of four, one deliberately wrong rank per case -----------

WORLD = 4


def _step(batcher: Batcher, config: BatchConfig, dp_rank: int, consumed: int = 0,
          shift: int = 0, positions: np.ndarray | None = None) -> Step:  # fmt: skip
    rows = positions_for(consumed, dp_rank, config) + shift if positions is None else positions
    return Step(consumed // config.global_batch, consumed, config,
                tuple(batcher.batch(row) for row in rows))  # fmt: skip


def _no_pickle(*args, **kwargs):
    raise AssertionError("check_step must not move Python objects (pickle)")


def _check_worker(rank: int, plan_path: str, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD, timeout=timedelta(seconds=60))  # fmt: skip
    dist.all_gather_object = dist.gather_object = dist.broadcast_object_list = _no_pickle
    plan = load_plan(plan_path)
    batcher = Batcher(plan)
    two, one = BatchConfig(2, 2, 1), BatchConfig(1, 2, 2)
    tp_inner, dp_inner = rank // 2, rank % 2
    outcomes = {}

    def case(name: str, step: Step, dp_rank: int, *args, **kwargs) -> None:
        try:
            reports = check_step(step, dp_rank, *args, **kwargs)
            outcomes[name] = f"ok {len(reports)}"
        except TokentapeError as exc:
            outcomes[name] = str(exc)

    try:
        with Loader(plan, tp_inner, two) as loader:  # the real loader, tp inner, two steps
            for i in range(2):
                case(f"loader {i}", loader.step(), tp_inner, 2)
                loader.commit()
        case("dp inner", _step(batcher, two, dp_inner), dp_inner)  # another layout: fine
        case("tp_size alias", _step(batcher, two, tp_inner), tp_inner, tp_size=2)
        case("pp x tp, one replica", _step(batcher, one, 0), 0)  # 4 model-parallel ranks
        case("wrong model_parallel_size", _step(batcher, one, 0), 0, 2)
        claimed = 0 if rank == 3 else tp_inner  # rank 3 reads dp 1's data, says it is dp 0
        case("claims dp 0", _step(batcher, two, tp_inner), claimed)
        shift = 1 if rank == 3 else 0  # rank 3 reads dp 1's positions shifted by one
        case("shifted", _step(batcher, two, tp_inner, shift=shift), tp_inner)
        gap = np.array([[6], [8]]) if rank >= 2 else None  # dp 1 reads 6 and 8, not 6 and 7
        case("gap", _step(batcher, BatchConfig(2, 1, 2), tp_inner, 4, positions=gap), tp_inner)
        consumed = 4 if rank == 2 else 0  # rank 2 is a step ahead
        case("out of step", _step(batcher, two, tp_inner, consumed), tp_inner)
        if hasattr(dist, "all_gather_single"):  # the older torch path: list all_gather
            del dist.all_gather_single
        case("list all_gather", _step(batcher, two, tp_inner, shift=shift), tp_inner)
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"{rank}.json").write_text(json.dumps(outcomes))


@pytest.mark.subprocess
@pytest.mark.slow
def test_check_step_in_real_gloo_processes(plan_json, tmp_path):
    launch(_check_worker, (str(plan_json), str(tmp_path / "init"), str(tmp_path)), WORLD)
    outcomes = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    assert all(o == outcomes[0] for o in outcomes)  # every rank reaches the same verdict
    got = outcomes[0]
    assert got["loader 0"] == got["loader 1"] == "ok 4"
    assert got["dp inner"] == "ok 4"
    assert got["tp_size alias"] == "ok 4"
    assert got["pp x tp, one replica"] == "ok 4"
    wrong_size = got["wrong model_parallel_size"]
    assert "model_parallel_size 2 x dp_size 1 is not the 4 ranks of the group" in wrong_size
    claims = got["claims dp 0"]
    assert "dp rank 0: 3 ranks [0, 1, 3] reported it, expected 2" in claims
    assert "dp rank 1: 1 ranks [2] reported it, expected 2" in claims
    assert "dp rank 0: model-parallel peers [0, 1, 3] got different data" in claims
    shifted = got["shifted"]
    assert "dp rank 1: model-parallel peers [2, 3] got different data" in shifted
    assert "dp rank 1 (ranks [2, 3]) read [2, 4), [3, 5), expected [2, 4)" in shifted
    assert "are not [0, 4)" in shifted
    gap = got["gap"]
    assert "rank 2: its positions are not one contiguous run" in gap
    assert "rank 3: its positions are not one contiguous run" in gap
    assert got["list all_gather"] == shifted
    assert "ranks are not at the same step" in got["out of step"]
    assert "step 1 consumed 4 dp 2 micro 2 accum 1 on ranks [2]" in got["out of step"]


# --- a worker that fails is one line ---------------------------------------------------------


def _failing_worker(rank: int, how: str) -> None:
    if how == "raise":
        raise TokentapeError("store 'x' changed\nsince the plan was made")
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_failed_worker_is_one_line():
    with pytest.raises(TokentapeError) as raised:
        launch(_failing_worker, ("raise",), 1)
    assert str(raised.value) == (
        "smoke: rank 0 failed: TokentapeError: store 'x' changed since the plan was made"
    )
    with pytest.raises(TokentapeError, match=r"^smoke: rank 0 was killed by SIGKILL$"):
        launch(_failing_worker, ("kill",), 1)


# --- the CLI: bad input is one line and exit 2, before any process starts ------------------


def _one_line_exit_2(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokentape: error: "), captured.err
    return lines[0]


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--tp", "0"),
        ("--tp", "-1"),
        ("--dp", "0"),
        ("--micro", "0"),
        ("--accum", "-2"),
        ("--steps", "0"),
    ],
)
def test_smoke_refuses_bad_sizes(plan_json, capsys, flag, value):
    line = _one_line_exit_2(["smoke", str(plan_json), flag, value], capsys)
    assert f"{flag} must be at least 1, got {value}" in line


def test_nccl_needs_a_cuda_device_per_rank(plan_json, capsys):
    """Refused in one line before any process starts when the machine has fewer CUDA devices
    than ranks (here: none unless a GPU is present, so ask for more than it has)."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    dp = have + 1
    line = _one_line_exit_2(
        ["smoke", str(plan_json), "--backend", "nccl", "--dp", str(dp), "--tp", "1"], capsys
    )
    assert f"each of the {dp} ranks on its own CUDA device, and this machine has {have}" in line
    with pytest.raises(TokentapeError, match="backend must be 'gloo' or 'nccl'"):
        smoke.run_smoke(str(plan_json), 1, 1, BatchConfig(1, 1, 1), 1, backend="mpi")


def test_run_smoke_refuses_bad_sizes(plan_json):
    with pytest.raises(TokentapeError, match="tp must be a positive integer, got 0"):
        smoke.run_smoke(str(plan_json), 2, 0, BatchConfig(2, 1, 1), 1)
    with pytest.raises(TokentapeError, match="steps must be a positive integer, got 0"):
        smoke.run_smoke(str(plan_json), 2, 1, BatchConfig(2, 1, 1), 0)


def _edited_plan(plan_json: Path, tmp_path: Path, path_of_source_0: str) -> Path:
    data = json.loads(plan_json.read_text())
    data["sources"][0]["path"] = path_of_source_0
    out = tmp_path / "plan.json"
    out.write_text(json.dumps(data))
    return out


def test_smoke_refuses_a_bad_plan_or_store_in_one_line(plan_json, tmp_path, capsys):
    line = _one_line_exit_2(["smoke", str(tmp_path / "none.json")], capsys)
    assert "no such file" in line
    moved = _edited_plan(plan_json, tmp_path, str(tmp_path / "moved-away"))
    line = _one_line_exit_2(["smoke", str(moved)], capsys)
    assert "moved-away" in line
    other_store = json.loads(plan_json.read_text())["sources"][1]["path"]
    changed = _edited_plan(plan_json, tmp_path, other_store)  # another store's content
    line = _one_line_exit_2(["smoke", str(changed)], capsys)
    assert "changed since the plan was made" in line or "re-run `tokentape plan`" in line


# --- the verifier on its own -------------------------------------------------------------------


def rep(rank: int, dp: int, positions: list[int], h: bytes = b"a", consumed: int = 0,
        dp_size: int = 2) -> RankReport:  # fmt: skip
    contiguous = positions == list(range(positions[0], positions[0] + len(positions)))
    return RankReport(rank, dp, 0, consumed, dp_size, len(positions), 1, positions[0],
                      len(positions), contiguous, h.ljust(32, b"\0"))  # fmt: skip


def test_verify_catches_each_violation():
    good = [rep(0, 0, [0, 1]), rep(1, 0, [0, 1]), rep(2, 1, [2, 3]), rep(3, 1, [2, 3])]
    assert verify(good, model_parallel_size=2) == []
    assert verify(good) == []
    assert verify([good[0], good[2], good[1], good[3]]) == []  # any layout of ranks
    tp_differs = [*good[:3], rep(3, 1, [2, 3], h=b"b")]
    assert any("model-parallel peers [2, 3]" in p for p in verify(tp_differs, 2))
    overlap = [rep(0, 0, [0, 1]), rep(1, 0, [0, 1]), rep(2, 1, [1, 2]), rep(3, 1, [1, 2])]
    problems = verify(overlap, 2)
    assert any("positions [1, 2) read by dp ranks 0 and 1" in p for p in problems)
    assert any("dp rank 1 (ranks [2, 3]) read [1, 3), expected [2, 4)" in p for p in problems)
    assert any("are not [0, 4)" in p for p in problems)
    swapped = [rep(0, 1, [0, 1]), rep(1, 1, [0, 1]), rep(2, 0, [2, 3]), rep(3, 0, [2, 3])]
    assert any("dp rank 0 (ranks [2, 3]) read [2, 4)" in p for p in verify(swapped))
    assert any("expected 2" in p for p in verify([*good[:3], rep(3, 0, [0, 1])], 2))
    assert any("not a multiple of dp_size 2" in p for p in verify(good[:3]))
    assert any("model_parallel_size 1 x dp_size 2" in p for p in verify(good, 1))
    missing = [rep(0, 0, [0, 1]), rep(1, 0, [0, 1])]
    assert any("dp ranks [1]: no rank reported them" in p for p in verify(missing))
    outside = [*good[:3], rep(3, 2, [2, 3])]
    assert any("ranks [3] claim dp rank 2, outside [0, 2)" in p for p in verify(outside))
    gap = [rep(0, 0, [0, 1]), rep(1, 1, [2, 4])]
    assert any("rank 1: its positions are not one contiguous run" in p for p in verify(gap))
    behind = [*good[:3], rep(3, 1, [6, 7], consumed=4)]
    assert verify(behind)[0].startswith("ranks are not at the same step")


def test_a_report_round_trips_through_its_int64_record():
    r = RankReport(5, 2, 7, 10**12, 4, 3, 2, 10**12 + 12, 6, False, bytes(range(32)))
    record = r.to_record()
    assert record.dtype == np.int64 and record.shape == (smoke.RECORD_WIDTH,)
    assert RankReport.from_record(record) == r

"""Check, in real ``torch.distributed`` processes, that ranks get the data the contract promises:
tensor-parallel peers identical inputs, data-parallel ranks disjoint positions, and their union
exactly the step's positions.

``check_step`` is the library form, for a user's own training script and process groups;
``run_smoke`` launches ``dp · tp`` gloo processes on this machine (``tokentape smoke``).
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch.distributed as dist
import torch.multiprocessing as mp

from tokentape.errors import TokentapeError
from tokentape.tape.plan import load_plan
from tokentape.train.loader import Loader, Step
from tokentape.train.partition import BatchConfig


@dataclass(frozen=True)
class RankReport:
    """What one rank read in one step: enough to compare ranks without moving tokens."""

    rank: int
    dp_rank: int
    step: int
    consumed: int
    positions: tuple[int, ...]
    inputs_hash: str


def report(step: Step, rank: int, dp_rank: int) -> RankReport:
    h = hashlib.sha256()
    positions: list[int] = []
    for micro in step.micro_batches:
        h.update(np.ascontiguousarray(micro.tokens, dtype="<i8"))
        positions += micro.positions.tolist()
    return RankReport(rank, dp_rank, step.step, step.consumed, tuple(positions), h.hexdigest())


def verify(reports: list[RankReport], tp_size: int, global_batch: int) -> list[str]:
    """Violations of the contract among one step's reports (empty when all is well)."""
    problems = []
    by_dp: dict[int, list[RankReport]] = {}
    for r in reports:
        by_dp.setdefault(r.dp_rank, []).append(r)
    for dp_rank, peers in sorted(by_dp.items()):
        if len(peers) != tp_size:
            problems.append(f"dp rank {dp_rank}: {len(peers)} peers reported, expected {tp_size}")
        if len({(p.positions, p.inputs_hash) for p in peers}) != 1:
            ranks = [p.rank for p in peers]
            problems.append(f"dp rank {dp_rank}: tensor-parallel peers {ranks} got different data")
    seen: dict[int, int] = {}
    for dp_rank, peers in sorted(by_dp.items()):
        for q in peers[0].positions:
            if q in seen:
                problems.append(f"position {q} read by dp ranks {seen[q]} and {dp_rank}")
            seen[q] = dp_rank
    consumed = reports[0].consumed
    if sorted(seen) != list(range(consumed, consumed + global_batch)):
        problems.append(
            f"step {reports[0].step}: the ranks' positions are not [{consumed}, "
            f"{consumed + global_batch})"
        )
    return problems


def check_step(step: Step, dp_rank: int, tp_size: int, group: dist.ProcessGroup | None = None):
    """Inside a training script: all-gather this step's reports and raise on any violation."""
    mine = report(step, dist.get_rank(group), dp_rank)
    everyone: list[RankReport | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    problems = verify([r for r in everyone if r is not None], tp_size, step.config.global_batch)
    if problems:
        raise TokentapeError("rank check failed: " + "; ".join(problems))


def _worker(rank: int, plan_path: str, dp: int, tp: int, config: BatchConfig, steps: int,
            init_file: str, out_dir: str) -> None:  # fmt: skip
    init = f"file://{init_file}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=dp * tp)
    try:
        dp_rank = rank // tp  # ranks of one data-parallel replica are consecutive (tp inner)
        with Loader(load_plan(plan_path), dp_rank, config) as loader:
            rows = []
            for _ in range(steps):
                step = loader.step()
                mine = report(step, rank, dp_rank)
                everyone: list[RankReport | None] = [None] * (dp * tp)
                dist.all_gather_object(everyone, mine)
                if rank == 0:
                    reports = [r for r in everyone if r is not None]
                    problems = verify(reports, tp, config.global_batch)
                    rows.append((step.step, step.consumed, reports, problems))
                loader.commit()
        if rank == 0:
            Path(out_dir, "result.txt").write_text(_render(rows, tp))
    finally:
        dist.destroy_process_group()


def _render(rows: list, tp: int) -> str:
    lines = []
    for step, consumed, reports, problems in rows:
        for r in sorted(reports, key=lambda r: r.rank):
            lo, hi = r.positions[0], r.positions[-1]
            lines.append(
                f"{step}\t{consumed}\t{r.rank}\t{r.dp_rank}\t{r.rank % tp}\t[{lo}, {hi}]\t"
                f"{r.inputs_hash[:12]}"
            )
        lines += [f"PROBLEM\t{p}" for p in problems]
    return "\n".join(lines) + "\n"


def run_smoke(plan_path: str, dp: int, tp: int, config: BatchConfig, steps: int) -> str:
    """Launch ``dp · tp`` gloo processes; returns rank 0's table (lines starting PROBLEM flag
    violations)."""
    if config.dp_size != dp:
        raise TokentapeError(f"--dp {dp} does not match the batch config's dp_size")
    load_plan(plan_path)  # fail here, with one line, on a bad plan
    with tempfile.TemporaryDirectory() as tmp:
        init_file = str(Path(tmp) / "init")
        args = (plan_path, dp, tp, config, steps, init_file, tmp)
        mp.start_processes(_worker, args=args, nprocs=dp * tp, start_method="spawn")
        return Path(tmp, "result.txt").read_text()

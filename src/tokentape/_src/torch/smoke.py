"""Check, in real ``torch.distributed`` processes, that ranks get the data the contract promises:
model-parallel peers identical inputs, data-parallel ranks disjoint positions, each the slice
the partition assigns it, and their union exactly the step's positions.

``check_step`` is the library form, for a user's own training script and process groups;
``run_smoke`` launches ``dp · tp`` gloo processes on this machine (``tokentape smoke``). Both
go through ``gather_reports``: every rank contributes one fixed-size int64 record (no Python
objects are pickled or unpickled, and a step moves ``world × 112`` bytes whatever the batch),
and every rank verifies the gathered records, so all ranks reach the same verdict.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import ProcessException, ProcessExitedException, start_processes

from tokentape._src.plan.load import load_plan
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import Loader, Step
from tokentape._src.train.partition import BatchConfig
from tokentape._src.util.checks import as_index
from tokentape.errors import ArgumentError, TokentapeError

_FIELDS = ("rank", "dp_rank", "step", "consumed", "dp_size", "micro", "accum", "first", "count",
           "contiguous")  # fmt: skip
_DIGEST_WORDS = 4  # sha256: 32 bytes as 4 little-endian int64 words
RECORD_WIDTH = len(_FIELDS) + _DIGEST_WORDS
"""int64 values one rank contributes per step."""


@dataclass(frozen=True)
class RankReport:
    """What one rank read in one step: enough to compare ranks without moving tokens.

    Its positions are ``[first, first + count)`` (``contiguous`` says whether they really were
    that run); ``digest`` is a sha256 of the positions, tokens, and segment ids / document
    positions when present, micro-batch by micro-batch."""

    rank: int
    dp_rank: int
    step: int
    consumed: int
    dp_size: int
    micro: int
    accum: int
    first: int
    count: int
    contiguous: bool
    digest: bytes

    @property
    def positions(self) -> range:
        return range(self.first, self.first + self.count)

    def to_record(self) -> np.ndarray:
        head = [int(getattr(self, name)) for name in _FIELDS]
        words = np.frombuffer(self.digest.ljust(32, b"\0")[:32], dtype="<i8")
        return np.concatenate([np.asarray(head, dtype=np.int64), words.astype(np.int64)])

    @classmethod
    def from_record(cls, record: np.ndarray) -> RankReport:
        values = [int(v) for v in record[: len(_FIELDS)]]
        fields: dict[str, Any] = dict(zip(_FIELDS, values, strict=True))
        fields["contiguous"] = bool(fields["contiguous"])
        digest = np.ascontiguousarray(record[len(_FIELDS) :], dtype="<i8").tobytes()
        return cls(**fields, digest=digest)


def report(step: Step, rank: int, dp_rank: int) -> RankReport:
    """This rank's report of ``step``."""
    h = hashlib.sha256()
    parts = []
    for micro in step.micro_batches:
        positions = np.ascontiguousarray(micro.positions, dtype="<i8").reshape(-1)
        parts.append(positions)
        h.update(positions.data)
        h.update(np.ascontiguousarray(micro.tokens, dtype="<i8").data)
        for extra in (micro.segment_ids, micro.doc_positions):
            if extra is not None:
                h.update(np.ascontiguousarray(extra, dtype="<i8").data)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    first = int(flat[0]) if flat.size else 0
    contiguous = bool(np.array_equal(flat, np.arange(first, first + flat.size)))
    c = step.config
    return RankReport(rank, dp_rank, step.step, step.consumed, c.dp_size, c.micro, c.accum,
                      first, int(flat.size), contiguous, h.digest())  # fmt: skip


def _collective_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where the group's collectives want their tensors: CPU for gloo (also the CPU half of
    ``cpu:gloo,cuda:nccl``), else the current accelerator."""
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        return torch.device(
            accelerator.current_accelerator().type, accelerator.current_device_index()
        )
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_reports(
    step: Step,
    dp_rank: int,
    group: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
) -> list[RankReport]:
    """All ranks' reports of this step (a collective: every rank of ``group`` must call it),
    in group-rank order. ``rank`` in a report is the global rank."""
    mine = torch.from_numpy(report(step, dist.get_rank(), dp_rank).to_record())
    dev = torch.device(device) if device is not None else _collective_device(group)
    world = dist.get_world_size(group)
    gather_single = getattr(dist, "all_gather_single", None)  # torch ≥ 2.13
    if gather_single is not None:
        out = torch.empty(world * RECORD_WIDTH, dtype=torch.int64, device=dev)
        gather_single(out, mine.to(dev), group=group)
    else:  # older torch: all_gather of fixed-size tensors works on every backend
        parts = [torch.empty(RECORD_WIDTH, dtype=torch.int64, device=dev) for _ in range(world)]
        dist.all_gather(parts, mine.to(dev), group=group)
        out = torch.cat(parts)
    rows = out.cpu().numpy().reshape(world, RECORD_WIDTH)
    return [RankReport.from_record(row) for row in rows]


def _ranges(items: list[tuple[int, int]]) -> str:
    return ", ".join(f"[{a}, {b})" for a, b in items)


def verify(reports: list[RankReport], model_parallel_size: int | None = None) -> list[str]:
    """Violations of the contract among one step's reports (empty when all is well).

    Groups ranks by the dp rank each reported, so any layout of ranks works. There must be
    ``len(reports) / dp_size`` ranks per dp rank (the model-parallel size: tp·pp·cp when the
    group is the whole world; checked against ``model_parallel_size`` when given), all with
    identical data; dp rank r must read ``[consumed + r·micro·accum, … + micro·accum)``; the dp
    ranks' positions must be disjoint and their union ``[consumed, consumed + B)``."""
    if not reports:
        return ["no rank reported"]
    shapes: dict[tuple[int, ...], list[int]] = {}
    for r in reports:
        shapes.setdefault((r.step, r.consumed, r.dp_size, r.micro, r.accum), []).append(r.rank)
    if len(shapes) > 1:
        described = "; ".join(
            f"step {s} consumed {c} dp {d} micro {m} accum {a} on ranks {ranks}"
            for (s, c, d, m, a), ranks in sorted(shapes.items())
        )
        return [f"ranks are not at the same step with the same batch config: {described}"]
    ref = reports[0]
    world, dp_size, per_rank = len(reports), ref.dp_size, ref.micro * ref.accum
    global_batch, consumed = dp_size * per_rank, ref.consumed
    problems = []
    peers_expected = world // dp_size if world % dp_size == 0 else None
    if peers_expected is None:
        problems.append(f"{world} ranks are not a multiple of dp_size {dp_size}")
    if model_parallel_size is not None and model_parallel_size * dp_size != world:
        problems.append(
            f"model_parallel_size {model_parallel_size} x dp_size {dp_size} is not the "
            f"{world} ranks of the group"
        )
    for r in reports:
        if not r.contiguous:
            problems.append(f"rank {r.rank}: its positions are not one contiguous run")
    by_dp: dict[int, list[RankReport]] = {}
    for r in reports:
        by_dp.setdefault(r.dp_rank, []).append(r)
    for dp_rank, peers in sorted(by_dp.items()):
        ranks = [p.rank for p in peers]
        if not 0 <= dp_rank < dp_size:
            problems.append(f"ranks {ranks} claim dp rank {dp_rank}, outside [0, {dp_size})")
            continue
        if peers_expected is not None and len(peers) != peers_expected:
            problems.append(
                f"dp rank {dp_rank}: {len(peers)} ranks {ranks} reported it, expected "
                f"{peers_expected} (ranks / dp_size)"
            )
        if len({(p.first, p.count, p.contiguous, p.digest) for p in peers}) != 1:
            problems.append(f"dp rank {dp_rank}: model-parallel peers {ranks} got different data")
        lo = consumed + dp_rank * per_rank
        read = sorted({(p.first, p.first + p.count) for p in peers})
        if read != [(lo, lo + per_rank)]:
            problems.append(
                f"dp rank {dp_rank} (ranks {ranks}) read {_ranges(read)}, expected "
                f"{_ranges([(lo, lo + per_rank)])}"
            )
    missing = sorted(set(range(dp_size)) - set(by_dp))
    if missing:
        problems.append(f"dp ranks {missing}: no rank reported them")
    # Disjoint across dp ranks, union = the step: a sweep over the distinct ranges read.
    spans = sorted({(p.first, p.first + p.count, d) for d, ps in by_dp.items() for p in ps})
    reach: tuple[int, int, int] | None = None  # the span reaching furthest so far
    merged: list[list[int]] = []
    for a, b, d in spans:
        if reach is not None and a < reach[1] and reach[2] != d:
            problems.append(
                f"positions {_ranges([(a, min(b, reach[1]))])} read by dp ranks {reach[2]} and {d}"
            )
        if reach is None or b > reach[1]:
            reach = (a, b, d)
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        elif b > a:
            merged.append([a, b])
    if merged != [[consumed, consumed + global_batch]]:
        problems.append(
            f"step {ref.step}: the ranks' positions {_ranges([(a, b) for a, b in merged])} are "
            f"not [{consumed}, {consumed + global_batch})"
        )
    return problems


def check_step(
    step: Step,
    dp_rank: int,
    model_parallel_size: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    tp_size: int | None = None,
    device: torch.device | str | None = None,
) -> list[RankReport]:
    """Inside a training script, on every rank of ``group`` (default: the world) after
    ``loader.step()``: gather what each rank read and raise ``TokentapeError`` on any violation
    (every rank raises the same). Returns the reports when all is well.

    ``dp_rank`` is this rank's data-parallel rank, the one its loader was built with; ranks are
    grouped by the dp rank they report, so any layout of ranks works (model-parallel inner or
    outer). Every rank of the group takes part: ``world / step.config.dp_size`` ranks per dp
    rank — with tensor, pipeline and context parallelism over the whole world that is
    ``tp · pp · cp``. Pass ``model_parallel_size`` to have that number checked too
    (``tp_size`` is its former name). ``device`` overrides where the collective's tensor lives
    (default: CPU for gloo, the current accelerator otherwise).

    Args:
        step: What this rank's loader handed out (``loader.step()``).
        dp_rank: This rank's data-parallel rank, the one its loader was built with.
        model_parallel_size: Ranks per data-parallel rank, checked when given.
        group: The process group to check over (default: the world).
        tp_size: The former name of ``model_parallel_size``.
        device: Where the collective's tensor lives.

    Returns:
        One report per rank of the group.

    Raises:
        TokentapeError: A rank read another rank's positions, or model-parallel peers read
            different inputs (every rank raises the same).
        ArgumentError: An argument of the wrong type (checked before the collective), or
            ``tp_size`` and ``model_parallel_size`` disagree, or a size is invalid.
    """
    if not isinstance(step, Step):
        raise ArgumentError(f"step must be a Step (what loader.step() returned), got {step!r}")
    as_index("dp_rank", dp_rank)
    for name, size in (("model_parallel_size", model_parallel_size), ("tp_size", tp_size)):
        if size is not None:
            _positive(name, size)
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise ArgumentError(f"group must be a torch.distributed process group, got {group!r}")
    if device is not None and not isinstance(device, torch.device | str):
        raise ArgumentError(f"device must be a torch.device, its name or None, got {device!r}")
    if tp_size is not None:
        if model_parallel_size is not None and model_parallel_size != tp_size:
            raise ArgumentError("check_step: give model_parallel_size or tp_size (its old name)")
        model_parallel_size = tp_size
    reports = gather_reports(step, dp_rank, group, device)
    problems = verify(reports, model_parallel_size)
    if problems:
        steps = sorted({r.step for r in reports})  # the same on every rank, so is the message
        where = f" at step {steps[0]}" if len(steps) == 1 else ""
        raise TokentapeError(f"rank check failed{where}: " + "; ".join(problems))
    return reports


# --- tokentape smoke: dp · tp gloo processes on this machine -------------------------------


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= 500 else text[:497] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _guarded(rank: int, out_dir: str, fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(rank, *args)`` in a spawned process; on failure leave one line for the parent
    (as text: nothing is unpickled) and exit 1."""
    try:
        fn(rank, *args)
    except Exception as exc:
        Path(out_dir, f"error-{rank}.txt").write_text(_one_line(exc) + "\n")
        sys.stderr.flush()
        sys.exit(1)


def _failure(exc: ProcessException, out_dir: str) -> str:
    """One line for a failed worker: the rank that failed first and its error."""
    errors = {}
    for path in Path(out_dir).glob("error-*.txt"):
        errors[int(path.stem.split("-")[1])] = path.read_text().strip()
    rank = exc.error_index
    if rank in errors:
        return f"smoke: rank {rank} failed: {errors[rank]}"
    if isinstance(exc, ProcessExitedException):
        how = (
            f"was killed by {exc.signal_name}" if exc.signal_name
            else f"exited with code {exc.exit_code}"
        )  # fmt: skip
        if errors:  # it died without a word, but others said why
            other = min(errors)
            return f"smoke: rank {rank} {how}; rank {other} failed: {errors[other]}"
        return f"smoke: rank {rank} {how}"
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"smoke: rank {rank} failed: {lines[-1].strip() if lines else type(exc).__name__}"


def launch(fn: Callable[..., None], args: tuple[object, ...], nprocs: int) -> None:
    """Spawn ``nprocs`` processes running ``fn(rank, *args)``; a failure of any comes back as one
    ``TokentapeError`` line (the others are stopped)."""
    with tempfile.TemporaryDirectory(prefix="tokentape-launch-") as errors:
        try:
            # torch leaves start_processes unannotated
            start_processes(  # type: ignore[no-untyped-call]
                _guarded, args=(errors, fn, *args), nprocs=nprocs, start_method="spawn"
            )
        except ProcessException as exc:
            raise TokentapeError(_failure(exc, errors)) from None


def _worker(rank: int, plan_path: str, dp: int, tp: int, micro: int, accum: int, steps: int,
            init_file: str, out_dir: str, backend: str = "gloo") -> None:  # fmt: skip
    if backend == "nccl":
        torch.cuda.set_device(rank)  # one device per rank: NCCL refuses two ranks on one
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=dp * tp, timeout=timedelta(seconds=120))  # fmt: skip
    try:
        dp_rank = rank // tp  # ranks of one data-parallel replica are consecutive (tp inner)
        with Loader(load_plan(plan_path), dp_rank, BatchConfig(dp, micro, accum)) as loader:
            rows = []
            for _ in range(steps):
                step = loader.step()
                reports = gather_reports(step, dp_rank)  # the same path as check_step
                problems = verify(reports, tp)
                rows.append((step.step, step.consumed, reports, problems))
                loader.commit()
        if rank == 0:
            Path(out_dir, "result.txt").write_text(_render(rows, tp))
    finally:
        dist.destroy_process_group()


def _render(rows: list[tuple[int, int, list[RankReport], list[str]]], tp: int) -> str:
    lines = []
    for step, consumed, reports, problems in rows:
        for r in sorted(reports, key=lambda r: r.rank):
            span = f"[{r.first}, {r.first + r.count - 1}]"
            lines.append(
                f"{step}\t{consumed}\t{r.rank}\t{r.dp_rank}\t{r.rank % tp}\t{span}\t"
                f"{r.digest.hex()[:12]}"
            )
        lines += [f"PROBLEM\t{p}" for p in problems]
    return "\n".join(lines) + "\n"


MAX_PROCESSES = 64
"""Most gloo processes one smoke check starts: every rank runs on this machine."""


def check_smoke_args(dp: int, tp: int, global_batch: int, steps: int) -> None:
    """Refuse a check this machine cannot run, before anything starts (one line)."""
    if dp * tp > MAX_PROCESSES:
        raise ArgumentError(
            f"dp {dp} x tp {tp} = {dp * tp} processes: smoke runs every rank on this machine, "
            f"at most {MAX_PROCESSES}"
        )
    if steps * global_batch > MAX_POSITION:
        raise ArgumentError(
            f"{steps} steps of {global_batch} samples go beyond position 2**62; check fewer steps"
        )


def check_backend(backend: str, ranks: int) -> None:
    """Refuse a backend this machine cannot run ``ranks`` processes of (one line)."""
    if backend == "gloo":
        return
    if backend != "nccl":
        raise ArgumentError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if devices < ranks:
        raise ArgumentError(
            f"--backend nccl puts each of the {ranks} ranks on its own CUDA device, and this "
            f"machine has {devices}; use fewer ranks (--dp x --tp) or --backend gloo"
        )


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{name} must be a positive integer, got {value!r}")
    return value


def run_smoke(
    plan_path: str, dp: int, tp: int, config: BatchConfig, steps: int, backend: str = "gloo"
) -> str:
    """Launch ``dp · tp`` processes in a ``backend`` group (``gloo`` on CPU, or ``nccl`` with
    rank r on CUDA device r); returns rank 0's table (lines starting PROBLEM flag violations).
    Bad arguments, a bad plan, a moved or changed store, too few CUDA devices for ``nccl`` and
    a failed worker all raise one-line ``TokentapeError``s."""
    for name, value in (("dp", dp), ("tp", tp), ("steps", steps)):
        _positive(name, value)
    check_backend(backend, dp * tp)
    if config.dp_size != dp:
        raise ArgumentError(f"dp {dp} does not match the batch config's dp_size {config.dp_size}")
    check_smoke_args(dp, tp, config.global_batch, steps)
    Batcher(load_plan(plan_path))  # here, with one line: a bad plan, a moved or changed store
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        args = (os.fspath(plan_path), dp, tp, config.micro, config.accum, steps, init_file, tmp,
                backend)  # fmt: skip
        launch(_worker, args, dp * tp)
        return Path(tmp, "result.txt").read_text()


__all__ = [
    "RECORD_WIDTH",
    "RankReport",
    "check_backend",
    "check_smoke_args",
    "check_step",
    "gather_reports",
    "launch",
    "report",
    "run_smoke",
    "verify",
]

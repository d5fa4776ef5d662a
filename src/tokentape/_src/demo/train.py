"""The demo's training section: simulated data-parallel ranks, a crash, an elastic resume.

Every "rank" is a ``Loader`` in this process. A phase trains some steps with one shape
(dp, micro, accum), checkpointing the data state every few steps; a phase may "crash" — the
steps after its last checkpoint are lost, as in a real run — and the next phase resumes from
that checkpoint with another dp size. The demo then proves the contract from the records:
within each step the ranks' positions are disjoint and cover the step; over the run every
position in [0, consumed) was applied exactly once; the step log, read back, is contiguous and
each line's tokens hash equals the hash of what the ranks were given.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.audit.losslog import read_loss_lines
from tokentape._src.plan.plan import Plan
from tokentape._src.train.batch import Batch
from tokentape._src.train.loader import Loader, Step, step_tokens_hash
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.steplog import read_step_log
from tokentape._src.util.text import fmt_int, table


@dataclass(frozen=True)
class Phase:
    config: BatchConfig
    until_step: int  # train until this step count
    crash: bool  # lose the steps after the last checkpoint


@dataclass
class Run:
    """What the simulated trainer applied: positions per committed step, and step hashes."""

    checkpoint: dict[str, Any] | None = None
    applied: dict[int, np.ndarray] | None = None  # step → positions applied (all ranks)
    given: dict[int, str] | None = None  # step → tokens hash of what the ranks were given
    rank_problems: int = 0
    redone: int = 0
    checkpoints: dict[int, dict[str, Any]] | None = None  # step → every data state saved


CHECKPOINT_EVERY = 5
REPETITIVE = 0.2  # a window with fewer distinct tokens than this share counts as repetition
BURST = 1 / 8  # a step with more repetitive windows than this share is a burst
BURST_PENALTY = 8.0


def stand_in_losses(tokens: np.ndarray, step: int) -> np.ndarray:
    """Not a model: each row's loss is a smooth decaying curve, plus small noise seeded by the
    step, plus 2 if the window is near-total repetition (fewer than 20% distinct tokens) — 8
    when such windows make up more than 1 in 8 of the step (a burst). It stands in for a
    trainer whose loss jumps on a burst of repeated text."""
    distinct = np.array([np.unique(row).size for row in tokens]) / tokens.shape[1]
    repetitive = distinct < REPETITIVE
    penalty = BURST_PENALTY if repetitive.mean() > BURST else 2.0
    noise = float(np.random.default_rng(step).normal(0.0, 0.01))
    base = 2.3 + 1.7 * float(np.exp(-step / 25)) + noise
    return np.asarray(base + penalty * repetitive.astype(np.float64), dtype=np.float64)


def loss_line(whole: Batch, step: int, names: list[str], seq_len: int) -> dict[str, Any]:
    """The loss log's line of a step (as ``examples/train_tiny.py`` writes it): the step's
    loss, and each source's mean row loss and tokens, from the rows' sources."""
    rows = stand_in_losses(whole.tokens, step)
    by_source, tokens = {}, {}
    for d, name in enumerate(names):
        mine = whole.source == d
        if mine.any():
            by_source[name] = round(float(rows[mine].mean()), 4)
            tokens[name] = int(mine.sum()) * seq_len
    return {"step": step, "consumed": int(whole.positions[0]),
            "loss": round(float(rows.mean()), 4), "loss_by_source": by_source,
            "tokens_by_source": tokens}  # fmt: skip


def read_losses(path: Path, names: list[str]) -> dict[int, float]:
    """step → loss of the steps applied (the loss log's reader: a line for step s supersedes
    every earlier line of step s or later, as in the step log)."""
    lines = read_loss_lines(path, names)
    return dict(zip(lines.step.tolist(), lines.loss.tolist(), strict=True))


def _whole_step(steps: list[Step]) -> Batch:
    """The ranks' micro-batches of one step, concatenated in position order."""
    parts = [m for s in steps for m in s.micro_batches]
    positions = np.concatenate([m.positions for m in parts])
    order = np.argsort(positions, kind="stable")
    columns = [np.concatenate([getattr(m, f) for m in parts])[order]
               for f in ("positions", "source", "epoch", "sample", "tokens")]  # fmt: skip
    return Batch(*columns)


def _ranks_ok(steps: list[Step]) -> bool:
    """Disjoint positions whose union is exactly the step's [consumed, consumed + B)."""
    positions = np.concatenate([m.positions for s in steps for m in s.micro_batches])
    b, consumed = steps[0].config.global_batch, steps[0].consumed
    return np.array_equal(np.sort(positions), np.arange(consumed, consumed + b))


def run_phase(plan: Plan, phase: Phase, run: Run, log: Path, loss_log: Path) -> list[Any]:
    """Train one phase; returns its row for the table."""
    dp = phase.config.dp_size
    loaders = [
        Loader(plan, r, phase.config, step_log=log if r == 0 else None, prefetch=1)
        for r in range(dp)
    ]
    applied, given = dict(run.applied or {}), dict(run.given or {})
    if run.checkpoint is not None:
        for loader in loaders:
            loader.load_state_dict(run.checkpoint)
    start = loaders[0].state.consumed
    run.redone += sum(1 for s in applied if s >= loaders[0].state.step)
    applied = {s: p for s, p in applied.items() if s < loaders[0].state.step}
    while loaders[0].state.step < phase.until_step:
        steps = [lo.step() for lo in loaders]
        run.rank_problems += not _ranks_ok(steps)
        whole = _whole_step(steps)
        applied[steps[0].step] = whole.positions  # "optimizer.step()" on every rank, then:
        given[steps[0].step] = step_tokens_hash(whole, plan)
        line = loss_line(whole, steps[0].step, [s.name for s in plan.sources], plan.seq_len)
        with open(loss_log, "a") as f:  # as a trainer's rank 0 would, every step
            f.write(json.dumps({**line, "time": round(time.time(), 3)}) + "\n")
        for lo in loaders:
            lo.commit()
        if loaders[0].state.step % CHECKPOINT_EVERY == 0:
            run.checkpoint = loaders[0].state_dict()
            if run.checkpoints is not None:
                run.checkpoints[loaders[0].state.step] = run.checkpoint
    for lo in loaders:
        lo.close()
    end = loaders[0].state.consumed
    lost = ""
    if phase.crash:  # the process dies: what came after the last checkpoint is gone
        saved = run.checkpoint["step"] if run.checkpoint else 0
        lost = f"crash: steps {saved}..{loaders[0].state.step - 1} lost"
    else:
        run.checkpoint = loaders[0].state_dict()
    run.applied, run.given = applied, given
    c = phase.config
    return [dp, c.micro, c.accum, c.global_batch, f"{start}..{end}", lost or "checkpoint"]


@dataclass(frozen=True)
class Trained:
    ok: bool  # every check held
    checkpoint: dict[str, Any]  # the final data state
    step_log: Path
    loss_log: Path
    checkpoints: dict[int, dict[str, Any]]  # step → every data state saved on the way


def simulate_training(plan: Plan, root: Path, phases: list[Phase]) -> Trained:
    """Run the phases; print the table and the proofs."""
    log, loss_log = root / "steps.jsonl", root / "loss.jsonl"
    log.unlink(missing_ok=True)
    loss_log.unlink(missing_ok=True)
    run = Run(checkpoints={})
    rows = [run_phase(plan, phase, run, log, loss_log) for phase in phases]
    print(table(["dp", "micro", "accum", "global batch", "consumed start..end", "then"], rows))
    assert run.applied is not None and run.given is not None
    # Only what was applied before a checkpoint that a later phase resumed from counts.
    final = run.checkpoint["consumed"] if run.checkpoint else 0
    applied = np.concatenate([run.applied[s] for s in sorted(run.applied)])
    exact = np.array_equal(np.sort(applied), np.arange(final))
    records = read_step_log(log)
    hashes_ok = all(r.tokens_hash == run.given[r.step] for r in records)
    contiguous = len(records) == len(run.applied) and (
        records[-1].consumed + records[-1].global_batch == final
    )
    digest = hashlib.sha256(applied.astype("<i8").tobytes()).hexdigest()[:16]
    checks = [
        ("every step: ranks disjoint, union = [consumed, consumed + B)", run.rank_problems == 0),
        (f"every position in [0, {fmt_int(final)}) applied exactly once", exact),
        (
            f"step log: {len(records)} steps contiguous, {run.redone} redone after a crash",
            contiguous,
        ),
        ("step log tokens hash = hash of the batches the ranks got, every step", hashes_ok),
    ]
    print()
    for text, ok in checks:
        print(f"  [{'ok' if ok else 'FAILED'}] {text}")
    print(f"  applied positions digest {digest}; step log {log}, loss log {loss_log}")
    assert run.checkpoint is not None
    saved = run.checkpoints or {}
    return Trained(all(ok for _, ok in checks), run.checkpoint, log, loss_log, saved)


__all__ = [
    "CHECKPOINT_EVERY",
    "Phase",
    "Run",
    "Trained",
    "loss_line",
    "read_losses",
    "run_phase",
    "simulate_training",
    "stand_in_losses",
]

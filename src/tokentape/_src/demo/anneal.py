"""The demo's last section: an annealing phase appended to the running plan. The run resumes on
it from its checkpoint (accepted: nothing below ``consumed`` changes, and the change is
recorded), trains on, and every earlier step still replays exactly with the newer plan; a
phase that would start before ``consumed`` is refused, naming the first position it changes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tokentape._src.audit.replay import replay
from tokentape._src.audit.runs import log_schedule
from tokentape._src.demo.audit import heading
from tokentape._src.demo.train import Phase, Run, Trained, run_phase
from tokentape._src.plan.plan import Plan, check_budgets, resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.store.atomic import write_atomic
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import hash_dtype
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState
from tokentape._src.train.steplog import read_step_log
from tokentape._src.util.text import fmt_int, table
from tokentape.errors import ResumeRefused

ANNEAL_WEIGHTS = "{ prose = 2, code = 1, notes = 1 }"
ANNEAL_HORIZON = 'total_tokens = "1M"'
"""The annealed run ends sooner: its last stretch, from the checkpoint on, anneals."""
ANNEAL_STEPS = 10


def annealed_plan(root: Path, start: int, name: str) -> tuple[Path, Plan]:
    """The demo's plan file with a phase appended from position ``start``, resolved."""
    text = re.sub(
        r"^total_tokens = .*$", ANNEAL_HORIZON, (root / "plan.toml").read_text(), flags=re.M
    )
    text += f"\n[[phase]]\nstart_samples = {start}\nweights = {ANNEAL_WEIGHTS}\n"
    path = root / f"{name}.toml"
    path.write_text(text)
    plan = resolve_plan(load_plan_spec(path), str(path))
    check_budgets(plan, str(path))
    write_atomic(root / f"{name}.json", plan.to_json().encode())
    return path, plan


def anneal_story(root: Path, plan: Plan, trained: Trained) -> bool:
    """Section 14 of the demo; True when the change is accepted, the past replays the same
    under the newer plan, and a change to the past is refused."""
    checkpoint = trained.checkpoint
    consumed, step = checkpoint["consumed"], checkpoint["step"]
    heading(14, "Anneal: append a phase to the running plan, resume, then try the past")
    path, annealed = annealed_plan(root, consumed, "plan-anneal")
    print(f"  {path}: the plan ending sooner, and annealing from the checkpoint's consumed on:")
    print(f"    {ANNEAL_HORIZON}\n    ...\n    [[phase]]\n    start_samples = {consumed}")
    print(f"    weights = {ANNEAL_WEIGHTS}\n")
    state = DataState.from_dict(checkpoint).resume_on(annealed)
    change = state.plan_changes[-1]
    print(
        f"  resume at step {step} on it: accepted; the data state records the change at consumed "
        f"{fmt_int(change.consumed)}\n    {change.old_index_hash[:23]}… → "
        f"{change.new_index_hash[:23]}…\n"
    )
    run = Run(checkpoint=checkpoint, applied={}, given={})
    config = BatchConfig(8, 2, 2)
    row = run_phase(annealed, Phase(config, step + ANNEAL_STEPS, crash=False), run,
                    trained.step_log, trained.loss_log)  # fmt: skip
    print(table(["dp", "micro", "accum", "global batch", "consumed start..end", "then"], [row]))
    tape = annealed.tape()
    before = tape.resolve(np.arange(consumed - ANNEAL_STEPS * 32, consumed)).source
    after = tape.resolve(np.arange(consumed, consumed + ANNEAL_STEPS * 32)).source
    shares = [
        [s.name, f"{np.mean(before == d):.0%}", f"{np.mean(after == d):.0%}"]
        for d, s in enumerate(annealed.sources)
    ]
    print("\n" + table(["source", f"{ANNEAL_STEPS} steps before", f"{ANNEAL_STEPS} steps after"],
                       shares))  # fmt: skip
    records = read_step_log(trained.step_log)
    schedule = log_schedule(str(trained.step_log), annealed)
    batcher = Batcher(annealed, hash_dtype(annealed))
    same = all(
        replay(annealed, r.step, schedule, batcher).tokens_hash == r.tokens_hash
        for r in records[:: max(1, len(records) // 12)]
    )
    plans = sorted({r.index_hash[:23] for r in records})
    print(
        f"\n  the step log names the plan in force at each step ({len(plans)} plans); replayed "
        f"with the annealed plan,\n  steps before and after the change give the tokens hash "
        f"the loader logged: {'yes' if same else 'NO'}"
    )
    _, early = annealed_plan(root, consumed // 2, "plan-anneal-early")
    print(f"\n  the same phase from sample {fmt_int(consumed // 2)}, before consumed:")
    refused = False
    try:
        DataState.from_dict(run.checkpoint or checkpoint).resume_on(early)
    except ResumeRefused as exc:
        refused = True
        print(f"    refused: {str(exc).split('. The checkpoint')[0]}")
    return same and refused and change.consumed == consumed


__all__ = ["anneal_story", "annealed_plan"]

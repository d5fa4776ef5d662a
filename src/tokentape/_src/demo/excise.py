"""The demo's remedy for the spike, inside the run: go back to the last checkpoint before the
spike, excise the document behind it from there on, resume (accepted), and train past the
spike. Proved from the records: no step from the checkpoint on trains a window of the
document, every step before the checkpoint replays with the logged tokens hash under the
excised plan, and the spike is gone from the loss."""

from __future__ import annotations

import shutil
from pathlib import Path

from tokentape._src.audit.replay import replay, top_documents
from tokentape._src.audit.runs import log_schedule
from tokentape._src.demo.audit import Spike, heading, run_command
from tokentape._src.demo.train import Phase, Run, Trained, read_losses, run_phase
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import hash_dtype
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState
from tokentape._src.train.steplog import read_step_log
from tokentape._src.util.text import fmt_int, table

AFTER = 6
"""Steps trained past the spike on the excised plan."""


def excise_story(n: int, root: Path, plan: Plan, trained: Trained, spike: Spike) -> bool:
    """Section ``n`` of the demo; True when the resume is accepted and every proof holds."""
    heading(n, "Excise it: back to the checkpoint before the spike, leave the dump out, go on")
    before = [s for s in trained.checkpoints if s < spike.step]
    if not before or spike.id is None:
        print("  no checkpoint before the spike, or no id recorded: nothing to show")
        return False
    at = max(before)
    checkpoint = trained.checkpoints[at]
    consumed = checkpoint["consumed"]
    print(
        f"  the last checkpoint before step {spike.step}: step {at}, consumed {fmt_int(consumed)}"
    )
    new_path = root / "plan-excised.json"
    code = run_command(["excise", str(root / "plan.json"), "--from-consumed", str(consumed),
                        "--id", spike.id, "--out", str(new_path)])  # fmt: skip
    excised = load_plan(new_path)
    state = DataState.from_dict(checkpoint).resume_on(excised)
    change = state.plan_changes[-1]
    print(
        f"\n  resume at step {at} on it: accepted; the data state records the change at "
        f"consumed {fmt_int(change.consumed)}\n"
    )
    log, losses = root / "steps-excised.jsonl", root / "loss-excised.jsonl"
    shutil.copyfile(trained.step_log, log)  # the run's own log goes on (the steps redone)
    shutil.copyfile(trained.loss_log, losses)
    run = Run(checkpoint=checkpoint, applied={}, given={})
    row = run_phase(excised, Phase(BatchConfig(8, 2, 2), spike.step + AFTER, crash=False), run,
                    log, losses)  # fmt: skip
    print(table(["dp", "micro", "accum", "global batch", "consumed start..end", "then"], [row]))
    schedule = log_schedule(str(log), excised)
    batcher = Batcher(excised, hash_dtype(excised))
    d = [s.name for s in excised.sources].index(spike.source)
    clean = all(
        all((h.source, h.doc) != (d, spike.doc)
            for h in top_documents(replay(excised, step, schedule, batcher), batcher))
        for step in range(at, spike.step + AFTER)
    )  # fmt: skip
    records = {r.step: r for r in read_step_log(trained.step_log)}
    same = all(
        replay(excised, step, schedule, batcher).tokens_hash == records[step].tokens_hash
        for step in range(at)
    )
    names = [s.name for s in excised.sources]
    old, new = read_losses(trained.loss_log, names), read_losses(losses, names)
    print(
        f"\n  steps {at}..{spike.step + AFTER - 1} replayed on the excised plan: no window of "
        f"{spike.source} #{spike.doc}: {'yes' if clean else 'NO'}"
    )
    print(
        f"  steps 0..{at - 1} replayed on it give the tokens hash the run logged: "
        f"{'yes' if same else 'NO'}"
    )
    print(
        f"  the stand-in loss at step {spike.step}: {old[spike.step]:.3f} before, "
        f"{new[spike.step]:.3f} now\n"
    )
    code |= run_command(["replay", str(new_path), "--step", str(spike.step), "--log", str(log),
                         "--top", "3"])  # fmt: skip
    print()
    code |= run_command(["locate", str(new_path), "--id", spike.id, "--log", str(log), "--limit",
                         "4"])  # fmt: skip
    return clean and same and code == 0 and change.consumed == consumed


__all__ = ["excise_story"]

"""The demo's audit story (the article's worked example): a loss spike, the replay of its step,
the document behind it (named by its file, line and id), every step that document lands in;
then the fix of the article — a re-tokenized source under a new index hash, which a resume from
the old checkpoint refuses (the remedy inside the run, excision, is ``demo.excise``)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from tokentape._src.audit.replay import replay, top_documents
from tokentape._src.audit.runs import log_schedule
from tokentape._src.cli import app
from tokentape._src.demo.train import Trained, read_losses
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan, resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.store.atomic import write_atomic
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import Loader, hash_dtype
from tokentape._src.train.partition import BatchConfig
from tokentape._src.util.text import fmt_int, table
from tokentape.errors import TokentapeError

PLANTED = "healthd[812]: heartbeat ok"  # the planted log line (see tokentape._src.corpora)


def heading(n: int, title: str) -> None:
    print(f"\n== {n}. {title} " + "=" * max(0, 72 - len(title)))


def run_command(args: list[str]) -> int:
    """Show a ``tokentape`` command line, then run it in this process."""
    print("  $ tokentape " + shlex.join(args) + "\n")
    return app.main(args)


def worst_step(losses: dict[int, float]) -> tuple[int, float, float]:
    """The step whose loss jumped most above the step before: (step, before, at)."""
    jumps = {s: losses[s] - losses[s - 1] for s in losses if s - 1 in losses}
    step = max(jumps, key=lambda s: jumps[s])
    return step, losses[step - 1], losses[step]


@dataclass(frozen=True)
class Spike:
    """What the audit found: the spike's step and the document on top of it."""

    ok: bool
    """The planted document was found on top, and every command succeeded."""
    step: int
    source: str
    doc: int
    id: str | None
    """The document's id, as tokenize recorded it."""


def loss_spike_story(root: Path, plan: Plan, trained: Trained) -> Spike:
    """Sections 8-11 of the demo: the spike, its replay, its document located by id, the
    stores verified."""
    plan_json = str(root / "plan.json")
    log = str(trained.step_log)

    heading(8, "A loss spike: the worst step in the loss log")
    losses = read_losses(trained.loss_log, [s.name for s in plan.sources])
    step, before, at = worst_step(losses)
    around = [s for s in range(step - 3, step + 4) if s in losses]
    print(table(["step", "loss"], [[s, f"{losses[s]:.3f}"] for s in around]))
    print(f"\n  the loss jumps from {before:.3f} to {at:.3f} at step {step}")

    heading(9, f"Replay step {step}: its exact batch, rebuilt offline")
    code = run_command(["replay", plan_json, "--step", str(step), "--log", log, "--top", "5"])
    batcher = Batcher(plan, hash_dtype(plan))
    replayed = replay(plan, step, log_schedule(log, plan), batcher)
    top = top_documents(replayed, batcher)[0]
    source = plan.sources[top.source].name
    store = batcher.sources[top.source]
    planted = PLANTED in store.decode(store.doc(top.doc)[:64])
    origin = store.provenance(top.doc)
    print(
        f"\n  the top document, {source} #{top.doc}, fills {top.windows} of the step's "
        f"{replayed.global_batch} windows; it is the planted log dump: {'yes' if planted else 'NO'}"
    )
    if origin is not None:
        print(f"  it came from {origin.where}, id {origin.id}: the record to go and look at")

    handle = ["--id", origin.id] if origin is not None and origin.id else [source, str(top.doc)]
    heading(10, "Locate it by its id: every step it lands in")
    code |= run_command(["locate", plan_json, *handle, "--log", log, "--limit", "8"])
    print("\n  the per-sample shuffle spreads its windows over the whole run; the spike is the")
    print("  step where chance put the most of them together")

    heading(11, "Verify the stores against their manifests")
    code |= run_command(["verify", plan_json])
    return Spike(
        planted and code == 0, step, source, top.doc, None if origin is None else origin.id
    )


def retokenize_story(
    n: int, root: Path, plan: Plan, trained: Trained, spike: Spike, prose_inputs: Path,
    tokenizer: Path, workers: int,
) -> bool:  # fmt: skip
    """The article's fix (section ``n``): re-tokenize with the repetition filter; True when a
    resume from the old checkpoint on the new plan is refused."""
    source = spike.source
    heading(n, "The other fix: re-tokenize with the repetition filter, under a new index")
    fixed = root / "stores" / f"{source}-filtered"
    summary = tokenize(
        TokenizeConfig(
            inputs=(str(prose_inputs),),
            out=str(fixed),
            tokenizer=str(tokenizer),
            filters=("unique-lines",),
            workers=workers,
        ),
    )
    dropped = summary.dropped_docs.get("unique-lines", 0)
    dropped_tokens = summary.dropped_tokens.get("unique-lines", 0)
    print(f"  {fixed}: unique-lines dropped {dropped} document ({fmt_int(dropped_tokens)} tokens)")
    toml = (root / "plan.toml").read_text().replace(f'"stores/{source}"', f'"stores/{fixed.name}"')
    fixed_toml = root / "plan-filtered.toml"
    fixed_toml.write_text(toml)
    new_plan = resolve_plan(load_plan_spec(fixed_toml), str(fixed_toml))
    write_atomic(root / "plan-filtered.json", new_plan.to_json().encode())
    print(f"  new plan {root / 'plan-filtered.json'}")
    print(f"    index hash {plan.index_hash}\n            →  {new_plan.index_hash}")
    print(
        f"\n  resuming the run (checkpoint at step {trained.checkpoint['step']}) on the new plan:"
    )
    refused = False
    try:
        with Loader(load_plan(root / "plan-filtered.json"), 0, BatchConfig(8, 2, 2)) as loader:
            loader.load_state_dict(trained.checkpoint)
    except TokentapeError as exc:
        refused = True
        print(f"    refused: {exc}")
    print("  a new run starts from consumed = 0 on the new plan, or the old data stays in use")
    return refused


__all__ = ["Spike", "heading", "loss_spike_story", "retokenize_story", "run_command", "worst_step"]

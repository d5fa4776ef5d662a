"""A plain training loop under ``torchrun`` (gloo on CPU): loss per source, checkpoint, resume.

    torchrun --nproc_per_node 2 examples/recipes/torchrun_loop.py PLAN.json --out run-loop --steps 4
    torchrun --nproc_per_node 1 examples/recipes/torchrun_loop.py PLAN.json --out run-loop --steps 8

The second command resumes the first on one rank: the global batch stays, ``accum`` is
recomputed (``B / (ranks × micro)``) and training continues at exactly ``consumed``.

- ``tokentape.Loader`` hands each data-parallel rank its micro-batches of the step at
  ``consumed``; ``loader.commit()`` after ``optimizer.step()`` is all that advances it.
- The checkpoint (``run/checkpoint.pt``, written by rank 0, then renamed over the last) holds
  the model, the optimizer and ``loader.state_dict()``: plain dicts, lists, numbers and
  strings, so ``torch.load(..., weights_only=True)`` reads it back.
- Each row of a batch names its source (``to_torch(micro)["source"]``): the loss per source
  is one ``all_reduce`` a step, written by rank 0 to ``run/loss.jsonl``, one line a step.
- ``--record`` writes what each rank trained on, ``run/batches-rank{R}.jsonl`` (step,
  positions, sources, token ids): enough to check that a resumed run trains on the batches of
  an uninterrupted one.

Run without ``torchrun`` it trains as a single rank. See docs/recipes.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tokentape import BatchConfig, Loader, TokentapeError, load_plan
from tokentape.torch import to_torch

CHECKPOINT = "checkpoint.pt"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plan", help="PLAN.json from `tokentape plan --out`")
    p.add_argument("--out", required=True, help="run directory: checkpoint and loss log")
    p.add_argument("--steps", type=int, default=8, help="train until this many steps (total)")
    p.add_argument("--global-batch", type=int, default=8, help="samples per optimizer step")
    p.add_argument("--micro", type=int, default=2, help="samples per micro-batch per rank")
    p.add_argument("--save-every", type=int, default=2, help="checkpoint every N steps")
    p.add_argument("--record", action="store_true", help="write each rank's batches")
    return p.parse_args(argv)


def train(args: argparse.Namespace) -> None:
    distributed = "WORLD_SIZE" in os.environ  # set by torchrun
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    dp = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = load_plan(args.plan)
    if args.global_batch % (dp * args.micro):
        raise TokentapeError(
            f"--global-batch {args.global_batch} is not a multiple of {dp} x micro"
        )
    config = BatchConfig(dp, args.micro, args.global_batch // (dp * args.micro))

    model = nn.Sequential(nn.Embedding(plan.vocab_size, 32), nn.Linear(32, plan.vocab_size))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = Loader(plan, rank, config)
    if (out / CHECKPOINT).exists():  # resume: model, optimizer and data where they were saved
        saved = torch.load(out / CHECKPOINT, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["data"])  # refuses a plan that changes the past
    ddp = DistributedDataParallel(model) if distributed else model
    if rank == 0:
        print(f"step {loader.state.step}, consumed {loader.state.consumed}: dp {dp}, micro "
              f"{config.micro}, accum {config.accum}", flush=True)  # fmt: skip

    n = len(plan.sources)
    with loader:
        while loader.state.step < args.steps:
            step = loader.step()
            sums = torch.zeros(1 + 2 * n)  # the loss; per source: row-loss sums, then rows
            for i, micro in enumerate(step.micro_batches):
                t = to_torch(micro)
                last = i == config.accum - 1
                with contextlib.nullcontext() if last or not distributed else ddp.no_sync():
                    logits = ddp(t["inputs"])
                    per_token = F.cross_entropy(
                        logits.flatten(0, 1), t["targets"].flatten(), reduction="none"
                    )
                    (per_token.mean() / config.accum).backward()
                rows = per_token.detach().view(len(t["source"]), -1).mean(dim=1)
                sums[0] += rows.mean() / config.accum
                sums[1 : 1 + n].index_add_(0, t["source"], rows)
                sums[1 + n :].index_add_(0, t["source"], torch.ones_like(rows))
                if args.record:
                    _record(out, rank, step.step, t)
            opt.step()
            opt.zero_grad(set_to_none=True)
            loader.commit()  # after optimizer.step(): the only thing that advances the data
            if distributed:
                dist.all_reduce(sums)  # one collective: the loss and every source's sums
                sums[0] /= dp
            if rank == 0:
                _log_loss(out, step.step, step.consumed, sums, [s.name for s in plan.sources])
            if loader.state.step % args.save_every == 0 or loader.state.step == args.steps:
                if rank == 0:
                    state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                             "data": loader.state_dict()}  # fmt: skip
                    torch.save(state, out / f".{CHECKPOINT}.tmp")
                    os.replace(out / f".{CHECKPOINT}.tmp", out / CHECKPOINT)
                if distributed:
                    dist.barrier()
    if distributed:
        dist.destroy_process_group()


def _log_loss(out: Path, step: int, consumed: int, sums: torch.Tensor, names: list[str]) -> None:
    """One line of the loss log: the step's loss, and each drawn source's loss and tokens."""
    rows = sums[1 + len(names) :].tolist()
    line = {
        "step": step,
        "consumed": consumed,
        "loss": float(sums[0]),
        "loss_by_source": {s: float(sums[1 + d]) / rows[d] for d, s in enumerate(names) if rows[d]},
        "rows_by_source": {s: int(rows[d]) for d, s in enumerate(names) if rows[d]},
    }
    with open(out / "loss.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
    by_source = "  ".join(f"{s} {x:.4f}" for s, x in line["loss_by_source"].items())
    print(f"step {step:>3}  consumed {consumed:>5}  loss {line['loss']:.4f}  ({by_source})",
          flush=True)  # fmt: skip


def _record(out: Path, rank: int, step: int, t: dict[str, torch.Tensor]) -> None:
    line = {"step": step, "rank": rank, "positions": t["positions"].tolist(),
            "source": t["source"].tolist(), "inputs": t["inputs"].tolist()}  # fmt: skip
    with open(out / f"batches-rank{rank}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> int:
    try:
        train(parse_args(argv))
    except TokentapeError as exc:
        print(f"torchrun_loop: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

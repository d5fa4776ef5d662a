"""Train a tiny GPT on a tokentape plan with ``torchrun`` (CPU, gloo), checkpoint, resume.

    torchrun --nproc_per_node 2 examples/train_tiny.py PLAN.json --out run/ --steps 20
    # killed, or finished: resume with another number of ranks, the same global batch
    torchrun --nproc_per_node 1 examples/train_tiny.py PLAN.json --out run/ --steps 40

What it shows:
- each data-parallel rank asks the loader for its micro-batches of the step at ``consumed``;
- ``loader.commit()`` right after ``optimizer.step()`` is the only thing that advances data;
- one checkpoint (``run/checkpoint.npz``) holds model, optimizer and data state, written
  atomically by rank 0 — an ``.npz`` of arrays plus a JSON header, loaded without unpickling;
- on resume with another number of ranks, ``accum`` is recomputed so the global batch stays
  the same and the run continues at exactly ``consumed``;
- rank 0 writes the step log (``run/steps.jsonl``) and a loss log (``run/loss.jsonl``), one
  line a step: ``{"step", "consumed", "loss", "loss_by_source": {name: mean token loss},
  "tokens_by_source": {name: tokens}, "time"}``; every row of a batch carries its source
  (``to_torch(...)["source"]``), so the loss per source costs one ``all_reduce`` a step;
- rank 0 saves the plan beside them (``run/plan.json``): ``tokentape report run/ --out
  report.html`` draws the run (docs/report.md).

- a plan whose stores are in a bucket is streamed (ranged GETs), or with ``--cache-dir`` staged
  to that node-local directory first: one download per node and store, the node's other
  ranks waiting for it; on several nodes (docs/cluster.md):

    # on each node, NODE = 0 or 1; MASTER = node 0's address; /local/cache on each node's disk
    torchrun --nnodes 2 --node-rank NODE --nproc-per-node 8 --master-addr MASTER \\
        --master-port 29500 examples/train_tiny.py s3://bucket/plans/mix.json \\
        --out /shared/run --cache-dir /local/cache --steps 1000

- ``--rank-log`` has every rank write what it trained on (``run/ranks/rank-R.jsonl``, one line
  a step: step, consumed, batch shape, its sample positions and the sha256 of its tokens), to
  compare ranks and runs.

Run without ``torchrun`` it trains as a single rank.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tokentape import BatchConfig, Loader, Plan, Step, TokentapeError, load_plan
from tokentape.torch import check_step, to_torch

CHECKPOINT = "checkpoint.npz"


# --- the model -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads).unbind(2)
        q, k, v = (a.transpose(1, 2) for a in (q, k, v))
        if mask is None:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, inputs: torch.Tensor, segments: torch.Tensor | None) -> torch.Tensor:
        t = inputs.shape[1]
        x = self.embed(inputs) + self.pos(torch.arange(t, device=inputs.device))
        mask = None
        if segments is not None:  # attend only within the same document, causally
            causal = torch.ones(t, t, dtype=torch.bool, device=inputs.device).tril()
            same = segments[:, None, :, None] == segments[:, None, None, :]
            mask = same & causal
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


# --- one checkpoint: model + optimizer + data, no pickle ------------------------------------


def save_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer, data: dict) -> None:
    """Arrays in an ``.npz``; everything else in a JSON header stored as bytes beside them."""
    arrays = {f"model/{k}": v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    state = opt.state_dict()
    for index, slots in state["state"].items():
        for name, value in slots.items():
            arrays[f"opt/{index}/{name}"] = value.detach().cpu().numpy()
    header = {"data": data, "param_groups": state["param_groups"]}
    arrays["header.json"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_atomic(path, buffer.getvalue())


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it (rank 0 is the only
    writer), flushed to disk, then renamed over it, so a kill leaves the old checkpoint or the
    new one, never a torn one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Restore model and optimizer; return the data state."""
    with np.load(path, allow_pickle=False) as z:
        header = json.loads(z["header.json"].tobytes())
        model.load_state_dict({k[6:]: torch.from_numpy(z[k]) for k in z.files if k[:6] == "model/"})
        slots: dict[int, dict[str, torch.Tensor]] = {}
        for key in (k for k in z.files if k.startswith("opt/")):
            _, index, name = key.split("/")
            slots.setdefault(int(index), {})[name] = torch.from_numpy(z[key])
    groups = [  # JSON turned tuples (AdamW's betas) into lists
        {k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()}
        for g in header["param_groups"]
    ]
    opt.load_state_dict({"state": slots, "param_groups": groups})
    return header["data"]


# --- training ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plan", help="PLAN.json from `tokentape plan --out`")
    p.add_argument("--out", required=True, help="run directory: checkpoint, step and loss logs")
    p.add_argument("--steps", type=int, default=20, help="train until this many steps (total)")
    p.add_argument("--global-batch", type=int, default=8, help="samples per optimizer step")
    p.add_argument("--micro", type=int, default=2, help="samples per micro-batch per rank")
    p.add_argument("--save-every", type=int, default=2, help="checkpoint every N steps")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--doc-mask", action="store_true", help="mask attention at document ends")
    p.add_argument("--check-ranks", action="store_true", help="all-gather and check each step")
    p.add_argument(
        "--cache-dir",
        help="node-local directory to stage a bucket plan's stores to (default: stream them)",
    )
    p.add_argument(
        "--stage",
        choices=["background", "first"],
        default="background",
        help="with --cache-dir: stream the first steps while staging (default), or stage first",
    )
    p.add_argument(
        "--rank-log",
        action="store_true",
        help="each rank logs what it trains on to OUT/ranks/rank-R.jsonl",
    )
    return p.parse_args(argv)


def batch_config(global_batch: int, micro: int, dp: int) -> BatchConfig:
    """The same global batch on any number of ranks: accum = B / (dp · micro)."""
    if global_batch % (dp * micro):
        raise TokentapeError(
            f"--global-batch {global_batch} is not a multiple of dp {dp} x micro {micro}"
        )
    return BatchConfig(dp, micro, global_batch // (dp * micro))


def train(args: argparse.Namespace) -> int:
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    dp = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = load_plan(args.plan)
    if rank == 0:  # beside the logs: `tokentape report run/` reads the plan the run is under
        plan.save(out / "plan.json")
    config = batch_config(args.global_batch, args.micro, dp)
    model = TinyGPT(plan.vocab_size, plan.seq_len, args.width, args.layers, args.heads)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ckpt = out / CHECKPOINT
    data_state = load_checkpoint(ckpt, model, opt) if ckpt.exists() else None
    ddp = DistributedDataParallel(model) if distributed else model
    log = out / "steps.jsonl" if rank == 0 else None
    loader = Loader(
        plan,
        rank,
        config,
        step_log=log,
        segments=args.doc_mask,
        cache_dir=args.cache_dir,
        stage=args.stage,
    )
    rank_log = out / "ranks" / f"rank-{rank}.jsonl" if args.rank_log else None
    if rank_log is not None:
        rank_log.parent.mkdir(exist_ok=True)
    if data_state is not None:
        loader.load_state_dict(data_state)
    if rank == 0:
        where = f"resumed at step {loader.state.step}" if data_state else "started"
        print(
            f"{where}: consumed {loader.state.consumed}, dp {dp}, micro {config.micro}, "
            f"accum {config.accum}, global batch {config.global_batch}",
            flush=True,
        )
    with loader:
        while loader.state.step < args.steps:
            step = loader.step()
            if args.check_ranks and distributed:
                check_step(step, rank, model_parallel_size=1)
            if rank_log is not None:
                _log_rank(rank_log, rank, step)
            n = len(plan.sources)
            sums = torch.zeros(1 + 2 * n)  # [loss, per-source row-loss sums, row counts]
            for i, micro in enumerate(step.micro_batches):
                t = to_torch(micro)
                segments = t.get("segment_ids") if args.doc_mask else None
                sync = i == config.accum - 1 or not distributed
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    logits = ddp(t["inputs"], segments)
                    per_token = F.cross_entropy(
                        logits.flatten(0, 1), t["targets"].flatten(), reduction="none"
                    )
                    loss = per_token.mean()
                    (loss / config.accum).backward()
                sums[0] += loss.detach() / config.accum
                rows = per_token.detach().view(len(t["source"]), -1).mean(dim=1)
                sums[1 : 1 + n].index_add_(0, t["source"], rows)
                sums[1 + n :].index_add_(0, t["source"], torch.ones_like(rows))
            opt.step()
            opt.zero_grad(set_to_none=True)
            loader.commit()  # after optimizer.step(): the only thing that advances `consumed`
            if distributed:
                dist.all_reduce(sums)  # one collective: the loss and every source's sums
                sums[0] /= dp
            if rank == 0:
                _log_loss(out, step.step, step.consumed, sums, plan)
            if loader.state.step % args.save_every == 0 or loader.state.step == args.steps:
                if rank == 0:
                    save_checkpoint(ckpt, model, opt, loader.state_dict())
                if distributed:
                    dist.barrier()
    if distributed:
        dist.destroy_process_group()
    return 0


def _log_loss(out: Path, step: int, consumed: int, sums: torch.Tensor, plan: Plan) -> None:
    """One line of the loss log: the step's loss, and each drawn source's mean token loss and
    tokens (``sums`` as the training loop gathered them)."""
    n = len(plan.sources)
    loss = float(sums[0])
    if not math.isfinite(loss):
        raise RuntimeError(f"step {step}: loss is {loss}")
    rows = sums[1 + n :].tolist()
    by_source = {s.name: round(float(sums[1 + d]) / rows[d], 5)
                 for d, s in enumerate(plan.sources) if rows[d]}  # fmt: skip
    tokens = {s.name: int(rows[d]) * plan.seq_len for d, s in enumerate(plan.sources) if rows[d]}
    record = {
        "step": step, "consumed": consumed, "loss": round(loss, 5),
        "loss_by_source": by_source, "tokens_by_source": tokens, "time": time.time(),
    }  # fmt: skip
    with open(out / "loss.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"step {step:>4}  consumed {consumed:>6}  loss {loss:.4f}", flush=True)


def _log_rank(path: Path, rank: int, step: Step) -> None:
    """One line of this rank's log: the step, its shape, the positions and tokens it gives this
    rank. Written before training on them: a step logged but never committed is redone."""
    tokens = hashlib.sha256()
    for micro in step.micro_batches:
        tokens.update(np.ascontiguousarray(micro.tokens, dtype="<i8").tobytes())
    c = step.config
    record = {
        "step": step.step, "consumed": step.consumed, "rank": rank,
        "dp": c.dp_size, "micro": c.micro, "accum": c.accum,
        "positions": [int(p) for m in step.micro_batches for p in m.positions],
        "tokens_sha256": tokens.hexdigest(),
    }  # fmt: skip
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    try:
        return train(parse_args(argv))
    except TokentapeError as exc:
        print(f"train_tiny: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""PyTorch Lightning on a tokentape plan: a ``LightningDataModule`` whose position is checkpointed.

    python examples/recipes/lightning_datamodule.py PLAN.json --out run-pl --steps 8 --stop-after 4
    python examples/recipes/lightning_datamodule.py PLAN.json --out run-pl --steps 8 --resume

``TapeDataModule`` hands Lightning the plan's tape as its training data:

- ``train_dataloader()`` is a stock ``DataLoader`` over ``tokentape.torch.TapeDataset`` with a
  ``TapeBatchSampler`` for this rank: micro-batches of ``micro`` samples, Lightning's
  ``accumulate_grad_batches`` of them per optimizer step, ``max_steps`` steps in one epoch.
- ``state_dict()`` is tokentape's data state (a ``tokentape.DataState``: ``consumed``, the
  plan's identity, the batch shapes), brought up to the trainer's ``global_step``; Lightning
  saves it in its checkpoint (under the datamodule's class name) and gives it back to
  ``load_state_dict()`` on ``trainer.fit(..., ckpt_path=...)``, before it asks for the
  dataloader. The state is checked against the plan there (a plan that changes a sample
  already trained on is refused, ``tokentape.ResumeRefused``).
- Lightning resumes mid-epoch by counting on from the checkpoint's micro-batch, but iterates
  a stock ``DataLoader`` from its start. So the sampler starts where Lightning goes on: at the
  micro-batch after the checkpoint's, positions ``global_step × global batch`` on for a
  checkpoint between steps. Nothing is re-read or skipped; the epoch keeps its length, so
  Lightning's counters agree with it.
- ``StepCheckpoint`` is ``ModelCheckpoint`` saving only between optimizer steps: on resume,
  Lightning's own saves once more inside the first step, where gradients are lost.

Give the ``Trainer`` ``max_steps`` and ``use_distributed_sampler=False`` (the sampler is
already per rank; Lightning's ``DistributedSampler`` would split it again). See
docs/recipes.md for what resumes exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader

from tokentape import BatchConfig, DataState, Plan, TokentapeError, load_plan
from tokentape.torch import TapeBatchSampler, TapeDataset, collate


class TapeDataModule(L.LightningDataModule):
    """The plan's tape as Lightning's training data, its position saved in the checkpoint.

    Args:
        plan: The plan to train on.
        micro: Samples per micro-batch on each rank (the DataLoader's batch).
        num_workers: DataLoader worker processes.
        segments: Also give each batch's ``segment_ids`` and ``doc_positions``.
    """

    def __init__(self, plan: Plan, micro: int, num_workers: int = 0, segments: bool = False):
        super().__init__()
        self.plan, self.micro = plan, micro
        self.num_workers, self.segments = num_workers, segments
        self.data: DataState | None = None
        """tokentape's state: loaded from the checkpoint, or started by ``train_dataloader``."""

    def config(self) -> BatchConfig:
        """The shape of a step: every rank's micro-batches, Lightning's accumulation."""
        t = self.trainer
        return BatchConfig(t.world_size, self.micro, t.accumulate_grad_batches)

    def train_dataloader(self) -> DataLoader:
        t, config = self.trainer, self.config()
        if t.max_steps <= 0:
            raise ValueError("TapeDataModule: give the Trainer max_steps (the tape has no epochs)")
        if self.data is None:
            self.data = DataState.start(self.plan)
        step, index = t.global_step, self._next_micro_batch()  # restored from the checkpoint
        if (self.data.step, self.data.consumed) != (step, step * config.global_batch):
            raise ValueError(
                f"TapeDataModule: the data state (step {self.data.step}, consumed "
                f"{self.data.consumed}) is not at the trainer's step {step} with a global "
                f"batch of {config.global_batch}: Lightning resumes an epoch by its step count, "
                "so keep the global batch of the run (change micro and the number of ranks "
                "together)"
            )
        if index // config.accum != step:
            raise ValueError(
                f"TapeDataModule: Lightning resumes at micro-batch {index} of the epoch, not in "
                f"step {step} with accumulate_grad_batches={config.accum}: keep the run's "
                "accumulate_grad_batches (change micro and the number of ranks instead)"
            )
        sampler = TapeBatchSampler(t.global_rank, config, consumed=0, steps=t.max_steps)
        # the epoch is the whole run; its pass starts at the micro-batch Lightning trains next
        sampler.load_state_dict({**sampler.state_dict(), "yielded": index * config.micro})
        return DataLoader(
            TapeDataset(self.plan, segments=self.segments),
            batch_sampler=sampler,
            collate_fn=collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def _next_micro_batch(self) -> int:
        """The micro-batch of the epoch that Lightning trains next (0 at the start): its batch
        counter as restored from the checkpoint, as ``TrainingEpochLoop.reset`` will set it.

        A checkpoint saved at a batch's end (ModelCheckpoint's) resumes after that batch. It
        may lie inside an optimizer step: Lightning then trains the rest of that step's
        micro-batches (the gradients of those before the checkpoint are lost), and so must
        the sampler, for every later step to get its own samples.
        """
        p = self.trainer.fit_loop.epoch_loop.batch_progress.current
        if p.started == p.ready and p.processed == p.started and p.completed >= p.processed - 1:
            return p.ready
        return p.completed

    def state_dict(self) -> dict[str, Any]:
        """tokentape's state at the trainer's ``global_step`` (Lightning saves it)."""
        if self.data is None:
            self.data = DataState.start(self.plan)
        config = self.config()
        while self.data.step < self.trainer.global_step:  # the steps applied since the last
            self.data = self.data.commit(config)  # checkpoint, each of this run's shape
        return {"tokentape": self.data.to_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a checkpoint's state, on this plan (refused if it changes the past)."""
        self.data = DataState.from_dict(state_dict["tokentape"]).resume_on(self.plan)


class TinyLM(L.LightningModule):
    """A one-layer causal transformer, randomly initialised."""

    def __init__(self, vocab: int, seq_len: int, width: int = 32, dropout: float = 0.0):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq_len, width)
        self.block = nn.TransformerEncoderLayer(
            width, nhead=2, dim_feedforward=2 * width, dropout=dropout, batch_first=True
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        t = inputs.shape[1]
        x = self.embed(inputs) + self.pos(torch.arange(t, device=inputs.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=inputs.device)
        return self.head(self.block(x, src_mask=mask, is_causal=True))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self(batch["inputs"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
        total = self.trainer.max_steps
        decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": decay, "interval": "step"}}


class StepCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that saves only between optimizer steps.

    A resumed run's ``ModelCheckpoint(every_n_train_steps=N)`` saves once more after the first
    micro-batch of the step it resumed at, under that checkpoint's name, mid-accumulation: a
    checkpoint without that micro-batch's gradient.
    """

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, out: Any, batch: Any, i: int):
        if (i + 1) % trainer.accumulate_grad_batches == 0:  # the step's last micro-batch
            super().on_train_batch_end(trainer, module, out, batch, i)


class StopAfter(Callback):
    """Stop the run after ``steps`` optimizer steps (a preemption): the last checkpoint stays."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.steps:
            trainer.should_stop = True


def trainer(
    out: Path,
    steps: int,
    accum: int,
    save_steps: int,
    stop_after: int | None = None,
    callbacks: Sequence[Callback] = (),
    devices: int = 1,
) -> L.Trainer:
    """A CPU ``Trainer`` of ``steps`` optimizer steps, a checkpoint in ``out`` every
    ``save_steps``; ``stop_after``: stop after that many steps; ``devices``: processes (DDP)."""
    checkpoints = StepCheckpoint(out, every_n_train_steps=save_steps, save_top_k=-1)
    stop = [StopAfter(stop_after)] if stop_after else []
    return L.Trainer(
        max_steps=steps,
        accumulate_grad_batches=accum,
        use_distributed_sampler=False,  # the sampler is already per rank
        callbacks=[checkpoints, *stop, *callbacks],
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def last_checkpoint(out: Path) -> Path:
    """The checkpoint of the latest step ModelCheckpoint wrote (``epoch=0-step=N.ckpt``)."""
    found = sorted(out.glob("*step=*.ckpt"), key=lambda p: int(p.stem.rsplit("step=", 1)[1]))
    if not found:
        raise FileNotFoundError(f"no checkpoint in {out}")
    return found[-1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plan", help="PLAN.json from `tokentape plan --out`")
    p.add_argument("--out", required=True, help="the checkpoint directory")
    p.add_argument("--steps", type=int, default=8, help="max_steps: optimizer steps in all")
    p.add_argument("--micro", type=int, default=2, help="samples per micro-batch")
    p.add_argument("--accum", type=int, default=2, help="accumulate_grad_batches")
    p.add_argument("--save-steps", type=int, default=2, help="a checkpoint every N steps")
    p.add_argument("--stop-after", type=int, help="stop after N steps (keeping the checkpoints)")
    p.add_argument("--resume", action="store_true", help="resume from the last checkpoint")
    p.add_argument("--devices", type=int, default=1, help="data-parallel processes (DDP)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    # Lightning warns that a stock DataLoader cannot resume mid-epoch: this one starts where
    # the checkpoint's data state says (see TapeDataModule.train_dataloader)
    warnings.filterwarnings("ignore", "You're resuming from a checkpoint that ended before")
    L.seed_everything(0, verbose=False)
    run = trainer(out, args.steps, args.accum, args.save_steps, args.stop_after, (), args.devices)
    try:
        plan = load_plan(args.plan)
        data = TapeDataModule(plan, args.micro)
        model = TinyLM(plan.vocab_size, plan.seq_len)
        run.fit(model, datamodule=data, ckpt_path=last_checkpoint(out) if args.resume else None)
    except TokentapeError as exc:  # a plan or store refused, a resume on a changed past
        print(f"lightning_datamodule: error: {exc}", file=sys.stderr)
        return 2
    state = data.state_dict()["tokentape"]
    if run.is_global_zero:
        print(json.dumps({k: state[k] for k in ("step", "consumed", "history")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hugging Face ``transformers.Trainer`` on a tokentape plan, resumed through its own checkpoint.

    python examples/recipes/hf_trainer.py PLAN.json --out run-hf --steps 8 --stop-after 4
    python examples/recipes/hf_trainer.py PLAN.json --out run-hf --steps 8 --resume

``TapeTrainer`` is a ``Trainer`` whose training data is the plan's tape:

- ``get_train_dataloader`` is a stock ``DataLoader`` over ``tokentape.torch.TapeDataset``,
  driven by a ``TapeBatchSampler`` for this rank: ``max_steps`` steps of
  ``per_device_train_batch_size × gradient_accumulation_steps`` samples per rank. It is not
  passed through ``accelerate``'s ``prepare``, which would shard a sampler that is already
  per rank (the Trainer moves each batch to its device itself).
- tokentape's data state (a ``tokentape.DataState``: ``consumed``, the plan's identity, the
  batch shapes) is committed after every optimizer step by a ``TapeData`` callback and saved
  in the trainer's own checkpoint, ``checkpoint-N/trainer_state.json`` (under
  ``stateful_callbacks``), written with the rest of the checkpoint.
- on ``trainer.train(resume_from_checkpoint=...)`` the Trainer would fast-forward the data by
  re-iterating the first ``global_step × gradient_accumulation_steps`` batches
  (``skip_first_batches``). ``get_resumed_dataloader`` replaces that: it reads the saved state,
  checks it against the plan (a plan that changes a sample already trained on is refused,
  ``tokentape.ResumeRefused``) and starts a new sampler at its ``consumed``, for the steps
  left. Nothing is re-read or skipped, and another number of processes resumes at the same
  position (keep the global batch to keep the Trainer's own step counts).

Each batch is ``input_ids`` (the window's first ``seq_len`` tokens) and ``shift_labels`` (its
next tokens, all ``seq_len`` of them; ``labels`` too, which the model's loss needs present but
replaces by ``shift_labels``). The model here is a tiny GPT-2 built from a config, randomly
initialised: nothing is downloaded. See docs/recipes.md for what resumes exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import torch
import transformers
from torch.utils.data import DataLoader
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_callback import ExportableState

from tokentape import BatchConfig, DataState, Plan, TokentapeError, load_plan
from tokentape.torch import TapeBatchSampler, TapeDataset, collate


def lm_batch(samples: Sequence[Any]) -> dict[str, torch.Tensor]:
    """A ``collate_fn``: tokentape's micro-batch as a causal LM's keyword arguments."""
    t = collate(samples)
    return {"input_ids": t["inputs"], "labels": t["inputs"], "shift_labels": t["targets"]}


class TapeData(TrainerCallback, ExportableState):
    """tokentape's data state, committed after each optimizer step, saved in the checkpoint.

    ``state()`` is what the Trainer writes into ``trainer_state.json`` at each checkpoint
    (``stateful_callbacks["TapeData"]``); ``TapeTrainer`` reads it back on resume.
    """

    def __init__(self) -> None:
        self.data: DataState | None = None
        self.config: BatchConfig | None = None

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.data is None or self.config is None:
            raise RuntimeError("TapeData: no data state (use it through TapeTrainer)")
        self.data = self.data.commit(self.config)  # the step the optimizer just applied
        if self.data.step != state.global_step:
            raise RuntimeError(
                f"TapeData: data state at step {self.data.step}, trainer at {state.global_step}"
            )

    def state(self) -> dict[str, Any]:
        saved = None if self.data is None else self.data.to_dict()
        return {"args": {}, "attributes": {"saved": saved}}


class TapeTrainer(Trainer):
    """A ``Trainer`` that trains on ``plan``'s tape and resumes it from its own checkpoint.

    Give ``max_steps`` (the tape has no epochs) and no ``train_dataset``; the data-parallel
    rank is the process's (``args.process_index`` of ``args.world_size``).
    """

    def __init__(self, *args: Any, plan: Plan, **kwargs: Any) -> None:
        if not hasattr(Trainer, "get_resumed_dataloader"):  # the hook this class overrides
            raise ImportError(
                f"TapeTrainer needs a Trainer with get_resumed_dataloader (transformers "
                f"5.25 has it), not transformers {transformers.__version__}"
            )
        super().__init__(*args, **kwargs)
        self.plan = plan
        self.add_callback(TapeData())

    def tape_config(self) -> BatchConfig:
        """The shape of a step: every process's micro-batches, accumulated."""
        a = self.args
        return BatchConfig(
            a.world_size, a.per_device_train_batch_size, a.gradient_accumulation_steps
        )

    def _tape(self) -> TapeData:
        # looked up each time: restore_callback_states_from_checkpoint=True replaces the instance
        return next(c for c in self.callback_handler.callbacks if isinstance(c, TapeData))

    def _tape_loader(self, consumed: int, steps: int) -> DataLoader:
        a = self.args
        sampler = TapeBatchSampler(a.process_index, self.tape_config(), consumed, steps)
        workers = a.dataloader_num_workers
        return DataLoader(
            TapeDataset(self.plan),
            batch_sampler=sampler,
            collate_fn=lm_batch,
            num_workers=workers,
            pin_memory=a.dataloader_pin_memory and torch.cuda.is_available(),
            persistent_workers=a.dataloader_persistent_workers and workers > 0,
            prefetch_factor=a.dataloader_prefetch_factor if workers else None,
        )

    def get_train_dataloader(self) -> DataLoader:
        """The whole run from position 0: ``max_steps`` steps (the Trainer's one epoch)."""
        if self.args.max_steps <= 0:
            raise ValueError("TapeTrainer: give max_steps (the tape has no epochs)")
        if self.args.ignore_data_skip:
            raise ValueError(
                "TapeTrainer: ignore_data_skip=True would restart the data at position 0 on "
                "resume; TapeTrainer resumes the data exactly without skipping anything"
            )
        tape = self._tape()
        tape.data, tape.config = DataState.start(self.plan), self.tape_config()
        return self._tape_loader(0, self.args.max_steps)

    def get_resumed_dataloader(self, dataloader: DataLoader, num_batches: int) -> DataLoader:
        """The steps left, from the ``consumed`` saved in the checkpoint: no batch re-read."""
        saved = self.state.stateful_callbacks.get("TapeData")
        saved = saved.get("attributes", {}).get("saved") if isinstance(saved, dict) else None
        if saved is None:
            raise ValueError("TapeTrainer: the checkpoint holds no tokentape data state")
        data = DataState.from_dict(saved).resume_on(self.plan)  # refuses a changed past
        if data.step != self.state.global_step:
            raise ValueError(
                f"TapeTrainer: the checkpoint's data state is at step {data.step}, its "
                f"trainer state at step {self.state.global_step}"
            )
        tape = self._tape()
        tape.data, tape.config = data, self.tape_config()
        return self._tape_loader(data.consumed, self.args.max_steps - data.step)


class StopAfter(TrainerCallback):
    """Stop the run after ``steps`` optimizer steps, with a checkpoint (a preemption)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.global_step == self.steps:
            control.should_save = control.should_training_stop = True


def tiny_gpt2(plan: Plan, width: int = 32, layers: int = 2, heads: int = 2) -> GPT2LMHeadModel:
    """A randomly initialised GPT-2 sized for the plan (nothing downloaded)."""
    config = GPT2Config(
        vocab_size=plan.vocab_size,
        n_positions=plan.seq_len,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        bos_token_id=plan.eod_id,
        eos_token_id=plan.eod_id,
    )
    return GPT2LMHeadModel(config)


def training_args(
    out: str, steps: int, micro: int, accum: int, save_steps: int
) -> TrainingArguments:
    """The run's arguments: ``steps`` optimizer steps on CPU (or a GPU), a checkpoint every
    ``save_steps``, the loss logged at every step."""
    return TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        learning_rate=3e-3,
        save_strategy="steps",
        save_steps=save_steps,
        logging_steps=1,
        use_cpu=not torch.cuda.is_available(),
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plan", help="PLAN.json from `tokentape plan --out`")
    p.add_argument("--out", required=True, help="the Trainer's output_dir (its checkpoints)")
    p.add_argument("--steps", type=int, default=8, help="max_steps: optimizer steps in all")
    p.add_argument("--micro", type=int, default=2, help="per_device_train_batch_size")
    p.add_argument("--accum", type=int, default=2, help="gradient_accumulation_steps")
    p.add_argument("--save-steps", type=int, default=2, help="a checkpoint every N steps")
    p.add_argument("--stop-after", type=int, help="stop (with a checkpoint) after N steps")
    p.add_argument("--resume", action="store_true", help="resume from the last checkpoint")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transformers.set_seed(0)
    targs = training_args(args.out, args.steps, args.micro, args.accum, args.save_steps)
    callbacks = [StopAfter(args.stop_after)] if args.stop_after else []
    try:
        plan = load_plan(args.plan)
        trainer = TapeTrainer(model=tiny_gpt2(plan), args=targs, plan=plan, callbacks=callbacks)
        trainer.train(resume_from_checkpoint=True if args.resume else None)
    except TokentapeError as exc:  # a plan or store refused, a resume on a changed past
        print(f"hf_trainer: error: {exc}", file=sys.stderr)
        return 2
    if trainer.is_world_process_zero():
        losses = [(x["step"], x["loss"]) for x in trainer.state.log_history if "loss" in x]
        print(json.dumps({"global_step": trainer.state.global_step, "losses": losses}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

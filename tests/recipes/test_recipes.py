"""The trainer recipes of examples/recipes, each run for real for a few steps on CPU: an
uninterrupted run, then one stopped at step K and resumed from the trainer's own checkpoint;
the batches after the resume are the uninterrupted run's, step by step. The trainers' tests
also run the resume that the recipe avoids (the trainer's stock one) and check that it trains
on other batches; the torchrun test checks that a restart of the data would.

A recipe whose package is absent is skipped; with TOKENTAPE_REQUIRE_RECIPES=1 (CI) it fails.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import tokentape

pytestmark = [pytest.mark.torch, pytest.mark.slow]

RECIPES = Path(__file__).parents[2] / "examples" / "recipes"
STEPS, STOP = 6, 3  # optimizer steps in all; the stopped run's last (and its checkpoint)


def require(name: str) -> ModuleType:
    """``pytest.importorskip``, but a failure when TOKENTAPE_REQUIRE_RECIPES=1."""
    try:
        return pytest.importorskip(name)
    except pytest.skip.Exception as skipped:
        if os.environ.get("TOKENTAPE_REQUIRE_RECIPES") == "1":
            pytest.fail(f"{skipped} (TOKENTAPE_REQUIRE_RECIPES=1: the recipes must run)")
        raise


torch = require("torch")
import tokentape.torch  # noqa: E402


def recipe(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    """Two small stores (bytes tokenizer) and a 70/30 plan over them, seq_len 32."""
    root = tmp_path_factory.mktemp("recipes")
    for name, n in (("prose", 60), ("code", 40)):
        lines = [
            {"text": f"{name} document {i}: " + f"word{i % 7} " * (8 + i % 13)} for i in range(n)
        ]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        tokentape.tokenize(root / f"{name}.jsonl", root / "stores" / name)
    sources = {"prose": {"path": "stores/prose", "weight": 70}}
    sources["code"] = {"path": "stores/code", "weight": 30}
    plan = tokentape.Plan.build(sources, seq_len=32, seed=7, total_samples=200, base_dir=root)
    plan.save(root / "plan.json")
    return root / "plan.json"


# --- Hugging Face Trainer -----------------------------------------------------------------


def test_hf_trainer_resumes_from_its_own_checkpoint(plan_path, tmp_path):
    transformers = require("transformers")
    require("accelerate")  # the Trainer needs it
    hf = recipe("hf_trainer")
    plan = tokentape.load_plan(plan_path)

    def recording(base: type) -> type:
        class Recording(base):
            """Records the input ids of each micro-batch under the step it trains."""

            seen: dict[int, list[list[int]]]

            def training_step(self, model, inputs, num_items_in_batch=None):
                rows = inputs["input_ids"].tolist()
                self.seen.setdefault(self.state.global_step, []).extend(rows)
                return super().training_step(model, inputs, num_items_in_batch)

        return Recording

    def run(out, micro=2, accum=2, steps=STEPS, stop=None, resume=False, kind=hf.TapeTrainer):
        transformers.set_seed(0)
        args = hf.training_args(str(out), steps, micro, accum, save_steps=STOP)
        callbacks = [hf.StopAfter(stop)] if stop else []
        extra = {"plan": plan} if issubclass(kind, hf.TapeTrainer) else {}
        trainer = recording(kind)(hf.tiny_gpt2(plan), args, callbacks=callbacks, **extra)
        trainer.seen = {}
        trainer.train(resume_from_checkpoint=str(out / f"checkpoint-{STOP}") if resume else None)
        losses = {x["step"]: x["loss"] for x in trainer.state.log_history if "loss" in x}
        return trainer.seen, losses

    full, full_losses = run(tmp_path / "full")
    assert sorted(full) == list(range(STEPS)) and all(len(r) == 4 for r in full.values())
    head, _ = run(tmp_path / "stopped", stop=STOP)
    assert head == {s: full[s] for s in range(STOP)}
    saved = json.loads(
        (tmp_path / "stopped" / f"checkpoint-{STOP}" / "trainer_state.json").read_text()
    )
    assert saved["stateful_callbacks"]["TapeData"]["attributes"]["saved"]["consumed"] == STOP * 4

    tail, tail_losses = run(tmp_path / "stopped", resume=True)
    assert tail == {s: full[s] for s in range(STOP, STEPS)}  # each step's batch, exactly
    # model, optimizer, scheduler and RNG (GPT-2's dropout) come from the Trainer's checkpoint:
    # the log (steps 1-3 from the checkpoint, then 4-6) is the uninterrupted run's
    assert tail_losses == pytest.approx(full_losses) and len(full_losses) == STEPS

    # another global batch (micro 2, no accumulation: 2 samples a step): the tape continues
    # at the checkpoint's consumed (12), where the uninterrupted run's step 3 begins
    other, _ = run(tmp_path / "stopped", accum=1, steps=STOP + 1, resume=True)
    assert other == {STOP: full[STOP][:2]}

    class Stock(transformers.Trainer):
        """What overriding get_train_dataloader alone gives: the Trainer skips batches."""

        def get_train_dataloader(self):
            config = tokentape.BatchConfig(1, self.args.per_device_train_batch_size, 1)
            sampler = tokentape.torch.TapeBatchSampler(0, config, 0, self.args.max_steps)
            return torch.utils.data.DataLoader(
                tokentape.torch.TapeDataset(plan), batch_sampler=sampler, collate_fn=hf.lm_batch
            )

    stock, _ = run(tmp_path / "stopped", accum=1, steps=STOP + 1, resume=True, kind=Stock)
    # skip_first_batches skipped 3 batches of the new shape: positions 6, 7, not 12, 13
    assert stock == {STOP: full[1][2:]} and stock[STOP] != full[STOP][:2]


def test_hf_trainer_refuses_ignore_data_skip(plan_path, tmp_path):
    require("transformers")
    require("accelerate")
    hf = recipe("hf_trainer")
    plan = tokentape.load_plan(plan_path)
    args = hf.training_args(str(tmp_path), STEPS, 2, 2, save_steps=STOP)
    args.ignore_data_skip = True  # the Trainer would then restart the data at position 0
    trainer = hf.TapeTrainer(hf.tiny_gpt2(plan), args, plan=plan)
    with pytest.raises(ValueError, match="ignore_data_skip"):
        trainer.train()


# --- PyTorch Lightning ----------------------------------------------------------------------


def test_lightning_datamodule_resumes_from_lightnings_checkpoint(plan_path, tmp_path):
    lightning = require("lightning")
    pl = recipe("lightning_datamodule")
    plan = tokentape.load_plan(plan_path)

    class Recording(pl.TinyLM):
        """Records each micro-batch's positions and token ids, and each step's loss."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen: dict[int, list] = {}
            self.losses: dict[int, float] = {}

        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            rows = list(zip(batch["positions"].tolist(), batch["inputs"].tolist(), strict=True))
            self.seen.setdefault(self.global_step, []).extend(rows)
            self.losses[self.global_step] = self.losses.get(self.global_step, 0) + float(loss)
            return loss

    def run(
        out, ckpt=None, data_class=pl.TapeDataModule, micro=2, stop=None, callbacks=(), on=plan
    ):
        lightning.seed_everything(0, verbose=False)
        model = Recording(plan.vocab_size, plan.seq_len)
        trainer = pl.trainer(out, STEPS, 2, STOP, stop_after=stop, callbacks=callbacks)
        trainer.fit(model, datamodule=data_class(on, micro), ckpt_path=ckpt)
        return model.seen, model.losses

    full, full_losses = run(tmp_path / "full")
    assert sorted(full) == list(range(STEPS))
    assert [p for s in range(STEPS) for p, _ in full[s]] == list(range(STEPS * 4))
    out = tmp_path / "stopped"
    head, _ = run(out, stop=STOP)
    assert head == {s: full[s] for s in range(STOP)}
    ckpt = out / f"epoch=0-step={STOP}.ckpt"
    saved = torch.load(ckpt, weights_only=True)
    assert saved["TapeDataModule"]["tokentape"]["consumed"] == STOP * 4

    # Lightning's own ModelCheckpoint, beside the recipe's, saves again after the resumed
    # run's first micro-batch: a checkpoint inside step 3 (used below)
    stock_checkpoint = lightning.pytorch.callbacks.ModelCheckpoint(
        tmp_path / "mid", every_n_train_steps=STOP, save_top_k=-1
    )
    tail, tail_losses = run(out, ckpt, callbacks=[stock_checkpoint])
    assert tail == {s: full[s] for s in range(STOP, STEPS)}  # each step's batch, exactly
    # no dropout here: model, optimizer and LR scheduler all come from the checkpoint
    assert tail_losses == pytest.approx({s: full_losses[s] for s in range(STOP, STEPS)})

    # resumed from inside step 3, Lightning trains the step's second micro-batch, then steps
    # on: the sampler follows (the first micro-batch's gradient is lost, by Lightning)
    mid, _ = run(out, tmp_path / "mid" / f"epoch=0-step={STOP}.ckpt")
    assert mid == {STOP: full[STOP][2:], **{s: full[s] for s in range(STOP + 1, STEPS)}}

    class Stock(pl.TapeDataModule):
        """A datamodule without the position: Lightning iterates its loader from the start."""

        def train_dataloader(self):
            sampler = tokentape.torch.TapeBatchSampler(0, self.config(), 0, self.trainer.max_steps)
            return torch.utils.data.DataLoader(
                tokentape.torch.TapeDataset(plan),
                batch_sampler=sampler,
                collate_fn=tokentape.torch.collate,
            )

    # (the recipe's checkpoint at step 3 is still the one between steps 2 and 3)
    stock, _ = run(out, ckpt, data_class=Stock)
    assert stock[STOP] == full[0] != full[STOP]  # the data restarted at position 0

    # another global batch cannot go on in the same epoch: refused in one line
    with pytest.raises(ValueError, match="keep the global batch"):
        run(out, ckpt, micro=1)
    # nor can a plan that changes the samples already trained on (another seed)
    with pytest.raises(tokentape.ResumeRefused, match="seed"):
        run(out, ckpt, on=dataclasses.replace(plan, seed=8))


# --- torchrun -------------------------------------------------------------------------------


@pytest.fixture
def started():
    """The processes a test starts; those still running at its end (it failed) are stopped
    (torchrun passes SIGTERM on to its workers)."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)


def _torchrun(plan: Path, out: Path, nproc: int, steps: int) -> subprocess.Popen:
    """Start the recipe under torchrun with ``nproc`` ranks, or alone (one rank, no torchrun)
    for ``nproc=0``; ``_finish`` waits for it."""
    args = [sys.executable]
    if nproc:
        args += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    args += [str(RECIPES / "torchrun_loop.py"), str(plan), "--out", str(out)]
    args += ["--steps", str(steps), "--save-every", str(STOP), "--record"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _finish(proc: subprocess.Popen) -> str:
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, output
    return output


def _batches(out: Path) -> dict[int, list[tuple[int, int, list[int]]]]:
    """Each step's rows, from every rank's record, in tape order: (position, source, ids)."""
    steps: dict[int, list] = {}
    for path in sorted(out.glob("batches-rank*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            rows = zip(r["positions"], r["source"], r["inputs"], strict=True)
            steps.setdefault(r["step"], []).extend(rows)
    return {s: sorted(rows) for s, rows in sorted(steps.items())}


@pytest.mark.subprocess
def test_torchrun_loop_resumes_on_another_number_of_ranks(plan_path, tmp_path, started):
    full_out, out = tmp_path / "full", tmp_path / "run"
    # the uninterrupted run in one process (the same samples on any number of ranks), beside
    # the run stopped after step 3 on 2 ranks, then its resume on 1
    uninterrupted = _torchrun(plan_path, full_out, nproc=0, steps=STEPS)
    started.append(uninterrupted)
    started.append(stopped := _torchrun(plan_path, out, nproc=2, steps=STOP))
    _finish(stopped)
    head = _batches(out)
    (out / "batches-rank1.jsonl").rename(out / "stopped-rank1.jsonl")
    (out / "batches-rank0.jsonl").rename(out / "stopped-rank0.jsonl")
    started.append(resumed := _torchrun(plan_path, out, nproc=1, steps=STEPS))  # 2 ranks -> 1
    _finish(uninterrupted)
    full = _batches(full_out)
    assert [p for s in range(STEPS) for p, _, _ in full[s]] == list(range(STEPS * 8))
    assert head == {s: full[s] for s in range(STOP)}
    assert f"step {STOP}, consumed {STOP * 8}: dp 1, micro 2, accum 4" in _finish(resumed)
    tail = _batches(out)
    assert tail == {s: full[s] for s in range(STOP, STEPS)}  # each step's batch, exactly
    # a resume that restarted the data would train on other token ids
    assert [ids for _, _, ids in tail[STOP]] != [ids for _, _, ids in full[0]]

    # the loss per source, in both runs: each step's rows by source are those it trained on,
    # and the sources' losses average, by rows, to the step's loss; the resumed run's losses
    # are the uninterrupted run's (model and optimizer from the checkpoint; 2 ranks sum the
    # same gradients as one, in another order)
    names = [s.name for s in tokentape.load_plan(plan_path).sources]
    logs = [
        [json.loads(x) for x in (o / "loss.jsonl").read_text().splitlines()]
        for o in (full_out, out)
    ]
    assert [[x["step"] for x in log] for log in logs] == [list(range(STEPS))] * 2
    for log, batches in zip(logs, (full, {**head, **tail}), strict=True):
        for x in log:
            rows = [names[source] for _, source, _ in batches[x["step"]]]
            assert x["rows_by_source"] == {n: rows.count(n) for n in names if n in rows}
            mean = sum(x["loss_by_source"][n] * c for n, c in x["rows_by_source"].items()) / 8
            assert mean == pytest.approx(x["loss"], rel=1e-5)
    assert [x["loss"] for x in logs[1]] == pytest.approx([x["loss"] for x in logs[0]], rel=1e-4)

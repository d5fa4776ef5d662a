"""GPU check: the tiny model trained from the native loader on a CUDA device, then the rank check.

Builds once (reused under ``bench-out/gpu/``) the demo's plan over the built-in corpora (its
BPE, its three stores, ``demo_plan_toml``: seq_len 256), then, on ``cuda:0``:

1. **train**: ``examples/train_tiny.py``'s ``TinyGPT`` from ``Loader`` (dp 1). Each step goes
   through ``to_torch(pin=True)`` and ``non_blocking`` copies on a side CUDA stream, issued as
   soon as the previous step's compute is queued, so they can run under it. CUDA events time
   every copy and compute; **copy hidden** is the share of copy time under compute; **data
   wait** is the time the trainer blocks in ``loader.step()``.
2. **smoke**: ``tokentape smoke PLAN --dp 2 --tp 2`` as a process (gloo), then
   ``tokentape smoke PLAN --backend nccl`` with one rank per CUDA device (at most 4); and
   ``check_step`` in this process, one rank in an NCCL group, each step.

Exit 0 when all passed, 1 when a check failed, 2 without a CUDA device or on bad arguments:
    python benchmarks/gpu_check.py [--steps 100] [--micro 16] [--accum 2] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tokentape import BatchConfig, Loader, TokentapeError, load_plan
from tokentape._src.corpora import write_builtin_corpora
from tokentape._src.demo import run as demo
from tokentape._src.plan.plan import Plan, check_budgets, resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.store.atomic import write_atomic
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.util.text import table
from tokentape.torch import check_step, to_torch

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench-out" / "gpu"
NO_GPU = "gpu-check: no CUDA device (torch.cuda.is_available() is False); run it on an NVIDIA GPU"


def build_plan(out: Path, workers: int = 4) -> Path:
    """The demo's plan over the built-in corpora, built once under ``out``."""
    plan_json = out / "plan.json"
    if plan_json.exists():
        return plan_json
    sources = write_builtin_corpora(out / "corpora")
    tokenizer = out / "tokenizer.json"
    if not tokenizer.exists():
        demo.train_bpe(demo.corpus_texts(list(sources.values())), demo.DEMO_VOCAB, tokenizer)
    for name, directory in sources.items():
        tokenize(TokenizeConfig(inputs=(str(directory),), out=str(out / "stores" / name),
                                tokenizer=str(tokenizer), workers=workers))  # fmt: skip
    spec = out / "plan.toml"
    write_atomic(spec, demo.demo_plan_toml(max_repeats=demo.DEMO_BUDGETS).encode())
    plan = resolve_plan(load_plan_spec(spec), str(spec))
    check_budgets(plan, str(spec))
    write_atomic(plan_json, plan.to_json().encode())
    return plan_json


def tiny_model_module() -> ModuleType:
    """``examples/train_tiny.py`` as a module (its ``TinyGPT``)."""
    spec = importlib.util.spec_from_file_location("train_tiny", REPO / "examples" / "train_tiny.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()  # on the current stream
    return event


@dataclass
class Fetched:
    """One step on its way to the GPU: its device tensors and the events around their copy."""

    batches: list[dict[str, torch.Tensor]]
    host: list[dict[str, torch.Tensor]]  # pinned: kept until the step is done
    copy: tuple[torch.cuda.Event, torch.cuda.Event]
    wait_s: float
    pin_s: float


def fetch(loader: Loader, side: torch.cuda.Stream, device: torch.device) -> Fetched:
    started = time.perf_counter()
    step = loader.step()
    waited = time.perf_counter()
    host = [to_torch(micro, pin=True) for micro in step.micro_batches]
    pinned = time.perf_counter()
    with torch.cuda.stream(side):  # allocated and copied on the side stream
        begin = _event()
        batches = [{k: t[k].to(device, non_blocking=True) for k in ("inputs", "targets")}
                   for t in host]  # fmt: skip
        end = _event()
    return Fetched(batches, host, (begin, end), waited - started, pinned - waited)


def train(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda", 0)
    model = tiny_model_module().TinyGPT(plan.vocab_size, plan.seq_len, args.width, 4, 4).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    side, main = torch.cuda.Stream(device), torch.cuda.current_stream(device)
    total, started = args.warmup + args.steps, time.perf_counter()
    fetched: list[Fetched] = []
    computes: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    loss_sum = torch.zeros((), device=device)
    base = _event()
    with Loader(plan, 0, BatchConfig(1, args.micro, args.accum), prefetch=args.prefetch) as loader:
        nxt = fetch(loader, side, device)
        for i in range(total):
            if i == args.warmup:
                torch.cuda.synchronize(device)
                started = time.perf_counter()
            fetched.append(replace(nxt, batches=[], host=[]))  # its timings, not its tensors
            main.wait_stream(side)
            begin = _event()
            for t in nxt.batches:
                for tensor in t.values():
                    tensor.record_stream(main)  # used on main: the allocator must know
                logits = model(t["inputs"], None).flatten(0, 1)
                loss = F.cross_entropy(logits, t["targets"].flatten())
                (loss / args.accum).backward()
                loss_sum += loss.detach()
            opt.step()
            opt.zero_grad(set_to_none=True)
            computes.append((begin, _event()))
            loader.commit()
            if i + 1 < total:
                nxt = fetch(loader, side, device)  # its copy runs under this step's compute
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
    if not torch.isfinite(loss_sum):
        raise TokentapeError(f"the loss is {float(loss_sum)}")
    ms = base.elapsed_time  # milliseconds from the start, on the GPU's clock
    copies = [(ms(a), ms(b)) for a, b in (f.copy for f in fetched[args.warmup :])]
    spans = [(ms(a), ms(b)) for a, b in computes]
    copy_ms = sum(b - a for a, b in copies)
    hidden_ms = sum(max(0.0, min(e, b) - max(s, a)) for s, e in copies for a, b in spans)
    waits = np.array([f.wait_s for f in fetched[args.warmup :]]) * 1e3
    tokens = args.steps * args.micro * args.accum * plan.seq_len
    return {
        "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
        "steps": args.steps, "micro": args.micro, "accum": args.accum, "seq_len": plan.seq_len,
        "steps_per_s": args.steps / seconds, "tokens_per_s": tokens / seconds,
        "data_wait_ms_mean": float(waits.mean()), "data_wait_ms_p50": float(np.median(waits)),
        "data_wait_ms_max": float(waits.max()),
        "pin_ms_mean": 1e3 * float(np.mean([f.pin_s for f in fetched[args.warmup :]])),
        "compute_ms_mean": float(np.mean([b - a for a, b in spans[args.warmup :]])),
        "copy_ms_mean": copy_ms / len(copies),
        "copy_hidden_pct": 100.0 * hidden_ms / copy_ms if copy_ms > 0 else 0.0,
    }  # fmt: skip


def smoke_process(plan_json: Path, steps: int, backend: str, dp: int, tp: int) -> dict[str, Any]:
    """``tokentape smoke`` as a process, ``dp x tp`` ranks in a ``backend`` group."""
    args = [sys.executable, "-m", "tokentape", "smoke", str(plan_json), "--dp", str(dp),
            "--tp", str(tp), "--backend", backend, "--steps", str(steps)]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return {"rc": done.returncode, "backend": backend, "ranks": dp * tp,
            "verdict": lines[-1] if lines else ""}  # fmt: skip


def nccl_check(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    """One rank in an NCCL group: ``check_step`` (all-gather on the GPU) on every step."""
    if not dist.is_nccl_available():
        return {"ok": False, "verdict": "this torch has no NCCL"}
    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl", init_method=f"file://{tmp}/init", rank=0, world_size=1)
        try:
            with Loader(plan, 0, BatchConfig(1, args.micro, args.accum)) as loader:
                for _ in range(args.smoke_steps):
                    check_step(loader.step(), 0, model_parallel_size=1)
                    loader.commit()
            verdict = f"OK: {args.smoke_steps} steps, world 1"
        except Exception as exc:  # report the failure as one line, keep the other figures
            verdict = f"FAIL: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        finally:
            dist.destroy_process_group()
    return {"ok": verdict.startswith("OK"), "verdict": verdict}


OPTIONS = {  # name: (default, least, help)
    "steps": (100, 1, "measured steps"),
    "warmup": (5, 0, "steps before measuring"),
    "micro": (16, 1, "samples per micro-batch"),
    "accum": (2, 1, "micro-batches per step"),
    "prefetch": (2, 0, "the loader's prefetch"),
    "width": (256, 1, "TinyGPT width (layers 4, heads 4)"),
    "smoke-steps": (3, 1, "steps of each rank check"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="plan and stores, reused")
    for name, (default, _, text) in OPTIONS.items():
        p.add_argument(f"--{name}", type=int, default=default, help=f"{text} (default {default})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = p.parse_args(argv)
    for name, (_, least, _) in OPTIONS.items():
        if getattr(args, name.replace("-", "_")) < least:
            p.exit(2, f"gpu-check: error: --{name} must be at least {least}\n")
    return args


def render(result: dict[str, Any]) -> str:
    rows = [[k, round(v, 3) if isinstance(v, float) else v] for k, v in result["train"].items()]
    smoke, over_nccl, nccl = result["smoke"], result["smoke_nccl"], result["nccl"]
    rows += [["smoke dp 2 tp 2 (gloo)", f"rc {smoke['rc']}: {smoke['verdict']}"],
             [f"smoke over NCCL, {over_nccl['ranks']} ranks",
              f"rc {over_nccl['rc']}: {over_nccl['verdict']}"],
             ["check_step over NCCL", nccl["verdict"]]]  # fmt: skip
    return table(["gpu check", "value"], rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    try:
        plan_json = build_plan(args.out)
        plan = load_plan(plan_json)
        result: dict[str, Any] = {"plan": str(plan_json), "train": train(plan, args)}
        result["smoke"] = smoke_process(plan_json, args.smoke_steps, "gloo", 2, 2)
        gpus = min(4, torch.cuda.device_count())  # a data-parallel rank per device
        result["smoke_nccl"] = smoke_process(plan_json, args.smoke_steps, "nccl", gpus, 1)
        result["nccl"] = nccl_check(plan, args)
    except TokentapeError as exc:
        print(f"gpu-check: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else render(result))
    passed = result["smoke"]["rc"] == 0 and result["smoke_nccl"]["rc"] == 0
    return 0 if passed and result["nccl"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The torch DataLoader path against the native loader, side by side in one run.

Builds (once, cached under ``bench-out/torch/``) three token stores from synthetic jsonl with the
``bytes`` tokenizer (as ``loader_bench.py`` does), a plan mixing them 60/30/10 at ``seq_len`` L,
and reads it page-cached as int64 micro-batches of B samples (dp 1, accum 1), rounds
interleaved, each round continuing every system's own stream of positions:

- ``Loader`` with ``prefetch`` 0 and 2: ``step()`` + ``commit()``; alone (numpy arrays) and
  with ``to_torch(pin=False)`` per micro-batch (what a torch trainer does with it);
- ``TapeDataset`` + ``DataLoader(batch_sampler=TapeBatchSampler, collate_fn=collate)`` at 0 and
  2 workers: one ``__getitems__`` (one ``Batcher.batch``) per micro-batch; and the same at 0
  workers with torch's ``default_collate`` (which stacks the samples again);
- ``TapeSampler`` + ``batch_size=B``: the DataLoader's own batch sampler over single positions,
  which now also reads each micro-batch with one ``__getitems__`` (then ``default_collate``);
- the per-item path as it was before ``__getitems__`` (one ``__getitem__``, one
  ``Batcher.batch`` per sample), at 0 and 2 workers.

Each round of a system drops the first ``--warm`` batches (those prefetched while the other
systems ran) and times the next ``--batches``. Printed: samples/s (median over rounds) and the
ratio to the native ``Loader`` at the same prefetch depth (0 workers ~ prefetch 0). Ratios are
what matter; nothing here asserts a time.

    python benchmarks/torch_bench.py [--micro 64] [--seq-len 2048] [--rounds 5] [--batches 40]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from loader_bench import make_jsonl, page_in
from torch.utils.data import DataLoader

from tokentape._src.plan.plan import resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.torch.data import (
    TapeBatchSampler,
    TapeDataset,
    TapeSampler,
    collate,
    to_torch,
)
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench-out" / "torch"
SOURCES = (("web", 60), ("code", 30), ("math", 10))


def build(out: Path, mb: float, seq_len: int) -> Path:
    """Three stores of synthetic text (about ``mb`` MiB in all, split by weight) and a plan."""
    out.mkdir(parents=True, exist_ok=True)
    for i, (name, weight) in enumerate(SOURCES):
        if not (out / name).exists():
            make_jsonl(out / f"{name}.jsonl", mb * weight / 100, seed=i)
            tokenize(TokenizeConfig(inputs=(str(out / f"{name}.jsonl"),), out=str(out / name)))
    toml = out / f"plan-{seq_len}.toml"
    lines = [f"seq_len = {seq_len}", "seed = 1234", "total_samples = 10_000_000_000_000", ""]
    for name, weight in SOURCES:
        lines += ["[[source]]", f'name = "{name}"', f'path = "{name}"', f"weight = {weight}"]
        lines += ["max_repeats = 1e12", ""]
    toml.write_text("\n".join(lines))
    return toml


def native(plan: Any, config: BatchConfig, prefetch: int, torch_out: bool) -> Iterator[Any]:
    """Micro-batches of a native loader, forever; as ``to_torch`` dicts if ``torch_out``."""
    with Loader(plan, 0, config, prefetch=prefetch) as loader:
        while True:
            for micro in loader.step().micro_batches:
                yield to_torch(micro, pin=False) if torch_out else micro
            loader.commit()


class PerItem(TapeDataset):
    """TapeDataset without ``__getitems__``: the DataLoader calls ``__getitem__`` per sample."""

    __getitems__ = None  # the DataLoader checks the attribute is truthy


def torch_loader(plan: Any, config: BatchConfig, steps: int, **kw: Any) -> Iterator[Any]:
    """A DataLoader's batches; ``kw``: ``batched`` (batch sampler, else TapeSampler +
    batch_size), ``workers``, ``collate`` (ours, else torch's default), ``per_item``."""
    dataset = PerItem(plan) if kw.get("per_item") else TapeDataset(plan)
    workers = kw["workers"]
    common: dict[str, Any] = {"num_workers": workers, "persistent_workers": workers > 0}
    if kw["batched"]:
        sampler = TapeBatchSampler(0, config, 0, steps)
        fn = collate if kw["collate"] else None
        data = DataLoader(dataset, batch_sampler=sampler, collate_fn=fn, **common)
    else:
        data = DataLoader(
            dataset, batch_size=config.micro, sampler=TapeSampler(0, config, 0, steps), **common
        )
    yield from data


def timed(stream: Iterator[Any], warm: int, batches: int) -> tuple[float, float, int]:
    """Wall and CPU seconds (this process, all its threads) and this process's minor page
    faults for ``batches`` batches after dropping ``warm``."""
    for _ in range(warm):
        next(stream)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(stream)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--micro", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=40, help="timed batches per round")
    ap.add_argument("--item-batches", type=int, default=4, help="the same, per-item path")
    ap.add_argument("--warm", type=int, default=4)
    ap.add_argument("--mb", type=float, default=48.0, help="MiB of synthetic text, all sources")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    B, L = args.micro, args.seq_len

    plan = resolve_plan(load_plan_spec(build(args.out, args.mb, L)))
    n_tokens = page_in(Batcher(plan))
    config = BatchConfig(dp_size=1, micro=B)
    torch.set_num_threads(1)
    print(
        f"stores: {len(SOURCES)} (60/30/10), {n_tokens / 1e6:.1f} M tokens (page-cached); "
        f"micro-batch {B} x {L + 1} int64; cpus {os.cpu_count()}; torch {torch.__version__}"
    )
    per_round = args.warm + max(args.batches, args.item_batches)
    steps = args.rounds * per_round + 8
    systems: list[tuple[str, Callable[[], Iterator[Any]], int, str]] = [
        ("Loader prefetch 0", lambda: native(plan, config, 0, False), args.batches, "0"),
        ("Loader prefetch 2", lambda: native(plan, config, 2, False), args.batches, "2"),
        ("Loader prefetch 0 + to_torch", lambda: native(plan, config, 0, True), args.batches, "0"),
        ("Loader prefetch 2 + to_torch", lambda: native(plan, config, 2, True), args.batches, "2"),
    ]
    for workers in (0, 2):
        ref = "0" if workers == 0 else "2"
        for batched, fn, per_item, label, n in (
            (True, True, False, "TapeBatchSampler + __getitems__ + collate", args.batches),
            (True, False, False, "TapeBatchSampler + __getitems__ + default_collate", args.batches),
            (False, False, False, "TapeSampler + batch_size=B (__getitems__)", args.batches),
            (False, False, True, "per item, no __getitems__ (before)", args.item_batches),
        ):
            if workers and batched and not fn:
                continue
            kw = {"batched": batched, "collate": fn, "workers": workers, "per_item": per_item}
            make = lambda kw=kw: torch_loader(plan, config, steps, **kw)  # noqa: E731
            systems.append((f"DataLoader {workers} workers: {label}", make, n, ref))
    streams = {name: make() for name, make, _, _ in systems}
    wall: dict[str, list[float]] = {name: [] for name, _, _, _ in systems}
    cpu: dict[str, list[float]] = {name: [] for name, _, _, _ in systems}
    faults: dict[str, list[float]] = {name: [] for name, _, _, _ in systems}
    for _ in range(args.rounds):
        for name, _, n, _ in systems:
            w, c, f = timed(streams[name], args.warm, n)
            wall[name].append(w / n)
            cpu[name].append(c / n)
            faults[name].append(f / n)
    rate = {name: B / float(np.median(wall[name])) for name in wall}
    used = {name: float(np.median(cpu[name])) for name in cpu}
    print(f"\n{args.rounds} rounds, interleaved, medians. Ratios to the native Loader at")
    print("prefetch 0 for 0 workers, 2 for 2 workers. 'CPU': this process's CPU time per batch")
    print("(all its threads, not the workers'), the work done; wall time on a loaded machine also")
    print("counts waits for a thread to be scheduled (the Loader builds steps in its prefetch")
    print("thread even at prefetch 0). 'faults': this process's minor page faults per batch.\n")
    head = "| system | samples/s | vs Loader | vs Loader + to_torch | CPU ms/batch | CPU vs Loader"
    print(head + " | faults |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, _, _, ref in systems:
        bare, conv = f"Loader prefetch {ref}", f"Loader prefetch {ref} + to_torch"
        print(
            f"| {name} | {rate[name]:,.0f} | {rate[name] / rate[bare]:.2f}x "
            f"| {rate[name] / rate[conv]:.2f}x | {used[name] * 1e3:.2f} "
            f"| {used[bare] / used[name]:.2f}x | {np.median(faults[name]):.0f} |"
        )


if __name__ == "__main__":
    main()

"""The loader in isolation, at a training batch size, against a bare memcpy of the same bytes.

Builds (once, cached under ``bench-out/loader/``) two token stores from synthetic jsonl with the
``bytes`` tokenizer (uint16), a plan over them at ``seq_len`` L with a horizon of 10**13 samples,
and reads it page-cached. Measured side by side in one run, rounds interleaved:

1. **assembly**: ``Batcher(plan).batch(positions)`` for one step of B consecutive positions (what
   ``Loader.step()`` does with ``prefetch=0``): p50/p99 latency and tokens/s; and a breakdown of
   one step into ``tape.resolve`` and gathering the windows.
2. **memcpy**: the same bytes without the loader, every destination freshly allocated as the
   loader's is: B random (L+1)-token slices of the page-cached store copied into an output array
   in a Python loop (same widening to the output dtype), one contiguous ``np.copyto`` of the same
   tokens, and a raw byte copy of the output's size. The aim is assembly within 2x of the memcpy.
3. **prefetch**: ``Loader(prefetch=2)`` under a simulated trainer that sleeps X ms per step; the
   time it waits in ``step()`` in steady state (the first 6 steps dropped). Headroom =
   X / assembly p50; the wait should be ~0 above 1.
4. **resume**: a fresh ``Loader`` + ``load_state_dict`` at ``consumed = 0`` and at 10**12, to the
   first step returned (alternating). The aim is equal times.

Ratios are what matter: the machine is noisy and nothing here asserts an absolute time.

    python benchmarks/loader_bench.py [--batch 1024] [--seq-len 4096] [--steps 30] [--mb 64]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from tokentape._src.plan.plan import resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.train.ahead import CHUNK, MAX_STEPS, ResolveAhead, StepShape
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import Loader, hash_dtype, step_tokens_hash
from tokentape._src.train.partition import BatchConfig

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench-out" / "loader"
SOURCES = ("web", "code")


def make_jsonl(path: Path, mb: float, seed: int) -> None:
    """Documents of random words (deterministic), about ``mb`` MiB of text."""
    if path.exists():
        return
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    words = [bytes(letters[rng.integers(0, 26, rng.integers(2, 10))]).decode() for _ in range(5000)]
    target = int(mb * 2**20)
    written = 0
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        while written < target:
            n_docs = 256
            lengths = rng.integers(50, 3000, n_docs)
            picks = rng.integers(0, len(words), int(lengths.sum()))
            at = 0
            for n in lengths.tolist():
                line = json.dumps({"text": " ".join(words[i] for i in picks[at : at + n])}) + "\n"
                at += n
                f.write(line)
                written += len(line)
    tmp.rename(path)


def build(out: Path, mb: float, seq_len: int, seconds: dict[str, float]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for i, name in enumerate(SOURCES):
        make_jsonl(out / f"{name}.jsonl", mb / len(SOURCES), seed=i)
    seconds["jsonl"] = time.perf_counter() - started
    started = time.perf_counter()
    for name in SOURCES:
        config = TokenizeConfig(inputs=(str(out / f"{name}.jsonl"),), out=str(out / name))
        tokenize(config)
    seconds["tokenize"] = time.perf_counter() - started
    toml = out / "plan.toml"
    lines = [f"seq_len = {seq_len}", "seed = 1234", "total_samples = 10_000_000_000_000", ""]
    for name, weight in zip(SOURCES, (3, 1), strict=True):
        lines += ["[[source]]", f'name = "{name}"', f'path = "{name}"', f"weight = {weight}"]
        lines += ["max_repeats = 1e12", ""]
    toml.write_text("\n".join(lines))
    return toml


def page_in(batcher: Batcher) -> int:
    """Read every shard once so the store is page-cached; returns the store's token count."""
    total = 0
    for src in batcher.sources:
        for shard in src._shards:
            np.asarray(shard).sum()
            total += len(shard)
    return total


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x >= 0.01 else f"{x * 1e3:.3g} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--mb", type=float, default=64.0, help="MiB of synthetic text, all sources")
    ap.add_argument("--dtype", default="int64", choices=["int32", "int64"])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    B, L, dtype = args.batch, args.seq_len, np.dtype(args.dtype)

    seconds: dict[str, float] = {}
    plan = resolve_plan(load_plan_spec(build(args.out, args.mb, L, seconds)))
    batcher = Batcher(plan, dtype)
    n_tokens = page_in(batcher)
    step_tokens = B * (L + 1)
    out_bytes = step_tokens * dtype.itemsize
    print(
        f"stores: {len(SOURCES)} x uint16, {n_tokens / 1e6:.1f} M tokens (page-cached); "
        f"jsonl {seconds['jsonl']:.1f} s, tokenize {seconds['tokenize']:.1f} s; "
        f"cpus {os.cpu_count()}"
    )
    print(
        f"step: B = {B}, L = {L}, {step_tokens / 1e6:.2f} M tokens, "
        f"{out_bytes / 2**20:.1f} MiB as {dtype}"
    )

    # --- 1 + 2: assembly vs memcpy, interleaved --------------------------------------------
    shard = max((s for src in batcher.sources for s in src._shards), key=len)
    rng = np.random.default_rng(0)
    raw_src = np.empty(out_bytes, dtype=np.uint8)
    raw_src[:] = 1
    t_batch, t_resolve, t_loop, t_contig, t_raw, t_blocks = [], [], [], [], [], []
    t_hash: list[float] = []
    log_batcher = Batcher(plan, hash_dtype(plan))
    tape = plan.tape()
    for i in range(args.steps + 2):
        positions = np.arange(i * B, (i + 1) * B, dtype=np.int64)
        t0 = time.perf_counter()
        batch = batcher.batch(positions)
        t1 = time.perf_counter()
        r = tape.resolve(positions)
        t2 = time.perf_counter()
        for d in np.unique(r.source).tolist():  # the gather alone, into per-source blocks
            rows = np.flatnonzero(r.source == d)
            block = np.empty((rows.size, L + 1), dtype=dtype)
            batcher.sources[d].windows_into(r.sample[rows], L, block)
        t_blocks.append(time.perf_counter() - t2)
        starts = rng.integers(0, len(shard) - L - 1, B).tolist()
        t3 = time.perf_counter()
        out = np.empty((B, L + 1), dtype=dtype)
        for row, s in enumerate(starts):
            out[row] = shard[s : s + L + 1]
        t4 = time.perf_counter()
        lo = int(rng.integers(0, len(shard) - step_tokens)) if len(shard) > step_tokens else 0
        flat = np.empty(step_tokens, dtype=dtype)
        np.copyto(flat[: min(step_tokens, len(shard))], shard[lo : lo + step_tokens])
        t5 = time.perf_counter()
        raw = np.empty_like(raw_src)
        np.copyto(raw, raw_src)
        t6 = time.perf_counter()
        assert batch.tokens.shape == (B, L + 1)
        t7 = time.perf_counter()  # the step log's path: the whole step in the stores' width
        step_tokens_hash(log_batcher.batch(positions), plan)
        t_hash.append(time.perf_counter() - t7)
        if i >= 2:  # two warm-up rounds
            t_batch.append(t1 - t0)
            t_resolve.append(t2 - t1)
            t_loop.append(t4 - t3)
            t_contig.append(t5 - t4)
            t_raw.append(t6 - t5)
    asm50, asm99 = pct(t_batch, 50), pct(t_batch, 99)
    loop50, contig50, raw50 = pct(t_loop, 50), pct(t_contig, 50), pct(t_raw, 50)
    res50, blk50 = pct(t_resolve, 50), pct(t_blocks[2:], 50)
    print(f"\n1. assembly ({args.steps} steps, prefetch=0 path: Batcher.batch)")
    print(f"   p50 {ms(asm50)}  p99 {ms(asm99)}  {step_tokens / asm50 / 1e6:.1f} M tokens/s")
    print(
        f"   breakdown (p50): tape.resolve {ms(res50)} ({res50 / asm50:.1%}), "
        f"gather windows {ms(asm50 - res50)} ({1 - res50 / asm50:.1%})"
    )
    ahead_steps = 4 * min(MAX_STEPS, max(1, CHUNK // B))  # its chunks grow to full size first
    ahead = ResolveAhead(tape)  # what Loader uses: coming steps resolved in chunks
    t0 = time.perf_counter()
    for i in range(ahead_steps):
        ahead.resolved(i * B, StepShape(B, 0, B))
    ahead_mean = (time.perf_counter() - t0) / ahead_steps
    print(
        f"   the same resolve through the loader's chunks (ResolveAhead), mean over "
        f"{ahead_steps:,} steps: {ms(ahead_mean)} ({ahead_mean / res50:.3f}x the direct call)"
    )
    print(
        f"   of the gather: windows_into per-source blocks alone {ms(blk50)}, the rest "
        f"(scatter of the blocks into the batch rows, allocation) {ms(asm50 - res50 - blk50)}"
    )
    hash50 = pct(t_hash[2:], 50)
    print(
        f"   step log (rank 0's prefetch thread): the whole step assembled as "
        f"{hash_dtype(plan)} + sha256: {ms(hash50)} ({hash50 / asm50:.2f}x assembly)"
    )
    print("2. memcpy of the same step, same run (p50)")
    print(
        f"   {B} random slices, Python loop: {ms(loop50)}  -> assembly / it = {asm50 / loop50:.2f}x"
    )
    print(
        f"   one contiguous np.copyto:   {ms(contig50)}  -> assembly / it = {asm50 / contig50:.2f}x"
    )
    print(f"   raw byte copy ({out_bytes / 2**20:.0f} MiB):  {ms(raw50)}  -> {asm50 / raw50:.2f}x")

    # --- 3: prefetch under a simulated trainer ------------------------------------------------
    print("3. Loader(prefetch=2), trainer sleeps X per step; wait in step()")
    config = BatchConfig(dp_size=1, micro=B, accum=1)
    prefetch_rows = []
    for factor in (0.0, 0.5, 1.5, 3.0):
        sleep = factor * asm50
        with Loader(plan, dp_rank=0, config=config, prefetch=2, dtype=dtype) as loader:
            waits = []
            for _ in range(max(12, args.steps)):
                t0 = time.perf_counter()
                loader.step()
                waits.append(time.perf_counter() - t0)
                time.sleep(sleep)
                loader.commit()
        waits = waits[6:]  # steady state: the pipeline's start-up drained
        w50, w99 = pct(waits, 50), pct(waits, 99)
        prefetch_rows.append((factor, sleep, w50, w99))
        print(
            f"   X = {ms(sleep)} (headroom {factor:.1f}): wait p50 {ms(w50)} p99 {ms(w99)} "
            f"({w50 / asm50:.2f}x assembly)"
        )

    # --- 4: resume ------------------------------------------------------------------------
    print("4. resume: new Loader + load_state_dict + first step (prefetch=0), alternating")
    times: dict[int, list[float]] = {0: [], 10**12 // B * B: []}
    for _ in range(5):
        for consumed in times:
            t0 = time.perf_counter()
            loader = Loader(plan, dp_rank=0, config=config, prefetch=0, dtype=dtype)
            steps = consumed // B  # a run of `steps` steps of B samples
            history = [{"step": 0, "consumed": 0, "dp_size": 1, "micro": B, "accum": 1}]
            saved = {**loader.state_dict(), "consumed": steps * B, "step": steps}
            loader.load_state_dict({**saved, "history": history if steps else []})
            s = loader.step()
            times[consumed].append(time.perf_counter() - t0)
            assert s.consumed == consumed
            loader.close()
    r0, r12 = pct(times[0], 50), pct(times[10**12 // B * B], 50)
    print(f"   consumed = 0: {ms(r0)}  consumed = 10^12: {ms(r12)}  ratio {r12 / r0:.2f}x")

    print("\n| measure | value | aim |")
    print("| --- | --- | --- |")
    print(
        f"| assembly, one step (B = {B}, L = {L}, {dtype}) | p50 {ms(asm50)}, p99 {ms(asm99)}, "
        f"{step_tokens / asm50 / 1e6:.1f} M tokens/s | |"
    )
    print(f"| of which tape.resolve / gather | {ms(res50)} / {ms(asm50 - res50)} | |")
    print(
        f"| of the gather: windows_into / scatter into rows | {ms(blk50)} / "
        f"{ms(asm50 - res50 - blk50)} | |"
    )
    print(
        f"| step log (rank 0, prefetch thread): whole step as {hash_dtype(plan)} + sha256 | "
        f"{ms(hash50)} ({hash50 / asm50:.2f}x assembly) | off the trainer's thread |"
    )
    verdict = "PASS" if asm50 / loop50 <= 2 else "MISS"
    print(
        f"| vs memcpy, {B} random slices (loop) | {ms(loop50)}: {asm50 / loop50:.2f}x "
        f"| within 2x: {verdict} |"
    )
    print(f"| vs memcpy, contiguous np.copyto | {ms(contig50)}: {asm50 / contig50:.2f}x | |")
    print(f"| vs raw byte copy of the output | {ms(raw50)}: {asm50 / raw50:.2f}x | |")
    for factor, sleep, w50, w99 in prefetch_rows:
        print(
            f"| prefetch=2, trainer step {ms(sleep)} (headroom {factor:.1f}) "
            f"| wait p50 {ms(w50)}, p99 {ms(w99)} | ~0 above 1 |"
        )
    verdict = "PASS" if r12 / r0 <= 1.25 else "MISS"
    print(
        f"| resume to first step, consumed 0 / 10^12 | {ms(r0)} / {ms(r12)}: {r12 / r0:.2f}x "
        f"| equal: {verdict} |"
    )


if __name__ == "__main__":
    main()

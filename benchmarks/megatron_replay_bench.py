"""``tokentape megatron replay|locate`` on a cache megatron-core built, side by side with
megatron-core reading the same samples.

The data (cached under ``bench-out/megatron-replay/``): three prefixes (``--tokens`` in all,
default 3 * 10**7; random uint16 ids, documents of 50-3,000 tokens each ending with the EOD id)
written by tokentape's ``MegatronWriter``, and a blend (60/30/10) of ``--samples`` training
samples (default 2 * 10**6) at sequence length ``--seq-len`` (1024) built by megatron-core's
``BlendedMegatronDatasetBuilder`` with ``path_to_cache`` (the run's data cache).

Measured in this one process, best of ``--rounds``, after one warm-up:

1. **replay**: iteration ``N`` at global batch ``B`` (1,024): ``open_run`` + ``replay_iteration``
   (tokentape), against ``[blend[g]["tokens"] for g in the batch]`` on megatron-core's already
   built ``BlendedDataset`` (its build, which a real run does at start-up, not counted).
   The command as a user runs it (a fresh process, imports included) is timed too.
2. **locate**: the inverted map of the largest dataset, built (seconds, and per sample), its
   size on disk (bytes per sample), read back (checked against the cache), and one
   ``locate`` of a document with the map warm.
3. **a blend never saved**, rebuilt by megatron-core's rule for the run's samples: the compiled
   rule against the Python loop (on a tenth of the samples, scaled) and against megatron-core's
   own compiled helper (``helpers_cpp.build_blending_indices``), the arrays compared.

Nothing is asserted; the ratios are the figures.

    python benchmarks/megatron_replay_bench.py [--samples 2000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from tokentape._src.audit.megatron_locate import dataset_map, landings
from tokentape._src.audit.megatron_replay import Shape, replay_iteration
from tokentape._src.megatron.format import MegatronWriter
from tokentape._src.megatron.greedy import blending_indices, normalize
from tokentape._src.megatron.select import RunQuery, open_run

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench-out" / "megatron-replay"
VOCAB, EOD = 50257, 50256
WEIGHTS = {"web": 0.6, "code": 0.3, "math": 0.1}


def write_prefixes(out: Path, tokens: int) -> list[Path]:
    rng = np.random.default_rng(0)
    prefixes = []
    for name, w in WEIGHTS.items():
        prefix = out / name
        prefixes.append(prefix)
        if Path(f"{prefix}.idx").exists():
            continue
        want = int(tokens * w)
        lengths = rng.integers(50, 3000, size=want // 1500 + 1)
        lengths = lengths[: np.searchsorted(np.cumsum(lengths), want) + 1]
        data = rng.integers(0, EOD, size=int(lengths.sum()), dtype=np.uint16)
        data[np.cumsum(lengths) - 1] = EOD
        writer = MegatronWriter(prefix, "uint16")
        writer.add(data, lengths)
        writer.finish()
    return prefixes


class _Tokenizer:
    unique_identifiers = {"class": "BenchTokenizer", "vocab": VOCAB}  # noqa: RUF012
    vocab_size = VOCAB
    eod = EOD

    @property
    def pad(self) -> int:
        raise NotImplementedError


def build_cache(prefixes: list[Path], cache: Path, samples: int, seq_len: int):
    """megatron-core's blend over ``prefixes`` (its data cache in ``cache``)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

        if not torch.distributed.is_initialized():
            rendezvous = Path(tempfile.mkdtemp()) / "rendezvous"
            torch.distributed.init_process_group(
                "gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1
            )
        config = GPTDatasetConfig(
            random_seed=1234,
            sequence_length=seq_len,
            blend=([str(p) for p in prefixes], list(WEIGHTS.values())),
            split="100,0,0",
            path_to_cache=str(cache),
            tokenizer=_Tokenizer(),
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            create_attention_mask=False,
        )
        return BlendedMegatronDatasetBuilder(
            GPTDataset, [samples, 0, 0], lambda: True, config
        ).build()[0]


def best(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=float, default=3e7)
    ap.add_argument("--samples", type=int, default=2_000_000)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prefixes = write_prefixes(args.out, int(args.tokens))
    cache = args.out / f"cache-{args.samples}-{args.seq_len}"
    t = time.perf_counter()
    blend = build_cache(prefixes, cache, args.samples, args.seq_len)
    print(
        f"megatron-core blend: {len(blend):,} samples "
        f"({time.perf_counter() - t:.1f} s to build or load)"
    )
    query = RunQuery((cache,), tuple(prefixes))
    iteration = len(blend) // args.batch // 2
    start = (iteration - 1) * args.batch

    def ours() -> None:
        run = open_run(query)
        replay_iteration(run, iteration, start, args.batch, Shape())

    def theirs() -> None:
        for g in range(start, start + args.batch):
            blend[g]["tokens"]

    a, b = best(ours, args.rounds), best(theirs, args.rounds)
    print(f"replay of iteration {iteration:,} (B = {args.batch:,}, L = {args.seq_len}):")
    print(f"  tokentape open + replay   {a * 1000:8.1f} ms")
    print(f"  megatron-core getitem     {b * 1000:8.1f} ms (its blend already built)")
    print(f"  ratio (megatron / tokentape) {b / a:.2f}x")
    command = [
        sys.executable, "-m", "tokentape", "megatron", "replay", str(cache),
        *[x for p in prefixes for x in ("--prefix", str(p))],
        "--iteration", str(iteration), "--global-batch", str(args.batch), "--json",
    ]  # fmt: skip
    times = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    print(f"  the command, fresh process: {min(times):.2f} s best of 3 (imports included)")

    run = open_run(query)
    with tempfile.TemporaryDirectory() as maps:
        t = time.perf_counter()
        m, _ = dataset_map(run, 0, Path(maps))
        built = time.perf_counter() - t
        size = sum(f.stat().st_size for f in Path(maps).rglob("*.npy"))
        n = run.datasets[0].n_samples
        print(
            f"locate map of {prefixes[0].name} ({n:,} samples, "
            f"{len(run.datasets[0].document_index):,} positions):"
        )
        print(
            f"  built in {built:.2f} s ({built / n * 1e6:.2f} us per sample), "
            f"{size / n:.1f} bytes per sample on disk"
        )
        t = time.perf_counter()
        m, _ = dataset_map(run, 0, Path(maps))
        loaded = time.perf_counter() - t
        docs = run.datasets[0]
        doc = (docs.begin + docs.end) // 2
        t = time.perf_counter()
        hits = landings(run, 0, doc, m)
        found = time.perf_counter() - t
        print(
            f"  read back (checked) in {loaded:.2f} s; locate of one document: "
            f"{found * 1000:.1f} ms ({len(hits)} samples)"
        )

    weights = normalize(normalize(list(WEIGHTS.values())))
    n = len(blend)
    t = time.perf_counter()
    which, nth = blending_indices(weights, n)
    fast = time.perf_counter() - t
    t = time.perf_counter()
    blending_indices(weights, n // 10, use_compiled=False)
    slow = (time.perf_counter() - t) * 10
    from megatron.core.datasets import helpers_cpp

    theirs_which = np.zeros(n, dtype=np.int16)
    theirs_nth = np.zeros(n, dtype=np.int64)
    t = time.perf_counter()
    helpers_cpp.build_blending_indices(theirs_which, theirs_nth, weights, len(weights), n, False)
    core = time.perf_counter() - t
    same = np.array_equal(which, theirs_which) and np.array_equal(nth, theirs_nth)
    print(f"blend rebuilt by megatron-core's rule ({n:,} samples, 3 datasets):")
    print(f"  compiled {fast * 1000:.1f} ms; Python loop {slow:.2f} s (x{slow / fast:.0f});")
    print(f"  megatron-core's helper {core * 1000:.1f} ms; arrays equal: {same}")


if __name__ == "__main__":
    main()

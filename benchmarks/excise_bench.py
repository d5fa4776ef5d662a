"""Excision at scale: ``Plan.excise`` of 1,000 documents over a 2T-token horizon, and what an
excised plan costs the loader.

Builds (once, cached under ``bench-out/excise/<mtokens>M/``) three token stores with
``tokentape.tokenize`` and the ``bytes`` tokenizer (uint16) from generated jsonl (documents of
random letters and spaces, 64 to 1,024 tokens, mean ~545; the jsonl is deleted once its store is
made): ``web``, ``code`` and ``books`` with 1/2, 3/10 and 1/5 of ``--mtokens`` million tokens
(default 320 M: ~590 k documents, 640 MB of stores), and a plan over them at weights 50/30/20,
``seq_len`` 2048, seed 1234 and a horizon of 2T tokens (``total_tokens="2T"``, 976,562,500
samples). The stores are sized in proportion to the weights, so every source makes the same
number of passes over the horizon, ``2T / --mtokens`` (6,250 by default), and each document is
drawn that many times per sample it overlaps (~1.27). ``Plan.excise`` refuses more than
``MAX_EXCISED`` (10**7) positions, so the stores are this big (rather than a few thousand
documents each) for 1,000 documents' draws (~8 * 10**6) to fit; the count, computed in closed
form, is printed against the bound.

Measured in one run, nothing asserted:

1. **excise**: ``plan.excise(C, docs=...)`` from ``C = --consumed`` (10**6) of ``--docs``
   documents (1,000: evenly spaced ids, split over the sources by weight). First a probe of
   ``--probe`` of them (10), timed once, projects the time of all of them, linearly in the
   documents (a lower bound: a larger excision takes more rounds of ``excise``'s search to
   settle; 1,000 documents took 2.2x the projection here); the full call is made (best of
   ``--rounds``) when the projection is within ``--budget`` seconds, else it is reported as not
   run with the projection (``--budget 900 --rounds 1`` runs it: ~6.5 min here). Aim (the
   issue): <= 1 s. Also: samples removed (per source), and, once, the excised plan's first
   ``tape()`` and its ``to_json()`` (what ``tokentape excise`` writes; size in MiB).
2. **loader**: ``Loader(plan, 0, BatchConfig(dp_size=1, micro=64), prefetch=2, state=...)``
   started at ``consumed = C`` reads ``--steps`` steps (after 4 warm-up steps) of the plan, of the
   plan excised of ``--removed`` positions (10**5: a random 1 in ``--spacing`` = 20 of the
   positions from C on, so the stretch the loader reads is full of gaps; the fraction of its
   steps that straddle one is printed) and of the plan excised of documents (part 1, or its
   probe). Samples/s, best of ``--loader-rounds`` after one unkept round, each side first in
   turn, and the ratio excised / plain (aim: >= 0.97); beside it the median of the rounds'
   ratios and the CPU time a step (both threads). The stores are read once first (page-cached).
   Wall and CPU figures move by 10-15% between rounds here, so the part an excision changes is
   also timed alone: resolving 4,096 steps as the loader does (``ResolveAhead``), its extra
   microseconds a step shown as a share of a plain loader step.
3. **resolve_range**: ``plan.tape().resolve_range(C, n)`` for n = 2**18 (the loader's chunk) and
   2**20, plain against the excised tapes, best of ``--rounds``, interleaved.

The machine is noisy: read the ratios within one run.

    python benchmarks/excise_bench.py [--mtokens 320] [--docs 1000] [--budget 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import tokentape
from tokentape._src.store.format import MANIFEST_NAME
from tokentape._src.tape.excise import MAX_EXCISED, draws_of_samples, samples_overlapping
from tokentape._src.train.ahead import CHUNK, ResolveAhead, StepShape
from tokentape._src.train.batch import Batcher
from tokentape._src.train.state import BatchChange
from tokentape.errors import PlanError

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench-out" / "excise"
SOURCES = (("web", 50), ("code", 30), ("books", 20))
SEED = 1234
HORIZON = "2T"
WARMUP = 4
MEAN_DOC = 544  # tokens: the mean of make_jsonl's lengths


def make_jsonl(path: Path, tokens: int, seed: int) -> None:
    """Documents of random lowercase letters and spaces (64 to 1,024 bytes: as many tokens with
    the ``bytes`` tokenizer), about ``tokens`` bytes of text in all; no JSON escaping needed."""
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
    tmp = path.with_suffix(".tmp")
    written = 0
    with tmp.open("wb") as f:
        while written < tokens:
            lengths = rng.integers(64, 1025, min(4096, (tokens - written) // MEAN_DOC + 1))
            text = alphabet[rng.integers(0, alphabet.size, int(lengths.sum()))].tobytes()
            ends = np.cumsum(lengths).tolist()
            spans = zip([0, *ends[:-1]], ends, strict=True)
            f.write(b"".join(b'{"text": "' + text[a:b] + b'"}\n' for a, b in spans))
            written += ends[-1]
    tmp.rename(path)


def build_stores(root: Path, mtokens: float) -> tuple[dict[str, Path], float]:
    """The stores (cached per size); the seconds spent building them now (0 when cached)."""
    started = time.perf_counter()
    total = sum(w for _, w in SOURCES)
    stores = {}
    for i, (name, weight) in enumerate(SOURCES):
        store = root / name
        stores[name] = store
        if (store / MANIFEST_NAME).exists():
            continue
        jsonl = root / f"{name}.jsonl"
        if not jsonl.exists():
            root.mkdir(parents=True, exist_ok=True)
            make_jsonl(jsonl, int(mtokens * 1e6 * weight / total), seed=i)
        tokentape.tokenize(jsonl, store)
        jsonl.unlink()
    return stores, time.perf_counter() - started


def page_in(plan: tokentape.Plan) -> int:
    """Read every shard once so the stores are page-cached; their token count."""
    total = 0
    for src in Batcher(plan).sources:
        for shard in src._shards:
            np.asarray(shard).sum()
            total += len(shard)
    return total


def picked_docs(n_docs: dict[str, int], n: int) -> list[tuple[str, int]]:
    """``n`` documents, split over the sources by weight, evenly spaced ids in each."""
    total = sum(w for _, w in SOURCES)
    counts = [n * w // total for _, w in SOURCES]
    counts[0] += n - sum(counts)
    docs = []
    for (name, _), k in zip(SOURCES, counts, strict=True):
        docs += [(name, int(d)) for d in np.linspace(0, n_docs[name] - 1, k).astype(np.int64)]
    return docs


def draws_within(plan: tokentape.Plan, docs: list[tuple[str, int]]) -> int:
    """Draws over the horizon of samples holding a token of ``docs`` (closed form; what
    ``excise`` checks against ``MAX_EXCISED``, before its positions grow the horizon)."""
    names = [s.name for s in plan.sources]
    opened = {name: tokentape.open_source(plan.sources[names.index(name)].path) for name in names}
    tape = plan.tape()
    total = 0
    for name, doc in docs:
        d = names.index(name)
        samples = samples_overlapping(opened[name].doc_span(doc), plan.seq_len,
                                      plan.sources[d].n_samples)  # fmt: skip
        total += draws_of_samples(tape, d, samples, plan.horizon_samples)
    return total


def state_at(plan: tokentape.Plan, consumed: int, batch: int) -> tokentape.DataState:
    """A data state of ``plan`` after ``consumed // batch`` steps of ``batch`` samples."""
    steps = consumed // batch
    return replace(tokentape.DataState.start(plan), consumed=steps * batch, step=steps,
                   history=(BatchChange(0, 0, 1, batch, 1),))  # fmt: skip


def loader_rate(plan: tokentape.Plan, consumed: int, batch: int, steps: int) -> tuple[float, float]:
    """Samples/s over ``steps`` steps of a fresh ``Loader(prefetch=2)`` from ``consumed``, and
    the process's CPU seconds a step (both threads: less moved by other processes)."""
    config = tokentape.BatchConfig(dp_size=1, micro=batch)
    with tokentape.Loader(plan, 0, config, state_at(plan, consumed, batch), prefetch=2) as loader:
        for _ in range(WARMUP):
            loader.step()
            loader.commit()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            s = loader.step()
            loader.commit()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert s.micro_batches[0].tokens.shape == (batch, plan.seq_len + 1)
    return steps * batch / seconds, cpu / steps


def ahead_per_step(plan: tokentape.Plan, consumed: int, batch: int, steps: int) -> float:
    """Seconds a step of resolving what ``Loader`` resolves (``ResolveAhead``, in chunks), over
    ``steps`` steps from ``consumed``: the one part of a step an excision changes."""
    ahead = ResolveAhead(plan.tape())
    shape = StepShape(batch, 0, batch)
    first = consumed // batch * batch
    t0 = time.perf_counter()
    for i in range(steps):
        ahead.resolved(first + i * batch, shape)
    return (time.perf_counter() - t0) / steps


def gaps_read(plan: tokentape.Plan, consumed: int, batch: int, steps: int) -> tuple[float, int]:
    """Of the steps ``loader_rate`` reads (warm-up included): the fraction that straddle an
    excised position, and how many excised positions lie among their positions."""
    excision = plan.tape().excision
    first = consumed // batch * batch
    new = np.arange(first, first + (steps + WARMUP) * batch, dtype=np.int64)
    base = excision.to_base(new).reshape(-1, batch)
    straddle = (base[:, -1] - base[:, 0]) != batch - 1
    return float(straddle.mean()), int(base[-1, -1] - base[0, 0] + 1 - base.size)


def timed(call: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = call()
    return out, time.perf_counter() - t0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--mtokens", type=float, default=320.0, help="million tokens, all stores")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--docs", type=int, default=1000, help="documents to excise (part 1)")
    ap.add_argument("--probe", type=int, default=10, help="documents of the timed probe")
    ap.add_argument("--budget", type=float, default=60.0,
                    help="seconds the full excise may take (projected), else not run")  # fmt: skip
    ap.add_argument("--consumed", type=float, default=1e6, help="from_consumed C")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of excise and resolve_range")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300, help="timed loader steps per round")
    ap.add_argument("--loader-rounds", type=int, default=9)
    ap.add_argument("--removed", type=int, default=100_000, help="positions excised (part 2)")
    ap.add_argument("--spacing", type=int, default=20, help="1 in this many positions excised")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args, unknown = ap.parse_known_args(argv)
    if unknown:  # run.py passes the same extra arguments to every benchmark
        print(f"excise_bench: ignoring {' '.join(unknown)}", file=sys.stderr)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    C, B, L = int(args.consumed), args.batch, args.seq_len
    say = (lambda *a: None) if args.json else print
    started = time.perf_counter()
    results: dict[str, Any] = {
        "meta": {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(),
                 "numpy": np.__version__, "cpus": os.cpu_count(),
                 "args": {k: str(v) for k, v in vars(args).items()}},
    }  # fmt: skip

    stores, built = build_stores(args.out / f"{args.mtokens:g}M", args.mtokens)
    plan = tokentape.Plan.build(
        {name: {"path": str(stores[name]), "weight": w, "max_repeats": 1e9} for name, w in SOURCES},
        seq_len=L, seed=SEED, total_tokens=HORIZON,
    )  # fmt: skip
    n_tokens, t_page = timed(lambda: page_in(plan))
    n_docs = {name: tokentape.open_source(stores[name]).n_docs for name, _ in SOURCES}
    passes = {s.name: s.passes for s in plan.sources}
    listed = [f"{s.name} {n_docs[s.name]:,} docs / {s.n_samples:,} samples" for s in plan.sources]
    say(
        f"stores: {', '.join(listed)} ({n_tokens / 1e6:.0f} M tokens, read once in "
        f"{t_page:.1f} s to page-cache them; "
        + (f"built now in {built:.0f} s)" if built > 0.5 else "cached)")
    )
    say(
        f"plan: seq_len {L}, horizon {HORIZON} tokens = {plan.horizon_samples:,} samples; "
        f"passes over it: {', '.join(f'{k} {v:,.0f}' for k, v in passes.items())}; "
        f"cpus {os.cpu_count()}"
    )
    results["setup"] = {"n_docs": n_docs, "tokens": n_tokens, "seq_len": L,
                        "horizon_samples": plan.horizon_samples, "passes": passes,
                        "n_samples": {s.name: s.n_samples for s in plan.sources},
                        "build_seconds": built, "page_in_seconds": t_page}  # fmt: skip

    # --- 1: excise documents ---------------------------------------------------------------
    docs = picked_docs(n_docs, args.docs)
    draws = draws_within(plan, docs)
    fits = draws <= MAX_EXCISED
    say(
        f"\n1. plan.excise({C:,}, docs=<{len(docs):,} documents>): their samples are drawn "
        f"{draws:,} times over the horizon (closed form), {draws / MAX_EXCISED:.0%} of the "
        f"bound MAX_EXCISED {MAX_EXCISED:,}: {'fits' if fits else 'over it: refused'}"
    )
    probe = [docs[i] for i in np.linspace(0, len(docs) - 1, min(args.probe, len(docs)))
             .astype(np.int64).tolist()]  # fmt: skip
    probe_plan, t_probe = timed(lambda: plan.excise(C, docs=probe))
    projected = t_probe * len(docs) / len(probe)
    say(
        f"   probe, {len(probe)} of them: {t_probe:.2f} s, {probe_plan.excisions[-1].count:,} "
        f"samples removed; projected for {len(docs):,}, linearly: {projected:,.0f} s (a lower "
        "bound)"
    )
    res1: dict[str, Any] = {"draws": draws, "bound": MAX_EXCISED, "probe_docs": len(probe),
                            "probe_seconds": t_probe, "projected_seconds": projected,
                            "probe_removed": probe_plan.excisions[-1].count}  # fmt: skip
    docs_plan = None
    times: list[float] = []
    if not fits:
        say("   not run: over the bound (a larger --mtokens makes fewer passes)")
    elif projected > args.budget:
        say(f"   not run: ~{projected:,.0f} s projected, over --budget {args.budget:g} s: aim "
            "<= 1 s: MISS")  # fmt: skip
    else:
        try:
            for _ in range(args.rounds):
                docs_plan, seconds = timed(lambda: plan.excise(C, docs=docs))
                times.append(seconds)
                if sum(times) > args.budget:
                    break
        except PlanError as exc:
            say(f"   refused: {exc}")
            res1["refused"] = str(exc)
    shown_plan = docs_plan if docs_plan is not None else probe_plan
    record = shown_plan.excisions[-1]
    _, t_tape = timed(shown_plan.tape)
    text, t_json = timed(shown_plan.to_json)
    if docs_plan is not None:
        verdict = "PASS" if min(times) <= 1 else "MISS"
        say(
            f"   {len(docs):,} documents: {min(times):.3f} s best of {len(times)} "
            f"({', '.join(f'{t:.3f}' for t in times)}): aim <= 1 s: {verdict}"
        )
        res1.update(seconds=times, best=min(times))
    which = f"{len(docs):,} documents" if docs_plan is not None else f"the probe's {len(probe)}"
    say(
        f"   samples removed ({which}): {record.count:,} "
        f"({record.count / len(record.docs):,.0f} a document), per source "
        f"{', '.join(f'{n} {c:,}' for n, c in record.removed)}; first changed position "
        f"{record.first:,}"
    )
    say(
        f"   then, once ({which}): the excised plan's first tape() {t_tape:.3f} s; "
        f"to_json() {t_json:.2f} s ({t_json / record.count * 1e6:.2f} µs a position), "
        f"{len(text) / 2**20:.1f} MiB"
    )
    res1.update(removed=record.count, removed_of=len(record.docs),
                removed_per_source=dict(record.removed), first=record.first,
                tape_seconds=t_tape, to_json_seconds=t_json,
                to_json_bytes=len(text))  # fmt: skip
    results["excise"] = res1

    # --- 2: the loader on excised plans ------------------------------------------------------
    rng = np.random.default_rng(0)
    span = args.removed * args.spacing
    positions = np.sort(rng.choice(span, args.removed, replace=False)) + C
    cut_plan, t_cut = timed(lambda: plan.excise(C, positions=positions))
    sides = {"plain": plan, "positions": cut_plan, "docs": shown_plan}
    gaps = {k: gaps_read(p, C, B, args.steps) for k, p in sides.items() if k != "plain"}
    labels = {
        "plain": "plain",
        "positions": f"excised, {cut_plan.excisions[-1].count:,} positions",
        "docs": f"excised, {len(record.docs):,} documents ({record.count:,} positions)",
    }
    say(
        f"\n2. Loader(prefetch=2), B = {B} x {L + 1} int64, from consumed {C:,}: {args.steps} "
        f"steps a round after {WARMUP} warm-up, best of {args.loader_rounds} rounds (after one "
        "unkept), each side in turn first"
    )
    say(
        f"   excision of positions: 1 in {args.spacing} of [{C:,}, {C + span:,}) "
        f"(plan.excise {t_cut:.3f} s)"
    )
    for k, (frac, met) in gaps.items():
        say(f"   {labels[k]}: the steps read skip {met:,} excised positions; {frac:.1%} of "
            "them straddle a gap")  # fmt: skip
    rates: dict[str, list[float]] = {k: [] for k in sides}
    cpus: dict[str, list[float]] = {k: [] for k in sides}
    names = list(sides)
    for r in range(-1, args.loader_rounds):  # round -1: warm-up, not kept
        for name in names[r % len(names) :] + names[: r % len(names)]:  # each side in each slot
            rate, cpu = loader_rate(sides[name], C, B, args.steps)
            if r >= 0:
                rates[name].append(rate)
                cpus[name].append(cpu)
    top = {k: max(v) for k, v in rates.items()}
    low_cpu = {k: min(v) for k, v in cpus.items()}
    paired = {k: float(np.median(np.asarray(v) / np.asarray(rates["plain"])))
              for k, v in rates.items()}  # fmt: skip
    for name, rate in top.items():
        ratio = rate / top["plain"]
        aim = "" if name == "plain" else f": aim >= 0.97: {'PASS' if ratio >= 0.97 else 'MISS'}"
        say(f"   {labels[name]}: {rate:,.0f} samples/s ({rate / B:,.0f} steps/s), "
            f"{ratio:.3f}x plain{aim}")  # fmt: skip
        if name != "plain":
            say(f"      median of the rounds' ratios {paired[name]:.3f}x; CPU a step "
                f"{low_cpu[name] * 1e3:.3f} ms against {low_cpu['plain'] * 1e3:.3f} ms: "
                f"{low_cpu['plain'] / low_cpu[name]:.3f}x")  # fmt: skip
    ahead: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            ahead[name].append(ahead_per_step(sides[name], C, B, 4096))
    low_ahead = {k: min(v) for k, v in ahead.items()}
    say(f"   the part an excision changes, resolving the steps (ResolveAhead, 4,096 steps, best "
        f"of {args.rounds}): plain {low_ahead['plain'] * 1e6:.1f} µs a step")  # fmt: skip
    for name in names[1:]:
        extra = low_ahead[name] - low_ahead["plain"]
        say(f"      {labels[name]}: {low_ahead[name] * 1e6:.1f} µs, {extra * 1e6:+.1f} µs = "
            f"{extra * top['plain'] / B:+.2%} of a plain loader step")  # fmt: skip
    results["loader"] = {
        "labels": labels, "excise_positions_seconds": t_cut,
        "gaps": {k: {"fraction_of_steps": f, "skipped": m} for k, (f, m) in gaps.items()},
        "samples_per_s": rates, "best": top, "ratio": {k: top[k] / top["plain"] for k in top},
        "median_round_ratio": paired, "cpu_seconds_per_step": cpus, "best_cpu": low_cpu,
        "resolve_ahead_seconds_per_step": ahead, "best_resolve_ahead": low_ahead,
    }  # fmt: skip

    # --- 3: resolve_range --------------------------------------------------------------------
    say(f"\n3. tape().resolve_range({C:,}, n), best of {args.rounds}, interleaved")
    tapes = {name: p.tape() for name, p in sides.items()}
    results["resolve_range"] = {}
    for n in (CHUNK, 1 << 20):
        secs: dict[str, list[float]] = {k: [] for k in tapes}
        for r in range(args.rounds):
            for name in list(tapes)[:: 1 if r % 2 == 0 else -1]:
                secs[name].append(timed(lambda t=tapes[name], n=n: t.resolve_range(C, n))[1])
        low = {k: min(v) for k, v in secs.items()}
        say(f"   n = {n:,}: " + "; ".join(
            f"{k} {low[k] * 1e3:.1f} ms ({n / low[k] / 1e6:.1f} M pos/s, "
            f"{low['plain'] / low[k]:.2f}x plain)" for k in low))  # fmt: skip
        results["resolve_range"][str(n)] = {"best_seconds": low, "seconds": secs}

    results["meta"]["seconds"] = time.perf_counter() - started
    say(f"\ntotal {results['meta']['seconds']:.0f} s")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Peers side by side (issue 15, item 3). So far: mixture deviation, issue 13's Grain row.

    python benchmarks/peers_bench.py [--quick] [--json] [--peers-venv PATH] [--grain-budget S]

Three sources mixed 60/30/10. For each system, the sequence of sources of the first N
elements, and the largest deviation over every prefix n <= N of any source's count from
n * w_d with w = 0.6 / 0.3 / 0.1 exactly. The arithmetic is exact integer arithmetic:
|10 * count_d(n) - n * W_d| / 10 with W = 6 / 3 / 1. "n at worst" is the first prefix where
the largest deviation occurs.

- **Grain** (``grain.MapDataset.mix``): one ``MapDataset.range(N)`` per source, each element
  mapped to ``(source, index)``, mixed with weights ``[60, 30, 10]``, read by index
  (``mix[i]``, the fastest public path: iterating is slower) for i < N. The mixture's length is
  ``min(len_d / w_d)`` (Grain never repeats an element), about 1.67 N here, so no source runs
  out. The child also checks that each source's indices come in order 0, 1, 2, ... (no element
  skipped or repeated). Grain runs in its own virtual environment, never the project's
  ``.venv`` (it pulls its own numpy): ``bench-out/peers-venv`` by default, created with
  ``python -m venv`` and ``pip install grain==<pin>`` when missing (this is the one benchmark
  that downloads). If that fails, Grain is skipped with a line saying why. The child script
  runs with that venv's python and writes the source sequence as an int8 ``.npy`` under
  ``bench-out/peers/``. Horizons 10^5, 10^6, 10^7 and 10^8, read in one pass; a horizon is
  skipped, with a note, when the time to reach it, projected from the last one reached,
  exceeds ``--grain-budget`` seconds (180).
- **tokentape**: the blend of ``exact_weights([60, 30, 10])`` (6/3/1 over a period of 10, the
  default since algorithm version 2) and of ``rational_weights(..., 65536)`` (39,322 / 19,661
  / 6,553 over 2^16, version 1's default), sources from ``Blend.source_and_draw`` in chunks.

Seconds: the time to produce the sequence of sources (Grain: building the datasets and
reading the elements; tokentape: building the blend and resolving the positions), not the
deviation scan. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokentape import __version__ as tokentape_version
from tokentape._src.tape.blend import Blend, exact_weights, rational_weights

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out" / "peers"
WEIGHTS = (60, 30, 10)
NAMES = ("a", "b", "c")
STATED = (6, 3, 1)  # the stated shares 0.6 / 0.3 / 0.1 exactly, over STATED_PERIOD
STATED_PERIOD = 10
HORIZONS = (10**5, 10**6, 10**7, 10**8)
QUICK = (10**5, 10**6)
CHUNK = 2**22
GRAIN_PIN = "grain==0.2.18"

GRAIN_CHILD = r"""
import json, os, sys, time
from importlib.metadata import version
import numpy as np
import grain

out, budget = sys.argv[1], float(sys.argv[2])
horizons = sorted(int(h) for h in sys.argv[3].split(","))
weights = [int(w) for w in sys.argv[4].split(",")]
top, chunk = horizons[-1], 1 << 16
busy = 0.0
start = time.perf_counter()
parts = [grain.MapDataset.range(top).map(lambda x, d=d: (d, x)) for d in range(len(weights))]
mix = grain.MapDataset.mix(parts, weights)
busy += time.perf_counter() - start
src = np.empty(top, dtype=np.int8)
drawn = np.zeros(len(weights), dtype=np.int64)
reached, marks, skipped, bad = 0, [], [], None
for h in horizons:
    if reached and busy * h / reached > budget:
        skipped.append({"horizon": h, "projected_s": busy * h / reached})
        continue
    while reached < h:
        b = min(h, reached + chunk)
        start = time.perf_counter()
        pairs = np.array([mix[i] for i in range(reached, b)], dtype=np.int64)
        src[reached:b] = pairs[:, 0]
        busy += time.perf_counter() - start
        for d in range(len(weights)):
            got = pairs[pairs[:, 0] == d, 1]
            want = np.arange(drawn[d], drawn[d] + len(got))
            if bad is None and not np.array_equal(got, want):
                bad = f"source {d}: indices out of order near element {reached}"
            drawn[d] += len(got)
        reached = b
    marks.append({"horizon": h, "seconds": busy})
tmp = out + ".tmp.npy"
np.save(tmp, src[:reached])
os.replace(tmp, out)
print(json.dumps({
    "version": version("grain"), "length": len(mix), "source_lengths": [len(p) for p in parts],
    "marks": marks, "skipped": skipped, "order_error": bad,
}))
"""


def prefix_deviation(
    chunks: Iterator[np.ndarray], horizons: Sequence[int]
) -> list[tuple[float, int]]:
    """For each horizon N: the max over prefixes n <= N and sources d of |count_d(n) - n w_d|
    (w = STATED / STATED_PERIOD, exact integers) and the first n where it occurs. ``chunks``
    yields the sources of consecutive positions from 0, split at every horizon."""
    counts = np.zeros(len(STATED), dtype=np.int64)
    worst, at, done, out = 0, 0, 0, []
    marks = iter(sorted(horizons))
    mark = next(marks)
    for src in chunks:
        n = np.arange(done + 1, done + len(src) + 1, dtype=np.int64)
        for d, w in enumerate(STATED):
            c = np.cumsum(src == d, dtype=np.int64) + counts[d]
            dev = np.abs(STATED_PERIOD * c - n * w)
            i = int(np.argmax(dev))
            if dev[i] > worst:
                worst, at = int(dev[i]), done + i + 1
            counts[d] = c[-1]
        done += len(src)
        if done == mark:
            out.append((worst / STATED_PERIOD, at))
            mark = next(marks, -1)
    return out


def split(horizons: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Ranges [a, b) of at most CHUNK positions covering [0, max(horizons)), cut at each."""
    a = 0
    for h in sorted(horizons):
        while a < h:
            b = min(h, a + CHUNK)
            yield a, b
            a = b


def tokentape_rows(label: str, units: Sequence[int], horizons: Sequence[int]) -> list[dict]:
    """Rows for one blend: the sequence from ``source_and_draw`` in chunks, timed."""
    timer = {"s": 0.0}
    marks: dict[int, float] = {}

    def chunks() -> Iterator[np.ndarray]:
        start = time.perf_counter()
        blend = Blend.build(units)
        timer["s"] += time.perf_counter() - start
        for a, b in split(horizons):
            start = time.perf_counter()
            src = blend.source_and_draw(np.arange(a, b, dtype=np.int64))[0]
            timer["s"] += time.perf_counter() - start
            if b in horizons:
                marks[b] = timer["s"]
            yield src

    devs = prefix_deviation(chunks(), horizons)
    weights = "/".join(f"{u:,}" for u in units) + f" over {sum(units):,}"
    return [
        _row("tokentape", tokentape_version, f"{label} {weights}", h, dev, at, marks[h])
        for h, (dev, at) in zip(sorted(horizons), devs, strict=True)
    ]


def _row(
    system: str, version: str, weights: str, n: int, dev: float, at: int, seconds: float
) -> dict[str, Any]:
    return {
        "system": system,
        "version": version,
        "weights": weights,
        "N": n,
        "max_prefix_deviation": dev,
        "n_at_worst": at,
        "seconds": seconds,
    }


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [x for x in (proc.stderr + proc.stdout).splitlines() if x.strip()]
    return lines[-1].strip() if lines else f"exit {proc.returncode}"


def ensure_grain(venv: Path) -> tuple[Path | None, str]:
    """The peers venv's python with ``GRAIN_PIN`` installed (created if missing), or None and
    why not. The second value says what was done."""
    python = venv / "bin" / "python"
    start = time.perf_counter()
    try:
        if not python.exists():
            made = _run([sys.executable, "-m", "venv", str(venv)], 300)
            if made.returncode != 0:
                return None, f"python -m venv {venv} failed: {_last_line(made)}"
        pin = GRAIN_PIN.split("==")[1]
        probe = "from importlib.metadata import version; print(version('grain'))"
        have = _run([str(python), "-c", probe], 60)
        if have.returncode == 0 and have.stdout.strip() == pin:
            return python, f"{GRAIN_PIN} already in {venv}"
        cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        got = _run([*cmd, GRAIN_PIN], 900)
        if got.returncode != 0:
            return None, f"pip install {GRAIN_PIN} into {venv} failed: {_last_line(got)}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"setting up {venv} failed: {exc}"
    return python, f"installed {GRAIN_PIN} into {venv} in {time.perf_counter() - start:.0f} s"


def grain_rows(
    python: Path, horizons: Sequence[int], budget: float
) -> tuple[list[dict], list[str]]:
    """Rows for Grain's ``MapDataset.mix`` (run by ``python``), and notes."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "grain-mix-sources.npy"
    args = [str(path), str(budget), ",".join(map(str, horizons)), ",".join(map(str, WEIGHTS))]
    try:
        proc = _run([str(python), "-c", GRAIN_CHILD, *args], 3600)
    except subprocess.TimeoutExpired:
        return [], ["grain: skipped (the child ran over an hour)"]
    if proc.returncode != 0:
        return [], [f"grain: skipped (its run failed: {_last_line(proc)})"]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    notes = [
        f"grain {info['version']}: sources of {info['source_lengths'][0]:,} elements each, "
        f"mixture length {info['length']:,} (no source runs out)"
    ]
    if info["order_error"]:
        notes.append(f"grain: {info['order_error']}")
    for s in info["skipped"]:
        notes.append(
            f"grain: N = {s['horizon']:,} not run: reading it would take about "
            f"{s['projected_s']:.0f} s (projected), over --grain-budget {budget:.0f} s"
        )
    src = np.load(path, allow_pickle=False)
    diff = first_difference(src, Blend.build(exact_weights(WEIGHTS, NAMES)[0]))
    notes.append(
        f"grain: its sequence of sources equals tokentape's exact blend over all {len(src):,}"
        if diff is None
        else f"grain: its sequence of sources first differs from tokentape's at position {diff:,}"
    )
    ran = [m["horizon"] for m in info["marks"]]
    devs = prefix_deviation((src[a:b] for a, b in split(ran)), ran) if ran else []
    rows = [
        _row(
            "grain",
            info["version"],
            "MapDataset.mix [60, 30, 10]",
            m["horizon"],
            d,
            at,
            m["seconds"],
        )
        for m, (d, at) in zip(info["marks"], devs, strict=True)
    ]
    return rows, notes


def first_difference(src: np.ndarray, blend: Blend) -> int | None:
    """The first position where ``src`` and the blend's sources differ, or None."""
    for a, b in split([len(src)]):
        ours = blend.source_and_draw(np.arange(a, b, dtype=np.int64))[0]
        off = np.flatnonzero(ours != src[a:b])
        if len(off):
            return a + int(off[0])
    return None


def table(rows: list[dict]) -> str:
    head = f"{'system':<10} {'version':<8} {'weights':<42} {'N':>12} {'max dev':>8} "
    head += f"{'n at worst':>12} {'seconds':>8}"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['system']:<10} {r['version']:<8} {r['weights']:<42} {r['N']:>12,} "
            f"{r['max_prefix_deviation']:>8.1f} {r['n_at_worst']:>12,} {r['seconds']:>8.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="horizons 10^5 and 10^6 only")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--peers-venv",
        type=Path,
        default=ROOT / "bench-out" / "peers-venv",
        help="the virtual environment the peers run in (default: bench-out/peers-venv)",
    )
    parser.add_argument(
        "--grain-budget",
        type=float,
        default=180.0,
        help="seconds Grain may take to reach a horizon before it is skipped (default 180)",
    )
    args = parser.parse_args(argv)
    horizons = QUICK if args.quick else HORIZONS
    notes: list[str] = []
    rows: list[dict] = []
    python, how = ensure_grain(args.peers_venv.absolute())
    notes.append(f"grain: {how}" if python else f"grain: skipped ({how})")
    if python:
        got, more = grain_rows(python, horizons, args.grain_budget)
        rows += got
        notes += more
    rows += tokentape_rows("exact", exact_weights(WEIGHTS, NAMES)[0], horizons)
    rows += tokentape_rows("2^16", rational_weights(WEIGHTS, NAMES, 65536), horizons)
    if args.json:
        print(json.dumps({"rows": rows, "notes": notes}, indent=2))
    else:
        print("Mixture 60/30/10: largest deviation of any prefix n <= N from n * (0.6, 0.3, 0.1)")
        print(table(rows))
        print("\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

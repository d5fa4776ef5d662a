"""Run every benchmark in this folder (each ``*_bench.py``), one after another.

    python benchmarks/run.py [NAME ...] [-- ARGS]

``make bench`` calls this. Each benchmark runs in its own process with this interpreter and
prints its own figures; NAMEs (e.g. ``tokenize``) pick some, ARGS after ``--`` are passed to
each. The exit status is 1 if a benchmark failed to run (missing an aim is not a failure:
benchmarks report figures, they do not assert them).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def benchmarks() -> dict[str, Path]:
    return {p.name.removesuffix("_bench.py"): p for p in sorted(HERE.glob("*_bench.py"))}


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    found = benchmarks()
    unknown = [name for name in argv if name not in found]
    if unknown:
        print(f"unknown benchmark {unknown[0]!r}; have: {', '.join(found)}", file=sys.stderr)
        return 2
    chosen = {name: found[name] for name in argv} if argv else found
    failed = []
    for name, path in chosen.items():
        print(f"== {name} ({path.relative_to(HERE.parent)}) ==", flush=True)
        started = time.perf_counter()
        rc = subprocess.run([sys.executable, str(path), *extra], check=False).returncode
        print(f"== {name}: exit {rc}, {time.perf_counter() - started:.0f} s ==\n", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``make soak``: the kill campaign. SIGKILLs a training loop (``sim_trainer.py``: real Loaders,
``commit()`` after each step, state and applied positions saved atomically in one checkpoint,
rank 0 writing the step log) at random moments, restarting it with a random dp / micro / accum /
prefetch each time; and SIGKILLs ``tokentape tokenize --workers 2`` (the whole process group),
reruns it to completion and compares the store, every file, with a reference. Prints a summary
(``--json``: as JSON) and exits 1 on any loss, duplicate, mismatch or other problem.

    .venv/bin/python tests/tools/soak.py [--train-kills 1000] [--tokenize-kills 100] [--seed 0]

See docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS), str(TOOLS.parent)]  # the helpers here; tests/helpers.py's small plan

import soak_tokenize  # noqa: E402
import soak_train  # noqa: E402
from soak_procs import CLI, Child, child_env, kill_all  # noqa: E402


def progress(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="soak.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--train-kills", type=int, default=1000, metavar="N")
    p.add_argument("--tokenize-kills", type=int, default=100, metavar="N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--trainer",
        metavar="PY",
        default=str(soak_train.TRAINER),
        help="the trainer script to kill (default: sim_trainer.py; another one, e.g. with a "
        "planted bug, to see the soak catch it)",
    )
    p.add_argument("--tmp", metavar="DIR", help="where to make the scratch directory")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    if args.train_kills < 0 or args.tokenize_kills < 0:
        p.error("kill counts must be >= 0")
    return args


def corpus(root: Path) -> list[Path]:
    """The built-in corpora plus a second copy of the code source (about 14 MB of text):
    enough for a tokenize run of a few seconds, so that kills land mid-run."""
    out = root / "corpora"
    child = Child(
        [sys.executable, "-c", CLI, "corpora", "--out", str(out)], root / "c.out", child_env()
    )
    if child.run(kill_after=600).returncode != 0:
        raise SystemExit(f"soak: tokentape corpora failed: {child.tail()}")
    shutil.copytree(out / "code", out / "code-copy")
    return [out / "code", out / "prose", out / "notes", out / "code-copy"]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up as on Ctrl-C
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="tokentape-soak-", dir=args.tmp))
    started = time.monotonic()
    progress(f"scratch directory {root}")
    try:
        from helpers import small_plan_json

        (root / "train").mkdir()
        plan = small_plan_json(root / "train")
        train = soak_train.run_campaign(
            root / "train", plan, args.train_kills, rng, progress, Path(args.trainer)
        )
        shutil.rmtree(root / "train" / "stores", ignore_errors=True)
        tok = (
            soak_tokenize.run_campaign(
                root / "tokenize", corpus(root), args.tokenize_kills, rng, progress
            )
            if args.tokenize_kills
            else soak_tokenize.TokenizeReport()
        )
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    finally:
        kill_all()
        if args.keep:
            progress(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    problems = train.problems + tok.problems
    ok = not problems and train.lost == 0 and train.duplicated == 0
    ok = ok and train.log_hash_mismatches == 0 and tok.identical == tok.stores_compared
    summary = {
        "ok": ok,
        "seed": args.seed,
        "wall_seconds": round(time.monotonic() - started, 1),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "train": train.to_dict(),
        "tokenize": tok.to_dict(),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    return 0 if ok else 1


def print_summary(s: dict) -> None:
    t, k = s["train"], s["tokenize"]
    rows = [
        (
            "training loop: kills",
            f"{t['kills']:,} ({t['kills_without_progress']:,} before a "
            f"first checkpoint), {t['restarts']:,} runs, {t['shapes']} shapes, prefetch "
            f"{t['prefetch']}",
        ),
        (
            "steps committed",
            f"{t['steps_committed']:,} ({t['log_lines']:,} step-log lines, "
            f"{t['shape_changes']:,} shape changes)",
        ),
        ("positions checked", f"{t['positions_checked']:,}"),
        ("lost", f"{t['lost']:,}"),
        ("duplicated", f"{t['duplicated']:,}"),
        (
            "step log",
            f"{t['log_steps_checked']:,} steps checked, {t['log_hash_mismatches']} hash mismatches",
        ),
        (
            "tokenize: kills",
            f"{k['kills']:,} timed + {k['crash_point_kills']} at crash points "
            f"({k['kills_after_manifest']} after the manifest), {k['runs']:,} runs",
        ),
        ("stores compared", f"{k['stores_compared']:,}"),
        ("identical", f"{k['identical']:,}"),
        ("wall time", f"{s['wall_seconds']:,} s on {s['machine']}"),
    ]
    width = max(len(a) for a, _ in rows)
    for a, b in rows:
        print(f"{a:<{width}}  {b}")
    for p in s["train"]["problems"] + s["tokenize"]["problems"]:
        print(f"PROBLEM: {p}")
    print("OK" if s["ok"] else "FAILED")


if __name__ == "__main__":
    sys.exit(main())

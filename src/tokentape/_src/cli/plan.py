"""`tokentape plan`: resolve a mixture plan, print its repeat table, write PLAN.json."""

from __future__ import annotations

import argparse
import os
from contextlib import ExitStack

from tokentape._src.cli.progress import add_progress_arg, progress_callback
from tokentape._src.objects.client import is_url
from tokentape._src.plan.plan import check_budgets, resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.render.text import plan_text
from tokentape._src.store.atomic import atomic_writer, write_atomic, write_output
from tokentape.errors import OutputError, PlanError, _reworded

PLAN_EPILOG = """\
plan file:
  seq_len = 4096
  seed = 1234
  total_tokens = "2T"          # or total_samples = 488_281_250: the horizon
  [[source]]
  name = "web"
  path = "stores/web"          # a store directory, relative to the plan file
  weight = 60                  # any positive numbers; normalised
  max_repeats = 1.0            # repeat budget: planned passes over this source
  [[phase]]                    # optional: the mixture changes from here on
  start_tokens = "1.8T"        # or start_samples = 439_453_125
  weights = { web = 10, math = 60 }   # a source not named has weight 0 here

example:
  tokentape plan mix.toml --out mix.json --plot mix.png
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="resolve a mixture plan: repeat table, index hash, PLAN.json",
        description="Resolve a plan file (TOML): open its stores, turn the weights into exact "
        "rationals, print the repeat table and the index hash, and refuse a plan that repeats a "
        "source beyond its max_repeats. See docs/plan.md.",
        epilog=PLAN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("plan", metavar="PLAN.toml")
    p.add_argument("--out", metavar="PLAN.json", help="write the resolved plan (for the loader)")
    p.add_argument("--json", action="store_true", help="print the resolved plan as JSON")
    p.add_argument("--plot", metavar="PNG", help="draw shares and repeats (needs matplotlib)")
    add_progress_arg(p)
    p.set_defaults(func=cmd)


def cmd(args: argparse.Namespace) -> int:
    _refuse_one_file_twice(args.plan, [("--out", args.out), ("--plot", args.plot)])
    plan = resolve_plan(
        load_plan_spec(args.plan), args.plan, progress_callback(args.progress, quiet=args.json)
    )
    for path in (args.out, args.plot):
        _check_output_file(path)  # both, before either is written
    drawing = None
    if args.plot:  # drawn before anything is written: a bad --plot writes nothing
        from tokentape._src.render.plot import draw_plan  # matplotlib: imported only when drawing

        drawing = draw_plan(plan, args.plot)
    try:
        check_budgets(plan, args.plan)
    except PlanError as exc:  # refused: no --out, but the plot shows why
        if drawing is None:
            raise
        write_atomic(args.plot, drawing)
        raise _reworded(exc, f"{exc}; the refused plan's plot is in '{args.plot}'") from None
    outputs = [(args.plot, drawing), (args.out, plan.to_json().encode() if args.out else None)]
    _write_together([(path, data) for path, data in outputs if path and data is not None])
    print(plan.to_json() if args.json else plan_text(plan), end="" if args.json else "\n")
    return 0


def _check_output_file(path: str | None) -> None:
    """Refuse an output file that cannot be written (no directory, or a directory there), in
    the words the atomic writer would use."""
    if path is None or is_url(path):  # an object: its PUT says what is wrong
        return
    if os.path.isdir(path):
        raise OutputError(f"'{path}': Is a directory")
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise OutputError(f"'{path}': No such file or directory")


def _refuse_one_file_twice(plan: str, outputs: list[tuple[str, str | None]]) -> None:
    """Refuse an output naming the plan file itself, or both outputs naming one file (the
    same real path, or one file under two names)."""
    taken = [(plan, f"the plan file '{plan}'")]
    for flag, path in outputs:
        if path is None:
            continue
        for other, what in taken:
            if _same_file(path, other):
                raise OutputError(f"{flag} '{path}' is {what}: name another file")
        taken.append((path, f"the file of {flag} too"))


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links: two names of one file
    except OSError:  # one of them does not exist (yet): not the same file
        return False


def _write_together(files: list[tuple[str, bytes]]) -> None:
    """Write each ``(path, data)`` atomically, every file complete and durable under its
    temporary name before any is renamed into place: an output that cannot be written (no
    directory, no permission, no space) leaves none of them written."""
    with ExitStack() as stack:
        for path, data in files:
            if is_url(path):
                continue  # put once every local file is complete, before any is renamed
            f = stack.enter_context(atomic_writer(path))
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        for path, data in files:
            if is_url(path):
                write_output(path, data)

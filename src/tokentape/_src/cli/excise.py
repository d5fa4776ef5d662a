"""`tokentape excise`: a plan that leaves documents, or logged steps' samples, out of the rest
of a run."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from tokentape._src import api
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.render.text import excisions_text
from tokentape._src.util.checks import check_int
from tokentape._src.util.files import read_regular
from tokentape._src.util.text import escaped, fmt_int, key_values
from tokentape.errors import InputError

EPILOG = """\
what to leave out (any of them, together):
  --doc SOURCE:N     document N of SOURCE (repeatable)
  --id VALUE         every document whose record has this id (repeatable; the stores must
                     record provenance, as `tokentape tokenize` does)
  --ids-file FILE    one id per line (UTF-8; blank lines skipped)
  --steps A..B       the samples steps A to B drew, read from the run's --log steps.jsonl

The new plan gives the same sample at every position below --from-consumed C; from C on it is
the old sequence without every sample holding a token of those documents (within the horizon)
and without those steps' samples, the rest in the same order. Resume the run on it from a
checkpoint at consumed C (any checkpoint at or before the first position left out is
accepted; a later one is refused, naming that position). `replay`, `locate` and `info` follow
the new plan. See docs/audit.md.

examples:
  tokentape excise mix.json --from-consumed 24000 --id log-dump-0042 --out mix-2.json
  tokentape excise mix.json --from-consumed 24000 --doc web:3325 --doc web:17 --out mix-2.json
  tokentape excise mix.json --from-consumed 24000 --steps 751..753 --log run/steps.jsonl \\
      --out mix-2.json --json
"""

_STEPS = re.compile(r"^(\d+)\.\.(\d+)$", re.ASCII)
_NUMBER = re.compile(r"^\d+$", re.ASCII)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "excise",
        help="leave documents or logged steps out of the rest of a run (a new plan)",
        description="Write a plan that leaves documents, or the samples of logged steps, out\n"
        "of a run from a checkpoint on, exactly: nothing before it changes, and nothing after\n"
        "it holds a token of what was left out. Computed in closed form from the plan.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("plan", metavar="PLAN.json", help="the run's resolved plan")
    p.add_argument("--from-consumed", type=int, required=True, metavar="C",
                   help="consumed of the checkpoint the run goes on from")  # fmt: skip
    p.add_argument("--doc", action="append", default=[], metavar="SOURCE:N")
    p.add_argument("--id", action="append", default=[], metavar="VALUE")
    p.add_argument("--ids-file", metavar="FILE")
    p.add_argument("--steps", metavar="A..B")
    p.add_argument("--log", metavar="steps.jsonl", help="the run's step log (with --steps)")
    p.add_argument("--out", required=True, metavar="NEW.json", help="where to write the plan")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd)


def _docs(values: list[str]) -> list[tuple[str, int]]:
    docs = []
    for value in values:
        name, sep, number = value.rpartition(":")
        if not sep or not name or not _NUMBER.match(number):
            raise InputError(f"--doc {escaped(value)}: expected SOURCE:N (e.g. web:3325)")
        docs.append((name, int(number)))
    return docs


def _ids(args: argparse.Namespace) -> list[str]:
    ids = list(args.id)
    if args.ids_file is not None:
        try:
            data = read_regular(Path(args.ids_file))
        except OSError as exc:
            raise InputError(f"--ids-file {args.ids_file}: {exc.strerror or exc}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"--ids-file {args.ids_file}: not UTF-8 text") from None
        ids += [line.strip() for line in text.splitlines() if line.strip()]
    return ids


def _steps(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    m = _STEPS.match(value)
    if m is None or int(m[1]) > int(m[2]):
        raise InputError(f"--steps {escaped(value)}: expected A..B, steps A <= B (e.g. 751..753)")
    return int(m[1]), int(m[2])


def _summary(old: Plan, new: Plan, out: str) -> dict[str, object]:
    e = new.excisions[-1]
    return {
        "plan": out,
        "index_hash": new.index_hash,
        "was": old.index_hash,
        "excision": e.summary(),
        "draws": {s.name: s.draws for s in new.sources},
        "draws_before": {s.name: s.draws for s in old.sources},
        "resume_from_consumed_at_most": e.first,
    }


def cmd(args: argparse.Namespace) -> int:
    check_int("--from-consumed", args.from_consumed, 0)
    plan = load_plan(args.plan)
    docs, ids, steps = _docs(args.doc), _ids(args), _steps(args.steps)
    if not (docs or ids or steps):
        raise InputError("nothing named to leave out: give --doc, --id, --ids-file or --steps")
    if (steps is None) != (args.log is None):
        raise InputError("--steps and --log go together")
    new = api.excise(plan, args.from_consumed, docs=docs, ids=ids, steps=steps,
                     step_log=args.log)  # fmt: skip
    new.save(args.out)
    s = _summary(plan, new, args.out)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    e = new.excisions[-1]
    rows = [
        ("wrote", escaped(args.out)),
        ("left out", f"{fmt_int(e.count)} samples: {escaped(e.what)}"),
        ("from consumed", f"{fmt_int(e.from_consumed)} (every position below it as before)"),
        ("first left out", f"position {fmt_int(e.first)}: resume at consumed <= it"),
        ("index hash", f"{new.index_hash} (was {plan.index_hash[:19]}…)"),
    ]
    print(key_values(rows))
    print()
    print(excisions_text(new))
    return 0

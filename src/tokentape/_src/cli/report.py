"""`tokentape report`: a run drawn as one self-contained HTML page (or its data as JSON)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokentape._src import api
from tokentape._src.audit.report import SPIKE_WINDOW, SPIKE_Z, TOP_DOCS
from tokentape._src.audit.runinfo import STEP_LOG_NAME, step_log_path, step_log_url
from tokentape._src.objects.client import is_url, join, object_store
from tokentape._src.render.report import render_report
from tokentape._src.store.atomic import write_output
from tokentape._src.util.text import escaped
from tokentape.errors import InputError

LOSS_LOG_NAME = "loss.jsonl"
PLAN_NAME = "plan.json"

EPILOG = f"""\
RUN is a run directory (holding {STEP_LOG_NAME}, and {LOSS_LOG_NAME} and {PLAN_NAME} when the
run wrote them) or a step log. --plan is the resolved plan the run ended under (it answers
for every step, earlier plans included); --loss the trainer's loss log, one JSON line a step:
{{"step", "loss", "loss_by_source": {{name: loss}}, "tokens_by_source": {{name: tokens}}}} (only
step and loss are required; see docs/train.md).

The page shows the run's timeline (batch shapes, resumes and redone steps, plan changes,
phases, excisions), the mixture (planned against realised share per source over the run and
per phase, tokens per source), repetition (passes so far and at the horizon against each
budget; the documents trained most, with their file, record and id), the loss overall and per
source with spikes flagged (the rule is on the page) and each spike's top documents as
`tokentape replay` gives them, the plan's identity, and the command behind each figure.

It is one file: inline SVG and CSS, no script, nothing fetched; it opens offline. A run of any
length draws at most 2,000 points a series (the downsampling rule is on the page).

exit status: 0; 2 with one line on bad input (nothing is written)

examples:
  tokentape report run/ --plan mix.json --out report.html
  tokentape report run/steps.jsonl --plan mix.json --loss run/loss.jsonl --out report.html
  tokentape report run/ --plan mix.json --json | jq '.loss.spikes[].step'
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="draw a run (timeline, mixture, repetition, loss and spikes) as an HTML page",
        description="Draw a run as one self-contained HTML page: its timeline, mixture,\n"
        "repetition, loss per source and spikes with their documents (or print the data).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", metavar="RUN", help=f"a run directory or its {STEP_LOG_NAME}")
    p.add_argument("--plan", metavar="PLAN.json",
                   help=f"the plan the run ended under (default: RUN/{PLAN_NAME})")  # fmt: skip
    p.add_argument("--loss", metavar="LOSS.jsonl",
                   help=f"the loss log (default: RUN/{LOSS_LOG_NAME}, if there)")  # fmt: skip
    p.add_argument("--out", metavar="REPORT.html", help="where to write the page")
    p.add_argument("--json", action="store_true", help="print the report's data as JSON")
    p.add_argument("--spike-window", type=int, default=SPIKE_WINDOW, metavar="N",
                   help=f"logged steps in the spike rule's centred window (odd; default "
                        f"{SPIKE_WINDOW})")  # fmt: skip
    p.add_argument("--spike-z", type=float, default=SPIKE_Z, metavar="Z",
                   help=f"flag a step of robust z-score >= Z (default {SPIKE_Z})")  # fmt: skip
    p.add_argument("--top", type=int, default=TOP_DOCS, metavar="N",
                   help=f"the most trained documents listed (default {TOP_DOCS})")  # fmt: skip
    p.set_defaults(func=cmd)


_FLAGS = {"spike_window": "--spike-window", "spike_z": "--spike-z", "top": "--top"}


def _inputs(args: argparse.Namespace) -> tuple[Path | str, str, str | None]:
    """The step log, the plan and the loss log (the run directory's, when not given)."""
    if is_url(args.run):
        return _remote_inputs(args)
    run = Path(args.run)
    log = step_log_path(run)
    directory = run if run.is_dir() else None
    plan = args.plan
    if plan is None:
        if directory is None or not (directory / PLAN_NAME).is_file():
            where = f"{escaped(str(run))} holds no {PLAN_NAME}" if directory else "RUN is a file"
            raise InputError(f"--plan PLAN.json needed: {where} (give the plan the run ended "
                             "under)")  # fmt: skip
        plan = str(directory / PLAN_NAME)
    loss = args.loss
    if loss is None and directory is not None and (directory / LOSS_LOG_NAME).is_file():
        loss = str(directory / LOSS_LOG_NAME)
    return log, plan, loss


def _remote_inputs(args: argparse.Namespace) -> tuple[str, str, str | None]:
    """``_inputs`` of a run at an object URL: its log, or its "directory"."""
    run: str = args.run
    log = step_log_url(run)
    directory = None if run.endswith(".jsonl") else run.rstrip("/")
    objects = object_store(run)
    plan = args.plan
    if plan is None:
        if directory is None or objects.info(join(directory, PLAN_NAME)) is None:
            where = f"{escaped(run)} holds no {PLAN_NAME}" if directory else "RUN is a file"
            raise InputError(f"--plan PLAN.json needed: {where} (give the plan the run ended "
                             "under)")  # fmt: skip
        plan = join(directory, PLAN_NAME)
    loss = args.loss
    logged = None if directory is None else join(directory, LOSS_LOG_NAME)
    if loss is None and logged is not None and objects.info(logged) is not None:
        loss = logged
    return log, plan, loss


def cmd(args: argparse.Namespace) -> int:
    if args.out is None and not args.json:
        raise InputError("give --out REPORT.html (the page) or --json (its data), or both")
    if args.out is not None and not is_url(args.out) and Path(args.out).is_dir():
        raise InputError(f"--out {escaped(args.out)}: a directory; name the page's file")
    api.report_config(args.spike_window, args.spike_z, args.top, named=_FLAGS.__getitem__)
    log, plan, loss = _inputs(args)
    data = api.report(log, plan, loss_log=loss, spike_window=args.spike_window,
                      spike_z=args.spike_z, top=args.top)  # fmt: skip
    if args.out is not None:
        page = render_report(data)
        try:
            write_output(args.out, page.encode("utf-8"))
        except OSError as exc:
            raise InputError(f"--out {escaped(args.out)}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps(data, indent=1, allow_nan=False))
    else:
        spikes = data["loss"]["flagged"] if data["loss"] is not None else None
        said = (
            "no loss log"
            if spikes is None
            else f"{spikes:,} step{'' if spikes == 1 else 's'} flagged as loss spikes"
        )
        print(f"wrote {escaped(args.out)}: {data['run']['steps']:,} steps, {said}")
    return 0

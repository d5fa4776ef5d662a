"""The batch-shape flags of the audit commands (--global-batch, --dp/--micro/--accum, --log)."""

from __future__ import annotations

import argparse
from typing import Any

SCHEDULE_HELP = """\
batch configuration:
  --global-batch B              steps only (B samples per optimizer step, never changed)
  --dp D --micro M [--accum A]  steps, data-parallel ranks and micro-steps
  --log steps.jsonl             the run's step log (needed when the batch shape changed)
"""


def add_schedule_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--global-batch", type=int, metavar="B", help="samples per optimizer step")
    p.add_argument("--dp", type=int, metavar="D", help="data-parallel ranks")
    p.add_argument("--micro", type=int, metavar="M", help="micro-batch per rank")
    p.add_argument("--accum", type=int, metavar="A", help="accumulation steps (default 1)")
    p.add_argument("--log", metavar="steps.jsonl", help="the run's step log")


def shape_args(args: argparse.Namespace) -> dict[str, Any]:
    """The batch shape the flags give, as keyword arguments of ``api.replay_shape`` and
    ``api.locate_shape`` (which check it)."""
    return {
        "global_batch": args.global_batch,
        "dp": args.dp,
        "micro": args.micro,
        "accum": args.accum,
        "log": args.log,
    }

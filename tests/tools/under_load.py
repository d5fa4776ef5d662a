"""Run a command while busy processes compete for every CPU: ``python under_load.py [--busy N]
-- COMMAND ...`` (``make test-load`` runs the test suite this way).

N (default: the CPUs this process may use) processes spin in their own process group from
before the command starts until it ends, however it ends; the exit status is the command's.
A suite that passes here decides nothing from wall-clock time: every test that kills or races
a process waits for observable progress first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys

SPIN = "while True: pass"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    if args.busy < 1:
        parser.error("--busy must be at least 1")
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN], process_group=0)]
    group = spinners[0].pid
    try:
        spinners += [
            subprocess.Popen([sys.executable, "-c", SPIN], process_group=group)
            for _ in range(args.busy - 1)
        ]
        print(f"under_load: {len(spinners)} busy processes (group {group})", flush=True)
        return subprocess.call(command)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        for proc in spinners:
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())

"""The demo's last section: the run drawn as one HTML page (``tokentape report``), and the
excised branch beside it. Checked from the pages' own data: the spike the audit found is
flagged, with the planted document on top of it; on the excised branch nothing from the
excision on is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokentape._src import api
from tokentape._src.demo.audit import Spike, heading, run_command
from tokentape._src.demo.train import Trained
from tokentape._src.plan.load import load_plan
from tokentape._src.util.text import table


def _flagged(data: dict[str, Any]) -> str:
    rows = []
    for s in data["loss"]["spikes"]:
        top = s["top_documents"][0]
        ident = (top["origin"] or {}).get("id") or "-"
        rows.append([s["step"], f"{s['loss']:.3f}", f"{s['baseline']:.3f}", f"{s['z']:.1f}",
                     f"{top['source']} #{top['doc']}", ident, top["windows"]])  # fmt: skip
    header = ["step", "loss", "median", "z", "top document", "id", "windows"]
    return table(header, rows) if rows else "  (none)"


def report_story(n: int, root: Path, trained: Trained, spike: Spike) -> bool:
    """Section ``n`` of the demo; True when both pages are written, the main run's flags the
    spike's step with the spike's document on top, and the excised branch's flags no step
    from the excision on."""
    heading(n, "The run in one page: tokentape report")
    page, plan = root / "report.html", str(root / "plan-anneal.json")
    args = ["report", str(trained.step_log), "--plan", plan, "--loss", str(trained.loss_log)]
    code = run_command([*args, "--out", str(page)])
    data = api.report(trained.step_log, plan, loss_log=trained.loss_log)
    print("\n  flagged steps (the rule is on the page), each with the document on top of it:\n")
    print(_flagged(data))
    spikes = {s["step"]: s for s in data["loss"]["spikes"]}
    top = spikes[spike.step]["top_documents"][0] if spike.step in spikes else None
    on_top = top is not None and (top["source"], top["doc"]) == (spike.source, spike.doc)
    print(f"\n  step {spike.step} (section 8) flagged, {spike.source} #{spike.doc} on top: "
          f"{'yes' if on_top else 'NO'}")  # fmt: skip

    branch = root / "report-excised.html"
    log, losses = root / "steps-excised.jsonl", root / "loss-excised.jsonl"
    excised_plan = root / "plan-excised.json"
    print()
    code |= run_command(["report", str(log), "--plan", str(excised_plan), "--loss", str(losses),
                         "--out", str(branch)])  # fmt: skip
    clean = api.report(log, excised_plan, loss_log=losses)
    since = next(e["step"] for e in clean["timeline"]["events"] if e["kind"] == "excision")
    later = [s for s in clean["loss"]["flagged_steps"] if s >= since]
    gone = not later and load_plan(excised_plan).excisions != ()
    print(f"\n  on the excised branch, a step flagged from step {since} (the excision) on: "
          f"{'none' if gone else later}")  # fmt: skip
    print(f"\n  open {page.resolve()} in a browser (offline: one file, no script);")
    print(f"  the data behind it: `tokentape {' '.join(args[:1])} ... --json` "
          f"({len(json.dumps(data)):,} bytes)")  # fmt: skip
    return code == 0 and on_top and gone and page.is_file() and branch.is_file()


__all__ = ["report_story"]

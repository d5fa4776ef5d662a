"""Pictures of a plan (matplotlib, the ``plot`` extra): shares over positions, and repeats."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.plan.plan import Plan
from tokentape._src.store.atomic import write_atomic
from tokentape.errors import InputError, TokentapeError

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:  # the optional extra is not installed
    # mypy types a name bound by import as that module only: None marks the extra missing
    plt = None  # type: ignore[assignment]


def plot_plan(plan: Plan, path: str | Path) -> None:
    """Draw the plan (see ``draw_plan``) into ``path``, replaced atomically."""
    write_atomic(path, draw_plan(plan, path))


def draw_plan(plan: Plan, path: str | Path) -> bytes:
    """Cumulative share of each source against its target (log positions), and passes: the
    image file's bytes, in the format ``path``'s suffix names (.png, .svg, .pdf ...)."""
    if plt is None:
        raise TokentapeError("--plot needs matplotlib: pip install 'tokentape[plot]'")
    kind = Path(path).suffix.lower().removeprefix(".")
    probe = plt.figure()
    formats = probe.canvas.get_supported_filetypes()
    plt.close(probe)  # only our own figure: a caller's open figures stay open
    if kind not in formats:
        raise InputError(
            f"--plot {path}: unknown image format '{kind}'; name a file ending in one of "
            + ", ".join(f".{k}" for k in sorted(formats))
        )
    horizon = plan.horizon_samples
    fig, (ax_share, ax_pass) = plt.subplots(1, 2, figsize=(13, 4.8))
    if plan.phases:
        _draw_phases(plan, ax_share)
    else:
        _draw_cumulative(plan, ax_share)
    ax_share.set_xlabel("position (samples)")
    ax_share.legend(fontsize="small")
    names = [s.name for s in plan.sources]
    ax_pass.bar(names, [s.passes for s in plan.sources], color="tab:blue", label="planned passes")
    ax_pass.scatter(names, [s.max_repeats for s in plan.sources], color="tab:red", marker="_",
                    s=600, label="max_repeats")  # fmt: skip
    ax_pass.set_ylabel("passes over the source")
    ax_pass.set_title(f"repeats at the horizon ({horizon:,} samples)")
    ax_pass.legend(fontsize="small")
    fig.suptitle(f"plan {plan.index_hash[:19]}…  seq_len {plan.seq_len}, seed {plan.seed}")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, dpi=110, format=kind)
    plt.close(fig)
    return out.getvalue()


def _draw_cumulative(plan: Plan, ax: Any) -> None:
    """A plan in one phase: each source's share of the samples so far, on log positions."""
    tape = plan.tape()
    grid = np.unique(np.geomspace(1, plan.horizon_samples, num=400).astype(np.int64))
    for d, s in enumerate(plan.sources):
        share = np.asarray(tape.blend.count(d, grid)) / grid
        (line,) = ax.plot(grid, share, label=s.name, lw=1.2)
        ax.axhline(s.weight_units / plan.denominator, color=line.get_color(), ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_ylabel("share of samples so far")
    ax.set_title("cumulative share (dotted: target)")


def _draw_phases(plan: Plan, ax: Any) -> None:
    """A plan in phases: each source's share of the samples in each stretch of the run (about
    400 stretches of whole periods, none across a phase start), the phases' targets dotted
    and their starts marked."""
    tape = plan.tape()
    horizon = plan.horizon_samples
    spans, dens = plan.phase_spans, plan.phase_denominators
    pieces = []
    for (a, b), den in zip(spans, dens, strict=True):
        bins = max(1, round(400 * (b - a) / horizon))
        width = den * max(1, -(-(b - a) // (bins * den)))  # whole periods: no ripple
        cuts = np.arange(a, b, width, dtype=np.int64)
        if cuts.size > 1 and b - cuts[-1] < width:  # a short tail joins the stretch before it
            cuts = cuts[:-1]
        pieces.append(np.append(cuts, b))
    edges = np.unique(np.concatenate(pieces))
    for d, s in enumerate(plan.sources):
        counts = np.asarray(tape.blend.count(d, edges))
        share = np.diff(counts) / np.diff(edges)
        (line,) = ax.plot(edges[1:], share, label=s.name, lw=1.2, drawstyle="steps-pre")
        for units, den, (a, b) in zip(plan.phase_units, dens, spans, strict=True):
            ax.hlines(units[d] / den, a, b, color=line.get_color(), ls=":", lw=1)
    for i, start in enumerate(plan.phase_starts[1:], start=2):
        ax.axvline(start, color="0.4", ls="--", lw=0.8)
        ax.annotate(f"phase {i}", (start, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", fontsize="small")  # fmt: skip
    ax.set_xlim(0, horizon)
    ax.set_ylabel("share of the samples in each stretch")
    ax.set_title(f"share per source over the run, {len(spans)} phases (dotted: targets)")


__all__ = ["draw_plan", "plot_plan", "plt"]

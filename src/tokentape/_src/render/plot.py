"""Pictures of a plan (matplotlib, the ``plot`` extra): shares over positions, and repeats."""

from __future__ import annotations

import io
from pathlib import Path

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
    tape = plan.tape()
    horizon = plan.horizon_samples
    grid = np.unique(np.geomspace(1, horizon, num=400).astype(np.int64))
    fig, (ax_share, ax_pass) = plt.subplots(1, 2, figsize=(13, 4.8))
    for d, s in enumerate(plan.sources):
        share = np.array([tape.blend.count(d, int(n)) / n for n in grid])
        (line,) = ax_share.plot(grid, share, label=s.name, lw=1.2)
        ax_share.axhline(s.weight_units / plan.denominator, color=line.get_color(), ls=":", lw=1)
    ax_share.set_xscale("log")
    ax_share.set_xlabel("position (samples)")
    ax_share.set_ylabel("share of samples so far")
    ax_share.set_title("cumulative share (dotted: target)")
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

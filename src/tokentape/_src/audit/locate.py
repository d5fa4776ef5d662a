"""Locate: every position, step and rank at which a document is (or will be) trained on.

The inverse of replay, in closed form, without scanning the run:

    document d ─doc_span→ tokens [s, e) ─→ samples k with kL < e and s <= kL + L
      ─for each pass─→ position_of(source, k, pass) ─keep < limit─→ Schedule.place

Sample k is the window of tokens [kL, kL + L] (L + 1 tokens), so it overlaps the document iff
kL < e and s <= kL + L: exactly the documents ``Source.docs_in(k)`` lists. Each pass of the
source holds every sample once, so a document spanning m samples appears m times per pass; the
passes that matter are those whose draws fall below the limit (the plan's horizon, or the end
of step N).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokentape._src.audit.runs import (
    check_fits,
    source_index,
    tape_of,
)
from tokentape._src.plan.plan import Plan, check_planned, open_planned
from tokentape._src.store.origins import Origin
from tokentape._src.store.reader import TokenStream
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.tape.excise import draws_of_samples, samples_overlapping
from tokentape._src.tape.excise import positions_of_samples as base_positions
from tokentape._src.tape.resolve import Tape
from tokentape._src.train.schedule import Placement, Schedule
from tokentape._src.util.checks import as_index
from tokentape._src.util.text import fmt_int
from tokentape.errors import ArgumentError, OutOfRangeError, PlanError

DEFAULT_LIMIT = 50
_BYTES_PER_ROW = 120
"""Memory per position found: position, pass, sample, placement (int64 each) and sorting."""


@dataclass(frozen=True)
class Located:
    """Where one document is trained on: one entry per position, in ascending position order."""

    source: str
    source_index: int  # index of the source in the plan
    doc_id: int
    span: tuple[int, int]
    """The document's token range [start, end), its end-of-document token included."""
    samples: range
    """The samples whose L+1-token windows overlap the document (empty for a tail document)."""
    limit: int
    """Positions below this were searched: the end of ``until_step``; else the horizon, or the
    end of a step log that goes past it."""
    until_step: int | None
    position: np.ndarray  # int64, ascending
    epoch: np.ndarray  # int64: the pass over the source
    sample: np.ndarray  # int64: the sample (window) of the source
    placement: Placement | None
    """Step, DP rank, micro-step and row of each position (None without a schedule); step −1
    marks a position beyond the step log's last step: not yet trained."""
    origin: Origin | None = None
    """Where the document came from (its input, record and id); None where the store records
    none."""
    excised_from: int | None = None
    """The ``consumed`` from which an excision of the plan leaves the document out (its
    positions from there on are not trained, and not listed); None when none does."""

    @property
    def n_tokens(self) -> int:
        return self.span[1] - self.span[0]

    @property
    def trained(self) -> np.ndarray:
        """Which positions fall within the schedule (all of them when it is open-ended)."""
        if self.placement is None:
            return np.ones(self.position.shape, dtype=bool)
        return self.placement.step >= 0

    @property
    def seen(self) -> bool:
        """Whether any window of the document was trained on within the searched range."""
        return bool(self.trained.any())


# --- the closed form ------------------------------------------------------------------------


def positions_of_samples(
    tape: Tape, source: int, samples: range, limit: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(position, epoch, sample) of every draw of ``samples`` of ``source`` below ``limit``,
    sorted by position; of a plan with excisions, the draws it left out are not listed (they
    are never trained)."""
    excision = tape.excision
    base_limit = limit if excision is None else excision.base_limit(limit)
    rows = draws_of_samples(tape, source, samples, base_limit)
    check_fits(rows * _BYTES_PER_ROW, f"the {fmt_int(rows)} positions of {len(samples)} samples")
    position, epoch, sample = base_positions(tape, source, samples, base_limit)
    if excision is None:
        return position, epoch, sample
    position, kept = excision.to_new(position)
    return position[kept], epoch[kept], sample[kept]


def search_limit(plan: Plan, schedule: Schedule | None, until_step: int | None) -> int:
    """Positions below this are searched: the end of ``until_step``; else the horizon, or the
    end of a bounded schedule (a step log) when the run went past the horizon."""
    if until_step is None:
        end = schedule.end if schedule is not None else None
        if end is None or end <= plan.horizon_samples:
            return plan.horizon_samples
        if end > MAX_POSITION:
            raise PlanError("the step log ends beyond position 2**62")
        return end
    if schedule is None:
        raise ArgumentError(f"until step {until_step}: steps need a batch schedule")
    if until_step < 0:
        raise OutOfRangeError(f"until step {until_step}: expected a step >= 0")
    if schedule.steps is not None and until_step >= schedule.steps:
        raise OutOfRangeError(
            f"until step {until_step}: beyond the step log, which ends at step {schedule.steps - 1}"
        )
    consumed, config = schedule.start(until_step)
    end = consumed + config.global_batch
    if end > MAX_POSITION:
        raise OutOfRangeError(f"until step {until_step}: the step ends beyond position 2**62")
    return end


def locate(
    plan: Plan,
    source: str,
    doc_id: int,
    schedule: Schedule | None = None,
    until_step: int | None = None,
    store: TokenStream | None = None,
) -> Located:
    """Every position (through ``until_step``; else below the horizon, or below the end of a
    bounded ``schedule`` past it) at which a window of document ``doc_id`` of ``source`` is
    drawn, placed on ``schedule`` when given.

    ``store`` is the source's opened store (opened from the plan's path when None)."""
    doc_id = as_index("doc", doc_id)
    if until_step is not None:
        until_step = as_index("until_step", until_step)
    d = source_index(plan, source)
    store = open_planned(plan, d) if store is None else check_planned(plan, d, store)
    if not 0 <= doc_id < store.n_docs:
        raise OutOfRangeError(
            f"source '{source}': document {doc_id} out of range; it has documents "
            f"0..{store.n_docs - 1}"
        )
    span = store.doc_span(doc_id)
    samples = samples_overlapping(span, plan.seq_len, plan.sources[d].n_samples)
    limit = search_limit(plan, schedule, until_step)
    position, epoch, sample = positions_of_samples(tape_of(plan), d, samples, limit)
    placement = schedule.place(position) if schedule is not None else None
    return Located(
        source, d, doc_id, span, samples, limit, until_step, position, epoch, sample, placement,
        store.provenance(doc_id), _excised_from(plan, source, doc_id),
    )  # fmt: skip


def _excised_from(plan: Plan, source: str, doc: int) -> int | None:
    """The first ``from_consumed`` of the plan's excisions that leave the document out."""
    froms = [e.from_consumed for e in plan.excisions if (source, doc) in e.docs]
    return min(froms) if froms else None


__all__ = [
    "DEFAULT_LIMIT",
    "Located",
    "locate",
    "positions_of_samples",
    "search_limit",
]

"""Replay: the exact batch of optimizer step N, and the documents it was made of.

Every batch is a pure function of the plan and a position, so step N is rebuilt offline:

    step N ─schedule (step log, or B)→ positions [consumed, consumed + B)
      ─tape.resolve→ (source, epoch, sample) ─store→ token windows, and the documents each
      window overlaps (the same rule as ``Source.docs_in``)

The documents are then ranked by how many of the step's windows they appear in. With the step
log, the rebuilt step's tokens hash is checked against the one the loader logged while training.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from tokentape._src.audit.runs import (
    check_fits,
)
from tokentape._src.plan.plan import Plan
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.train.batch import Batch, Batcher
from tokentape._src.train.loader import hash_dtype, step_tokens_hash
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.schedule import Placement, Schedule
from tokentape._src.util.checks import as_index
from tokentape._src.util.text import fmt_int
from tokentape.errors import ArgumentError, OutOfRangeError

DEFAULT_TOP = 10
_BYTES_PER_WINDOW = 160
"""Memory per window besides its tokens: position, source, pass, sample, placement, documents
(int64 each) and the temporaries of ranking them."""
DEFAULT_PREVIEW = 80
DEFAULT_TEXT_CHARS = 500
EOD_MARK = "⟦EOD⟧"
"""Where a window's end-of-document token falls, in its decoded text (the token itself is not
decoded: the marker stands for it)."""
EOD_MARK_ESCAPED = "\\u27e6EOD\\u27e7"
"""What a document's own literal ``EOD_MARK`` text is shown as, so that every marker in a
window's text is a real end-of-document token."""


@dataclass(frozen=True)
class DocHits:
    """One document of the step: in how many of the step's windows it appears."""

    source: int
    doc: int
    windows: int
    tokens: int  # the document's length in tokens (its end-of-document token included)


@dataclass(frozen=True)
class Replayed:
    """Step ``step``: its positions, where each went, the batch, and each window's documents."""

    step: int
    consumed: int
    global_batch: int
    config: BatchConfig  # the step's shape (dp 1 x B when only the global batch is known)
    batch: Batch  # whole step, in position order
    placement: Placement
    doc_first: np.ndarray  # per window: the first document it overlaps
    doc_last: np.ndarray  # per window: the last document it overlaps (inclusive)
    tokens_hash: str  # the step log's hash of this rebuilt step

    def rows(
        self, rank: int | None = None, micro_step: int | None = None, row: int | None = None
    ) -> np.ndarray:
        """Indices of the step's windows: all, or those of one DP rank, micro-step and row
        within the micro-batch (each None: any)."""
        keep = np.ones(self.batch.positions.size, dtype=bool)
        for wanted, where in (
            (rank, self.placement.dp_rank),
            (micro_step, self.placement.micro_step),
            (row, self.placement.row),
        ):
            if wanted is not None:
                keep &= where == wanted
        return np.flatnonzero(keep)


def _doc_ranges(batcher: Batcher, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """Per window, the first and last document overlapping tokens [kL, kL + L]."""
    seq_len = batcher.plan.seq_len
    first = np.empty(batch.positions.size, dtype=np.int64)
    last = np.empty(batch.positions.size, dtype=np.int64)
    for d in np.unique(batch.source).tolist():
        rows = np.flatnonzero(batch.source == d)
        starts = batcher.sources[d].doc_starts
        lo = batch.sample[rows] * seq_len
        first[rows] = np.searchsorted(starts, lo, side="right") - 1
        last[rows] = np.searchsorted(starts, lo + seq_len, side="right") - 1
    return first, last


def replay(plan: Plan, step: int, schedule: Schedule, batcher: Batcher | None = None) -> Replayed:
    """Rebuild step ``step`` of a run with ``schedule``."""
    step = as_index("step", step)
    consumed, config = schedule.start(step)
    if schedule.steps is not None and step >= schedule.steps:
        raise OutOfRangeError(
            f"step {step} is beyond the step log, which ends at step {schedule.steps - 1}"
        )
    if consumed + config.global_batch > MAX_POSITION:
        raise OutOfRangeError(f"step {step}: the step ends beyond position 2**62")
    itemsize = batcher.dtype.itemsize if batcher is not None else hash_dtype(plan).itemsize
    per_window = (plan.seq_len + 1) * itemsize + _BYTES_PER_WINDOW
    check_fits(
        config.global_batch * per_window,
        f"step {step} ({fmt_int(config.global_batch)} windows of {fmt_int(plan.seq_len + 1)} "
        "tokens)",
    )
    batcher = batcher if batcher is not None else Batcher(plan, hash_dtype(plan))
    positions = np.arange(consumed, consumed + config.global_batch, dtype=np.int64)
    batch = batcher.batch(positions)
    first, last = _doc_ranges(batcher, batch)
    return Replayed(
        step,
        consumed,
        config.global_batch,
        config,
        batch,
        schedule.place(positions),
        first,
        last,
        step_tokens_hash(batch, plan),
    )


def top_documents(
    r: Replayed, batcher: Batcher, rank: int | None = None, rows: np.ndarray | None = None
) -> list[DocHits]:
    """The documents of the step (or of one rank's share, or of the windows ``rows``), most
    windows first."""
    rows = r.rows(rank) if rows is None else rows
    counts = r.doc_last[rows] - r.doc_first[rows] + 1
    source = np.repeat(r.batch.source[rows], counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    doc = np.repeat(r.doc_first[rows], counts) + offsets
    pairs, windows = np.unique(np.stack([source, doc], axis=1), axis=0, return_counts=True)
    order = np.lexsort((pairs[:, 1], pairs[:, 0], -windows))  # most windows, then by id
    hits = []
    for i in order.tolist():
        d, k = int(pairs[i, 0]), int(pairs[i, 1])
        lo, hi = batcher.sources[d].doc_span(k)
        hits.append(DocHits(d, k, int(windows[i]), hi - lo))
    return hits


def preview(batcher: Batcher, source: int, doc: int, chars: int) -> str:
    """The first ``chars`` characters of a document's text, on one line."""
    src = batcher.sources[source]
    lo, hi = src.doc_span(doc)
    text = src.decode(src.tokens(lo, min(hi, lo + chars + 8)))  # a token is at least a char
    one_line = " ".join(text.split())
    return one_line[:chars] + ("…" if len(one_line) > chars else "")


@dataclass(frozen=True)
class WindowText:
    """A window's text as decoded, ``EOD_MARK`` where each end-of-document token falls."""

    text: str  # at most the characters asked for
    truncated: bool  # the window's whole text is longer than ``text``
    eod_at: list[int]  # offsets in the window (0..seq_len) of its end-of-document tokens


def eod_offsets(r: Replayed, batcher: Batcher, i: int) -> list[int]:
    """Offsets in window ``i`` of the end-of-document tokens it holds (from the store's document
    starts, not by looking for the id)."""
    src = batcher.sources[int(r.batch.source[i])]
    seq_len = batcher.plan.seq_len
    lo = int(r.batch.sample[i]) * seq_len
    out = []
    for doc in range(int(r.doc_first[i]), int(r.doc_last[i]) + 1):
        eod = src.doc_span(doc)[1] - 1
        if lo <= eod <= lo + seq_len:
            out.append(eod - lo)
    return out


def _decoded(batcher: Batcher, source: int, tokens: np.ndarray, eod_at: list[int]) -> str:
    """``tokens`` decoded piece by piece between the end-of-document offsets (those below
    ``tokens.size``), each end-of-document token shown as ``EOD_MARK``."""
    src = batcher.sources[source]
    parts, start = [], 0
    for at in (a for a in eod_at if a < tokens.size):
        parts.append(_escape_mark(src.decode(tokens[start:at])) if at > start else "")
        parts.append(EOD_MARK)
        start = at + 1
    if start < tokens.size:
        parts.append(_escape_mark(src.decode(tokens[start:])))
    return "".join(parts)


def _escape_mark(text: str) -> str:
    """``text`` (decoded from a document) with its literal ``EOD_MARK`` escaped."""
    return text.replace(EOD_MARK, EOD_MARK_ESCAPED)


def _cut(text: str, chars: int) -> str:
    """The first ``chars`` characters of ``text``, less a marker the cut would fall inside."""
    inside = text.find(EOD_MARK, max(0, chars - len(EOD_MARK) + 1), chars + len(EOD_MARK) - 1)
    return text[: inside if 0 <= inside < chars else chars]


def window_text(
    r: Replayed, batcher: Batcher, i: int, chars: int, whole_marks: bool = False
) -> WindowText:
    """Window ``i`` of the step decoded, its first ``chars`` characters (0: all of it), less a
    marker cut in two when ``whole_marks``. Only a prefix of the tokens is decoded when that
    already gives more than ``chars`` characters."""
    if chars < 0:
        raise ArgumentError(f"chars must be >= 0, got {chars}")
    tokens = r.batch.tokens[i]
    eod_at = eod_offsets(r, batcher, i)
    source = int(r.batch.source[i])
    n = tokens.size if chars == 0 else min(tokens.size, chars + 8)
    while True:
        text = _decoded(batcher, source, tokens[:n], eod_at)
        # A prefix may end inside a character or a literal marker (escaped once whole): only
        # the text a marker's length before its end is final.
        if chars == 0 or len(text) >= chars + len(EOD_MARK) or n == tokens.size:
            break
        n = min(tokens.size, 4 * n)
    if chars and len(text) > chars:
        return WindowText(_cut(text, chars) if whole_marks else text[:chars], True, eod_at)
    return WindowText(text, False, eod_at)


def window_hash(tokens: np.ndarray, plan: Plan) -> str:
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype=hash_dtype(plan)).data).hexdigest()


__all__ = [
    "DEFAULT_PREVIEW",
    "DEFAULT_TEXT_CHARS",
    "DEFAULT_TOP",
    "EOD_MARK",
    "EOD_MARK_ESCAPED",
    "DocHits",
    "Replayed",
    "WindowText",
    "eod_offsets",
    "preview",
    "replay",
    "top_documents",
    "window_hash",
    "window_text",
]

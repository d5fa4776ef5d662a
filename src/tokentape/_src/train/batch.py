"""Batch assembly: positions → resolved samples → token windows, from the plan's stores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokentape._src.objects.ranged import FetchConfig
from tokentape._src.plan.plan import Plan, open_planned
from tokentape._src.store.origins import Origin
from tokentape._src.store.reader import TokenStream
from tokentape._src.tape.resolve import Resolved, Tape, as_positions
from tokentape._src.util.checks import as_index
from tokentape.errors import (
    ArgumentError,
    OutOfRangeError,
)


@dataclass(frozen=True)
class Batch:
    """Samples at some positions: where each came from, and its ``seq_len + 1`` tokens.

    Every array has one row per sample, in the order of ``positions``; a window is the sample's
    ``seq_len + 1`` tokens, so ``inputs`` and ``targets`` are it without its last or first
    token.

    Attributes:
        positions: ``(n,)`` int64: the tape positions of the samples.
        source: ``(n,)`` int64: each sample's source, an index into the plan's sources.
        epoch: ``(n,)`` int64: the pass over its source each sample is drawn in (0 = first).
        sample: ``(n,)`` int64: each sample's index within its source.
        tokens: ``(n, seq_len + 1)``: the token windows, in the dtype the batch was built with.
        segment_ids: ``(n, seq_len + 1)`` int64: each token's document index within its
            window; None unless segments were asked for (``Loader(..., segments=True)``).
        doc_positions: ``(n, seq_len + 1)`` int64: each token's offset inside its document;
            None unless segments were asked for.
    """

    positions: np.ndarray  # (n,) int64
    source: np.ndarray  # (n,) int64, index into the plan's sources
    epoch: np.ndarray  # (n,) int64
    sample: np.ndarray  # (n,) int64
    tokens: np.ndarray  # (n, seq_len + 1)
    segment_ids: np.ndarray | None = None  # (n, seq_len + 1): document index within the window
    doc_positions: np.ndarray | None = None  # (n, seq_len + 1): offset inside its document

    @property
    def inputs(self) -> np.ndarray:
        """The first ``seq_len`` tokens of each window."""
        return self.tokens[:, :-1]

    def cu_seqlens(self, row: int) -> np.ndarray:
        """Cumulative document lengths of one row's inputs (for varlen attention kernels).

        Args:
            row: The row (sample) of the batch, in ``[0, n)``.

        Returns:
            An int32 array ``[0, len_0, len_0 + len_1, ..., seq_len]`` over the documents that
            the row's ``seq_len`` inputs touch, in order (a document cut by the window counts
            only its tokens inside it).

        Raises:
            ArgumentError: ``row`` is not an integer, or the batch was built without segment
                ids.
            OutOfRangeError: ``row`` is not a row of the batch.
        """
        row = as_index("row", row)
        if self.segment_ids is None:
            raise ArgumentError("segment ids were not requested (Batcher(..., segments=True))")
        if not 0 <= row < self.segment_ids.shape[0]:
            raise OutOfRangeError(
                f"row {row}: the batch has rows 0..{self.segment_ids.shape[0] - 1}"
            )
        counts = np.bincount(self.segment_ids[row, :-1])
        return np.concatenate([[0], np.cumsum(counts[counts > 0])]).astype(np.int32)

    @property
    def targets(self) -> np.ndarray:
        """The window shifted by one: what each input position predicts."""
        return self.tokens[:, 1:]


@dataclass(frozen=True)
class DocOrigin:
    """One document that a window of a batch holds (in part or whole), and where it came from.

    Attributes:
        source: The name of the plan source it was drawn from.
        doc: The document's id within that source (``tokentape locate PLAN SOURCE DOC``,
            ``open_source(store).doc(doc)``).
        origin: Where it came from: its input, its record there and the user's id for it; None
            when the source records none (a store made before provenance was recorded, one
            converted from Megatron, a Megatron dataset).
    """

    source: str
    doc: int
    origin: Origin | None

    def to_json(self) -> dict[str, Any]:
        """``source``, ``doc`` and ``origin`` (``Origin.to_json()``, or None) as JSON-friendly
        values, as ``tokentape replay --json`` names a top document."""
        origin = None if self.origin is None else self.origin.to_json()
        return {"source": self.source, "doc": self.doc, "origin": origin}


class Batcher:
    """Assembles the batch of any positions of a plan; pure apart from reading the stores."""

    def __init__(
        self,
        plan: Plan,
        dtype: np.dtype | type = np.int64,
        segments: bool = False,
        sources: list[TokenStream] | None = None,
        fetch: FetchConfig | None = None,
    ) -> None:
        """``sources``: the plan's opened stores, to share with another Batcher; ``fetch``: how
        stores in object storage are read."""
        self.plan = plan
        self.dtype = np.dtype(dtype)
        top = max(s.vocab_size for s in plan.sources) - 1
        if self.dtype.kind not in "iu" or np.iinfo(self.dtype).max < top:
            raise ArgumentError(
                f"token dtype {self.dtype} cannot hold ids up to {top}; use int32 or int64"
            )
        self.tape: Tape = plan.tape()
        self.sources = (
            sources
            if sources is not None
            else [open_planned(plan, i, fetch) for i in range(len(plan.sources))]
        )
        for source in self.sources:
            source.advise_random()
        self.segments = segments
        """Also compute per-token document segment ids and in-document positions."""

    @property
    def fetches_ahead(self) -> bool:
        """Whether a source reads from object storage (``prefetch`` then starts its reads)."""
        return any(source.fetches_ahead for source in self.sources)

    def prefetch(self, positions: np.ndarray) -> Resolved:
        """Start reading the windows of ``positions`` in the background (sources in object
        storage fetch their byte ranges; memory-mapped ones do nothing); returns their
        resolution, for ``batch`` to reuse."""
        r = self.tape.resolve(as_positions(positions).reshape(-1))
        for d in self._sources_in(r):
            if self.sources[d].fetches_ahead:
                self.sources[d].prefetch(r.sample[r.source == d], self.plan.seq_len)
        return r

    def _sources_in(self, r: Resolved) -> list[int]:
        """The sources some position of ``r`` draws from, in order (counted, not sorted:
        ``np.unique`` would also load ``numpy.ma``, 80 ms, on a run's first step)."""
        if not r.source.size:
            return []
        return np.flatnonzero(np.bincount(r.source, minlength=len(self.sources))).tolist()

    def batch(self, positions: np.ndarray, resolved: Resolved | None = None) -> Batch:
        """The batch of ``positions``; ``resolved``: their resolution when already known (what
        ``prefetch`` returned for the same positions), else they are resolved here."""
        p = as_positions(positions).reshape(-1)
        r = self.tape.resolve(p) if resolved is None else resolved
        if r.source.shape != p.shape:
            raise ArgumentError(f"resolved holds {r.source.size} positions, not {p.size}")
        seq_len = self.plan.seq_len
        shape = (p.size, seq_len + 1)
        tokens = np.empty(shape, dtype=self.dtype)
        segment = np.empty(shape, dtype=np.int64) if self.segments else None
        position = np.empty(shape, dtype=np.int64) if self.segments else None
        for d in self._sources_in(r):
            rows = np.flatnonzero(r.source == d)
            self.sources[d].windows_into(r.sample[rows], seq_len, tokens, rows)
            if segment is not None and position is not None:
                seg = np.empty((rows.size, seq_len + 1), dtype=np.int64)
                pos = np.empty((rows.size, seq_len + 1), dtype=np.int64)
                self.sources[d].segments_into(r.sample[rows], seq_len, seg, pos)
                segment[rows], position[rows] = seg, pos
        return Batch(p, r.source, r.epoch, r.sample, tokens, segment, position)

    def origins(self, batch: Batch) -> list[list[DocOrigin]]:
        """Per row of ``batch``, the documents its window overlaps, in order (the same rule as
        ``TokenStream.docs_in``: every document with a token among the window's ``seq_len +
        1``), each with where it came from. ``batch`` must be one of this plan's: each row's
        source, pass and sample are checked against its position (``ArgumentError`` names the
        first row that differs)."""
        if not isinstance(batch, Batch):
            raise ArgumentError(
                f"batch must be a Batch (step.micro_batches[i]), got {type(batch).__name__}"
            )
        p = as_positions(batch.positions).reshape(-1)
        given = (batch.source, batch.epoch, batch.sample)
        if any(np.shape(a) != p.shape for a in given):
            raise ArgumentError(
                f"batch: positions, source, epoch and sample differ in length "
                f"({', '.join(str(np.size(a)) for a in (p, *given))})"
            )
        r = self.tape.resolve(p)
        same = (r.source == batch.source) & (r.epoch == batch.epoch) & (r.sample == batch.sample)
        if not same.all():
            i = int(np.flatnonzero(~same)[0])
            raise ArgumentError(
                f"batch row {i} (position {int(p[i])}) holds source {int(batch.source[i])} "
                f"pass {int(batch.epoch[i])} sample {int(batch.sample[i])}; this plan puts "
                f"source {int(r.source[i])} pass {int(r.epoch[i])} sample {int(r.sample[i])} "
                "there: not a batch of this plan"
            )
        names = [s.name for s in self.plan.sources]
        out = []
        for d, k in zip(r.source.tolist(), r.sample.tolist(), strict=True):
            stream = self.sources[d]
            docs = stream.docs_in(k, self.plan.seq_len)
            out.append([DocOrigin(names[d], doc, stream.provenance(doc)) for doc in docs])
        return out


__all__ = ["Batch", "Batcher", "DocOrigin"]

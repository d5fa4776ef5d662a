"""A Megatron-LM iteration replayed from the run's data cache: its samples, their documents.

    iteration N ─schedule (or the log, or --consumed)→ samples [C, C + B)
      ─MegatronRun.resolve→ dataset, its sample ─GptSamples.text→ tokens and document pieces

The documents are ranked by how many of the iteration's samples they appear in, then by tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokentape._src.megatron.run import MegatronRun, Piece
from tokentape._src.util.text import fmt_int
from tokentape.errors import ArgumentError


@dataclass(frozen=True)
class Shape:
    """How an iteration's samples were split over ranks (both None: unknown)."""

    micro_batch: int | None = None
    dp: int | None = None

    def known(self) -> bool:
        return self.micro_batch is not None and self.dp is not None

    def place(self, offset: int) -> tuple[int, int, int] | None:
        """(rank, micro-batch, row) of the ``offset``-th sample of an iteration."""
        if self.micro_batch is None or self.dp is None:
            return None
        per_micro = self.micro_batch * self.dp
        within = offset % per_micro
        return within // self.micro_batch, offset // per_micro, within % self.micro_batch


@dataclass(frozen=True)
class Sample:
    """One sample of the iteration."""

    g: int  # global sample
    dataset: int
    sample: int  # the dataset's sample
    place: tuple[int, int, int] | None  # (rank, micro-batch, row)
    tokens: np.ndarray  # L + extra tokens read (the model's input is the first L when extra)
    pieces: list[Piece]


@dataclass(frozen=True)
class DocShare:
    """A document of the iteration: in how many of its samples, with how many tokens."""

    dataset: int
    doc: int
    samples: int
    tokens: int  # tokens of it read into the iteration's samples


@dataclass(frozen=True)
class Iteration:
    iteration: int
    consumed: int
    global_batch: int
    shape: Shape
    samples: list[Sample]

    def documents(self) -> list[DocShare]:
        """The iteration's documents, most samples first, then most tokens, then by id."""
        counts: dict[tuple[int, int], list[int]] = {}  # samples, tokens, the last sample
        for k, s in enumerate(self.samples):
            for p in s.pieces:
                if p.stop > p.start:  # a document read twice in one sample counts once
                    entry = counts.setdefault((s.dataset, p.doc), [0, 0, -1])
                    entry[0] += entry[2] != k
                    entry[1] += p.stop - p.start
                    entry[2] = k
        return [
            DocShare(d, doc, n, t)
            for (d, doc), (n, t, _) in sorted(
                counts.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0])
            )
        ]


def check_shape(shape: Shape, global_batch: int, iteration: int) -> None:
    """The batch splits into whole micro-batches of every rank."""
    if shape.micro_batch is None and shape.dp is None:
        return
    if not shape.known():
        raise ArgumentError("--micro-batch and --dp go together (the ranks need both)")
    assert shape.micro_batch is not None and shape.dp is not None
    if shape.micro_batch < 1 or shape.dp < 1:
        raise ArgumentError("--micro-batch and --dp must be >= 1")
    if global_batch % (shape.micro_batch * shape.dp):
        raise ArgumentError(
            f"iteration {iteration}'s global batch {global_batch} is not a multiple of "
            f"--micro-batch {shape.micro_batch} x --dp {shape.dp}"
        )


def replay_iteration(
    run: MegatronRun,
    iteration: int,
    consumed: int,
    global_batch: int,
    shape: Shape,
    rank: int | None = None,
) -> Iteration:
    """The samples of ``iteration`` (``global_batch`` of them after ``consumed``), or of
    data-parallel rank ``rank``'s share."""
    check_shape(shape, global_batch, iteration)
    if rank is not None:
        if not shape.known():
            raise ArgumentError("--rank needs --micro-batch and --dp")
        assert shape.dp is not None
        if not 0 <= rank < shape.dp:
            raise ArgumentError(f"--rank {rank}: the run had data-parallel ranks 0..{shape.dp - 1}")
    end = consumed + global_batch
    if end > len(run):
        raise ArgumentError(
            f"iteration {iteration} reads samples {fmt_int(consumed)}..{fmt_int(end - 1)}, past "
            f"the {fmt_int(len(run))} the cache holds (a longer run, or the wrong schedule?)"
        )
    samples = []
    for offset in range(global_batch):
        place = shape.place(offset)
        if rank is not None and place is not None and place[0] != rank:
            continue
        g = consumed + offset
        d, j = run.resolve(g)
        tokens, pieces = run.datasets[d].text(j)
        samples.append(Sample(g, d, j, place, tokens, pieces))
    return Iteration(iteration, consumed, global_batch, shape, samples)

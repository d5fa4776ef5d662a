"""A Megatron-LM run's samples, from its data cache and its prefixes read in place.

Global sample ``g`` of the run's split is resolved as megatron-core resolves it:

    g ─blend (dataset_index, dataset_sample_index)→ dataset d, its sample j
      ─shuffle_index→ u ─sample_index[u], sample_index[u + 1]→ positions and offsets
      ─document_index→ sequences of d's prefix, and the token ranges read from them

A sample is ``L + 1`` tokens with ``add_extra_token_to_sequence`` (megatron-core's default:
neighbouring samples share a token; the model reads the first ``L`` and predicts the last
``L``), ``L`` without. A *document* here is what megatron-core's GPTDataset counts as one: a
sequence of the ``.idx`` (one per document unless the data was split into sentences).

Opening checks what is cheap for the whole cache (dtypes, shapes, that the sample count is the
one the prefix's tokens and the description give, the document index's range); each sample
read is checked as it is read (its positions, offsets and length).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.megatron.cache import (
    GPT_ARRAYS,
    Description,
    load_array,
    split_range,
)
from tokentape._src.megatron.format import MegatronIndex, bin_path, read_index
from tokentape._src.util.text import fmt_int
from tokentape.errors import ArgumentError, StoreError


class PrefixData:
    """A ``.bin``/``.idx`` pair read in place: the validated index and the tokens."""

    def __init__(self, prefix: str | os.PathLike[str]) -> None:
        self.prefix = Path(prefix)
        self.index: MegatronIndex = read_index(self.prefix)
        self.itemsize = self.index.dtype.itemsize
        self.tokens: np.ndarray = np.zeros(0, dtype=self.index.dtype)
        if self.index.n_tokens:
            self.tokens = np.memmap(bin_path(self.prefix), dtype=self.index.dtype, mode="r")

    def read(self, sequence: int, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of ``sequence``."""
        base = int(self.index.sequence_pointers[sequence]) // self.itemsize
        return np.asarray(self.tokens[base + start : base + stop], dtype=np.int64)


@dataclass(frozen=True)
class Piece:
    """Tokens ``[start, stop)`` of sequence (document) ``doc``, read into a sample."""

    doc: int
    start: int
    stop: int


class GptSamples:
    """One GPTDataset of the run: its description, prefix and the three arrays, checked."""

    def __init__(self, description: Description, prefix: PrefixData, extra_token: bool) -> None:
        self.description = description
        self.prefix = prefix
        settings = description.settings
        self.seq_len: int = settings["sequence_length"]
        self.extra = int(extra_token)
        where = description.path
        n_seq = prefix.index.n_sequences
        self.begin, self.end = split_range(where, settings, n_seq)
        arrays = {
            name: load_array(description.array_path(name), *GPT_ARRAYS[name]) for name in GPT_ARRAYS
        }
        self.document_index = arrays["document_index"]
        self.sample_index = arrays["sample_index"]
        self.shuffle_index = arrays["shuffle_index"]
        self.n_samples = len(self.sample_index) - 1
        docs = self.end - self.begin
        n_positions = len(self.document_index)
        if docs <= 0 or n_positions % docs or not n_positions:
            raise StoreError(
                f"{description.array_path('document_index')}: {fmt_int(n_positions)} entries, "
                f"not a whole number of epochs of the {fmt_int(docs)} sequences of "
                f"{prefix.prefix}'s {description.split} split: the cache was not built from it"
            )
        self.epochs = n_positions // docs
        low, high = int(self.document_index.min()), int(self.document_index.max())
        if low < self.begin or high >= self.end:
            raise StoreError(
                f"{description.array_path('document_index')}: sequences {low}..{high}, outside "
                f"the split's {self.begin}..{self.end - 1} of {prefix.prefix}: the cache was not "
                "built from it"
            )
        per_epoch = int(
            np.sum(prefix.index.sequence_lengths[self.begin : self.end], dtype=np.int64)
        )
        self.tokens_per_epoch = per_epoch
        expected = self._sample_count(self.extra)
        if self.n_samples not in expected:
            other = self._sample_count(1 - self.extra)
            flag = "without" if self.extra else "with"
            if self.n_samples in other:
                raise StoreError(
                    f"{description.array_path('sample_index')}: {fmt_int(self.n_samples)} "
                    f"samples, which {self.epochs} epoch(s) of {fmt_int(per_epoch)} tokens make "
                    f"{flag} add_extra_token_to_sequence: the run was "
                    + ("not " if self.extra else "")
                    + "using it ("
                    + ("--no-extra-token" if self.extra else "drop --no-extra-token")
                    + ")"
                )
            raise StoreError(
                f"{description.array_path('sample_index')}: {fmt_int(self.n_samples)} samples, "
                f"but {self.epochs} epoch(s) of the {fmt_int(per_epoch)} tokens of "
                f"{prefix.prefix}'s {description.split} split make {fmt_int(min(expected))} at "
                f"sequence length {self.seq_len}: the cache was not built from this prefix"
            )
        wanted = settings.get("num_samples")
        if wanted is not None and self.n_samples < wanted:
            raise StoreError(
                f"{description.array_path('sample_index')}: {fmt_int(self.n_samples)} samples, "
                f"fewer than the {fmt_int(wanted)} its description asks for"
            )
        if len(self.shuffle_index) != self.n_samples:
            raise StoreError(
                f"{description.array_path('shuffle_index')}: {fmt_int(len(self.shuffle_index))} "
                f"entries, expected one per sample ({fmt_int(self.n_samples)})"
            )

    def _sample_count(self, extra: int) -> set[int]:
        """The sample counts megatron-core's rule gives (the last partial sample dropped, or
        kept for a validation split)."""
        total = self.epochs * self.tokens_per_epoch - extra
        return {total // self.seq_len, math.ceil(total / self.seq_len)}

    def where(self) -> str:
        return f"{self.prefix.prefix}'s {self.description.split} samples"

    def pieces(self, j: int) -> list[Piece]:
        """The token ranges sample ``j`` reads, in order, checked against the prefix."""
        path = self.description.array_path
        if not 0 <= j < self.n_samples:
            raise StoreError(f"{self.where()}: sample {j} is outside 0..{self.n_samples - 1}")
        u = int(self.shuffle_index[j])
        if not 0 <= u < self.n_samples:
            raise StoreError(
                f"{path('shuffle_index')}: entry {j} is {u}, outside 0..{self.n_samples - 1}"
            )
        (b, b_off), (e, e_off) = (
            (int(x) for x in self.sample_index[u]),
            (int(x) for x in self.sample_index[u + 1]),
        )
        n_positions = len(self.document_index)
        if not (0 <= b <= e < n_positions):
            raise StoreError(
                f"{path('sample_index')}: rows {u} and {u + 1} are positions {b} and {e}, not "
                f"in order within 0..{n_positions - 1}"
            )
        lengths = self.prefix.index.sequence_lengths
        out: list[Piece] = []
        for position in range(b, e + 1):
            doc = int(self.document_index[position])
            start = b_off if position == b else 0
            stop = e_off + self.extra if position == e else int(lengths[doc])
            if not 0 <= start <= stop <= int(lengths[doc]):
                raise StoreError(
                    f"{path('sample_index')}: sample {u} reads tokens {start}..{stop} of "
                    f"sequence {doc}, which has {int(lengths[doc])}: the cache was not built "
                    f"from {self.prefix.prefix}"
                )
            out.append(Piece(doc, start, stop))
        total = sum(p.stop - p.start for p in out)
        wanted = self.seq_len + self.extra
        if total != wanted and not (total < wanted and u == self.n_samples - 1):
            raise StoreError(
                f"{path('sample_index')}: sample {u} spans {total} tokens, expected {wanted}: "
                f"the cache was not built from {self.prefix.prefix}"
            )
        return out

    def text(self, j: int) -> tuple[np.ndarray, list[Piece]]:
        """Sample ``j``'s ``L + extra`` tokens as megatron-core reads them (a short last
        sample padded with 0, as megatron-core feeds its padding), and its pieces."""
        pieces = self.pieces(j)
        parts = [self.prefix.read(p.doc, p.start, p.stop) for p in pieces]
        text = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        wanted = self.seq_len + self.extra
        if len(text) < wanted:
            text = np.concatenate([text, np.zeros(wanted - len(text), dtype=np.int64)])
        return text, pieces


@dataclass
class MegatronRun:
    """The run's split: its datasets, and how global samples map to them."""

    datasets: list[GptSamples]
    description: Description | None  # the blend's (or the only dataset's); None when rebuilt
    dataset_index: Any  # per global sample: the dataset (None: a single dataset)
    dataset_sample_index: Any
    rebuilt: bool  # the blend arrays were rebuilt with megatron-core's rule (never saved)
    extra_token: bool

    @property
    def seq_len(self) -> int:
        return self.datasets[0].seq_len

    def __len__(self) -> int:
        if self.dataset_index is None:
            return self.datasets[0].n_samples
        return len(self.dataset_index)

    def resolve(self, g: int) -> tuple[int, int]:
        """Global sample ``g`` → (dataset, its sample), checked."""
        if not 0 <= g < len(self):
            raise ArgumentError(
                f"sample {fmt_int(g)} is past the {fmt_int(len(self))} samples the cache holds"
            )
        if self.dataset_index is None:
            return 0, g
        d, j = int(self.dataset_index[g]), int(self.dataset_sample_index[g])
        where = self.description.path if self.description else "the rebuilt blend"
        if not 0 <= d < len(self.datasets):
            raise StoreError(
                f"{where}: sample {g} is of dataset {d}, outside 0..{len(self.datasets) - 1}"
            )
        if not 0 <= j < self.datasets[d].n_samples:
            raise StoreError(
                f"{where}: sample {g} is sample {j} of dataset {d}, which has "
                f"{self.datasets[d].n_samples}"
            )
        return d, j

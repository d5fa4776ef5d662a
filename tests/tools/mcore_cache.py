"""Build Megatron-LM data caches with whichever megatron-core this Python has, and record what
its own datasets return, for tests/megatron/test_megatron_versions.py.

    python tests/tools/mcore_cache.py OUT

Runs under another megatron-core than the project's (0.6.0, whose cache layout differs: no
split in the file names), in its own virtual environment (``make mcore06``), so it imports
nothing from tokentape. Writes under OUT:

- ``data/{web,code,math}.bin/.idx``: three prefixes (megatron-core's ``IndexedDatasetBuilder``);
- ``blend/cache``: a 50/30/20 blend's data cache, split 90/5/5 (train and valid);
- ``nocache/``: copies of the prefixes and a 2/1/1 blend built without ``path_to_cache`` (each
  prefix's arrays in ``PREFIX/cache/GPTDataset_indices``, the blend never saved);
- ``single/cache``: one prefix alone, over many epochs;
- ``expected.npz``: for each case and split, every sample's ``tokens`` as megatron-core returns
  them, and the document ids its GPTDataset reports for each sample (flat, with offsets), and
  for the blends the dataset of each sample; ``meta.json``: the version and the cases.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
from importlib.metadata import version

import numpy
import torch

warnings.simplefilter("ignore")
VERSION = version("megatron-core")
OLD = tuple(int(x) for x in VERSION.split(".")[:2]) < (0, 7)

from megatron.core.datasets import indexed_dataset  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import (  # noqa: E402
    BlendedMegatronDatasetBuilder,
)

try:
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
except ImportError:  # pragma: no cover - a layout this script was not written for
    raise SystemExit(f"megatron-core {VERSION}: no GPTDatasetConfig in gpt_dataset") from None
try:
    from megatron.core.datasets.megatron_tokenizer import MegatronTokenizer as _Base
except ImportError:
    from megatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer as _Base

VOCAB, EOD, SEQ_LEN = 1000, 999, 32
SIZES = {"web": 300, "code": 120, "math": 25}


class Tokenizer(_Base):
    """The least megatron-core asks of a tokenizer (its pad id is absent: -1)."""

    def __init__(self) -> None:
        super().__init__("test", vocab=VOCAB)

    def tokenize(self, text):
        return numpy.array([1])

    def detokenize(self, ids):
        return ""

    @property
    def vocab(self):
        return {}

    @property
    def inv_vocab(self):
        return {}

    @property
    def vocab_size(self):
        return VOCAB

    @property
    def eod(self):
        return EOD


def write_prefixes(root: str) -> list[str]:
    rng = numpy.random.default_rng(0)
    os.makedirs(root, exist_ok=True)
    out = []
    for name, n in SIZES.items():
        prefix = os.path.join(root, name)
        builder = indexed_dataset.IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
        for _ in range(n):
            doc = numpy.append(rng.integers(0, EOD, int(rng.integers(2, 70))), EOD)
            builder.add_item(torch.from_numpy(doc.astype(numpy.int64)))
            builder.end_document()
        builder.finalize(prefix + ".idx")
        out.append(prefix)
    return out


def build(prefixes, weights, sizes, cache, split):
    if OLD:  # a flat list of strings: [weight, prefix, weight, prefix, ...]
        pairs = (
            []
            if weights is None
            else [x for w, p in zip(weights, prefixes, strict=True) for x in (str(w), p)]
        )
        kw = {"blend": pairs or list(prefixes)}
    else:
        kw = {"blend": (list(prefixes), None if weights is None else [float(w) for w in weights])}
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=SEQ_LEN,
        split=split,
        path_to_cache=cache,
        tokenizer=Tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        **kw,
    )
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def record(arrays: dict, name: str, dataset) -> None:
    """Every sample's tokens, and the documents megatron-core says it holds."""
    n = len(dataset)
    tokens = numpy.stack([dataset[g]["tokens"].numpy() for g in range(n)])
    docs, offsets, which = [], [0], []
    for g in range(n):
        if hasattr(dataset, "dataset_index"):
            d, j = int(dataset.dataset_index[g]), int(dataset.dataset_sample_index[g])
            child = dataset.datasets[d]
        else:
            d, j, child = 0, g, dataset
        ids = child._query_document_sample_shuffle_indices(j)[1]
        docs += ids.tolist()
        offsets.append(len(docs))
        which.append(d)
    arrays[f"{name}.tokens"] = tokens
    arrays[f"{name}.docs"] = numpy.asarray(docs, dtype=numpy.int64)
    arrays[f"{name}.offsets"] = numpy.asarray(offsets, dtype=numpy.int64)
    arrays[f"{name}.dataset"] = numpy.asarray(which, dtype=numpy.int64)


def main(out: str) -> None:
    rendezvous = os.path.join(tempfile.mkdtemp(), "rendezvous")
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1
    )
    prefixes = write_prefixes(os.path.join(out, "data"))
    arrays: dict = {}
    train, valid, _ = build(
        prefixes, [50, 30, 20], [600, 40, 40], os.path.join(out, "blend", "cache"), "90,5,5"
    )
    record(arrays, "blend.train", train)
    record(arrays, "blend.valid", valid)
    copies = []
    for p in prefixes:
        copy = os.path.join(out, "nocache", os.path.basename(p))
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        for ext in (".bin", ".idx"):
            shutil.copy(p + ext, copy + ext)
        copies.append(copy)
    record(arrays, "nocache.train", build(copies, [2, 1, 1], [500, 10, 10], None, "90,5,5")[0])
    single = build(prefixes[2:], None, [300, 0, 0], os.path.join(out, "single", "cache"), "100,0,0")
    record(arrays, "single.train", single[0])
    numpy.savez(os.path.join(out, "expected.npz"), **arrays)
    meta = {
        "version": VERSION,
        "seq_len": SEQ_LEN,
        "prefixes": prefixes,
        "nocache": {"prefixes": copies, "weights": [2, 1, 1], "samples": 500},
    }
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f)


if __name__ == "__main__":
    main(sys.argv[1])

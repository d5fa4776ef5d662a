"""``Loader.origins(batch)``: for each row of a micro-batch, the documents its window holds and
where each came from. The expected documents are counted from the window's tokens (one
end-of-document id per document, bytes tokenizer) and the expected origins come from the input
files as written here (document i of a source is line i + 1 of its file, with the id written
on that line), checked against ``Source.provenance``; a store made before provenance was
recorded gives None."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import tokentape
from tokentape.errors import ArgumentError, TokentapeError

SEQ_LEN = 32
CONFIG = tokentape.BatchConfig(dp_size=2, micro=2, accum=2)
STEPS = 3


def _write(path: Path, name: str, n: int) -> list[str]:
    """``n`` documents of varied length, each with its id; returns the ids."""
    ids = [f"{name}-{i}" if i % 5 else f"{name}\x1b{i}" for i in range(n)]  # some need escaping
    lines = [json.dumps({"id": ids[i], "text": f"{name} {i} " * (1 + i % 9)}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return ids


def _without_provenance(store: Path, out: Path) -> Path:
    """A copy of ``store`` as a store made before provenance was recorded."""
    out.mkdir()
    for f in store.iterdir():
        if f.is_file() and not f.name.endswith((".rec.npy", ".ids", "inputs.json")):
            (out / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["provenance"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Two sources, ``web`` (with provenance and ids) and ``old`` (without), and their plan."""
    root = tmp_path_factory.mktemp("origins")
    ids = _write(root / "web.jsonl", "web", 80)
    _write(root / "old.jsonl", "old", 40)
    tokentape.tokenize(root / "web.jsonl", root / "web")
    tokentape.tokenize(root / "old.jsonl", root / "new")
    _without_provenance(root / "new", root / "old")
    sources = {"web": {"path": str(root / "web"), "weight": 3, "max_repeats": 4},
               "old": {"path": str(root / "old"), "weight": 1, "max_repeats": 4}}  # fmt: skip
    plan = tokentape.Plan.build(sources, seq_len=SEQ_LEN, seed=7, total_samples=48)
    stores = {name: tokentape.open_source(root / name) for name in ("web", "old")}
    return root, plan, stores, {"web": root / "web.jsonl", "old": root / "old.jsonl"}, ids


def expected_docs(store, sample: int) -> list[int]:
    """The documents a window overlaps: document i follows i end-of-document ids."""
    lo = sample * SEQ_LEN
    before = int(np.count_nonzero(store.tokens(0, lo) == store.eod_id))
    inside = int(np.count_nonzero(store.tokens(lo, lo + SEQ_LEN) == store.eod_id))
    return list(range(before, before + inside + 1))


def test_each_row_names_its_documents_and_where_each_came_from(made):
    _root, plan, stores, files, ids = made
    names = [s.name for s in plan.sources]
    loaders = [tokentape.Loader(plan, r, CONFIG, prefetch=1) for r in range(CONFIG.dp_size)]
    rows = several = 0
    seen = set()
    for _ in range(STEPS):
        for loader in loaders:
            for micro in loader.step().micro_batches:
                got = loader.origins(micro)
                assert len(got) == micro.positions.size
                for row, docs in enumerate(got):
                    name = names[int(micro.source[row])]
                    store = stores[name]
                    want = expected_docs(store, int(micro.sample[row]))
                    assert [(d.source, d.doc) for d in docs] == [(name, k) for k in want]
                    for d in docs:
                        assert d.origin == store.provenance(d.doc)
                        if name == "old":
                            assert d.origin is None
                            assert d.to_json() == {"source": "old", "doc": d.doc, "origin": None}
                        else:
                            o = d.origin
                            assert (o.input, o.kind, o.record) == (str(files["web"]), "jsonl",
                                                                   d.doc + 1)  # fmt: skip
                            assert (o.id, o.id_key, o.doc) == (ids[d.doc], "id", d.doc)
                            assert d.to_json()["origin"] == o.to_json()
                        json.dumps(d.to_json())
                    rows += 1
                    several += len(docs) > 1
                    seen.add(name)
        for loader in loaders:
            loader.commit()
    for loader in loaders:
        loader.close()
    assert rows == STEPS * CONFIG.global_batch and several and seen == {"web", "old"}


def test_a_batch_of_another_plan_is_refused(made):
    _root, plan, _stores, _files, _ids = made
    other = tokentape.Plan.build(
        {s.name: {"path": s.path, "weight": 1, "max_repeats": 4} for s in plan.sources},
        seq_len=SEQ_LEN, seed=8, total_samples=48,
    )  # fmt: skip
    with tokentape.Loader(other, 0, CONFIG, prefetch=0) as theirs:
        foreign = theirs.step().micro_batches[0]
    with tokentape.Loader(plan, 0, CONFIG, prefetch=0) as loader:
        ours = loader.step().micro_batches[0]
        with pytest.raises(ArgumentError, match=r"batch row \d+ \(position \d+\).*not a batch of"):
            loader.origins(foreign)
        moved = replace(ours, sample=ours.sample + 1)
        with pytest.raises(ArgumentError, match=r"batch row 0 \(position \d+\) holds source"):
            loader.origins(moved)
        short = replace(ours, sample=ours.sample[:1])
        with pytest.raises(ArgumentError, match="differ in length"):
            loader.origins(short)
        for wrong in (ours.positions, [ours], None):
            with pytest.raises(ArgumentError, match="batch must be a Batch"):
                loader.origins(wrong)  # type: ignore[arg-type]
    with pytest.raises(TokentapeError, match="the loader is closed"):
        loader.origins(ours)

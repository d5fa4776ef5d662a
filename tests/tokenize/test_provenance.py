"""Provenance recorded at tokenize: every document kept names its input, its record there
and the user's id, for every input format; the files are byte-identical whatever the worker
count or unit size, checked by ``verify``, and a store made before them still reads.

The expected origins are derived from the input files directly (lines enumerated, parquet rows
counted, ids read with ``json``/``pyarrow``) and the bytes tokenizer's rule (one token per
UTF-8 byte), never from the reader under test."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import tree_bytes

import tokentape
from tokentape._src.program import main
from tokentape._src.store.provenance import INPUTS_NAME, ShardProvenance, provenance_hash
from tokentape._src.verify.stores import check_store

MIN_TOKENS = 12  # the filter: bytes tokenizer, so a document's tokens are its UTF-8 bytes


def _text(i: int) -> str:
    """Document text: some short enough to be dropped by the filter, one empty (dropped)."""
    if i % 11 == 5:
        return ""
    return f"doc {i} " + "é" * (i % 9) + "w" * (i % 13)


def _corpus(root: Path) -> list[tuple[str, str, int, int | None, str | None]]:
    """Inputs of every kind under ``root`` and, in reading order, the (input, kind, record,
    row group, id) of every document the filter keeps."""
    root.mkdir()
    kept: list[tuple[str, str, int, int | None, str | None]] = []

    def keep(path: Path, kind: str, record: int, group: int | None, id_: str | None, t: str):
        if t and len(t.encode()) >= MIN_TOKENS:
            kept.append((str(path), kind, record, group, id_))

    # a.jsonl: ids of several types, blank lines, a record without an id; big enough to be cut
    lines = []
    for i in range(300):
        record: dict[str, object] = {"text": _text(i)}
        if i % 4 == 0:
            record["id"] = f"a-{i}"
        elif i % 4 == 1:
            record["id"] = 1000 + i
        elif i % 4 == 2:
            record["id"] = {"n": i}
        lines.append(json.dumps(record))
        if i % 17 == 3:
            lines.append("")
    a = root / "a.jsonl"
    a.write_text("\n".join(lines) + "\n")
    for number, line in enumerate(lines, start=1):
        if line:
            record = json.loads(line)
            value = record.get("id")
            id_ = None if value is None else value if isinstance(value, str) else json.dumps(
                value, separators=(",", ":"))  # fmt: skip
            keep(a, "jsonl", number, None, id_, record["text"])
    # b.jsonl.zst and c.jsonl.gz: nested ids (meta.url), found by "auto"? no: url is nested,
    # so auto finds "doc_id" in c and nothing in b
    b_lines = [json.dumps({"text": _text(i), "meta": {"url": f"u{i}"}}) for i in range(120)]
    b = root / "b.jsonl.zst"
    b.write_bytes(zstandard.ZstdCompressor().compress(("\n".join(b_lines) + "\n").encode()))
    for number, line in enumerate(b_lines, start=1):
        keep(b, "jsonl.zst", number, None, None, json.loads(line)["text"])
    c_lines = [json.dumps({"doc_id": f"c{i}", "text": _text(i)}) for i in range(90)]
    c = root / "c.jsonl.gz"
    with gzip.open(c, "wt") as f:
        f.write("\n".join(c_lines) + "\n")
    for number, line in enumerate(c_lines, start=1):
        keep(c, "jsonl.gz", number, None, f"c{number - 1}", json.loads(line)["text"])
    # d.parquet: several row groups, an id column with nulls
    texts = [_text(i) for i in range(200)]
    ids = [None if i % 9 == 0 else f"row{i}" for i in range(200)]
    d = root / "d.parquet"
    pq.write_table(pa.table({"url": ids, "text": texts}), d, row_group_size=37)
    meta = pq.ParquetFile(d).metadata
    group_of = [g for g in range(meta.num_row_groups) for _ in range(meta.row_group(g).num_rows)]
    for row in range(200):
        keep(d, "parquet", row, group_of[row], ids[row], texts[row])
    # e.txt: one record, no id
    e = root / "e.txt"
    e.write_text("a whole file is one document")
    keep(e, "txt", 0, None, None, e.read_text())
    return kept


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("prov")
    expected = _corpus(root / "in")
    summary = tokentape.tokenize(
        root / "in", root / "store", filters=[f"min-tokens:{MIN_TOKENS}"], unit_mb=0.002,
        shard_mb=0.002,
    )  # fmt: skip
    return root, expected, summary


def test_every_document_names_its_input_record_and_id(made):
    root, expected, summary = made
    assert summary.units > 5 and summary.n_shards > 2  # files cut, documents over shards
    src = tokentape.open_source(root / "store")
    assert src.n_docs == len(expected)
    got = []
    for doc in range(src.n_docs):
        o = src.provenance(doc)
        got.append((o.input, o.kind, o.record, o.row_group, o.id))
        assert o.doc == doc
    assert got == expected


def test_the_inputs_table_counts_what_each_input_gave(made):
    root, expected, summary = made
    table = tokentape.open_source(root / "store").inputs()
    names = [Path(row["path"]).name for row in table]
    assert names == ["a.jsonl", "b.jsonl.zst", "c.jsonl.gz", "d.parquet", "e.txt"]
    assert [row["id_key"] for row in table] == ["id", None, "doc_id", "url", None]
    kept = [sum(1 for e in expected if e[0] == row["path"]) for row in table]
    assert [row["docs_kept"] for row in table] == kept
    assert [row["docs_in"] for row in table] == [300, 120, 90, 200, 1]
    assert all(row["docs_dropped"] == row["docs_in"] - row["docs_kept"] for row in table)
    assert sum(row["docs_in"] - row["docs_kept"] for row in table) == sum(
        summary.dropped_docs.values()
    )
    assert summary.id_keys == {"": 2, "doc_id": 1, "id": 1, "url": 1}


def test_provenance_files_are_the_same_for_any_worker_count_and_unit_size(made, tmp_path):
    root, _, _ = made
    reference = tree_bytes(root / "store")
    assert {INPUTS_NAME, "part-00000.rec.npy", "part-00000.ids", "part-00000.idkeys.npy"} <= set(
        reference
    )
    for workers, unit_mb in ((2, 0.002), (1, 0.05)):
        out = tmp_path / f"s{workers}-{unit_mb}"
        tokentape.tokenize(
            root / "in", out, filters=[f"min-tokens:{MIN_TOKENS}"], unit_mb=unit_mb,
            shard_mb=0.002, workers=workers,
        )  # fmt: skip
        got = tree_bytes(out)
        for name in reference:
            if name != "manifest.json":  # records the unit size in its job
                assert got[name] == reference[name], (workers, unit_mb, name)


def test_ids_none_records_inputs_and_records_without_ids(made, tmp_path):
    root, expected, _ = made
    tokentape.tokenize(
        root / "in", tmp_path / "s", filters=[f"min-tokens:{MIN_TOKENS}"], id_key="none"
    )
    src = tokentape.open_source(tmp_path / "s")
    got = [src.provenance(d) for d in range(src.n_docs)]
    assert [(o.input, o.record, o.id) for o in got] == [(e[0], e[2], None) for e in expected]


def test_verify_finds_a_tampered_provenance_file(made, tmp_path):
    root, _, _ = made
    store = tmp_path / "s"
    store.mkdir()
    for name, data in tree_bytes(root / "store").items():
        (store / name).write_bytes(data)
    assert check_store(store).problems == ()
    ids = store / "part-00001.ids"
    data = bytearray(ids.read_bytes())
    data[0] ^= 1
    ids.write_bytes(bytes(data))
    problems = check_store(store).problems
    assert [(Path(p.file).name, p.what) for p in problems] == [
        ("part-00001.ids", "sha256 mismatch")
    ]
    (store / INPUTS_NAME).write_text("{}")
    names = {Path(p.file).name for p in check_store(store).problems}
    assert names == {"part-00001.ids", INPUTS_NAME}


def _without_provenance(store: Path, out: Path) -> Path:
    """A copy of ``store`` as a store made before provenance: its manifest has no block and
    the files are absent."""
    out.mkdir()
    for name, data in tree_bytes(store).items():
        if not name.endswith((".rec.npy", ".ids")) and name != INPUTS_NAME:
            (out / name).write_bytes(data)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["provenance"]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


def test_a_store_without_provenance_still_reads_plans_and_trains(made, tmp_path):
    """A store made before provenance: its manifest has no block and the files are absent."""
    root, _, _ = made
    store = _without_provenance(root / "store", tmp_path / "old")
    src = tokentape.open_source(store)
    assert src.provenance(0) is None and src.inputs() is None
    assert check_store(store).problems == ()
    plan = tokentape.Plan.build({"old": {"path": str(store), "weight": 1}}, seq_len=8, seed=1,
                                total_samples=64)  # fmt: skip
    loader = tokentape.Loader(plan, 0, tokentape.BatchConfig(1, 4), prefetch=0)
    step = loader.step()
    (batch,) = step.micro_batches
    want = [src.window(int(k), 8).tolist() for k in batch.sample]
    assert batch.tokens.tolist() == want
    loader.close()


def test_info_shows_the_inputs_table_or_says_there_is_none(made, tmp_path, capsys):
    root, _, _ = made
    assert main(["info", str(root / "store")]) == 0
    shown = capsys.readouterr().out
    for row in tokentape.open_source(root / "store").inputs():
        line = next(x for x in shown.splitlines() if x.strip().startswith(row["path"]))
        numbers = [int(w.replace(",", "")) for w in line.split()[-3:]]
        assert numbers == [row["docs_in"], row["docs_kept"], row["docs_dropped"]]
    tokentape.tokenize(root / "in" / "e.txt", tmp_path / "s")
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    del manifest["provenance"]
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    assert main(["info", str(tmp_path / "s")]) == 0
    assert "provenance: not recorded" in capsys.readouterr().out


def test_replay_names_each_documents_origin_and_id(made, tmp_path, capsys):
    root, _, _ = made
    plan = tokentape.Plan.build({"web": {"path": str(root / "store"), "weight": 1}}, seq_len=64,
                                seed=3, total_samples=128)  # fmt: skip
    plan.save(tmp_path / "PLAN.json")
    args = ["replay", str(tmp_path / "PLAN.json"), "--step", "2", "--global-batch", "8"]
    assert main([*args, "--json", "--top", "100"]) == 0
    shown = json.loads(capsys.readouterr().out)
    src = tokentape.open_source(root / "store")
    assert shown["top"]
    for hit in shown["top"]:
        assert hit["origin"] == src.provenance(hit["doc"]).to_json()
    assert main([*args, "--top", "100"]) == 0
    text = capsys.readouterr().out
    for hit in shown["top"]:
        origin = src.provenance(hit["doc"])
        row = next(line for line in text.splitlines() if f" {origin.where} " in line)
        assert (origin.id or "-") in row.split()


def test_info_json_gives_the_manifest_and_the_inputs_table(made, tmp_path, capsys):
    """``info STORE --json``: every field of ``manifest.json`` as it is, and ``inputs_table``
    (what each input gave, counted here from the inputs as written); null without provenance."""
    root, expected, _ = made
    assert main(["info", str(root / "store"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    manifest = json.loads((root / "store" / "manifest.json").read_text())
    assert list(shown) == [*manifest, "inputs_table"]
    assert {k: shown[k] for k in manifest} == manifest
    table = shown["inputs_table"]
    assert table == tokentape.open_source(root / "store").inputs()
    assert [Path(row["path"]).name for row in table] == [
        "a.jsonl", "b.jsonl.zst", "c.jsonl.gz", "d.parquet", "e.txt"
    ]  # fmt: skip
    assert [row["docs_in"] for row in table] == [300, 120, 90, 200, 1]
    assert [row["docs_kept"] for row in table] == [
        sum(1 for e in expected if e[0] == row["path"]) for row in table
    ]
    assert all(row["docs_dropped"] == row["docs_in"] - row["docs_kept"] for row in table)
    old = _without_provenance(root / "store", tmp_path / "old")
    assert main(["info", str(old), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["inputs_table"] is None and shown["n_docs"] == len(expected)


def test_replay_show_text_heads_each_window_with_its_documents_origins(made, tmp_path, capsys):
    """Each window's header names its documents' inputs, records and ids (escaped), in text
    order; the JSON gives each position's documents' origins, equal to what was written."""
    root, expected, _ = made
    plan = tokentape.Plan.build({"web": {"path": str(root / "store"), "weight": 1}}, seq_len=64,
                                seed=3, total_samples=128)  # fmt: skip
    plan.save(tmp_path / "PLAN.json")
    src = tokentape.open_source(root / "store")
    args = ["replay", str(tmp_path / "PLAN.json"), "--step", "1", "--global-batch", "16"]
    assert main([*args, "--json"]) == 0
    positions = json.loads(capsys.readouterr().out)["positions"]
    assert main([*args, "--show-text", "--text-chars", "20"]) == 0
    text = capsys.readouterr().out.splitlines()
    ids = 0
    for row in positions:
        got = [
            (o["input"], o["kind"], o["record"], o["row_group"], o["id"]) for o in row["origins"]
        ]
        assert got == [expected[d] for d in row["docs"]]
        head = next(i for i, x in enumerate(text) if x.startswith(f"  position {row['position']} "))
        lines = text[head + 1 : head + 1 + len(row["docs"])]
        for line, doc in zip(lines, row["docs"], strict=True):
            o = src.provenance(doc)
            want = o.where + ("" if o.id is None else f", id {o.id}")
            assert line == f"  doc {doc}: {want}"
            ids += o.id is not None
        assert text[head + 1 + len(row["docs"])].startswith("    ")  # then the text
    assert ids  # some documents have ids


def test_locate_names_the_documents_origin_and_id(made, tmp_path, capsys):
    root, _, _ = made
    plan = tokentape.Plan.build({"web": {"path": str(root / "store"), "weight": 1}}, seq_len=64,
                                seed=3, total_samples=128)  # fmt: skip
    plan.save(tmp_path / "PLAN.json")
    src = tokentape.open_source(root / "store")
    doc = next(d for d in range(src.n_docs) if src.provenance(d).id is not None)
    origin = src.provenance(doc)
    args = ["locate", str(tmp_path / "PLAN.json"), "web", str(doc)]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["origin"] == origin.to_json()
    assert main(args) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("from"))
    assert line.split(None, 1)[1] == f"{origin.where}, id {origin.id}"
    assert tokentape.locate(plan, "web", doc).origin == origin


# --- finding a document by the user's handle --------------------------------------------------


def test_every_kept_record_is_found_by_its_input_and_record(made):
    root, expected, _ = made
    src = tokentape.open_source(root / "store")
    for doc, (path, _, record, _, _) in enumerate(expected):
        assert src.find_record(path, record) == [doc]
    # the records no document came from: dropped by the filter, blank lines, past the end
    kept = {(e[0], e[2]) for e in expected}
    a = str(root / "in" / "a.jsonl")
    for record in range(0, 320):
        if (a, record) not in kept:
            assert src.find_record(a, record) == []
    # an input named by its index, by the end of its path, or by another spelling of it
    assert src.find_record(0, expected[0][2]) == [0]
    d_docs = [i for i, e in enumerate(expected) if e[1] == "parquet"]
    assert src.find_record("d.parquet", expected[d_docs[3]][2]) == [d_docs[3]]
    assert src.find_record(str(root / "in" / "." / "e.txt"), 0) == [len(expected) - 1]


def test_every_id_is_found_with_every_document_that_has_it(made):
    root, expected, _ = made
    src = tokentape.open_source(root / "store")
    by_id: dict[str, list[int]] = {}
    for doc, e in enumerate(expected):
        if e[4] is not None:
            by_id.setdefault(e[4], []).append(doc)
    assert len(by_id) > 100
    for value, docs in by_id.items():
        assert src.find_id(value) == docs
    assert src.find_id("no such id") == [] and src.find_id("") == []


def test_a_repeated_id_is_listed_and_an_absent_one_said(tmp_path, capsys):
    """Two inputs giving the same id: locate --id lists both and exits 2; --input --record
    finds each; an id no document has is one line."""
    root = tmp_path / "in"
    root.mkdir()
    for name in ("x.jsonl", "y.jsonl"):
        rows = [{"id": f"k{i}", "text": f"{name} document number {i} " * 3} for i in range(40)]
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokentape.tokenize(root, tmp_path / "s")
    plan = tokentape.Plan.build({"web": {"path": str(tmp_path / "s"), "weight": 1}}, seq_len=16,
                                seed=1, total_samples=200)  # fmt: skip
    plan.save(tmp_path / "PLAN.json")
    found = tokentape.find_documents(plan, id="k7")
    assert [(f.source, f.doc, Path(f.origin.input).name, f.origin.record) for f in found] == [
        ("web", 7, "x.jsonl", 8), ("web", 47, "y.jsonl", 8)
    ]  # fmt: skip
    assert main(["locate", str(tmp_path / "PLAN.json"), "--id", "k7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "names 2 documents" in err[0]
    assert "web doc 7 (" in err[0] and "web doc 47 (" in err[0]
    assert main(["locate", str(tmp_path / "PLAN.json"), "--id", "k99"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has id 'k99'" in err[0]
    args = ["locate", str(tmp_path / "PLAN.json"), "--input", "y.jsonl", "--record", "8"]
    assert main([*args, "--json", "--global-batch", "4"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["doc"], shown["origin"]["id"]) == (47, "k7")
    assert shown["rows"] == [
        {k: r[k] for k in ("position", "epoch", "sample", "step")}
        for r in summary_rows(plan, 47, 4)
    ]


def summary_rows(plan, doc, global_batch):
    """locate's rows of ``doc`` by SOURCE DOC, for comparing a lookup with."""
    found = tokentape.locate(plan, "web", doc, global_batch=global_batch)
    return [
        {"position": int(p), "epoch": int(e), "sample": int(k), "step": int(s)}
        for p, e, k, s in zip(
            found.position, found.epoch, found.sample, found.placement.step, strict=True
        )
    ]


def test_a_lookup_in_a_store_without_provenance_or_id_keys_says_so(made, tmp_path):
    root, _, _ = made
    old = tmp_path / "old"
    old.mkdir()
    for name, data in tree_bytes(root / "store").items():
        if not name.endswith(".idkeys.npy"):
            (old / name).write_bytes(data)
    manifest = json.loads((old / "manifest.json").read_text())
    block = manifest["provenance"]
    block["version"] = 1
    shards = []
    for s in block["shards"]:
        del s["keys_bytes"], s["keys_sha256"]
        shards.append(ShardProvenance(s["rec_bytes"], s["rec_sha256"], s["ids_bytes"],
                                      s["ids_sha256"]))  # fmt: skip
    block["provenance_hash"] = provenance_hash(block["inputs"]["sha256"], tuple(shards), 1)
    (old / "manifest.json").write_text(json.dumps(manifest))
    src = tokentape.open_source(old)
    assert src.find_record(0, src.provenance(0).record) == [0]
    assert check_store(old).problems == ()
    with pytest.raises(tokentape.StoreError, match="no id keys"):
        src.find_id("a-0")
    del manifest["provenance"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(tokentape.StoreError, match="records no provenance"):
        tokentape.open_source(old).find_id("a-0")
    plan = tokentape.Plan.build({"old": {"path": str(old), "weight": 1}}, seq_len=8, seed=1,
                                total_samples=64)  # fmt: skip
    with pytest.raises(tokentape.StoreError, match=r"^no source of the plan records provenance"):
        tokentape.find_documents(plan, id="a-0")
    with pytest.raises(tokentape.StoreError, match=r"^source 'old' records no provenance"):
        tokentape.locate(plan, "old", input="a.jsonl", record=3)


def _rewrite(store: Path, name: str, data: bytes) -> None:
    """Replace the provenance file ``name`` and make the manifest agree with it (a crafted
    store: its hashes all match)."""
    (store / name).write_bytes(data)
    manifest = json.loads((store / "manifest.json").read_text())
    block = manifest["provenance"]
    shard = int(name.split("-")[1].split(".")[0])
    kind = {"rec.npy": "rec", "ids": "ids", "idkeys.npy": "keys"}[name.split(".", 1)[1]]
    entry = block["shards"][shard]
    entry[f"{kind}_bytes"], entry[f"{kind}_sha256"] = len(data), hashlib.sha256(data).hexdigest()
    shards = tuple(ShardProvenance(**s) for s in block["shards"])
    block["provenance_hash"] = provenance_hash(block["inputs"]["sha256"], shards)
    (store / "manifest.json").write_text(json.dumps(manifest))


def test_verify_finds_crafted_id_keys_and_records_out_of_order(made, tmp_path):
    root, _, _ = made
    for case in ("keys", "order"):
        store = tmp_path / case
        store.mkdir()
        for name, data in tree_bytes(root / "store").items():
            (store / name).write_bytes(data)
        if case == "keys":  # a document's key pointed at another document
            keys = np.load(store / "part-00001.idkeys.npy")
            keys[1, 0] = (keys[1, 0] + 1) % max(2, keys.shape[1])
            _rewrite(store, "part-00001.idkeys.npy", npy(keys))
            expected = ("part-00001.idkeys.npy", "id keys")
        else:  # two documents' records swapped
            rec = np.load(store / "part-00001.rec.npy")
            rec["record"][[0, 1]] = rec["record"][[1, 0]]
            _rewrite(store, "part-00001.rec.npy", npy(rec))
            expected = ("part-00001.rec.npy", "records")
        problems = check_store(store).problems
        assert [(Path(p.file).name, p.what) for p in problems] == [expected]
        assert check_store(store, quick=True).problems == ()  # hashes agree: only a full check


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()

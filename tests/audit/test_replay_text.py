"""tokentape replay --show-text / --tokens: each window trained on, decoded with a marker where
each end-of-document token falls. Expectations come from the stores themselves (open_source)
and from what a real Loader gave each rank, not from the replay code."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import small_plan_json

from tokentape._src.audit.replay import EOD_MARK, eod_offsets, replay, window_text
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.program import main
from tokentape._src.store.reader import Source
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import Loader, hash_dtype
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.schedule import Schedule

CONFIG = BatchConfig(2, 2, 2)  # dp 2 x micro 2 x accum 2: B = 8
STEPS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """3 logged steps; what each (rank, micro-step, row) was given: position and tokens."""
    root = tmp_path_factory.mktemp("replay_text")
    plan_path = small_plan_json(root)
    plan = load_plan(plan_path)
    log = root / "steps.jsonl"
    loaders = [Loader(plan, r, CONFIG, step_log=log if r == 0 else None) for r in range(2)]
    given: list[dict[tuple[int, int, int], tuple[int, np.ndarray]]] = []
    for _ in range(STEPS):
        per = {}
        for rank, lo in enumerate(loaders):
            for m, micro in enumerate(lo.step().micro_batches):
                for row, p in enumerate(micro.positions):
                    per[(rank, m, row)] = (int(p), micro.tokens[row].astype(np.int64).copy())
        given.append(per)
        for lo in loaders:
            lo.commit()
    for lo in loaders:
        lo.close()
    stores = {s.name: Source(s.path) for s in plan.sources}
    return plan_path, plan, log, given, stores


def expected_window(stores, plan, source: str, sample: int) -> tuple[np.ndarray, str, list[int]]:
    """The window straight from the store, its text decoded between end-of-document ids (found
    by value), and where those fall."""
    store = stores[source]
    lo = sample * plan.seq_len
    tokens = store.tokens(lo, lo + plan.seq_len + 1).astype(np.int64)
    eods = np.flatnonzero(tokens == store.eod_id).tolist()
    pieces, start = [], 0
    for at in eods:
        pieces.append(store.decode(tokens[start:at]))
        start = at + 1
    text = EOD_MARK.join([*pieces, store.decode(tokens[start:])])
    return tokens, text, eods


def replay_json(plan_path, log, step: int, *extra: str, capsys) -> dict:
    args = ["replay", str(plan_path), "--step", str(step), "--log", str(log), "--json", *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_json_tokens_and_text_are_the_windows_each_rank_was_given(run, capsys):
    plan_path, plan, log, given, stores = run
    markers = 0
    for step in range(STEPS):
        out = replay_json(
            plan_path, log, step, "--tokens", "--show-text", "--text-chars", "0", capsys=capsys
        )
        assert len(out["positions"]) == CONFIG.global_batch
        for row in out["positions"]:
            position, tokens = given[step][(row["dp_rank"], row["micro_step"], row["row"])]
            assert row["position"] == position
            assert row["tokens"] == tokens.tolist()  # what the loader gave that rank
            want_tokens, want_text, want_eods = expected_window(
                stores, plan, row["source"], row["sample"]
            )
            assert row["tokens"] == want_tokens.tolist()
            assert row["eod_at"] == want_eods
            assert row["text"] == want_text and row["text_truncated"] is False
            assert row["text"].count(EOD_MARK) == len(want_eods)
            markers += len(want_eods)
    assert markers > 0  # some windows cross a document boundary (else this proves little)


def test_without_flags_the_json_has_no_tokens_or_text(run, capsys):
    plan_path, _plan, log, _given, _stores = run
    out = replay_json(plan_path, log, 1, capsys=capsys)
    assert all("tokens" not in r and "text" not in r for r in out["positions"])
    assert (
        main(["replay", str(plan_path), "--step", "1", "--log", str(log), "--json", "--tokens"])
        == 0
    )
    raw = capsys.readouterr().out
    out = json.loads(raw)
    assert all("tokens" in r and "eod_at" in r and "text" not in r for r in out["positions"])
    lists = [line for line in raw.splitlines() if '"tokens": [' in line]
    assert len(lists) == len(out["positions"])  # each window's ids on one line
    assert all(line.rstrip(",").endswith("]") for line in lists)


def test_the_text_is_capped_per_window_and_the_cap_is_a_prefix(run, capsys):
    plan_path, plan, log, _given, stores = run
    out = replay_json(plan_path, log, 2, "--show-text", "--text-chars", "10", capsys=capsys)
    for row in out["positions"]:
        full = expected_window(stores, plan, row["source"], row["sample"])[1]
        assert len(full) > 10
        assert row["text"] == full[:10] and row["text_truncated"] is True


def test_rank_micro_step_and_row_choose_the_windows(run, capsys):
    plan_path, plan, log, given, stores = run
    base = ["replay", str(plan_path), "--step", "1", "--log", str(log)]
    out = replay_json(plan_path, log, 1, "--rank", "1", "--micro-step", "1", capsys=capsys)
    want = sorted(p for (rank, m, _row), (p, _t) in given[1].items() if (rank, m) == (1, 1))
    assert [r["position"] for r in out["positions"]] == want
    out = replay_json(plan_path, log, 1, "--row", "0", capsys=capsys)
    want = sorted(p for (_rank, _m, row), (p, _t) in given[1].items() if row == 0)
    assert [r["position"] for r in out["positions"]] == want
    # the text view shows those windows only, each with its text
    assert main([*base, "--rank", "0", "--micro-step", "0", "--row", "1", "--show-text"]) == 0
    text = capsys.readouterr().out
    (position, tokens) = given[1][(0, 0, 1)]
    others = [p for key, (p, _t) in given[1].items() if key != (0, 0, 1)]
    assert f"position {position} · rank 0 micro-step 0 row 1" in text
    assert not any(f"position {p} ·" in text for p in others)
    chosen = ("--rank", "0", "--micro-step", "0", "--row", "1", "--show-text")
    out = replay_json(plan_path, log, 1, *chosen, "--text-chars", "40", capsys=capsys)
    (window,) = out["positions"]
    assert window["tokens_hash"] and window["position"] == position
    assert np.array_equal(
        tokens, expected_window(stores, plan, window["source"], window["sample"])[0]
    )
    full = expected_window(stores, plan, window["source"], window["sample"])[1]
    assert window["text"] == full[:40]
    assert "    " + full[:40].split("\n")[0] in text


def test_every_window_of_the_tape_marks_its_end_of_document_tokens(run):
    """Every sample of the horizon: offsets from the store's document starts equal the places
    the EOD id sits (a document ending on a window's first or last token included)."""
    _plan_path, plan, _log, _given, stores = run
    batcher = Batcher(plan, hash_dtype(plan))
    r = replay(plan, 0, Schedule.uniform(BatchConfig(1, plan.horizon_samples, 1)), batcher)
    edges = {"first": 0, "last": 0}
    for i in range(plan.horizon_samples):
        name = plan.sources[int(r.batch.source[i])].name
        _tokens, text, eods = expected_window(stores, plan, name, int(r.batch.sample[i]))
        assert eod_offsets(r, batcher, i) == eods
        edges["first"] += 0 in eods
        edges["last"] += plan.seq_len in eods
        if i % 97 == 0:
            assert window_text(r, batcher, i, 0).text == text
    assert edges["first"] and edges["last"]  # both edge cases occur in these stores


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--row", "2"], "--row 2: step 1 had rows per micro-batch 0..1"),
        (["--micro-step", "-1"], "--micro-step -1: step 1 had micro-steps 0..1"),
        (["--tokens"], "--tokens goes with --json"),
        (["--show-text", "--text-chars", "-3"], "--text-chars must be >= 0"),
    ],
)
def test_bad_input_is_one_line_exit_2(run, capsys, extra, message):
    plan_path, _plan, log, _given, _stores = run
    assert main(["replay", str(plan_path), "--step", "1", "--log", str(log), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_choosing_a_micro_step_needs_the_ranks(run, capsys):
    plan_path, _plan, _log, _given, _stores = run
    args = ["replay", str(plan_path), "--step", "1", "--global-batch", "8", "--micro-step", "0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--micro-step needs the ranks" in err and err.count("\n") == 1


def expected_docs(stores, plan, source: str, sample: int) -> list[int]:
    """The documents a window overlaps, counted from the tokens: document i is the one after i
    end-of-document ids (one per document), so the window's first is the count before its first
    token and its last the count before its last token."""
    store = stores[source]
    lo = sample * plan.seq_len
    before = int(np.count_nonzero(store.tokens(0, lo) == store.eod_id))
    window = store.tokens(lo, lo + plan.seq_len + 1)
    inside = int(np.count_nonzero(window[:-1] == store.eod_id))
    return list(range(before, before + inside + 1))


def origin_line(origin) -> str:
    """How a window's header names a document's origin (what locate's ``from`` line says)."""
    return f"  doc {origin.doc}: {origin.where}" + (f", id {origin.id}" if origin.id else "")


def window_blocks(text: str) -> dict[int, list[str]]:
    """Per position, the header lines of its window that follow the ``position ...`` line (at
    the header's indent; the text is indented further)."""
    blocks: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("  position "):
            current = blocks.setdefault(int(line.split()[1].replace(",", "")), [])
        elif current is not None and line.startswith("  ") and not line.startswith("    "):
            current.append(line)
        elif not line.startswith("  "):
            current = None
    return blocks


def test_each_window_names_where_each_of_its_documents_came_from(run, capsys):
    """The text view's header and the JSON's ``origins``, per window, against the documents
    counted from the tokens and each one's ``Source.provenance`` (whose line in the input file
    is also checked: nothing is filtered, so document i is line i + 1 of its source's file)."""
    plan_path, plan, log, _given, stores = run
    several = 0
    for step in range(STEPS):
        out = replay_json(plan_path, log, step, "--show-text", capsys=capsys)
        args = ["replay", str(plan_path), "--step", str(step), "--log", str(log), "--show-text"]
        assert main(args) == 0
        blocks = window_blocks(capsys.readouterr().out)
        assert len(blocks) == len(out["positions"]) == CONFIG.global_batch
        for row in out["positions"]:
            docs = expected_docs(stores, plan, row["source"], row["sample"])
            origins = [stores[row["source"]].provenance(d) for d in docs]
            for doc, origin in zip(docs, origins, strict=True):
                assert origin.input.endswith(f"{row['source']}.jsonl")
                assert (origin.doc, origin.record, origin.id) == (doc, doc + 1, None)
            assert row["docs"] == docs
            assert row["origins"] == [o.to_json() for o in origins]
            assert blocks[row["position"]] == [origin_line(o) for o in origins]
            several += len(docs) > 1
    assert several  # some windows hold more than one document (else the order proves little)


def test_a_store_without_provenance_says_so_in_text_and_json(run, tmp_path, capsys):
    """Copies of the stores with the provenance block taken out of their manifests (as a store
    made before provenance was recorded): the JSON's origins are null, and each window's header
    says in one line that where its documents came from is not recorded, as locate says it."""
    _plan_path, plan, _log, _given, stores = run
    sources = {}
    for s in plan.sources:
        copy = tmp_path / s.name
        copy.mkdir()
        for f in stores[s.name].directory.iterdir():
            if f.is_file() and not f.name.endswith((".rec.npy", ".ids", "inputs.json")):
                (copy / f.name).write_bytes(f.read_bytes())
        manifest = json.loads((copy / "manifest.json").read_text())
        del manifest["provenance"]
        (copy / "manifest.json").write_text(json.dumps(manifest))
        sources[s.name] = {"path": str(copy), "weight": s.weight, "max_repeats": s.max_repeats}
    old = Plan.build(sources, seq_len=plan.seq_len, seed=plan.seed,
                     total_samples=plan.horizon_samples)  # fmt: skip
    assert old.index_hash == plan.index_hash  # provenance is not part of the tokens' identity
    old.save(tmp_path / "old.json")
    args = ["replay", str(tmp_path / "old.json"), "--step", "1", "--global-batch", "8"]
    assert main([*args, "--json", "--top", "100"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(r["origins"] == [None] * len(r["docs"]) for r in out["positions"])
    assert all(hit["origin"] is None for hit in out["top"])
    assert main([*args, "--show-text"]) == 0
    blocks = window_blocks(capsys.readouterr().out)
    for row in out["positions"]:
        first, last = row["docs"][0], row["docs"][-1]
        docs = f"doc {first}" if first == last else f"docs {first}..{last}"
        want = f"  {docs}: not recorded (a store made before provenance was recorded)"
        assert blocks[row["position"]] == [want]
    found = main(["locate", str(tmp_path / "old.json"), out["positions"][0]["source"], "0"])
    assert found == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("from"))
    assert line.split(None, 1)[1] == want.split(": ", 1)[1]  # locate's own wording

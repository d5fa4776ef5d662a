"""tokentape replay: the rebuilt step equals what the loader gave the ranks, its documents equal
a brute-force docs_in count, and bad input is refused in one line."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import pytest
from helpers import small_plan_json

from tokentape._src.audit.replay import replay, top_documents
from tokentape._src.audit.runs import log_schedule
from tokentape._src.plan.load import load_plan
from tokentape._src.program import main
from tokentape._src.store.reader import Source
from tokentape._src.train import steplog
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import Loader, hash_dtype
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.schedule import Schedule
from tokentape.errors import TokentapeError

SHAPES = [BatchConfig(2, 2, 2), BatchConfig(3, 1, 2), BatchConfig(1, 5, 1)]  # B = 8, 6, 5


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run of 9 steps, 3 per shape, logged; what each rank was given, per step."""
    root = tmp_path_factory.mktemp("replay")
    plan_path = small_plan_json(root)
    plan = load_plan(plan_path)
    log = root / "steps.jsonl"
    given: list[dict[int, list[tuple[int, np.ndarray]]]] = []  # step → rank → (pos, tokens)
    state = None
    for config in SHAPES:
        loaders = [
            Loader(plan, r, config, step_log=log if r == 0 else None) for r in range(config.dp_size)
        ]
        for lo in loaders:
            if state is not None:
                lo.load_state_dict(state)
        for _ in range(3):
            per_rank = {}
            for r, lo in enumerate(loaders):
                step = lo.step()
                per_rank[r] = [
                    (int(p), m.tokens[i].copy())
                    for m in step.micro_batches
                    for i, p in enumerate(m.positions)
                ]
            given.append(per_rank)
            for lo in loaders:
                lo.commit()
        state = loaders[0].state_dict()
        for lo in loaders:
            lo.close()
    return plan_path, plan, log, given


def test_replay_equals_what_the_loader_gave_each_rank(run):
    _plan_path, plan, log, given = run
    schedule = log_schedule(str(log), plan)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    for step, per_rank in enumerate(given):
        r = replay(plan, step, schedule)
        assert r.tokens_hash == records[step]["tokens_hash"]
        for rank, items in per_rank.items():
            for position, tokens in items:
                i = position - r.consumed
                assert r.batch.positions[i] == position
                assert r.placement.dp_rank[i] == rank
                assert np.array_equal(r.batch.tokens[i].astype(np.int64), tokens)
        assert sum(len(v) for v in per_rank.values()) == r.global_batch


def test_without_a_shape_change_the_global_batch_is_enough(run):
    _plan_path, plan, log, _given = run
    from_log = log_schedule(str(log), plan)
    uniform = Schedule.uniform(BatchConfig(1, SHAPES[0].global_batch, 1))
    for step in range(3):  # the first shape's steps
        assert replay(plan, step, uniform).tokens_hash == replay(plan, step, from_log).tokens_hash
    # After the change, B alone gives other positions: the log is needed.
    assert replay(plan, 4, uniform).consumed != replay(plan, 4, from_log).consumed


def test_top_documents_equal_a_brute_force_count(run):
    _plan_path, plan, log, given = run
    schedule = log_schedule(str(log), plan)
    batcher = Batcher(plan, hash_dtype(plan))
    stores = [Source(s.path) for s in plan.sources]
    tape = plan.tape()
    for step in range(len(given)):
        r = replay(plan, step, schedule, batcher)
        for rank in [None, *range(r.config.dp_size)]:
            expected: Counter = Counter()
            consumed, config = schedule.start(step)
            positions = range(consumed, consumed + config.global_batch)
            if rank is not None:
                per = config.micro * config.accum
                positions = range(consumed + rank * per, consumed + (rank + 1) * per)
            res = tape.resolve(np.array(list(positions)))
            for d, k in zip(res.source.tolist(), res.sample.tolist(), strict=True):
                for doc in stores[d].docs_in(k, plan.seq_len):
                    expected[(d, doc)] += 1
            hits = top_documents(r, batcher, rank)
            assert {(h.source, h.doc): h.windows for h in hits} == dict(expected)
            assert [h.windows for h in hits] == sorted((h.windows for h in hits), reverse=True)
            for h in hits:
                lo, hi = stores[h.source].doc_span(h.doc)
                assert h.tokens == hi - lo


def test_cli_json_lists_every_position_with_its_documents_and_hash(run, capsys):
    plan_path, plan, log, given = run
    step = 4  # a step of the second shape: dp 3
    assert main(["replay", str(plan_path), "--step", str(step), "--log", str(log), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["log_tokens_hash_matches"] is True
    assert (out["dp"], out["micro"], out["accum"], out["global_batch"]) == (3, 1, 2, 6)
    stores = {s.name: Source(s.path) for s in plan.sources}
    got = {}
    for p in out["positions"]:
        window = stores[p["source"]].window(p["sample"], plan.seq_len)
        assert p["docs"] == stores[p["source"]].docs_in(p["sample"], plan.seq_len)
        assert p["tokens_hash"] == hashlib.sha256(window.astype("<u2").tobytes()).hexdigest()
        got[p["position"]] = (p["dp_rank"], window)
    for rank, items in given[step].items():
        for position, tokens in items:
            assert got[position][0] == rank and np.array_equal(got[position][1], tokens)
    assert len(got) == 6


def test_cli_rank_restricts_the_table(run, capsys):
    plan_path, _plan, _log, given = run
    args = ["replay", str(plan_path), "--step", "1", "--dp", "2", "--micro", "2", "--accum", "2"]
    assert main([*args, "--rank", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["position"] for p in out["positions"]] == [p for p, _ in given[1][1]]
    assert sum(t["windows"] for t in out["top"]) >= len(out["positions"])
    assert main([*args, "--rank", "1", "--top", "2", "--preview-chars", "10"]) == 0
    text = capsys.readouterr().out
    assert "rank               1: positions 12..15" in text
    assert "doc tokens" in text and "more documents" in text


def test_a_tampered_log_is_a_mismatch(run, tmp_path, capsys):
    plan_path, _plan, log, _given = run
    lines = log.read_text().splitlines()
    record = json.loads(lines[2])
    record["tokens_hash"] = "0" * 64
    lines[2] = json.dumps(record)
    bad = tmp_path / "steps.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    assert main(["replay", str(plan_path), "--step", "2", "--log", str(bad)]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    assert main(["replay", str(plan_path), "--step", "1", "--log", str(bad)]) == 0


def _other_plan_log(run, tmp_path):
    _plan_path, _plan, log, _given = run
    records = [json.loads(x) for x in log.read_text().splitlines()]
    for r in records:
        r["index_hash"] = "sha256:" + "1" * 64
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in records))
    return other


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--step", "3"], "give --log"),
        (["--step", "9", "--log", "LOG"], "beyond the step log"),
        (["--step", "-1", "--global-batch", "8"], "--step must be >= 0"),
        (["--step", "1", "--global-batch", "8", "--rank", "0"], "--rank needs the ranks"),
        (["--step", "1", "--log", "LOG", "--rank", "2"], "dp ranks 0..1"),
        (["--step", "1", "--log", "MISSING"], "cannot read the step log"),
        (["--step", "1", "--log", "OTHER"], "belongs to another plan"),
        (["--step", "1", "--log", "LOG", "--global-batch", "8"], "give one of"),
        (["--step", "1", "--global-batch", "0"], "--global-batch must be a positive"),
        (["--step", "1", "--global-batch", "8", "--top", "-1"], "--top must be >= 0"),
        (["--step", str(10**18), "--global-batch", "1024"], "beyond position 2**62"),
        (["--step", str(2**62 // 8), "--dp", "2", "--micro", "4"], "beyond position 2**62"),
        (["--step", "0", "--global-batch", str(10**11)], "of memory, more than this machine's"),
        (["--step", "0", "--dp", str(10**6), "--micro", str(10**6)], "of memory"),
        (["--step", "zero", "--global-batch", "8"], "replay: argument --step: invalid int value"),
    ],
)
def test_bad_input_is_one_line_exit_2(run, tmp_path, capsys, extra, message):
    plan_path, _plan, log, _given = run
    other = _other_plan_log(run, tmp_path)
    subst = {"LOG": str(log), "MISSING": str(tmp_path / "nope.jsonl"), "OTHER": str(other)}
    args = ["replay", str(plan_path), *(subst.get(a, a) for a in extra)]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err, captured.err


def test_a_missing_plan_is_one_line(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.json"), "--step", "0", "--global-batch", "4"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_document_starting_on_a_windows_last_token_is_listed(run):
    """Window k is tokens [kL, kL + L]: a document starting at kL + L shares its last token."""
    _plan_path, plan, _log, _given = run
    tape = plan.tape()
    checked = 0
    for d, spec in enumerate(plan.sources):
        store = Source(spec.path)
        starts = store.doc_starts
        aligned = starts[(starts % plan.seq_len == 0) & (starts >= plan.seq_len)]
        for start in aligned.tolist():
            k = start // plan.seq_len - 1
            if k >= spec.n_samples:
                continue
            doc = int(np.searchsorted(starts, start))
            position = int(tape.position_of(d, np.array([k]), np.array([0]))[0])
            schedule = Schedule.uniform(BatchConfig(1, 4, 1))
            r = replay(plan, position // 4, schedule)
            i = position % 4
            assert (int(r.batch.source[i]), int(r.batch.sample[i])) == (d, k)
            assert r.doc_last[i] == doc and doc in store.docs_in(k, plan.seq_len)
            checked += 1
    assert checked > 0  # the stores have such documents (else this test proves nothing)


def test_a_step_past_position_2_62_is_refused(run):
    _plan_path, plan, _log, _given = run
    last = 2**62 // 1024 - 1  # the last step whose positions all lie below 2**62
    schedule = Schedule.uniform(BatchConfig(1, 1024, 1))
    assert schedule.start(last)[0] + 1024 == 2**62
    with pytest.raises(TokentapeError, match=f"step {last + 1}: the step ends beyond"):
        replay(plan, last + 1, schedule)


def _log_lines(run) -> list[str]:
    return run[2].read_text().splitlines(keepends=True)


def test_the_effective_line_of_a_redone_step_is_checked(run, tmp_path, capsys):
    """Steps 7 and 8 were logged with other hashes, the run crashed and redid them: the later
    lines are what was applied, and their hashes are checked."""
    plan_path = run[0]
    lines = _log_lines(run)
    fake = [
        json.dumps(json.loads(x) | {"tokens_hash": "0" * 64}, sort_keys=True) + "\n"
        for x in lines[7:9]
    ]
    redone = tmp_path / "redone.jsonl"
    redone.write_text("".join(lines[:7] + fake + lines[7:]))
    for step in (6, 7, 8):
        assert main(["replay", str(plan_path), "--step", str(step), "--log", str(redone)]) == 0
    assert "tokens hash matches" in capsys.readouterr().out
    stale = tmp_path / "stale.jsonl"  # the other way round: the fake lines are the later ones
    stale.write_text("".join(lines + fake))
    assert main(["replay", str(plan_path), "--step", "8", "--log", str(stale)]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_a_torn_last_line_is_ignored(run, tmp_path, capsys):
    plan_path = run[0]
    lines = _log_lines(run)
    torn = tmp_path / "torn.jsonl"
    torn.write_text("".join(lines) + lines[3][:60])  # a writer died mid-line
    assert main(["replay", str(plan_path), "--step", "8", "--log", str(torn)]) == 0
    assert main(["replay", str(plan_path), "--step", "9", "--log", str(torn)]) == 2
    assert "which ends at step 8" in capsys.readouterr().err


def test_the_log_is_parsed_once(run, monkeypatch, capsys):
    plan_path, _plan, log, _given = run
    loads, parsed = steplog.loads_line, []

    def counting(s):
        if "tokens_hash" in s:
            parsed.append(s)
        return loads(s)

    monkeypatch.setattr(steplog, "loads_line", counting)  # the step log's line parser
    assert main(["replay", str(plan_path), "--step", "4", "--log", str(log)]) == 0
    assert len(parsed) == len(_log_lines(run))

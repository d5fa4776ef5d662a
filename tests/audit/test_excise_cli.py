"""`tokentape excise` as a user runs it: a run spikes, its documents are named by id and left
out from a checkpoint on, the run resumes on the new plan, and replay, locate and info follow
it. What must hold is checked against the stores and the old plan directly (which documents
each trained window holds), never against the excision's own record."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tokentape
from tokentape._src.program import main
from tokentape._src.store.reader import Source

SEQ_LEN = 16
MICRO = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A store whose records carry ids, a plan over it, and a run of 12 steps (dp 1, micro 4)
    with its step log; a checkpoint after step 5."""
    root = tmp_path_factory.mktemp("excise")
    rows = [{"id": f"rec-{i}", "text": f"record {i} says " + "word " * (3 + i % 11)}
            for i in range(300)]  # fmt: skip
    (root / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokentape.tokenize(root / "in.jsonl", root / "store")
    plan = tokentape.Plan.build({"web": {"path": str(root / "store"), "weight": 1,
                                         "max_repeats": 100}},
                                seq_len=SEQ_LEN, seed=5, total_samples=400)  # fmt: skip
    plan.save(root / "PLAN.json")
    config = tokentape.BatchConfig(1, MICRO)
    with tokentape.Loader(plan, 0, config, step_log=root / "steps.jsonl") as loader:
        for step in range(12):
            loader.step()
            loader.commit()
            if step == 5:
                checkpoint = loader.state_dict()
    return root, plan, checkpoint


def _docs_of(store: Source, plan, positions) -> list[set[int]]:
    r = plan.tape().resolve(np.asarray(positions, dtype=np.int64))
    return [set(store.docs_in(int(k), SEQ_LEN)) for k in r.sample]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tokentape: error: "), err
    return err[0]


def test_excise_by_id_then_resume_replay_and_locate(run, capsys):
    root, plan, checkpoint = run
    store = Source(root / "store")
    c = checkpoint["consumed"]
    # the documents step 9 trained on, named by their ids as replay shows them
    assert main(["replay", str(root / "PLAN.json"), "--step", "9", "--log",
                 str(root / "steps.jsonl"), "--json", "--top", "1"]) == 0  # fmt: skip
    top = json.loads(capsys.readouterr().out)["top"][0]
    victim_id, victim = top["origin"]["id"], top["doc"]
    assert store.find_id(victim_id) == [victim]
    out = root / "NEW.json"
    assert main(["excise", str(root / "PLAN.json"), "--from-consumed", str(c), "--id", victim_id,
                 "--out", str(out), "--json"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    new = tokentape.load_plan(out)
    assert summary["index_hash"] == new.index_hash != plan.index_hash
    assert summary["excision"]["docs"] == [["web", victim]]
    # the checkpoint resumes on it; every step after trains no window holding the document
    state = tokentape.DataState.from_dict(checkpoint).resume_on(new)
    assert state.plan_changes[-1].consumed == c
    with tokentape.Loader(new, 0, tokentape.BatchConfig(1, MICRO)) as loader:
        loader.load_state_dict(checkpoint)
        for _ in range(20):
            step = loader.step()
            (batch,) = step.micro_batches
            assert all(victim not in docs for docs in _docs_of(store, new, batch.positions))
            loader.commit()
    # below C, the same samples as the old plan
    below = np.arange(c)
    assert np.array_equal(new.tape().resolve(below).sample, plan.tape().resolve(below).sample)
    # locate says it is excised, and lists only positions before C
    assert main(["locate", str(out), "--id", victim_id, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["excised_from"] == c and all(r["position"] < c for r in found["rows"])
    old = json.loads((main(["locate", str(root / "PLAN.json"), "web", str(victim), "--json"]),
                      capsys.readouterr().out)[1])  # fmt: skip
    assert [r for r in old["rows"] if r["position"] < c] == found["rows"]
    assert any(r["position"] >= c for r in old["rows"])  # it was going to be trained again
    # info shows what was left out
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "excisions" in text and f"web {victim}" in text


def test_excise_the_steps_of_a_spike(run, capsys):
    """--steps A..B --log: exactly the samples those steps drew are left out, in order."""
    root, plan, checkpoint = run
    c = checkpoint["consumed"]
    out = root / "STEPS.json"
    assert main(["excise", str(root / "PLAN.json"), "--from-consumed", str(c), "--steps",
                 "7..8", "--log", str(root / "steps.jsonl"), "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    new = tokentape.load_plan(out)
    gone = set(range(7 * MICRO, 9 * MICRO))  # steps 7 and 8 of a constant batch of MICRO
    kept = [p for p in range(c, 100) if p not in gone]
    old_r, new_r = plan.tape().resolve(np.array(kept)), new.tape().resolve(np.arange(c, c + 60))
    assert np.array_equal(new_r.sample, old_r.sample[:60])
    assert new.excisions[-1].steps == (7, 8) and new.excisions[-1].count == len(gone)


def test_bad_input_is_one_line_and_writes_nothing(run, capsys, tmp_path):
    root, _, checkpoint = run
    plan = str(root / "PLAN.json")
    out = tmp_path / "X.json"
    cases = [
        (["--from-consumed", "0", "--out", str(out)], "nothing named"),
        (["--from-consumed", "0", "--id", "no-such-id", "--out", str(out)], "no-such-id"),
        (["--from-consumed", "0", "--doc", "web", "--out", str(out)], "SOURCE:N"),
        (["--from-consumed", "0", "--doc", "web:\u00b2", "--out", str(out)], "SOURCE:N"),
        (["--from-consumed", "0", "--doc", "math:1", "--out", str(out)], "unknown source"),
        (["--from-consumed", "0", "--doc", "web:99999", "--out", str(out)], "99999"),
        (["--from-consumed", "0", "--steps", "3..1", "--log", str(root / "steps.jsonl"),
          "--out", str(out)], "A <= B"),
        (["--from-consumed", "40", "--steps", "2..3", "--log", str(root / "steps.jsonl"),
          "--out", str(out)], "before from_consumed"),
        (["--from-consumed", "0", "--steps", "2..3", "--out", str(out)], "go together"),
        (["--from-consumed", "0", "--ids-file", str(tmp_path / "missing"), "--out", str(out)],
         "--ids-file"),
    ]  # fmt: skip
    for args, words in cases:
        assert main(["excise", plan, *args]) == 2, args
        assert words in _one_line(capsys), args
        assert not out.exists()
    # from Python: from_consumed checked before the steps' start is compared with it
    with pytest.raises(tokentape.ArgumentError, match="from_consumed"):
        tokentape.excise(plan, "x", steps=(2, 3), step_log=root / "steps.jsonl")
    # a checkpoint later than the first excised position is refused by the new plan
    late = tmp_path / "late.json"
    ids = tmp_path / "ids.txt"
    src = Source(root / "store")
    doc = next(d for d in range(src.n_docs) if src.provenance(d).id == "rec-3")
    ids.write_text("\nrec-3\n\n")
    assert main(["excise", plan, "--from-consumed", "0", "--ids-file", str(ids), "--out",
                 str(late)]) == 0  # fmt: skip
    capsys.readouterr()
    new = tokentape.load_plan(late)
    assert new.excisions[-1].docs == (("web", doc),)
    if new.excisions[-1].first < checkpoint["consumed"]:
        with pytest.raises(tokentape.ResumeRefused, match="leaves out position"):
            tokentape.DataState.from_dict(checkpoint).resume_on(new)


def test_the_step_log_and_state_record_the_change(run, tmp_path):
    root, plan, checkpoint = run
    new = plan.excise(checkpoint["consumed"], positions=[checkpoint["consumed"] + 1])
    log = tmp_path / "steps.jsonl"
    log.write_bytes(Path(root / "steps.jsonl").read_bytes())
    with tokentape.Loader(new, 0, tokentape.BatchConfig(1, MICRO), step_log=log) as loader:
        loader.load_state_dict(checkpoint)
        loader.step()
        loader.commit()
        assert loader.state.plan_changes[-1].new_index_hash == new.index_hash
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["index_hash"] == new.index_hash

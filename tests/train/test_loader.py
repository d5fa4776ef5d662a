"""The numpy loader: commit-only advancement, prefetch, shape changes, elastic resume, step log."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import PLAN, small_shard_stores

from tokentape._src.plan.plan import resolve_plan
from tokentape._src.plan.spec import load_plan_spec, parse_plan
from tokentape._src.store.reader import Source
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import Loader, step_tokens_hash
from tokentape._src.train.partition import BatchConfig, positions_for
from tokentape._src.train.state import DataState
from tokentape._src.train.steplog import read_step_log
from tokentape.errors import ArgumentError, OutOfRangeError, TokentapeError


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    small_shard_stores(root)
    return resolve_plan(load_plan_spec(root / "mix.toml"))


def run(loaders: list[Loader], steps: int) -> list[np.ndarray]:
    """Step every rank's loader, commit them all; return the positions each step applied."""
    applied = []
    for _ in range(steps):
        got = [lo.step() for lo in loaders]
        applied.append(np.concatenate([b.positions for s in got for b in s.micro_batches]))
        for lo in loaders:
            lo.commit()
    return applied


def test_steps_equal_the_batcher_on_the_partitioned_positions(plan):
    config = BatchConfig(dp_size=3, micro=2, accum=2)
    batcher = Batcher(plan)
    for rank in range(3):
        with Loader(plan, rank, config, prefetch=2) as loader:
            for _ in range(4):
                s = loader.step()
                assert s.step == loader.state.step and len(s.micro_batches) == 2
                rows = positions_for(s.consumed, rank, config)
                for i, micro in enumerate(s.micro_batches):
                    expected = batcher.batch(rows[i])
                    assert np.array_equal(micro.positions, rows[i])
                    assert np.array_equal(micro.tokens, expected.tokens)
                loader.commit()


def test_only_commit_advances(plan):
    with Loader(plan, 0, BatchConfig(2, 3)) as loader:
        a, b = loader.step(), loader.step()
        assert a.consumed == b.consumed == 0
        assert np.array_equal(a.micro_batches[0].tokens, b.micro_batches[0].tokens)
        loader.commit()
        assert loader.step().consumed == 6 and loader.state.consumed == 6


def test_shape_changes_and_elastic_resume_cover_every_position_once(plan):
    shapes = [BatchConfig(4, 2), BatchConfig(3, 1, 2), BatchConfig(6, 1), BatchConfig(1, 4, 2)]
    applied: list[np.ndarray] = []
    state = None
    for config in shapes:  # each shape: a "restart" with another dp size, from the state dict
        loaders = [Loader(plan, r, config) for r in range(config.dp_size)]
        if state is not None:
            for lo in loaders:
                lo.load_state_dict(json.loads(json.dumps(state)))
        applied += run(loaders, 3)
        state = loaders[0].state_dict()
        for lo in loaders:
            lo.close()
    flat = np.concatenate(applied)
    assert np.array_equal(np.sort(flat), np.arange(state["consumed"]))


def test_a_shape_change_applies_from_the_next_step(plan):
    """set_config() between step() and commit(): the step handed out is committed with its
    own shape; the new shape starts at the step after it."""
    with Loader(plan, 0, BatchConfig(2, 2)) as loader:
        first = loader.step()
        loader.set_config(BatchConfig(1, 5))
        again = loader.step()  # still the step that was handed out
        assert again.config == BatchConfig(2, 2) and again.consumed == 0
        assert np.array_equal(again.micro_batches[0].tokens, first.micro_batches[0].tokens)
        loader.commit()
        assert loader.state.consumed == 4
        assert [c.config for c in loader.state.history] == [BatchConfig(2, 2)]
        s = loader.step()
        assert s.config == BatchConfig(1, 5)
        assert s.micro_batches[0].positions.tolist() == list(range(4, 9))


def test_a_shape_change_drops_prefetched_steps_of_the_old_shape(plan):
    with Loader(plan, 0, BatchConfig(2, 2), prefetch=3) as loader:
        loader.step()
        assert len(loader._ahead) == 4  # the step handed out and 3 ahead
        loader.set_config(BatchConfig(1, 5))
        assert len(loader._ahead) == 1  # only the step handed out is kept
        loader.commit()
        loader.step()
        assert {key[1] for key in loader._ahead} == {BatchConfig(1, 5)}


def test_commit_needs_a_step_handed_out(plan):
    with Loader(plan, 0, BatchConfig(1, 2)) as loader:
        with pytest.raises(TokentapeError, match="without an outstanding step"):
            loader.commit()
        loader.step()
        loader.commit()
        with pytest.raises(TokentapeError, match="without an outstanding step"):
            loader.commit()  # committed already
        assert loader.state.consumed == 2


def test_a_state_loaded_between_step_and_commit_abandons_the_step(plan):
    with Loader(plan, 0, BatchConfig(1, 2)) as loader:
        loader.step()
        loader.commit()
        saved = loader.state_dict()
        loader.step()
        loader.load_state_dict(saved)
        with pytest.raises(TokentapeError, match="without an outstanding step"):
            loader.commit()
        assert loader.step().consumed == 2


def test_a_failed_build_is_retried(plan, monkeypatch):
    with Loader(plan, 0, BatchConfig(1, 2), prefetch=0) as loader:
        real = loader.batcher.batch
        failures = [OSError("EIO: transient read error")]

        def flaky(positions, resolved=None):
            if failures:
                raise failures.pop()
            return real(positions, resolved)

        monkeypatch.setattr(loader.batcher, "batch", flaky)
        with pytest.raises(OSError, match="EIO") as info:
            loader.step()
        assert any("building step 0 (consumed 0)" in note for note in info.value.__notes__)
        step = loader.step()  # built afresh, not the cached failure
        assert step.micro_batches[0].positions.tolist() == [0, 1]


def test_a_closed_loader_refuses_steps(plan):
    loader = Loader(plan, 0, BatchConfig(1, 2))
    loader.close()
    loader.close()  # idempotent
    with pytest.raises(TokentapeError, match="closed"):
        loader.step()


def test_waits_are_recorded(plan):
    with Loader(plan, 0, BatchConfig(1, 2)) as loader:
        for _ in range(3):
            loader.step()
            loader.commit()
        assert len(loader.waits) == 3 and all(w >= 0 for w in loader.waits)


def test_a_token_dtype_too_narrow_for_the_vocabulary_is_refused(plan):
    with pytest.raises(TokentapeError, match="cannot hold ids up to 256"):
        Batcher(plan, np.int8)
    with pytest.raises(TokentapeError, match="cannot hold"):
        Batcher(plan, np.float32)
    assert Batcher(plan, np.uint16).dtype == np.uint16


def test_resume_on_another_plan_is_refused(plan):
    with Loader(plan, 0, BatchConfig(1, 2)) as loader:
        loader.step()
        loader.commit()
        saved = loader.state_dict()
    base = str(Path(plan.sources[0].path).parent.parent)
    other = resolve_plan(parse_plan(PLAN.replace("seed = 1234", "seed = 7"), "mix.toml", base))
    loader = Loader(other, 0, BatchConfig(1, 2))
    with pytest.raises(TokentapeError, match="seed: 1234 → 7"):
        loader.load_state_dict(saved)
    loader.close()


def test_step_log(plan, tmp_path):
    log = tmp_path / "steps.jsonl"
    config = BatchConfig(2, 2, 2)
    with Loader(plan, 0, config, step_log=log) as loader:
        for _ in range(3):
            loader.step()
            loader.commit()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    assert [x["consumed"] for x in lines] == [0, 8, 16]
    assert all(x["global_batch"] == 8 and x["dp"] == 2 and x["accum"] == 2 for x in lines)
    assert all(x["index_hash"] == plan.index_hash for x in lines)
    expected = step_tokens_hash(Batcher(plan).batch(np.arange(8, 16)), plan)
    assert lines[1]["tokens_hash"] == expected != lines[0]["tokens_hash"]
    # The definition, spelled out: positions as int64, then each window in the stores' width.
    assert {s.dtype for s in plan.sources} == {"uint16"}
    h = hashlib.sha256(np.arange(8, 16, dtype="<i8").tobytes())
    r = plan.tape().resolve(np.arange(8, 16))
    for d, k in zip(r.source.tolist(), r.sample.tolist(), strict=True):
        window = Source(plan.sources[d].path).window(k, plan.seq_len)
        h.update(window.astype("<u2").tobytes())
    assert lines[1]["tokens_hash"] == h.hexdigest()


def test_micro_batches_carry_their_segments(plan):
    config = BatchConfig(2, 3, 2)
    with Loader(plan, 1, config, segments=True) as loader:
        step = loader.step()
    whole = Batcher(plan, segments=True).batch(positions_for(0, 1, config).ravel())
    got = np.concatenate([m.segment_ids for m in step.micro_batches])
    assert np.array_equal(got, whole.segment_ids)
    assert np.array_equal(
        np.concatenate([m.doc_positions for m in step.micro_batches]), whole.doc_positions
    )


def test_step_log_across_a_shape_change(plan, tmp_path):
    log = tmp_path / "steps.jsonl"
    with Loader(plan, 0, BatchConfig(2, 2), step_log=log) as loader:
        for config in (BatchConfig(2, 2), BatchConfig(2, 2), BatchConfig(3, 1), BatchConfig(3, 1)):
            loader.set_config(config)
            loader.step()
            loader.commit()
    records = read_step_log(log)
    assert [(r.consumed, r.global_batch, r.dp) for r in records] == [
        (0, 4, 2),
        (4, 4, 2),
        (8, 3, 3),
        (11, 3, 3),
    ]
    assert records[2].tokens_hash == step_tokens_hash(Batcher(plan).batch(np.arange(8, 11)), plan)


def test_a_torn_step_log_tail_is_cut_before_appending(plan, tmp_path):
    log = tmp_path / "steps.jsonl"
    with Loader(plan, 0, BatchConfig(1, 2), step_log=log) as loader:
        loader.step()
        loader.commit()
        state = loader.state_dict()
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"step": 1, "consumed": 2, "glo')  # died mid-line
    with Loader(plan, 0, BatchConfig(1, 2), step_log=log) as loader:
        loader.load_state_dict(state)
        loader.step()
        loader.commit()
    assert log.read_bytes().startswith(whole)
    assert [(r.step, r.consumed) for r in read_step_log(log)] == [(0, 0), (1, 2)]


def test_a_failed_hash_job_is_redone_at_commit(plan, tmp_path, monkeypatch):
    log = tmp_path / "steps.jsonl"
    with Loader(plan, 0, BatchConfig(1, 2), prefetch=0, step_log=log) as loader:
        real = loader._step_hash
        failures = [OSError("EIO while hashing")]

        def flaky(consumed, config, batcher=None):
            if failures:
                raise failures.pop()
            return real(consumed, config, batcher)

        monkeypatch.setattr(loader, "_step_hash", flaky)
        loader.step()
        loader.commit()  # the background job failed; commit hashes the step itself
        assert not failures
    [record] = read_step_log(log)
    assert record.tokens_hash == step_tokens_hash(Batcher(plan).batch(np.arange(0, 2)), plan)


def test_a_loader_at_2_62_refuses_the_step_that_would_pass_it(plan):
    """A state whose next step reaches position 2**62 is neither served nor committed."""
    start = DataState.start(plan)
    history = [{"step": 0, "consumed": 0, "dp_size": 1, "micro": 2, "accum": 1}]
    near = DataState.from_dict(
        start.to_dict() | {"consumed": 2**62 - 4, "step": 2**61 - 2, "history": history}
    )
    with Loader(plan, 0, BatchConfig(1, 4), state=near, prefetch=1) as loader:
        step = loader.step()  # the last four positions below 2**62
        assert step.micro_batches[0].positions.tolist() == list(range(2**62 - 4, 2**62))
        loader.commit()
        assert loader.state.consumed == 2**62
        with pytest.raises(OutOfRangeError, match=r"2\*\*62"):
            loader.step()
        with pytest.raises(TokentapeError, match="without an outstanding step"):
            loader.commit()
        assert loader.state.consumed == 2**62


def test_loader_misuse_names_the_argument(plan):
    with pytest.raises(ArgumentError, match="prefetch"):
        Loader(plan, 0, BatchConfig(1, 2), prefetch=-1)
    with pytest.raises(ArgumentError, match="dp_rank"):
        Loader(plan, 3, BatchConfig(2, 2))
    with pytest.raises(ArgumentError, match="state must be a DataState"):
        Loader(plan, 0, BatchConfig(1, 2), state={"consumed": 0})

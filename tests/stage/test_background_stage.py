"""``Loader(plan, ..., cache_dir=...)`` on a bucket plan: the first steps are streamed while the
stores are staged on a thread of the loader's, begun only once the first step's reads are
under way; the
loader then reads the staged copies. The batches are the local stores' throughout.
``stage="first"`` stages before the constructor returns."""

from __future__ import annotations

import numpy as np
import pytest
from faultproxy import FaultProxy, Recorder
from helpers import PLAN, plan_of, small_shard_stores, wait_for

import tokentape

pytestmark = [pytest.mark.s3]

CONFIG = tokentape.BatchConfig(1, 4, 2)


class Seen(Recorder):
    """Every request the proxy forwards; ``count``: the GETs of a ``.bin`` (whole or ranged)."""

    def count(self) -> int:
        return sum(method == "GET" and path.endswith(".bin") for method, path, _ in self.requests())


@pytest.fixture
def bucket(tmp_path, s3, s3_server, monkeypatch):
    small_shard_stores(tmp_path)
    s3.upload_tree(tmp_path / "stores", f"{s3.url}/stores")
    seen = Seen()
    with FaultProxy(s3_server.endpoint, before=seen) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        remote = plan_of(tmp_path, PLAN.replace('path = "stores/', f'path = "{s3.url}/stores/'))
        yield remote, plan_of(tmp_path), seen


def tokens(step: tokentape.Step) -> np.ndarray:
    return np.concatenate([m.tokens for m in step.micro_batches])


def test_first_steps_stream_then_the_staged_copies_are_read(bucket, tmp_path):
    remote, local, seen = bucket
    cache = tmp_path / "cache"
    with (
        tokentape.Loader(local, 0, CONFIG, prefetch=1) as expected,
        tokentape.Loader(remote, 0, CONFIG, prefetch=1, cache_dir=cache) as loader,
    ):
        assert not loader.staged
        # Nothing is staged before the first step: the constructor stages nothing, and the
        # stage's thread is let go only by step(), once the first step's reads are under way.
        assert not cache.exists() or not any(cache.iterdir())
        assert loader._stage is not None and not loader._stage._go.is_set()
        first = loader.step()
        assert loader._stage is None or loader._stage._go.is_set()
        assert np.array_equal(tokens(first), tokens(expected.step()))
        loader.commit()
        expected.commit()
        steps = 1
        while not loader.staged:  # the stage proceeds meanwhile; steps go on being served
            assert np.array_equal(tokens(loader.step()), tokens(expected.step()))
            loader.commit()
            expected.commit()
            steps += 1
            if not loader.staged:
                wait_for(lambda: loader._stage is None or loader._stage.finished, "the stage")
        staged_at = seen.count()
        for _ in range(loader.prefetch + 6):  # past the steps scheduled before the switch
            assert np.array_equal(tokens(loader.step()), tokens(expected.step()))
            loader.commit()
            expected.commit()
        # Once staged, reading asks the bucket for nothing more.
        later = loader.step()
        assert seen.count() == staged_at
        assert np.array_equal(tokens(later), tokens(expected.step()))
        # Every step read from the bucket has been built: the loader counts each of its GETs,
        # those made after the switch by steps scheduled before it too; the stage's one GET
        # of each (small) .bin file is not the loader's.
        bins = [f for d in cache.iterdir() if d.is_dir() for f in d.glob("*.bin")]
        assert loader.fetch_stats.requests == seen.count() - len(bins) > 0


def test_stage_first_stages_in_the_constructor(bucket, tmp_path):
    remote, local, seen = bucket
    cache = tmp_path / "cache"
    with tokentape.Loader(remote, 0, CONFIG, prefetch=0, cache_dir=cache, stage="first") as ld:
        assert ld.staged
        staged = seen.count()
        assert staged > 0 and any(cache.iterdir())
        with tokentape.Loader(local, 0, CONFIG, prefetch=0) as expected:
            assert np.array_equal(tokens(ld.step()), tokens(expected.step()))
        assert seen.count() == staged  # read from the staged copies only
    with pytest.raises(tokentape.ArgumentError, match="stage must be one of background, first"):
        tokentape.Loader(remote, 0, CONFIG, cache_dir=cache, stage="later")


def test_a_failed_background_stage_is_raised_by_step_then_streaming_goes_on(bucket, tmp_path):
    remote, local, _ = bucket
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache should be")
    with (
        tokentape.Loader(remote, 0, CONFIG, prefetch=0, cache_dir=blocker) as loader,
        tokentape.Loader(local, 0, CONFIG, prefetch=0) as expected,
    ):
        assert np.array_equal(tokens(loader.step()), tokens(expected.step()))
        loader.commit()
        expected.commit()
        assert loader._stage is not None
        loader._stage.wait()
        with pytest.raises(tokentape.OutputError, match="exists and is not a directory") as excinfo:
            loader.step()
        notes = getattr(excinfo.value, "__notes__", [])
        assert any("staging in the background failed" in n for n in notes)
        assert loader.staged  # no stage any more: it streams (not staged copies)
        assert np.array_equal(tokens(loader.step()), tokens(expected.step()))

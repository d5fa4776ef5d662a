"""One GET for a large range, its body handed over as it arrives (``ObjectStore.read_into``,
what a stage fetches with): a body cut short is followed by a GET for the rest only, a
rewritten object is refused, what the receiver raises is raised. And the stage's GET size
(``range_bytes_for``). Against a real S3 server (moto on 127.0.0.1) through the fault proxy."""

from __future__ import annotations

import random
import threading

import pytest
from faultproxy import FaultProxy, Recorder
from hypothesis import given
from hypothesis import strategies as st

from tokentape._src.objects.client import object_store
from tokentape._src.stage.stage import RANGE_BYTES, RANGE_BYTES_MAX, range_bytes_for
from tokentape.errors import StoreChanged

pytestmark = pytest.mark.s3

SIZE = 300_000


def _ranges(recorder: Recorder) -> list[tuple[int, int]]:
    """The byte ranges of the GETs the proxy forwarded, in order."""
    return [(start, stop) for _, start, stop in recorder.ranged_gets()]


@pytest.fixture
def blob(s3, s3_server):
    data = random.Random(5).randbytes(SIZE)
    url = f"{s3.url}/blob.bin"
    s3.put(url, data)
    recorder = Recorder()
    with FaultProxy(s3_server.endpoint, before=recorder) as proxy:
        store = object_store(url, {"endpoint_url": proxy.endpoint})
        info = store.info(url)
        assert info is not None
        yield store, url, info.version, data, proxy, recorder


def test_one_get_streams_the_whole_range_in_pieces(blob):
    store, url, etag, data, _proxy, recorder = blob
    pieces: list[bytes] = []
    gets = store.read_into(url, 1000, SIZE - 7, pieces.append, etag, chunk_bytes=4096)
    assert b"".join(pieces) == data[1000 : SIZE - 7]
    assert gets == 1 and _ranges(recorder) == [(1000, SIZE - 7)]
    assert max(len(p) for p in pieces) <= 4096 and len(pieces) > 1


def test_a_body_cut_short_is_followed_by_a_get_for_the_rest_only(blob):
    store, url, etag, data, proxy, recorder = blob
    half = SIZE // 2
    got = bytearray()
    read_half = threading.Event()

    def sink(piece: bytes) -> None:
        got.extend(piece)
        if len(got) >= half:
            read_half.set()

    # The first answer is cut after half its body, once the client has read that half (the
    # proxy holds the connection open till then); the next one is whole.
    def cut_once() -> None:
        read_half.wait(60)
        proxy.set(truncate=0.0)

    proxy.set(truncate=1.0, ranged=True, before_cut=cut_once)
    gets = store.read_into(url, 0, SIZE, sink, etag, chunk_bytes=2048)
    assert bytes(got) == data  # nothing handed over twice, nothing missing
    assert gets == 2 and proxy.stats().faults["truncate"] == 1
    assert _ranges(recorder) == [(0, SIZE), (half, SIZE)]  # the second GET asked for the rest only


def test_a_rewritten_object_is_refused_and_a_receivers_error_raised_once(blob, s3):
    store, url, etag, data, _proxy, recorder = blob

    class Full(Exception):
        pass

    def refuse(piece: bytes) -> None:
        raise Full("disk full")

    with pytest.raises(Full):
        store.read_into(url, 0, SIZE, refuse, etag, chunk_bytes=4096)
    assert len(_ranges(recorder)) == 1  # not retried

    s3.put(url, data[::-1])
    with pytest.raises(StoreChanged, match="rewritten since it was recorded"):
        store.read_into(url, 0, SIZE, lambda piece: None, etag)


@given(st.integers(0, 2**45), st.integers(1, 1024))
def test_the_stage_get_size_keeps_connections_busy_within_bounds(total, workers):
    size = range_bytes_for(total, workers)
    assert RANGE_BYTES <= size <= RANGE_BYTES_MAX
    if RANGE_BYTES < size < RANGE_BYTES_MAX:  # about 8 GETs a connection
        assert total // size in range(8 * workers, 8 * workers + 8 * workers // 2 + 2)
    assert range_bytes_for(total * 2, workers) >= size  # more bytes: never smaller GETs

"""The object layer through a fault-injecting proxy in front of the real S3 server: every call
succeeds, with exactly the right bytes, under 503 SlowDown, dropped connections, truncated
bodies and latency; after the retry budget, one line naming the object and the last error.
The proxy itself is tested first (it forwards exactly; each fault does what it says)."""

from __future__ import annotations

import http.client
import io
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pytest
from faultproxy import FaultProxy, Faults
from objstore import ACCESS_KEY, SECRET_KEY

from tokentape._src.objects.client import object_store
from tokentape.errors import ObjectStorageError, StoreChanged

pytestmark = pytest.mark.s3

DATA = os.urandom(3 * 2**20 + 12_345)  # a few MB: several ranged reads, several buffers


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server.endpoint, seed=12) as running:
        yield running


def through(proxy, s3):
    """An ObjectStore for the test's bucket that talks to the proxy."""
    return object_store(s3.url, {"endpoint_url": proxy.endpoint})


def presigned(s3, key, method="GET"):
    """The path and query of a presigned request for the object ``key``."""
    operation = {"GET": "get_object", "HEAD": "head_object", "PUT": "put_object"}[method]
    url = s3.client.generate_presigned_url(operation, {"Bucket": s3.name, "Key": key})
    return url.removeprefix(s3.endpoint)


def raw(proxy, s3, key, method="GET", headers=None):
    """One plain (presigned) HTTP request through the proxy: (status, headers, body)."""
    host, port = proxy.endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, presigned(s3, key, method), headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


# --- the proxy itself ------------------------------------------------------------------------


def test_proxy_forwards_exactly_and_counts(s3, proxy, tmp_path):
    import s3fs

    fs = s3fs.S3FileSystem(
        endpoint_url=proxy.endpoint,
        key=ACCESS_KEY,
        secret=SECRET_KEY,
        skip_instance_cache=True,
    )
    big = os.urandom(11 * 2**20 + 7)  # three parts of 5 MiB: a multipart upload
    local = tmp_path / "big.bin"
    local.write_bytes(big)
    fs.put_file(str(local), f"{s3.name}/big.bin", chunksize=5 * 2**20)
    fs.pipe_file(f"{s3.name}/small.txt", b"hello, proxy")
    assert s3.get(f"{s3.url}/big.bin") == big and s3.get(f"{s3.url}/small.txt") == b"hello, proxy"
    assert fs.cat_file(f"{s3.name}/big.bin", start=5, end=2**20 + 3) == big[5 : 2**20 + 3]
    assert fs.info(f"{s3.name}/big.bin")["size"] == len(big)
    assert sorted(fs.ls(s3.name)) == [f"{s3.name}/big.bin", f"{s3.name}/small.txt"]
    fs.rm_file(f"{s3.name}/small.txt")
    assert s3.keys() == ["big.bin"]
    methods = [m for m, _, _, _ in proxy.stats().log]
    assert {"PUT", "POST", "GET", "HEAD", "DELETE"} <= set(methods)
    assert methods.count("PUT") >= 4  # three parts and the small object

    stats = proxy.stats()
    assert stats.requests == len(stats.log) and stats.faulted == 0
    assert all(status is not None and status < 300 for _, _, status, _ in stats.log)
    assert stats.bytes_received >= len(big) + len(b"hello, proxy")
    assert 2**20 - 2 <= stats.bytes_sent < 2**20 + 20_000  # the range and a few XML answers

    # boto3 itself (Expect: 100-continue) and a chunked request body
    proxy.reset()
    client = boto3.client(
        "s3",
        endpoint_url=proxy.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    )
    client.put_object(Bucket=s3.name, Key="boto.bin", Body=io.BytesIO(big[: 2**20]))
    assert s3.get(f"{s3.url}/boto.bin") == big[: 2**20]
    put = s3.client.generate_presigned_url("put_object", {"Bucket": s3.name, "Key": "chunked"})
    host, port = proxy.endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    pieces = [big[:1000], big[1000:70_000], big[70_000:70_001]]
    conn.request("PUT", put.removeprefix(s3.endpoint), body=iter(pieces), encode_chunked=True)
    assert conn.getresponse().status == 200
    conn.close()
    assert s3.get(f"{s3.url}/chunked") == big[:70_001]
    assert proxy.stats().bytes_received == 2**20 + 70_001

    # keep-alive: two requests on one client connection; counters follow exactly
    proxy.reset()
    host, port = proxy.endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    for _ in range(2):
        conn.request("GET", presigned(s3, "big.bin"), headers={"Range": "bytes=0-99"})
        response = conn.getresponse()
        assert response.status == 206 and response.read() == big[:100]
    conn.close()
    assert proxy.stats().requests == 2 and proxy.stats().bytes_sent == 200


def test_a_mirror_answers_ranges_from_its_file_and_refuses_another_version(s3, s3_server, tmp_path):
    """The benchmarks' range-aware server: ranged GETs of a mirrored object are read from its
    file (the same bytes moto gives), and an If-Match for another version gets a 412."""
    key = "stores/x/part-00000.bin"
    url = f"{s3.url}/{key}"
    s3.put(url, DATA)
    etag = s3.client.head_object(Bucket=s3.name, Key=key)["ETag"]  # quoted, as S3 gives it
    same, other = tmp_path / "same", tmp_path / "other"
    same.write_bytes(DATA)
    other.write_bytes(bytes(len(DATA)))  # the same size, other bytes: another version
    with FaultProxy(s3_server.endpoint, mirror={f"/{s3.name}/{key}": same}) as mirrored:
        store = through(mirrored, s3)
        assert store.read(url, 1000, 2_000_000, etag.strip('"')) == DATA[1000:2_000_000]
        assert store.read(url) == DATA
        status, headers, body = raw(mirrored, s3, key, headers={"Range": "bytes=5-9"})
        assert (status, body, headers["Content-Range"]) == (
            206,
            DATA[5:10],
            f"bytes 5-9/{len(DATA)}",
        )
        assert headers["ETag"] == etag
    with (
        FaultProxy(s3_server.endpoint, mirror={f"/{s3.name}/{key}": other}) as mirrored,
        pytest.raises(StoreChanged),
    ):
        through(mirrored, s3).read(url, 0, 10, etag.strip('"'))


def test_proxy_faults_do_what_they_say(s3, proxy):
    s3.put(f"{s3.url}/x", DATA[:1000])
    proxy.set(slowdown=1.0)
    status, _, body = raw(proxy, s3, "x")
    assert status == 503 and b"<Code>SlowDown</Code>" in body
    proxy.set(slowdown=0.0, drop=1.0)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        raw(proxy, s3, "x")
    proxy.set(drop=0.0, truncate=1.0)
    with pytest.raises(http.client.IncompleteRead) as cut:
        raw(proxy, s3, "x")
    assert len(cut.value.partial) == 500
    proxy.set(truncate=0.0, corrupt=1.0)
    status, _, body = raw(proxy, s3, "x")
    assert status == 200 and len(body) == 1000 and body != DATA[:1000]
    assert sum(a != b for a, b in zip(body, DATA[:1000], strict=True)) == 1
    proxy.set(corrupt=0.0, delay=0.2)
    started = time.monotonic()
    assert raw(proxy, s3, "x")[2] == DATA[:1000]
    assert time.monotonic() - started >= 0.2
    proxy.set(delay=0.0, slowdown=1.0, methods={"HEAD"})
    assert raw(proxy, s3, "x")[0] == 200 and raw(proxy, s3, "x", "HEAD")[0] == 503
    proxy.set(methods=None, ranged=True)
    assert raw(proxy, s3, "x")[0] == 200
    assert raw(proxy, s3, "x", headers={"Range": "bytes=0-9"})[0] == 503
    proxy.set(slowdown=0.0, ranged=False, deny=1.0, methods={"PUT"})
    assert raw(proxy, s3, "x")[0] == 200
    status, _, body = raw(proxy, s3, "x", "PUT")
    assert status == 403 and b"<Code>AccessDenied</Code>" in body
    assert s3.get(f"{s3.url}/x") == DATA[:1000]  # the PUT never reached the server
    stats = proxy.stats()
    assert stats.requests == 11
    assert stats.faults == {
        "slowdown": 3, "drop": 1, "truncate": 1, "corrupt": 1, "stall": 0, "deny": 1
    }  # fmt: skip
    assert [(method, fault) for method, _, _, fault in stats.log] == [
        ("GET", "slowdown"),
        ("GET", "drop"),
        ("GET", "truncate"),
        ("GET", "corrupt"),
        ("GET", None),
        ("GET", None),
        ("HEAD", "slowdown"),
        ("GET", None),
        ("GET", "slowdown"),
        ("GET", None),
        ("PUT", "deny"),
    ]
    with pytest.raises(ValueError, match="fraction"):
        Faults(slowdown=1.5)
    with pytest.raises(ValueError, match="at most 1"):
        proxy.set(slowdown=0.6, drop=0.6)


def test_proxy_counts_concurrent_requests_exactly(s3, proxy):
    assert proxy.endpoint.startswith("http://127.0.0.1:")  # loopback only
    s3.put(f"{s3.url}/x", DATA[:50_000])
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda _: raw(proxy, s3, "x")[2], range(40)))
    assert all(body == DATA[:50_000] for body in bodies)
    stats = proxy.stats()
    assert stats.requests == len(stats.log) == 40 and stats.bytes_sent == 40 * 50_000


def test_proxy_faults_are_deterministic(s3, s3_server):
    s3.put(f"{s3.url}/x", b"abc")
    seen = []
    for _ in range(2):
        with FaultProxy(s3_server.endpoint, seed=5, slowdown=0.5) as p:
            seen.append([raw(p, s3, "x")[0] for _ in range(12)])
    assert seen[0] == seen[1] and 200 in seen[0] and 503 in seen[0]


# --- the object layer under faults -----------------------------------------------------------


def exercise(store, s3, tmp_path: Path) -> None:
    """Every ObjectStore call once, each result checked exactly."""
    url = f"{s3.url}/data/x.bin"
    store.put_bytes(url, DATA, metadata={"sha256": "ab12"})
    assert s3.get(url) == DATA
    local = tmp_path / "up.bin"
    local.write_bytes(DATA[::-1])
    store.put_file(local, f"{s3.url}/data/up.bin", metadata={"k": "v"})
    assert s3.get(f"{s3.url}/data/up.bin") == DATA[::-1]
    info = store.info(url)
    assert info is not None and info.size == len(DATA)
    assert [i.url for i in store.find(f"{s3.url}/data")] == [
        f"{s3.url}/data/up.bin",
        f"{s3.url}/data/x.bin",
    ]
    assert store.metadata(url) == {"sha256": "ab12"}
    assert store.read(url) == DATA
    for start, stop in [(0, 1), (17, 100_017), (2**20 - 3, 2**21 + 5), (len(DATA) - 9, len(DATA))]:
        assert store.read(url, start, stop) == DATA[start:stop]
    assert store.read_whole(url, len(DATA)) == DATA
    with store.open_reader(url, len(DATA), buffer_bytes=256 * 1024) as f:
        assert f.read(1000) == DATA[:1000]
        f.seek(2**20 + 11)
        assert f.read(300_000) == DATA[2**20 + 11 : 2**20 + 300_011]
        f.seek(0)
        assert f.read(len(DATA)) == DATA
    store.delete(f"{s3.url}/data/up.bin")
    assert store.info(f"{s3.url}/data/up.bin") is None


def test_every_call_survives_slowdowns(s3, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "12")
    proxy.set(slowdown=0.3)
    exercise(through(proxy, s3), s3, tmp_path)
    stats = proxy.stats()
    assert stats.faults["slowdown"] >= 3, stats.faults


def test_every_call_survives_dropped_connections(s3, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "12")
    proxy.set(drop=0.25)
    exercise(through(proxy, s3), s3, tmp_path)
    assert proxy.stats().faults["drop"] >= 3, proxy.stats().faults


def test_truncated_bodies_are_retried_and_never_returned(s3, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "12")
    proxy.set(truncate=0.3)
    exercise(through(proxy, s3), s3, tmp_path)
    assert proxy.stats().faults["truncate"] >= 3, proxy.stats().faults

    # every ranged GET cut once: each range still comes back exactly
    store = through(proxy, s3)
    url = f"{s3.url}/data/x.bin"
    proxy.set(truncate=0.5, methods={"GET"}, ranged=True)
    proxy.reset()
    for start in range(0, len(DATA), 400_000):
        stop = min(len(DATA), start + 300_000)
        assert store.read(url, start, stop) == DATA[start:stop]
    stats = proxy.stats()
    assert stats.faults["truncate"] >= 2 and stats.requests > 8, stats
    ranges = len(range(0, len(DATA), 400_000))
    assert stats.requests == ranges + stats.faults["truncate"]  # each cut read retried once


def test_whole_object_reads_cut_or_corrupted_are_retried(s3, proxy, monkeypatch):
    """A whole-object GET has no range to check the length against: a cut body is caught by
    its Content-Length, a corrupted one by the object's stored CRC (botocore's default
    checksums on upload and on download), and both are retried."""
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "12")
    url = f"{s3.url}/manifest.json"
    s3.put(url, DATA[:200_000])
    store = through(proxy, s3)
    for fault in ("truncate", "corrupt"):
        proxy.reset()
        proxy.set(**{fault: 0.5}, methods={"GET"})
        for _ in range(6):
            assert store.read(url) == DATA[:200_000]
        assert proxy.stats().faults[fault] >= 2, proxy.stats().faults
        proxy.clear()


def test_timeouts_are_retried(s3, proxy, monkeypatch):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "12")
    url = f"{s3.url}/x.bin"
    s3.put(url, DATA[:60_000])
    options = {"endpoint_url": proxy.endpoint, "config_kwargs": {"read_timeout": 0.2}}
    store = object_store(s3.url, options)
    proxy.set(stall=0.3, stall_seconds=0.5)
    for start in range(0, 60_000, 10_000):
        assert store.read(url, start, start + 10_000) == DATA[start : start + 10_000]
    assert proxy.stats().faults["stall"] >= 2, proxy.stats().faults

    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "2")
    proxy.set(stall=1.0)
    with pytest.raises(ObjectStorageError, match=r"reading failed after 2 attempts \(.*timeout"):
        object_store(s3.url, options).read(url, 0, 10)  # the budget is read at creation


@pytest.mark.slow
def test_multipart_upload_survives_faults(s3, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "12")
    big = tmp_path / "big.bin"
    data = os.urandom(101 * 2**20)  # s3fs uploads in 50 MiB parts from 100 MiB on
    big.write_bytes(data)
    proxy.set(slowdown=0.2, drop=0.1)
    through(proxy, s3).put_file(big, f"{s3.url}/big.bin", metadata={"sha256": "x"})
    assert s3.get(f"{s3.url}/big.bin") == data
    stats = proxy.stats()
    assert "POST" in {m for m, _, _, _ in stats.log} and stats.faulted >= 1, stats.faults


def test_latency_is_only_slower(s3, proxy, tmp_path):
    proxy.set(delay=0.02)
    started = time.monotonic()
    exercise(through(proxy, s3), s3, tmp_path)
    elapsed = time.monotonic() - started
    stats = proxy.stats()
    assert stats.faulted == 0 and elapsed >= 0.02 * stats.requests  # one call at a time


@pytest.mark.parametrize("fault", ["slowdown", "drop", "truncate"])
def test_after_the_budget_one_line_names_the_object_and_last_error(s3, proxy, monkeypatch, fault):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "2")
    monkeypatch.setenv("TOKENTAPE_IO_THROTTLE_S", "0")  # 503s count as attempts
    url = f"{s3.url}/some/object.bin"
    s3.put(url, DATA[:5000])
    store = object_store(
        s3.url, {"endpoint_url": proxy.endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY}
    )
    proxy.set(**{fault: 1.0})
    with pytest.raises(ObjectStorageError) as caught:
        store.read(url, 0, 4000)
    error = caught.value
    message = str(error)
    assert message.startswith(f"{url}: reading failed after 2 attempts (")
    assert "\n" not in message and SECRET_KEY not in message and ACCESS_KEY not in message
    assert error.url == url and error.last_error and error.last_error in message
    expected = {
        "slowdown": "reduce your request rate",
        "drop": "closed",
        "truncate": "content length",
    }[fault]
    assert expected in message.lower(), message

    proxy.clear()
    assert store.read(url, 0, 4000) == DATA[:4000]  # the store works again


def test_writes_and_listings_after_the_budget(s3, proxy, monkeypatch):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "2")
    monkeypatch.setenv("TOKENTAPE_IO_THROTTLE_S", "0")  # 503s count as attempts
    options = {"endpoint_url": proxy.endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY}
    store = object_store(s3.url, options)
    proxy.set(slowdown=1.0)
    with pytest.raises(ObjectStorageError, match=r"writing failed after 2 attempts") as put:
        store.put_bytes(f"{s3.url}/some/new.bin", b"x" * 10)
    assert str(put.value).startswith(f"{s3.url}/some/new.bin: ")
    assert SECRET_KEY not in str(put.value)
    with pytest.raises(ObjectStorageError, match=r"reading the object's size failed"):
        store.info(f"{s3.url}/some/new.bin")
    with pytest.raises(ObjectStorageError, match=r"^s3://[^ ]+/some: listing failed"):
        store.find(f"{s3.url}/some")
    assert s3.keys() == []


def test_one_request_per_attempt(s3, proxy, monkeypatch):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "3")
    monkeypatch.setenv("TOKENTAPE_IO_THROTTLE_S", "0")  # 503s count as attempts
    url = f"{s3.url}/x.bin"
    s3.put(url, b"abcdef")
    store = through(proxy, s3)
    proxy.set(slowdown=1.0, methods={"GET"})
    with pytest.raises(ObjectStorageError, match="after 3 attempts"):
        store.read(url, 0, 3)
    assert proxy.stats().requests == 3


def test_reading_to_the_end_is_not_one_request_per_8_kib(s3, proxy):
    url = f"{s3.url}/x.bin"
    s3.put(url, DATA[: 2**20])
    with through(proxy, s3).open_reader(url, 2**20) as f:
        assert f.read() == DATA[: 2**20]
    assert proxy.stats().requests <= 4, proxy.stats().requests


def test_a_whole_object_is_read_in_one_request(s3, proxy):
    """A manifest, a sidecar or a tokenizer copy read whole costs one GET (s3fs would first
    HEAD it for its size: a round trip more on every open)."""
    url = f"{s3.url}/x"
    s3.put(url, DATA[:3000])
    assert through(proxy, s3).read(url) == DATA[:3000]
    assert [method for method, _, _, _ in proxy.stats().log] == ["GET"]

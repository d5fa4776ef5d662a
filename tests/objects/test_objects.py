"""The object-storage layer against a real S3 server on loopback: reads, ranges, listing,
retries' final error, and credentials kept out of messages."""

from __future__ import annotations

import pytest

from tokentape._src.objects.client import (
    is_url,
    join,
    object_store,
    parse_storage_options,
    redact,
    secret_keys,
)
from tokentape.errors import InputError, ObjectStorageError

pytestmark = pytest.mark.s3


def test_urls_and_paths():
    assert is_url("s3://b/k") and is_url("gs://b") and is_url("az://c/x")
    assert not is_url("/tmp/x") and not is_url("file:///tmp/x") and not is_url("rel/s3://x")
    assert not is_url(None) and join("s3://b/p/", "manifest.json") == "s3://b/p/manifest.json"


def test_read_ranges_list_and_metadata(s3):
    data = bytes(range(256)) * 1000
    s3.put(f"{s3.url}/a/x.bin", data)
    s3.put(f"{s3.url}/a/b/y.txt", b"hello")
    store = object_store(s3.url)
    assert store.read(f"{s3.url}/a/x.bin", 1000, 1010) == data[1000:1010]
    assert store.read(f"{s3.url}/a/x.bin") == data
    info = store.info(f"{s3.url}/a/x.bin")
    assert info is not None and info.size == len(data) and info.version
    assert store.info(f"{s3.url}/a/none") is None and store.info(f"{s3.url}/a") is None
    assert [i.url for i in store.find(f"{s3.url}/a")] == [
        f"{s3.url}/a/b/y.txt",
        f"{s3.url}/a/x.bin",
    ]
    assert [i.url for i in store.glob(f"{s3.url}/a/**/*.txt")] == [f"{s3.url}/a/b/y.txt"]
    store.put_bytes(f"{s3.url}/m", b"meta", metadata={"sha256": "ab12"})
    assert store.metadata(f"{s3.url}/m") == {"sha256": "ab12"}
    with store.open_reader(f"{s3.url}/a/x.bin", len(data), buffer_bytes=4096) as f:
        f.seek(70_000)
        assert f.read(5000) == data[70_000:75_000]
    store.delete(f"{s3.url}/m")
    assert store.info(f"{s3.url}/m") is None


def test_missing_object_is_not_retried(s3):
    with pytest.raises(FileNotFoundError):
        object_store(s3.url).read(f"{s3.url}/nothing")


def test_unreachable_endpoint_names_the_object_not_the_secret(s3, monkeypatch):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "2")
    secret = "a-very-secret-value-42"
    store = object_store(
        s3.url,
        {"endpoint_url": "http://127.0.0.1:9", "key": "someone", "secret": secret},
    )
    with pytest.raises(ObjectStorageError) as caught:
        store.read(f"{s3.url}/x.bin", 0, 10)
    message = str(caught.value)
    assert f"{s3.url}/x.bin" in message and "after 2 attempts" in message
    assert secret not in message and "\n" not in message
    assert redact(f"oops {secret} and {s3.url}") == f"oops *** and {s3.url}"


def test_a_request_the_client_refuses_is_one_line_at_once(s3, capsys):
    from helpers import cli

    for options in ('{"endpoint_url": "notaurl"}', '{"no_such_option": 1}'):
        code, out, err = cli(capsys, "verify", f"{s3.url}/x", "--storage-options", options)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert "refused by the client" in err and "--storage-options" in err


def test_credentials_in_tables_and_connection_strings_are_secrets_whole():
    options = {
        "token": {"type": "service_account", "private_key": "-----BEGIN KEY-----abc"},
        "connection_string": "Account=x;AccountKey=SUPERSECRETAZUREKEY==",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    assert secret_keys(options) == ["token", "connection_string"]
    from tokentape._src.objects.client import _remember_secrets

    _remember_secrets(options)
    text = redact("got -----BEGIN KEY-----abc and Account=x;AccountKey=SUPERSECRETAZUREKEY== ok")
    assert "BEGIN KEY" not in text and "SUPERSECRET" not in text and text.endswith(" ok")
    assert "eu-west-1" in redact("region eu-west-1")


def test_storage_options_flag():
    assert parse_storage_options('{"endpoint_url": "http://127.0.0.1:1"}', "x") == {
        "endpoint_url": "http://127.0.0.1:1"
    }
    with pytest.raises(InputError, match="--storage-options: not valid JSON"):
        parse_storage_options("{", "--storage-options")
    with pytest.raises(InputError, match="expected an object"):
        parse_storage_options("[1]", "--storage-options")
    assert secret_keys({"key": "k", "secret": "s", "client_kwargs": {"region_name": "x"}}) == [
        "key",
        "secret",
    ]

"""Megatron prefixes in object storage, verified and refused by name: a reader's full verify
of a prefix whose identity a writer recorded passes (its sidecar never rewritten); verify
replaces a sidecar whose identity contradicts the objects and never compares objects replaced
after it read the sidecar; an unreadable or missing ``.idx`` object, and a tokenizer URL given
beside a prefix, are named by their URL. Against a real S3 server (moto) and, where the bucket
must misbehave, the fault proxy in front of it.

Expected values come from local copies of the same files (``helpers.build``), never from the
code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import build, cli, random_docs

from tokentape._src.megatron.remote import object_keys, read_sidecar
from tokentape._src.megatron.source import megatron_at_url
from tokentape._src.objects.client import object_store
from tokentape._src.verify.megatron_remote import check_remote_megatron
from tokentape.errors import StoreError

pytestmark = pytest.mark.s3


SIDECAR = ".tokentape.json"


def _upload(s3, local: Path, url: str) -> None:
    for suffix in (".bin", ".idx"):
        s3.put(url + suffix, Path(f"{local}{suffix}").read_bytes())


def _verify(capsys, url: str, *extra: object) -> tuple[int, str, str]:
    return cli(capsys, "verify", url, "--vocab-size", "257", "--eod-id", "256", *extra)


@pytest.fixture
def prefixes(s3, tmp_path):
    """Two Megatron prefixes (257 ids, EOD 256) of different sizes, on disk and in the bucket
    (.bin and .idx only: no sidecar)."""
    found = []
    for name, seed, n_docs in (("a", 1, 40), ("b", 2, 30)):
        local = tmp_path / name
        build(local, random_docs(seed, n_docs, 257, 256), np.uint16)
        url = f"{s3.url}/megatron/{name}"
        _upload(s3, local, url)
        found.append((local, url))
    return found


def _tokens(local: Path) -> int:
    return Path(f"{local}.bin").stat().st_size // 2


def test_a_full_verify_by_a_reader_of_a_recorded_prefix_passes(prefixes, s3, s3_server, capsys):
    """The documented workflow: someone with write access runs verify once; readers then plan,
    stream, stage and verify. A reader's full verify of intact, recorded data must pass."""
    (local, url), _ = prefixes
    assert _verify(capsys, url)[0] == 0  # the writer records the sidecar
    recorded = s3.get(url + SIDECAR)
    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.set(deny=1.0, methods=frozenset({"PUT"}))
        options = {"endpoint_url": proxy.endpoint}
        src = megatron_at_url(url, 257, 256, storage_options=options)  # usable
        assert src.n_tokens == _tokens(local)
        src.close()
        code, out, err = _verify(capsys, url, "--storage-options", json.dumps(options), "--json")
    assert s3.get(url + SIDECAR) == recorded
    problems = json.loads(out)["stores"][0]["problems"]
    assert (code, problems) == (0, []), err


def test_verify_replaces_a_sidecar_whose_identity_contradicts_its_object_sizes(
    prefixes, s3, capsys
):
    (local, url), (_, other) = prefixes
    assert _verify(capsys, url)[0] == 0 and _verify(capsys, other)[0] == 0
    damaged = json.loads(s3.get(url + SIDECAR))
    damaged["identity"] = json.loads(s3.get(other + SIDECAR))["identity"]  # a's objects, b's id
    s3.put(url + SIDECAR, json.dumps(damaged).encode())
    with pytest.raises(
        StoreError, match=r"not a well-formed one of ours\); .* run `tokentape verify"
    ):
        megatron_at_url(url, 257, 256)
    code, out, err = _verify(capsys, url)  # what the refusal says to run
    assert code == 0, out + err
    src = megatron_at_url(url, 257, 256)
    assert src.n_tokens == _tokens(local)
    src.close()


def test_verify_does_not_compare_objects_replaced_after_the_sidecar_was_read(
    prefixes, s3, s3_server, capsys, tmp_path
):
    (local, url), _ = prefixes
    assert _verify(capsys, url)[0] == 0
    new = bytearray(Path(f"{local}.bin").read_bytes())
    new[0] = (new[0] + 1) % 200  # same size, another id in range: a legitimate new upload
    sidecar_read: list[str] = []

    def upload_after_the_sidecar_is_read(method: str, path: str, _: str | None) -> None:
        """Run by the proxy before it forwards each request: the first one after the
        sidecar's GET waits for a new upload of the ``.bin`` (by another writer)."""
        if sidecar_read == ["GET"]:
            s3.put(url + ".bin", bytes(new))
            sidecar_read.append("uploaded")
        if method == "GET" and path.split("?")[0].endswith(SIDECAR) and not sidecar_read:
            sidecar_read.append("GET")

    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.set(before=upload_after_the_sidecar_is_read)
        objects = object_store(url, {"endpoint_url": proxy.endpoint})
        found = check_remote_megatron(objects, url, False, lambda n: list(range(n)), None)
    assert sidecar_read == ["GET", "uploaded"]
    assert s3.get(url + ".bin") == bytes(new)  # the upload did land during the check
    assert found.problems == []
    objects = object_store(url)
    recorded = read_sidecar(objects, url)
    assert recorded is not None and recorded[0] == object_keys(objects, url)


def test_an_unreadable_idx_object_is_named_by_its_url(prefixes, s3, capsys):
    (_, url), _ = prefixes
    s3.put(url + ".idx", b"NOTANIDX" * 8)
    code, out, _ = _verify(capsys, url, "--json")
    assert code == 1
    (problem,) = json.loads(out)["stores"][0]["problems"]
    assert problem["found"].startswith(f"{url}.idx: not a Megatron index"), problem


def test_a_tokenizer_url_beside_a_prefix_url_is_refused_by_its_name(prefixes, s3, capsys, tmp_path):
    (_, url), _ = prefixes
    assert _verify(capsys, url)[0] == 0
    tokenizer = f"{s3.url}/tokenizers/tokenizer.json"
    s3.put(tokenizer, b"{}")
    spec = tmp_path / "mix.toml"
    spec.write_text(
        f'seq_len = 8\nseed = 1\ntotal_samples = 10\n[[source]]\nname = "a"\npath = "{url}"\n'
        f'tokenizer = "{tokenizer}"\nweight = 1\n'
    )
    code, _, err = cli(capsys, "plan", spec)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"'{tokenizer}'" in err, err


def test_a_prefix_without_its_idx_object_is_named_as_such(prefixes, s3, capsys):
    (local, _), _ = prefixes
    url = f"{s3.url}/megatron/only_bin"
    s3.put(url + ".bin", Path(f"{local}.bin").read_bytes())
    code, _, err = _verify(capsys, url)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert ".idx" in err, err

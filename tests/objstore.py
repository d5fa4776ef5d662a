"""A real S3-compatible server for the tests: moto in server mode on 127.0.0.1.

``S3Server`` runs moto's threaded server on a free loopback port; the ``s3`` fixture (in
``conftest.py``) points the standard AWS variables at it with throw-away credentials and gives
each test a fresh bucket. Nothing here reaches any other address.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ACCESS_KEY = "tokentape-test-access-key"
SECRET_KEY = "tokentape-test-secret-0123456789"
"""Throw-away credentials moto accepts; the tests check that the secret is never printed or
written anywhere."""


def s3_environment(endpoint: str) -> dict[str, str]:
    """The variables that point boto (and so s3fs and tokentape) at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "TOKENTAPE_IO_BACKOFF": "0.01",
    }


class S3Server:
    """moto's S3 server on ``127.0.0.1`` and a free port, started and stopped by the tests."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        assert host == "127.0.0.1", host
        self.endpoint = f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.stop()


@dataclass
class Bucket:
    """A fresh bucket on the test server: ``url`` is ``s3://NAME``; ``client`` a boto3 client."""

    endpoint: str
    name: str
    client: Any

    @property
    def url(self) -> str:
        return f"s3://{self.name}"

    def key(self, url: str) -> str:
        prefix = self.url + "/"
        assert url.startswith(prefix), url
        return url[len(prefix) :]

    def put(self, url: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=self.key(url), Body=data)

    def get(self, url: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=self.key(url))["Body"].read()

    def versioned(self) -> None:
        """Keep every version of every object from now on: each PUT is counted (``puts``)."""
        self.client.put_bucket_versioning(
            Bucket=self.name, VersioningConfiguration={"Status": "Enabled"}
        )

    def puts(self) -> dict[str, int]:
        """PUTs per key since ``versioned()`` (object versions; delete markers not counted)."""
        counts: dict[str, int] = {}
        for page in self.client.get_paginator("list_object_versions").paginate(Bucket=self.name):
            for version in page.get("Versions", []):
                counts[version["Key"]] = counts.get(version["Key"], 0) + 1
        return counts

    def keys(self, url: str = "") -> list[str]:
        prefix = self.key(url.rstrip("/") + "/") if url and url != self.url else ""
        found, token = [], None
        while True:
            kwargs = {"Bucket": self.name, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = self.client.list_objects_v2(**kwargs)
            found += [o["Key"] for o in page.get("Contents", [])]
            token = page.get("NextContinuationToken")
            if not token:
                return sorted(found)

    def upload_tree(self, local: Path, url: str) -> str:
        """Every file below ``local`` to the prefix ``url``; returns ``url``."""
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            rel = path.relative_to(local).as_posix()
            self.put(url.rstrip("/") + "/" + rel, path.read_bytes())
        return url

    def download_tree(self, url: str, local: Path) -> Path:
        """Every object under ``url`` into ``local`` (relative keys kept); returns ``local``."""
        for key in self.keys(url):
            rel = key[len(self.key(url.rstrip("/") + "/")) :]
            target = local / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.client.get_object(Bucket=self.name, Key=key)["Body"].read())
        return local


def new_bucket(endpoint: str) -> Bucket:
    import boto3

    env = s3_environment(endpoint)
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    name = f"tt-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return Bucket(endpoint, name, client)


def available() -> str | None:
    """None when the object-storage stack is installed, else what is missing."""
    for module in ("fsspec", "s3fs", "moto.server", "boto3"):
        try:
            __import__(module)
        except ImportError:
            return module
    return None


def env_with_s3(endpoint: str) -> dict[str, str]:
    """This process's environment plus the S3 variables (for subprocesses)."""
    return {**os.environ, **s3_environment(endpoint)}

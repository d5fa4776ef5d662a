"""Several nodes staging the same store in the same minute from a bucket that throttles them
(503 SlowDown for half the requests, as S3 answers a prefix asked beyond its rate): each node
(a process with a cache of its own) completes its stage with the store's exact bytes, with a
retry budget of one attempt a request; with throttles counted as attempts, as they were, the
same stage fails. The nodes share one proxy, as they share the bucket's prefix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from faultproxy import FaultProxy
from helpers import tree_bytes, write_store

pytestmark = [pytest.mark.s3, pytest.mark.subprocess, pytest.mark.multinode]

NODES = 3
STAGE = """\
import sys
from tokentape._src.stage.stage import stage
stage(sys.argv[1], sys.argv[2], workers=4, range_bytes=256)
print("staged")
"""


def _docs() -> list[list[int]]:
    return [[(13 * i + j) % 250 + 1 for j in range(20 + i % 40)] for i in range(150)]


def _start(url: str, cache: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", STAGE, url, str(cache)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_nodes_staging_at_once_through_throttling_all_complete(tmp_path, s3, s3_server):
    local = tmp_path / "web"
    write_store(local, _docs(), 600, 64)
    url = s3.upload_tree(local, f"{s3.url}/stores/web")
    with FaultProxy(s3_server.endpoint, seed=3, slowdown=0.5) as proxy:
        env = os.environ | {
            "AWS_ENDPOINT_URL": proxy.endpoint,
            "TOKENTAPE_IO_RETRIES": "1",  # anything but a throttle fails at once
            "TOKENTAPE_IO_BACKOFF": "0.01",
        }
        nodes = [_start(url, tmp_path / f"node-{i}", env) for i in range(NODES)]
        results = [node.communicate(timeout=300) for node in nodes]
        for node, (out, err) in zip(nodes, results, strict=True):
            assert node.returncode == 0 and out.strip() == "staged", err
        for i in range(NODES):
            staged = [d for d in (tmp_path / f"node-{i}").iterdir() if not d.name.startswith(".")]
            assert len(staged) == 1 and tree_bytes(staged[0]) == tree_bytes(local)
        assert proxy.stats().faults["slowdown"] >= NODES

        # The same with throttles counted as attempts (what tokentape did): the stage fails.
        old = _start(url, tmp_path / "old", env | {"TOKENTAPE_IO_THROTTLE_S": "0"})
        out, err = old.communicate(timeout=300)
        assert old.returncode != 0 and "reduce your request rate" in err, err

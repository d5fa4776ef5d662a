"""``tokentape tokenize --executor ray`` on a real three-node Ray cluster (``ray.cluster_utils``:
a head and two more nodes on this machine, each its own raylet with one CPU, all on loopback),
from a bucket to a bucket on the local S3 server.

The units are spread over the three nodes (the summary says how many each made); a node whose
raylet is SIGKILLed while it tokenizes a unit loses that unit's task, which Ray reruns on a
node still alive; the job completes, its store is byte-identical to the local executor's, and
no object is uploaded twice (counted at the server: the bucket keeps every PUT as a version).
The nodes share no directory with the command: each returns its units' files to it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import jsonl_corpus, tree_bytes, wait_for

from tokentape._src.tokenize.ray_executor import GATE_ENV

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = [pytest.mark.ray, pytest.mark.s3, pytest.mark.subprocess, pytest.mark.slow,
              pytest.mark.multinode]  # fmt: skip

HELD = 12
"""Units numbered below this run freely (spread over the nodes); the tasks from this unit on
wait at the gate until the test has killed a node."""
HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 10}
"""A node silent for 5 s is dead (Ray's default: 15 s): the lost task is rerun sooner."""


def tokenize_args(inputs: str, out: str, tokenizer: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tokentape", "tokenize", inputs, "--out", out,
            "--tokenizer", str(tokenizer), "--unit-mb", "0.01", "--shard-mb", "0.05",
            "--json", *extra]  # fmt: skip


def test_three_nodes_spread_survive_a_lost_node_and_match_the_local_store(
    s3, hf_tokenizer_json, tmp_path, monkeypatch
):
    (tmp_path / "corpus").mkdir()
    corpus = jsonl_corpus(tmp_path / "corpus", 1500, seed=31)
    s3.versioned()
    inputs = s3.upload_tree(corpus, f"{s3.url}/corpus")
    local = tmp_path / "local"
    done = subprocess.run(tokenize_args(inputs, str(local), hf_tokenizer_json, "--workers", "2"),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = json.loads(done.stdout)
    assert expected["units"] > HELD + 6, "too few units to hold some back"

    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv(GATE_ENV, f"{gate}:{HELD}")
    # The nodes' tasks read the inputs with the credentials of their node's environment: the
    # cluster is started here, after the ``s3`` fixture set the AWS variables.
    c = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                        "include_dashboard": False, "_system_config": HEALTH},
    )  # fmt: skip
    try:
        workers = [c.add_node(num_cpus=1, node_ip_address="127.0.0.1") for _ in range(2)]
        c.wait_for_nodes()
        victim = workers[-1]
        out = f"{s3.url}/stores/web"
        argv = tokenize_args(inputs, out, hf_tokenizer_json, "--executor", "ray",
                             "--ray-address", c.address, "--workers", "3",
                             "--work-dir", str(tmp_path / "work"))  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # Three tasks in flight, one CPU a node: once every node holds one at the gate,
            # the victim is killed in the middle of its unit.
            def held_nodes() -> set[str]:
                return {p.name.split("-", 2)[2] for p in gate.glob("started-*")}

            wait_for(lambda: len(held_nodes()) == 3, "a held task on every node",
                     alive=lambda: proc.poll() is None)  # fmt: skip
            victim_tag = victim.node_id[:8]
            assert any(n.endswith(victim_tag) for n in held_nodes()), held_nodes()
            raylet = victim.all_processes["raylet"][0].process
            raylet.send_signal(signal.SIGKILL)
            raylet.wait()
            (gate / "open").touch()
            stdout, stderr = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    finally:
        c.shutdown()
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["status"] == "created" and summary["units"] == expected["units"]
    # Spread: every node made units, the lost one's held unit was made again elsewhere.
    nodes = summary["ray_nodes"]
    assert len(nodes) == 3 and all(n > 0 for n in nodes.values()), nodes
    assert sum(nodes.values()) == summary["units"]
    held_on_victim = [p for p in gate.glob("started-*") if p.name.endswith(victim_tag)]
    assert held_on_victim, "the victim held no task when it was killed"
    # Byte-identical to the local executor, every object PUT once.
    uploaded = tree_bytes(s3.download_tree(out, tmp_path / "downloaded"))
    assert uploaded == tree_bytes(local)
    counts = s3.puts()
    store_keys = {k: n for k, n in counts.items() if k.startswith("stores/web/")}
    assert len(store_keys) == len(uploaded)
    assert set(store_keys.values()) == {1}, {k: n for k, n in store_keys.items() if n != 1}

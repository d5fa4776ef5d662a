"""``examples/train_tiny.py`` under ``torchrun`` on two nodes (two agents on loopback, a c10d
rendezvous on 127.0.0.1, gloo), from a plan whose stores are in a bucket on the local S3
server; each node reaches the server through a proxy of its own, which counts its requests.

Staged (each node its own ``--cache-dir``): every byte of every store is downloaded once per
node, whatever its number of ranks, and never again when the run restarts on a node that has
staged it. Streamed (no cache): the same training, read by ranged GETs.

Either way, node 1 is SIGKILLed mid-run; node 0's ranks fail (their peers are gone) rather than
hang, and the run restarts on node 0 alone from the last checkpoint, with half the ranks and
twice the accumulation. In ``torchrun``'s elastic mode (``--nnodes 1:2``) the same happens
within one ``torchrun``: node 0's agent restarts its rank, which resumes alone.

Every rank's batch of every step is what the plan gives that rank for that step's shape (a
one-node computation), and the samples applied are exactly ``0 .. steps x global batch``, none
lost, none twice."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from faultproxy import FaultProxy, Recorder
from helpers import PLAN, kill_tree, plan_of, small_shard_stores, wait_for

from tokentape._src.store.format import MANIFEST_NAME
from tokentape._src.train.batch import Batcher
from tokentape._src.train.steplog import read_step_log

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.s3, pytest.mark.subprocess, pytest.mark.slow,
              pytest.mark.multinode]  # fmt: skip

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_tiny.py"
GLOBAL_BATCH = 8
MICRO = 2


class Requests(Recorder):
    """What one node asked its proxy for."""

    def __init__(self, bucket: str) -> None:
        super().__init__()
        self.prefix = f"/{bucket}/"

    def data_gets(self) -> dict[str, list[tuple[int, int] | None]]:
        """The GETs of each store file but the manifest, by key (the path in the bucket)."""
        got: dict[str, list[tuple[int, int] | None]] = {}
        for method, path, span in self.requests():
            key = path.removeprefix(self.prefix)
            if (
                method == "GET"
                and path.startswith(self.prefix)
                and key.startswith("stores/")
                and not key.endswith(MANIFEST_NAME)
            ):
                got.setdefault(key, []).append(span)
        return got


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lines(path: Path) -> list[dict]:
    """The JSON lines of a log a killed process may have left with its last line cut short."""
    if not path.exists():
        return []
    raw = path.read_text().splitlines()
    found = [json.loads(x) for x in raw[:-1]]
    with contextlib.suppress(ValueError):
        found += [json.loads(x) for x in raw[-1:]]
    return found


class Node:
    """One ``torchrun`` agent: ``nproc`` ranks of a job of ``nnodes`` nodes, reaching S3 through
    its own proxy."""

    def __init__(self, proxy: FaultProxy, cache: Path | None, log: Path) -> None:
        self.proxy, self.cache, self.log = proxy, cache, log
        self.proc: subprocess.Popen | None = None

    def start(self, plan: Path, run: Path, nnodes: int, nproc: int, port: int, steps: int,
              elastic: bool = False, host: bool = True):  # fmt: skip
        """``elastic``: ``--nnodes 1:2`` with restarts, this node hosting the rendezvous's
        store when ``host`` (two agents on one machine would race for it)."""
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                    "--rdzv-id=tiny", "--monitor-interval=0.2"]  # fmt: skip
        if elastic:
            launcher += ["--nnodes=1:2", "--max-restarts=3",
                         f"--rdzv-conf=is_host={int(host)},last_call_timeout=2"]  # fmt: skip
        else:
            launcher += [f"--nnodes={nnodes}", "--max-restarts=0"]
        script = [str(EXAMPLE), str(plan), "--out", str(run), "--steps", str(steps),
                  "--global-batch", str(GLOBAL_BATCH), "--micro", str(MICRO), "--save-every",
                  "3", "--check-ranks", "--rank-log", "--width", "32"]  # fmt: skip
        if self.cache is not None:  # staged before the first step: every GET is the stage's
            script += ["--cache-dir", str(self.cache), "--stage", "first"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1",
               "AWS_ENDPOINT_URL": self.proxy.endpoint}  # fmt: skip
        with open(self.log, "a") as out:  # a file, not a pipe: nothing waits for a reader
            self.proc = subprocess.Popen(
                [*launcher, *script], env=env, start_new_session=True,
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text()


@pytest.fixture
def bucket_plan(tmp_path, s3):
    """The small stores in the bucket, a plan over them there, and the same plan read locally."""
    small_shard_stores(tmp_path)
    s3.upload_tree(tmp_path / "stores", f"{s3.url}/stores")
    remote = plan_of(tmp_path, PLAN.replace('path = "stores/', f'path = "{s3.url}/stores/'))
    path = tmp_path / "plan.json"
    remote.save(path)
    return path, plan_of(tmp_path), s3


def check_every_rank_and_the_union(run: Path, local_plan, steps: int) -> None:
    """Each logged step's rank batches are the plan's for its shape; what was applied covers
    ``0 .. steps x global batch`` once."""
    records = read_step_log(run / "steps.jsonl")  # steps and consumed contiguous
    assert [r.step for r in records] == list(range(steps))
    ranks = {int(p.stem.split("-")[1]): lines(p) for p in (run / "ranks").glob("rank-*.jsonl")}
    batcher = Batcher(local_plan)
    applied = []
    for r in records:
        per_rank = GLOBAL_BATCH // r.dp
        for rank in range(r.dp):
            # The last time this rank logged the step is the attempt that was committed.
            line = [x for x in ranks[rank] if x["step"] == r.step][-1]
            assert (line["dp"], line["consumed"]) == (r.dp, r.consumed)
            want = r.consumed + rank * per_rank + np.arange(per_rank)
            assert line["positions"] == want.tolist(), (r.step, rank)
            tokens = batcher.batch(want).tokens.astype("<i8")
            digest = hashlib.sha256(tokens.tobytes()).hexdigest()
            assert line["tokens_sha256"] == digest, (r.step, rank)
            applied += line["positions"]
    assert sorted(applied) == list(range(steps * GLOBAL_BATCH))
    assert len(applied) == len(set(applied))


def run_kill_restart(tmp_path, bucket_plan, s3_server, nproc: int, staged: bool) -> dict:
    plan_path, local_plan, s3 = bucket_plan
    run = tmp_path / "run"
    nodes = []
    requests = []
    with contextlib.ExitStack() as stack:
        for n in range(2):
            seen = Requests(s3.name)
            proxy = stack.enter_context(FaultProxy(s3_server.endpoint, before=seen))
            nodes.append(Node(proxy, tmp_path / f"cache{n}" if staged else None,
                              tmp_path / f"node{n}.log"))  # fmt: skip
            requests.append(seen)
        port = free_port()
        for node in nodes:
            node.start(plan_path, run, nnodes=2, nproc=nproc, port=port, steps=2000)
        try:
            wait_for(lambda: len(lines(run / "steps.jsonl")) >= 5
                     and (run / "checkpoint.npz").exists(),
                     "five steps and a checkpoint on two nodes",
                     alive=lambda: all(n.alive() for n in nodes))  # fmt: skip
            assert {r["dp"] for r in lines(run / "steps.jsonl")} == {2 * nproc}
            kill_tree(nodes[1].proc.pid)
            nodes[1].proc.wait()
            # Node 0's ranks lose their peers: the agent ends (no hang), the job failed.
            wait_for(lambda: not nodes[0].alive(), "node 0 to stop after node 1 died")
            assert nodes[0].proc.returncode != 0
            before_restart = [sum(map(len, r.data_gets().values())) for r in requests]
            logged = len(lines(run / "steps.jsonl"))
            steps = logged + 4
            restart = nodes[0].start(plan_path, run, nnodes=1, nproc=nproc, port=free_port(),
                                     steps=steps)  # fmt: skip
            restart.proc.wait(timeout=600)
            output = restart.output()
            assert restart.proc.returncode == 0, output
            assert f"dp {nproc}, micro {MICRO}" in output
        finally:
            for node in nodes:
                if node.alive():
                    kill_tree(node.proc.pid)
    check_every_rank_and_the_union(run, local_plan, steps)
    dps = [r.dp for r in read_step_log(run / "steps.jsonl")]
    assert dps[0] == 2 * nproc and dps[-1] == nproc
    return {"requests": requests, "before_restart": before_restart, "s3": s3}


def test_two_nodes_stage_once_per_node_then_restart_on_one(tmp_path, bucket_plan, s3_server):
    got = run_kill_restart(tmp_path, bucket_plan, s3_server, nproc=2, staged=True)
    s3 = got["s3"]
    sizes = {k: len(s3.get(f"{s3.url}/{k}")) for k in s3.keys(f"{s3.url}/stores")}
    for n, seen in enumerate(got["requests"]):
        gets = seen.data_gets()
        # Every file the node's stage holds (but the manifest, and the empty files: no ids)
        # was downloaded by this node, each byte once.
        stores = [d for d in (tmp_path / f"cache{n}").iterdir() if d.is_dir()]
        staged = {f"stores/{d.name.split('-', 1)[1]}/{f.name}" for d in stores
                  for f in d.iterdir() if f.name != MANIFEST_NAME and f.stat().st_size}  # fmt: skip
        assert len(staged) > 3 * 4 and set(gets) == staged, n
        for key, spans in gets.items():
            whole = [(0, sizes[key]) if s is None else s for s in spans]
            assert sum(b - a for a, b in whole) == sizes[key], (n, key, whole)
            covered = np.zeros(sizes[key], dtype=np.int8)
            for a, b in whole:
                covered[a:b] += 1
            assert (covered == 1).all(), (n, key)
    # The restart on node 0 found its stage and downloaded nothing more.
    assert sum(map(len, got["requests"][0].data_gets().values())) == got["before_restart"][0]


def test_two_nodes_streaming_then_restart_on_one(tmp_path, bucket_plan, s3_server):
    got = run_kill_restart(tmp_path, bucket_plan, s3_server, nproc=1, staged=False)
    for seen in got["requests"]:  # each node read its windows from the bucket by ranges
        assert any(s is not None for spans in seen.data_gets().values() for s in spans)


def test_elastic_torchrun_goes_on_with_the_node_left(tmp_path, bucket_plan, s3_server):
    """``torchrun``'s own elastic mode (``--nnodes 1:2``, restarts allowed), streaming: node 1
    is killed; node 0's agent restarts its rank, which meets at the rendezvous alone and resumes
    from the checkpoint at dp 1, in the same ``torchrun``. Every step logged is the plan's for
    its shape and the applied samples are exact."""
    plan_path, local_plan, _ = bucket_plan
    run = tmp_path / "run"
    log = run / "steps.jsonl"
    with contextlib.ExitStack() as stack:
        nodes = [Node(stack.enter_context(FaultProxy(s3_server.endpoint)), None,
                      tmp_path / f"node{n}.log") for n in range(2)]  # fmt: skip
        port = free_port()
        nodes[0].start(plan_path, run, 2, 1, port, steps=10**5, elastic=True, host=True)
        nodes[1].start(plan_path, run, 2, 1, port, steps=10**5, elastic=True, host=False)
        try:
            wait_for(lambda: any(r["dp"] == 2 for r in lines(log))
                     and (run / "checkpoint.npz").exists(), "steps on two nodes",
                     alive=lambda: all(n.alive() for n in nodes))  # fmt: skip
            kill_tree(nodes[1].proc.pid)
            nodes[1].proc.wait()
            killed_at = len(lines(log))
            # node 0 goes on alone: its restarted rank commits steps at dp 1
            wait_for(lambda: sum(r["dp"] == 1 for r in lines(log)[killed_at:]) >= 3,
                     "steps at dp 1 after node 1 died", alive=nodes[0].alive)  # fmt: skip
        finally:
            for node in nodes:
                if node.alive():
                    kill_tree(node.proc.pid)
                    node.proc.wait()
    records = read_step_log(log)
    assert records[-1].dp == 1 and any(r.dp == 2 for r in records)
    check_every_rank_and_the_union(run, local_plan, len(records))

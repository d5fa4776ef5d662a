"""What every peer child shares: the corpus layout, sample identities, timing and the reply.

Children run as ``python benchmarks/peers/<system>_child.py '<json args>'`` (the peers' own
virtual environment, or the project's for tokentape) and print one JSON line on stdout; progress
goes to stderr. Only numpy and the standard library here: each peer's venv has its own numpy.

The corpus (written by ``peers_bench.py``): ``corpus/src<d>.npy``, one uint16 token stream per
source d of ``n_d * L + 1`` tokens; sample k of source d is the window ``[k L, k L + L + 1)``
(tokentape's windows; the peers store each window as its own record). Every window carries its
identity in tokens 1..4: the source, then k in base 256 (the bytes tokenizer's ids are < 256).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SEQ_LEN = 2048
WEIGHTS = (0.6, 0.3, 0.1)
SEED = 1234
BATCH = 64


def args() -> dict[str, Any]:
    """The child's JSON arguments (argv[1])."""
    return json.loads(sys.argv[1])


def reply(**fields: Any) -> None:
    """Print the child's one JSON line."""
    print(json.dumps(fields), flush=True)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def corpus(root: str) -> list[np.ndarray]:
    """The sources' token streams, memory-mapped."""
    paths = sorted(Path(root, "corpus").glob("src*.npy"))
    return [np.load(p, mmap_mode="r") for p in paths]


def n_samples(stream: np.ndarray) -> int:
    return (len(stream) - 1) // SEQ_LEN


def window(stream: np.ndarray, k: int) -> np.ndarray:
    return np.asarray(stream[k * SEQ_LEN : k * SEQ_LEN + SEQ_LEN + 1])


def identity(tokens: Any) -> np.ndarray:
    """(n, 2) int64 (source, index) of a batch of windows (any array-like of shape (n, L+1))."""
    t = np.asarray(tokens, dtype=np.int64)
    index = (t[:, 2] << 16) | (t[:, 3] << 8) | t[:, 4]
    return np.stack([t[:, 1], index], axis=1)


def span(ids: np.ndarray) -> float:
    """How random a batch is: max - min of the sample indices of its first source's samples
    (the 60 % one), in samples; -1 when it holds none."""
    own = ids[ids[:, 0] == 0, 1]
    return float(own.max() - own.min()) if len(own) > 1 else -1.0


def digest(ids: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]


def rss_mib() -> float:
    """Peak resident memory of this process (MiB) since the last ``reset_peak()`` (Linux's
    VmHWM), else since it started."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak() -> float:
    """Reset the peak to the current resident memory (Linux: ``clear_refs`` 5), so that a
    later ``rss_mib()`` is the peak of what follows, not of the imports; returns the current
    resident memory (MiB)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return rss_mib()


def children_rss_mib() -> float:
    """Peak resident memory of the largest waited-for child process (MiB)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


class Clock:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


def throughput(batches: Any, n: int) -> dict[str, Any]:
    """Read the first batch (not timed), then ``n`` more: samples/s, the median span and the
    digest of the identities of all ``n + 1`` batches, in order."""
    it = iter(batches)
    first = next(it)
    ids = [first]
    clock = Clock()
    for _ in range(n):
        ids.append(next(it))
    seconds = clock()
    spans = [span(b) for b in ids]
    got = sum(len(b) for b in ids[1:])
    return {
        "samples_per_s": got / seconds,
        "span": float(np.median([s for s in spans if s >= 0])),
        "digest": digest(np.concatenate(ids)),
        "ids": np.concatenate(ids).tolist(),
    }


def record_order(batches: Any, horizon: int, budget: float, out_path: str) -> None:
    """The sources of the first ``horizon`` samples ``batches`` yields (or as many as come in
    ``budget`` seconds), saved as int8 to ``out_path``; replies with the time and count."""
    clock, got, out = Clock(), 0, []
    for ids in batches:
        out.append(ids[:, 0].astype(np.int8))
        got += len(ids)
        if got >= horizon or clock() > budget:
            break
    np.save(out_path, np.concatenate(out)[:horizon])
    reply(seconds=clock(), samples=min(got, horizon))


def ranks_and_roundtrip(script: str, a: dict[str, Any]) -> bool:
    """Answer the ``resume`` and ``roundtrip`` measures of a child whose runs need only the
    root and the horizon; False for any other measure."""
    base = {"root": a["root"], "horizon": a["horizon"]}
    if a["measure"] == "resume":
        reply(result=resume_ranks(script, base, a["before"], a["after"], a["to"]))
    elif a["measure"] == "roundtrip":
        reply(result=roundtrip_runs(script, base, a["before"], a["after"]))
    else:
        return False
    return True


def compare(reference: list[np.ndarray], resumed: list[np.ndarray]) -> str:
    """'exact' when the identities read (before + after a resume) equal the uninterrupted run's
    as a multiset, else how many were lost, repeated (read more often than in the reference:
    a system may repeat samples within an epoch) or extra (not in the reference at all)."""
    ref = np.concatenate(reference)
    got = np.concatenate(resumed)
    key = lambda a: (a[:, 0] << 40) | a[:, 1]  # noqa: E731
    r, c = np.unique(key(ref), return_counts=True)
    g, d = np.unique(key(got), return_counts=True)
    ref_n = dict(zip(r.tolist(), c.tolist(), strict=True))
    got_n = dict(zip(g.tolist(), d.tolist(), strict=True))
    lost = sum(max(0, n - got_n.get(k, 0)) for k, n in ref_n.items())
    repeated = sum(max(0, n - ref_n[k]) for k, n in got_n.items() if k in ref_n)
    extra = sum(n for k, n in got_n.items() if k not in ref_n)
    if lost == extra == repeated == 0:
        return "exact"
    return f"lost {lost}, repeated {repeated}, extra {extra} of {len(ref)}"


class Windows:
    """Random access to one source's windows (Grain's data source, and what the peers' writers
    read): ``len()`` samples, ``[k]`` the uint16 window of sample k. Picklable (the memory map
    is reopened in each process)."""

    def __init__(self, root: str, source: int) -> None:
        self.root, self.source = root, source
        self._stream: np.ndarray | None = None

    def _open(self) -> np.ndarray:
        if self._stream is None:
            self._stream = corpus(self.root)[self.source]
        return self._stream

    def __len__(self) -> int:
        return n_samples(self._open())

    def __getitem__(self, k: int) -> np.ndarray:
        return window(self._open(), int(k))

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "source": self.source, "_stream": None}


_PORTS: list[int] = []


def run_ranks(
    script: str,
    fields: dict[str, Any],
    world: int,
    timeout: float,
    per_rank: list[dict[str, Any]] | None = None,
) -> list[dict]:
    """Run ``script`` as ``world`` concurrent rank processes (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` set), each with
    ``fields`` (updated with ``per_rank[rank]`` if given); their replies, by rank. Raises
    RuntimeError with a rank's last line if one fails."""
    _PORTS.append(len(_PORTS))
    port = str(20000 + (os.getpid() * 7 + len(_PORTS)) % 20000)
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
        env.update(LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        mine = dict(fields, **per_rank[rank]) if per_rank else fields
        cmd = [sys.executable, script, json.dumps(mine)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            if p.returncode != 0:
                lines = [x for x in stderr.decode().splitlines() if x.strip()]
                raise RuntimeError(lines[-1] if lines else f"exit {p.returncode}")
            out.append(json.loads(stdout.decode().strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def rank_env() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def resume_ranks(
    script: str, base: dict[str, Any], before: int, after: int, tos: list[int]
) -> dict[str, str]:
    """Exact resume 2 ranks -> each of ``tos``, with the child's ``run`` measure in rank
    processes: an uninterrupted 2-rank run; 2 ranks for ``before`` steps, each saving its
    state; ``to`` ranks from rank 0's state (2 ranks: each from its own) for ``after``
    samples in all. By ``to``: the ``compare`` verdict, or why not."""
    run = dict(base, measure="run")
    steps = before + after // (2 * BATCH)
    ids = lambda replies: [np.asarray(r["ids"], dtype=np.int64) for r in replies]  # noqa: E731
    try:
        reference = run_ranks(script, dict(run, steps=steps), 2, 300)
        first = run_ranks(script, dict(run, steps=before, save_at=before), 2, 300)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return {str(to): f"failed: {str(exc)[:160]}" for to in tos}
    out = {}
    for to in tos:
        # the same world size: each rank its own state; else rank 0's (the one checkpointed)
        own = [{"state": r["state"]} for r in first] if to == len(first) else None
        fields = dict(run, steps=after // (to * BATCH), state=first[0]["state"])
        try:
            then = run_ranks(script, fields, to, 300, own)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            out[str(to)] = f"refused: {str(exc)[:160]}"
            continue
        out[str(to)] = compare(ids(reference), ids(first) + ids(then))
    return out


def roundtrip_runs(script: str, base: dict[str, Any], before: int, after: int) -> str:
    """The state after ``before`` batches, through JSON (it crosses the process boundary as
    JSON), resumes a fresh process: do its next ``after`` batches equal the uninterrupted
    run's?"""
    run = dict(base, measure="run")
    try:
        (a,) = run_ranks(script, dict(run, steps=before + after, save_at=before), 1, 300)
        (b,) = run_ranks(script, dict(run, steps=after, state=a["state"]), 1, 300)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return f"no: {str(exc)[:160]}"
    seen = np.asarray(a["ids"], dtype=np.int64)
    want, got = seen[before * BATCH :], np.asarray(b["ids"], dtype=np.int64)
    if np.array_equal(want, got):
        return "yes (exact)"
    key = lambda z: set(map(tuple, z.tolist()))  # noqa: E731
    again = len(key(got) & key(seen[: before * BATCH]))
    return (
        f"no: other batches after it ({len(key(got) & key(want))} of the next {len(want)} "
        f"samples in common, {again} read before the save again)"
    )

"""Run units of work as Ray tasks: on a private local Ray, or on a cluster given its address.

One task per unfinished unit, at most ``workers`` in flight, submitted in unit order. A task
tokenizes its unit with the same code as the local pool, into a scratch directory of its own
node, and returns the unit's files (tokens and documents) with its counts; the driver writes
them into ``OUT/.tokentape-work`` (every file atomically, the ``.json`` marker last), so the
work directory is the driver's alone and the nodes share no file system with it. The tokenizer
file must be at the same path on every node, and so must the inputs unless they are object
URLs: then every task reads its unit from the bucket itself (ranged GETs), with the job's
storage options (they travel in the task's settings) and the credentials of its own node (the
``AWS_*`` variables a local Ray inherits from the driver; on a cluster, each node's
environment, profile or instance role). A unit's bytes depend only on the unit: a task that Ray
retries after its node died returns identical files, and the store assembled from them is
byte-identical to a local run.

Ray is an optional dependency (the ``ray`` extra), imported only when a session opens.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from tokentape._src.store.tokenizers import Tokenizer, load_tokenizer
from tokentape._src.tokenize.filters import FilterSet, parse_filters
from tokentape._src.tokenize.inputs import Unit
from tokentape._src.tokenize.pool import SINGLE_THREAD_ENV, PoolJob, WorkerDied
from tokentape._src.tokenize.worker import UnitResult, keep_unit_files, tokenize_unit, unit_paths
from tokentape._src.util.faults import CRASH_ENV, crashpoint
from tokentape._src.util.progress import Counters
from tokentape.errors import InputError, TokentapeError

INSTALL_HINT = "pip install 'tokentape[ray]'"
MAX_RETRIES = 3
"""Times Ray reruns a task whose worker process or node died."""
CONNECT_TIMEOUT_S = 10.0
CANCEL_WAIT_S = 60.0
RAY_TASK_CRASH = "ray-task-once"
"""Test hook (``TOKENTAPE_CRASH_AT``): the first task of a run to start dies (``os._exit``)
before tokenizing its unit; the tasks after it, its retry included, run normally."""
CRASH_MARKER = "ray-crash-hook"
GATE_ENV = "TOKENTAPE_RAY_GATE"
"""Test hook: ``DIR:N`` holds every task of a unit numbered N or above, once it has started on
its node (``DIR/started-UNIT-NODE`` created), until the file ``DIR/open`` exists: a test sees
which node runs which unit and kills a node while its task is under way."""
GATE_POLL_S = 0.02


@dataclass(frozen=True)
class TaskJob:
    """What every task of one run shares; sent to the cluster once."""

    pool: PoolJob
    """Tokenizer spec, EOD token, filter specs and settings (its ``units`` are left empty)."""
    fingerprint: str
    """The driver's tokenizer fingerprint: a node that loads another tokenizer refuses."""
    cwd: str
    """The driver's working directory: relative paths are resolved against it on every node."""
    crash_hook: str | None = None
    """The driver's ``TOKENTAPE_CRASH_AT`` (tests only)."""
    gate: str | None = None
    """The driver's ``TOKENTAPE_RAY_GATE`` (tests only)."""


@dataclass(frozen=True)
class TaskOutcome:
    """What a task returns: its unit's result and files, or the one-line error (bad input) it
    met; and the node it ran on."""

    result: UnitResult | None = None
    tokens: bytes = b""
    """The unit's ``.bin`` file."""
    docs: bytes = b""
    """The unit's ``.docs.npy`` file."""
    error: str | None = None
    node: str = ""
    """``IP/NODE`` (the first 8 hex digits of Ray's node id)."""


def import_ray() -> ModuleType:
    """The ``ray`` module, or a one-line error saying how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise TokentapeError(f"--executor ray needs Ray: {INSTALL_HINT} ({exc})") from None


@contextmanager
def ray_session(address: str | None, workers: int) -> Iterator[ModuleType]:
    """Ray, connected to the cluster at ``address``, or to a private local instance with
    ``workers`` CPUs (shut down at the end). A session this process already opened is used as
    it is and left open.

    Meanwhile standard output goes to standard error: Ray prints its notes (a worker died, ...)
    to standard output, which belongs to the command's result (``--json``).
    """
    ray = import_ray()
    with redirect_stdout(sys.stderr):
        if ray.is_initialized():
            if address is not None:
                raise InputError(
                    f"--ray-address {address}: Ray is already initialized in this process; "
                    "leave --ray-address unset to use that session"
                )
            yield ray
        else:
            with _connected(ray, address, workers):
                yield ray


@contextmanager
def _connected(ray: ModuleType, address: str | None, workers: int) -> Iterator[None]:
    """``ray.init`` quietly (no dashboard, errors only); ``ray.shutdown`` at the end."""
    quiet = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
    try:
        if address is None:
            ray.init(address="local", num_cpus=workers, **quiet)
        else:
            _check_reachable(address)
            ray.init(address=address, **quiet)
    except TokentapeError:
        raise
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError, ...
        what = "start a local Ray" if address is None else f"connect to Ray at {address}"
        raise TokentapeError(f"--executor ray: cannot {what} ({_one_line(exc)})") from None
    try:
        yield
    finally:
        ray.shutdown()  # stops the private instance; only disconnects from a cluster


def _check_reachable(address: str) -> None:
    """Fail fast when nothing listens at HOST:PORT (``ray.init`` retries for minutes)."""
    if address.startswith(("http://", "https://")):
        raise InputError(
            f"--ray-address {address}: that is a web (dashboard) address; give the head "
            "node's HOST:PORT (port 6379 by default), ray://HOST:10001 or auto"
        )
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not (port.isascii() and port.isdigit()) or "://" in host:
        return  # 'auto', 'local' or a scheme of a Ray plugin: left to Ray
    if not host.strip("[]"):
        raise InputError(f"--ray-address {address}: no host; expected HOST:PORT")
    if not 1 <= int(port) <= 65535:
        raise InputError(f"--ray-address {address}: port {port} is not in 1-65535")
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S).close()
    except (OSError, UnicodeError) as exc:  # UnicodeError: a host name IDNA cannot encode
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise TokentapeError(
            f"--ray-address {address}: cannot connect ({reason}); "
            "is the Ray head node running and reachable?"
        ) from None


def run_ray_tasks(
    ray: ModuleType, job: PoolJob, fingerprint: str, workers: int, counters: Counters
) -> dict[str, int]:
    """Tokenize the units of ``job`` as Ray tasks, at most ``workers`` in flight; each unit's
    files are written into the job's work directory here as its task returns them. Returns the
    units finished on each node (``IP/NODE``).

    Bad input in a unit raises its ``TokentapeError`` (the local executor's message) once the
    other tasks are stopped. A task that failed for another reason after Ray's retries (worker
    or node lost, an unexpected exception) leaves its unit unfinished: the other units run on,
    then ``WorkerDied`` says what failed.
    """
    shared = ray.put(
        TaskJob(
            pool=PoolJob(job.tokenizer_spec, job.eod_token, job.filter_specs, job.settings, ()),
            fingerprint=fingerprint,
            cwd=os.getcwd(),
            crash_hook=os.environ.get(CRASH_ENV),
            gate=os.environ.get(GATE_ENV),
        )
    )
    task = ray.remote(_tokenize_unit_task).options(
        num_cpus=1,
        max_retries=MAX_RETRIES,
        retry_exceptions=False,
        runtime_env={"env_vars": SINGLE_THREAD_ENV},
    )
    todo = deque(job.units)
    in_flight: dict[Any, Unit] = {}
    lost: list[str] = []
    by_node: dict[str, int] = {}
    try:
        while todo or in_flight:
            while todo and len(in_flight) < workers:
                unit = todo.popleft()
                in_flight[task.remote(shared, unit)] = unit
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in done:
                unit = in_flight.pop(ref)
                try:
                    outcome: TaskOutcome = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    lost.append(f"unit {unit.index} ({unit.parts[0].file.path}): {_cause(exc)}")
                    continue
                if outcome.error is not None:
                    raise TokentapeError(outcome.error)
                r = outcome.result
                assert r is not None
                keep_unit_files(job.settings.work_dir, r, outcome.tokens, outcome.docs)
                by_node[outcome.node] = by_node.get(outcome.node, 0) + 1
                counters.add(
                    docs=r.docs_in,
                    tokens=r.n_tokens,
                    text_bytes=r.text_bytes,
                    input_bytes=unit.n_bytes,
                )
                crashpoint("after-unit")
    finally:
        _stop(ray, list(in_flight))
    if lost:
        raise WorkerDied(
            f"{len(lost)} Ray task(s) failed ({lost[0]}; a task whose worker dies is retried "
            f"{MAX_RETRIES} times)"
        )
    return dict(sorted(by_node.items()))


def _stop(ray: ModuleType, refs: list[Any]) -> None:
    """Cancel unfinished tasks and wait until they have stopped writing."""
    if not refs:
        return
    for ref in refs:
        ray.cancel(ref)
    ray.wait(refs, num_returns=len(refs), timeout=CANCEL_WAIT_S)


def _cause(exc: BaseException) -> str:
    """One line for a failed task: the exception it raised, or how Ray lost it."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {_one_line(cause)}"
    return f"{type(exc).__name__}: {_one_line(exc)}"


def _one_line(exc: BaseException, limit: int = 200) -> str:
    lines = str(exc).strip().splitlines()
    text = " ".join(lines[0].split()) if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- on the cluster node ------------------------------------------------------------------


def _tokenize_unit_task(job: TaskJob, unit: Unit) -> TaskOutcome:
    """The body of one Ray task: tokenize ``unit`` in a scratch directory of this node and
    return its files."""
    node = _node_name()
    with _working_directory(job.cwd) as found:
        try:
            tokenizer, filters = _tools(
                job.pool.tokenizer_spec, job.pool.eod_token, job.pool.filter_specs, job.fingerprint
            )
            if job.crash_hook == RAY_TASK_CRASH:
                _die_once(job.pool.settings.work_dir)
            if job.gate is not None:
                _wait_at_gate(job.gate, unit.index, node)
            with tempfile.TemporaryDirectory(prefix="tokentape-unit-") as scratch:
                settings = replace(job.pool.settings, work_dir=scratch)
                result = tokenize_unit(unit, tokenizer, filters, settings)
                tokens, docs, _ = unit_paths(scratch, unit.index)
                return TaskOutcome(result, tokens.read_bytes(), docs.read_bytes(), node=node)
        except TokentapeError as exc:
            hint = (
                ""
                if found
                else f" (Ray node {socket.gethostname()} has no directory '{job.cwd}', the "
                "driver's working directory, against which relative paths are resolved: run "
                "from a shared directory or give absolute paths)"
            )
            return TaskOutcome(error=f"{exc}{hint}", node=node)


def _node_name() -> str:
    """``IP/NODE`` of the node this task runs on (several nodes may share a host)."""
    ray = import_ray()
    node_id = ray.get_runtime_context().get_node_id()
    return f"{ray.util.get_node_ip_address()}/{node_id[:8]}"


@contextmanager
def _working_directory(path: str) -> Iterator[bool]:
    """Run in ``path`` when this node has it (yields whether it has), then go back."""
    previous = os.getcwd()
    try:
        os.chdir(path)
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        os.chdir(previous)


@functools.lru_cache(maxsize=4)
def _tools(
    spec: str, eod_token: str | None, filter_specs: tuple[str, ...], fingerprint: str
) -> tuple[Tokenizer, FilterSet]:
    """The job's tokenizer and filters, loaded once per worker process."""
    tokenizer = load_tokenizer(spec, eod_token)
    if tokenizer.fingerprint != fingerprint:
        raise TokentapeError(
            f"tokenizer {spec!r} on Ray node {socket.gethostname()}: fingerprint "
            f"{tokenizer.fingerprint} differs from the driver's ({fingerprint}); every node "
            "must see the same tokenizer file"
        )
    return tokenizer, parse_filters(filter_specs)


def _wait_at_gate(gate: str, unit: int, node: str) -> None:
    """``GATE_ENV`` (``DIR:N``): a unit numbered N or above says it started on ``node`` and
    waits until ``DIR/open`` exists."""
    directory, _, first = gate.rpartition(":")
    if unit < int(first):
        return
    gate_dir = Path(directory)
    (gate_dir / f"started-{unit}-{node.replace('/', '-')}").touch()
    while not (gate_dir / "open").exists():
        time.sleep(GATE_POLL_S)


def _die_once(work_dir: str) -> None:
    """``RAY_TASK_CRASH``: the first task to create the marker file exits at once."""
    try:
        os.close(
            os.open(os.path.join(work_dir, CRASH_MARKER), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        )
    except FileExistsError:
        return
    os._exit(1)


__all__ = [
    "CRASH_MARKER",
    "GATE_ENV",
    "RAY_TASK_CRASH",
    "TaskJob",
    "TaskOutcome",
    "import_ray",
    "ray_session",
    "run_ray_tasks",
]

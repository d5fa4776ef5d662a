"""``tokentape verify``: check token stores against their manifests.

Full mode streams every shard once: its sha256, the sha256 of each ``block_bytes`` block and the
range of every token id. ``--quick`` hashes (and range-checks) only a few blocks per shard: the
first, the last and some picked by a seeded hash of the shard name. Both modes check file sizes,
the document index (``.idx.npy``: hash, int64, starts at 0, strictly ascending, in range, one
entry per document), the end-of-document id at every document end, the manifest's totals and
its content hash. Shards are read in chunks and through memory maps, never whole into memory.

A store at an object URL (``s3://bucket/stores/web``, given directly or as a plan's source) is
checked the same way through ranged GETs (``objects.client``, the plan's ``storage_options`` or
the ones given): streamed, never copied to disk. Its document index is read whole, and the
end-of-document check reads each shard once more, in 8 MiB ranges, for the token at every
document end, so ``--quick`` still reads every ``.bin`` of a store in a bucket once.

A Megatron prefix (``PREFIX.bin`` + ``PREFIX.idx``, given directly or as a plan's source) is
checked by ``verify.megatron``: its structure, its bytes against the identity recorded in
its sidecar, and its ids and end-of-document ids where the vocabulary is known.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np

from tokentape._src.megatron.format import is_prefix
from tokentape._src.megatron.source import MEGATRON
from tokentape._src.objects.client import ObjectStore, basename, is_url, join, object_store
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.open import detect_remote_format
from tokentape._src.store.confine import inside_problem, open_directory, open_inside
from tokentape._src.store.format import (
    MANIFEST_NAME,
    NPY_ERRORS,
    Manifest,
    ShardInfo,
    StoreFile,
    content_hash,
    manifest_files,
    numpy_dtype,
    parse_manifest,
    read_manifest_text,
    read_npy_header,
    sha256_stream,
    shard_name,
)
from tokentape._src.store.origins import parse_inputs, record_order_problem, records_offset
from tokentape._src.store.provenance import INPUTS_NAME, RECORD, id_keys, provenance_hash
from tokentape._src.store.remote import remote_manifest_text
from tokentape._src.store.tokenizers import STORED_NAMES
from tokentape._src.store.writer import npy_bytes
from tokentape._src.util.checks import as_parameter, is_int
from tokentape._src.util.progress import ProgressCallback, check_callback, tally
from tokentape._src.verify.megatron import check_megatron, planned_bytes
from tokentape._src.verify.megatron_remote import check_remote_megatron, planned_remote_bytes
from tokentape.errors import ArgumentError, InputError, StoreError, TokentapeError

DEFAULT_QUICK_BLOCKS = 4
"""Blocks hashed per shard by ``--quick``: the first, the last and two picked by a seeded hash."""
CHUNK_BYTES = 8 * 2**20
"""Bytes read (and hashed) at a time."""
INDEX_CHUNK = 2**20
"""Document starts checked at a time."""

Progress = Callable[[int, int], None]
"""Called with the bytes and tokens just read."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a store: which file, what, what the manifest says, what is there."""

    file: str
    what: str
    expected: str
    found: str

    def __str__(self) -> str:
        return f"{self.file}: {self.what}: expected {self.expected}, found {self.found}"


@dataclass(frozen=True)
class PlanRef:
    """A plan that names a store, with the content hash it recorded for it."""

    plan: str
    source: str
    content_hash: str


@dataclass(frozen=True)
class StoreReport:
    """The outcome of verifying one store."""

    path: str
    quick: bool
    n_shards: int
    n_tokens: int
    n_docs: int
    blocks_checked: int
    blocks_total: int
    bytes_hashed: int
    seconds: float
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        data["problems"] = [asdict(p) for p in self.problems]
        return {"path": self.path, "ok": self.ok} | data


@dataclass(frozen=True)
class Target:
    """A store to verify: its directory (or Megatron prefix), how to name it, and the plans
    that refer to it."""

    path: Path | str  # a directory or prefix, or a store's object URL (a str)
    label: str
    plans: tuple[PlanRef, ...] = ()
    kind: str = "tokentape"  # or "megatron"
    vocab_size: int | None = None  # Megatron: ids are below it (from a plan, or --vocab-size)
    eod_id: int | None = None  # Megatron: every document ends with it (plan, or --eod-id)
    storage_options: dict[str, Any] = field(default_factory=dict)  # an object URL's options


@dataclass
class _Work:
    bytes_hashed: int = 0
    blocks_checked: int = 0
    blocks_total: int = 0


@dataclass(frozen=True)
class _Store:
    """What the shard checks need to know about the store being verified."""

    directory: Path
    label: str
    manifest: Manifest
    progress: Progress | None
    dir_fd: int | None = None
    """The store directory, opened once: every file is looked up in it."""

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.manifest.dtype)

    def file(self, name: str) -> str:
        return str(Path(self.label) / name)

    def open(self, name: str) -> io.BufferedReader:
        """The store's file ``name``, opened without following a link at its name (one put
        there after the confinement check is refused, never read): ``TokentapeError``."""
        return open(open_inside(self.directory, name, "store file", self.dir_fd), "rb")

    def size(self, name: str) -> int:
        """The size of the file ``name`` (``FileNotFoundError`` when missing)."""
        return os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False).st_size

    def tell_data(self, data: memoryview) -> None:
        if self.progress is not None:
            self.progress(len(data), len(data) // self.dtype.itemsize)

    def inside(self, name: str) -> str | None:
        """What stops ``name`` being read as the store's own file (see ``store.confine``)."""
        return inside_problem(self.directory, name, self.dir_fd)


@dataclass(frozen=True)
class _RemoteStore(_Store):
    """A store at an object URL: its files read through ranged GETs."""

    objects: ObjectStore | None = None
    url: str = ""

    def file(self, name: str) -> str:
        return join(self.label, name)

    def open(self, name: str) -> io.BufferedReader:
        assert self.objects is not None
        return self.objects.open_reader(join(self.url, name), self.size(name), CHUNK_BYTES)

    def size(self, name: str) -> int:
        assert self.objects is not None
        found = self.objects.info(join(self.url, name))
        if found is None:
            raise FileNotFoundError(name)
        return found.size

    def inside(self, name: str) -> str | None:
        return None  # an object key: the manifest's names are checked plain at parsing


# --- manifest and targets --------------------------------------------------------------------


def load_manifest(
    store: str | Path, dir_fd: int | None = None, objects: ObjectStore | None = None
) -> tuple[Manifest, list[Problem]]:
    """Parse ``STORE/manifest.json`` (looked up in ``dir_fd`` when given; read through
    ``objects`` for a store at an object URL). Totals that disagree with the shards are problems
    (the sums are used from then on); a manifest that cannot be read at all is a
    ``TokentapeError``."""
    if objects is not None:
        text, path = remote_manifest_text(objects, str(store)), join(str(store), MANIFEST_NAME)
    else:
        text, local = read_manifest_text(store, dir_fd)
        path = str(local)
    problems: list[Problem] = []
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # bad JSON, nested too deep: parse_manifest says why
        data = None
    if isinstance(data, dict):
        problems = _fix_totals(data, str(path))
        if problems:
            text = json.dumps(data)
    return parse_manifest(text, path, strict=False), problems


def _fix_totals(data: dict[str, Any], where: str) -> list[Problem]:
    """Compare ``n_tokens``/``n_docs`` with the sums over shards; put the sums in ``data``."""
    shards = data.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
        return []
    problems = []
    for key in ("n_tokens", "n_docs"):
        values = [s.get(key) for s in shards]
        if not is_int(data.get(key)) or not all(is_int(v) for v in values):
            continue
        total = sum(values)
        if data[key] != total:
            expected = f"{total} (the sum over shards)"
            problems.append(Problem(where, f"{key} total", expected, str(data[key])))
            data[key] = total
    return problems


def find_targets(
    paths: Iterable[str], storage_options: dict[str, Any] | None = None
) -> list[Target]:
    """The stores named by ``paths`` (store directories, object URLs of stores, or plan JSON
    files), each once; ``storage_options`` are for the URLs given directly (a plan's sources
    use the plan's)."""
    storage_options = dict(storage_options or {})
    found: dict[Path | str, Target] = {}
    for raw in paths:
        for target in _expand(raw, storage_options):
            key = target.path if isinstance(target.path, str) else target.path.resolve()
            first = found.setdefault(key, target)
            if first is not target:
                found[key] = replace(
                    first,
                    plans=first.plans + target.plans,
                    vocab_size=first.vocab_size
                    if first.vocab_size is not None
                    else target.vocab_size,
                    eod_id=first.eod_id if first.eod_id is not None else target.eod_id,
                )
    return list(found.values())


def _expand(raw: str, storage_options: dict[str, Any]) -> list[Target]:
    if is_url(raw) and raw.endswith((".json", ".toml")):  # a plan in a bucket
        return _plan_targets(raw, raw, storage_options)
    if is_url(raw):
        kind = detect_remote_format(raw, storage_options)
        return [Target(raw.rstrip("/"), raw, kind=kind, storage_options=storage_options)]
    path = Path(raw)
    if not (path / MANIFEST_NAME).is_file() and is_prefix(path):
        return [Target(path, raw, kind=MEGATRON)]
    if path.is_dir():
        if not (path / MANIFEST_NAME).is_file():
            raise InputError(
                f"'{raw}': directory without {MANIFEST_NAME}; expected a complete token store "
                "or a plan JSON (tokentape plan --out)"
            )
        return [Target(path, raw)]
    if not path.exists():
        raise InputError(
            f"'{raw}': no such file or directory; expected a token store directory, a Megatron "
            "prefix or a plan JSON"
        )
    return _plan_targets(path, raw, storage_options)


def _plan_targets(path: Path | str, raw: str, storage_options: dict[str, Any]) -> list[Target]:
    """The sources of the plan at ``path`` (``raw`` as given)."""
    try:
        plan = load_plan(path)
    except TokentapeError as exc:
        if "a plan spec (TOML)" in str(exc):
            raise  # what to run is the whole message
        raise InputError(
            f"'{raw}' is neither a token store directory nor a resolved plan JSON "
            f"(tokentape plan --out): {exc}"
        ) from None
    return [
        Target(
            s.path if is_url(s.path) else Path(s.path),
            s.path,
            (PlanRef(raw, s.name, s.content_hash),),
            s.format,
            s.vocab_size if s.format == MEGATRON else None,
            s.eod_id if s.format == MEGATRON else None,
            plan.storage_options | storage_options,  # the options given win
        )
        for s in plan.sources
    ]


# --- block choice and planned work ---------------------------------------------------------


def quick_blocks(n_blocks: int, count: int, seed: str) -> list[int]:
    """The blocks ``--quick`` hashes, ascending: all if ``count >= n_blocks``, else the first,
    the last and ``count - 2`` more ranked by sha256 of ``seed`` and the block number."""
    if count >= n_blocks:
        return list(range(n_blocks))
    if count <= 1:
        return [0][:count]
    inner = range(1, n_blocks - 1)
    ranked = sorted(inner, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).digest())
    return sorted({0, n_blocks - 1, *ranked[: count - 2]})


def _n_blocks(n_bytes: int, block_bytes: int) -> int:
    return -(-n_bytes // block_bytes)


def _block_size(index: int, block_bytes: int, n_bytes: int) -> int:
    return max(0, min(block_bytes, n_bytes - index * block_bytes))


def _blocks_usable(shard: ShardInfo, itemsize: int) -> bool:
    return shard.block_bytes > 0 and shard.block_bytes % itemsize == 0


def bytes_to_hash(manifest: Manifest, quick: bool, blocks: int = DEFAULT_QUICK_BLOCKS) -> int:
    """Bytes of ``.bin`` data a verification reads (by the manifest's sizes)."""
    itemsize = numpy_dtype(manifest.dtype).itemsize
    total = 0
    for shard in manifest.shards:
        size = shard.n_tokens * itemsize
        if not quick:
            total += size
        elif _blocks_usable(shard, itemsize):
            chosen = quick_blocks(_n_blocks(size, shard.block_bytes), blocks, shard.name)
            total += sum(_block_size(i, shard.block_bytes, size) for i in chosen)
    return total


# --- checks ----------------------------------------------------------------------------------


def check_store(
    store: str | Path,
    quick: bool = False,
    blocks: int = DEFAULT_QUICK_BLOCKS,
    progress: Progress | None = None,
    *,
    label: str | None = None,
    plans: Sequence[PlanRef] = (),
    storage_options: dict[str, Any] | None = None,
) -> StoreReport:
    """Verify one store (see the module docstring); ``label`` names it in problems."""
    started = time.monotonic()
    if is_url(store):
        objects = object_store(str(store), storage_options)
        manifest, problems = load_manifest(store, objects=objects)
        url = str(store).rstrip("/")
        ctx = _RemoteStore(Path(), label or url, manifest, progress, objects=objects, url=url)
        return _report(ctx, problems, quick, blocks, plans, started)
    with contextlib.ExitStack() as held:
        dir_fd = open_directory(Path(store))
        held.callback(os.close, dir_fd)
        return _check_store(store, quick, blocks, progress, label, plans, dir_fd, started)


def _check_store(
    store: str | Path,
    quick: bool,
    blocks: int,
    progress: Progress | None,
    label: str | None,
    plans: Sequence[PlanRef],
    dir_fd: int,
    started: float,
) -> StoreReport:
    manifest, problems = load_manifest(store, dir_fd)
    ctx = _Store(Path(store), label or str(store), manifest, progress, dir_fd)
    return _report(ctx, problems, quick, blocks, plans, started)


def _report(
    ctx: _Store,
    problems: list[Problem],
    quick: bool,
    blocks: int,
    plans: Sequence[PlanRef],
    started: float,
) -> StoreReport:
    """Check the store of ``ctx`` whose manifest was read with ``problems``."""
    manifest = ctx.manifest
    problems += _manifest_problems(ctx)
    problems += _plan_problems(manifest, plans)
    work = _Work()
    problems += _tokenizer_copy_problems(ctx)
    problems += _provenance_problems(ctx, quick)
    for i, shard in enumerate(manifest.shards):
        outside = _confinement_problems(ctx, i, shard)
        if outside:  # never read a file that is not the store's own
            problems += outside
            continue
        try:
            problems += _check_shard(ctx, shard, quick, blocks, work)
        except TokentapeError as exc:  # a file replaced by a link (or a FIFO) meanwhile
            problems.append(Problem(ctx.file(shard.name), "not read", _INSIDE, str(exc)))
        except OSError as exc:  # permissions, I/O errors: name the file, keep going
            where = ctx.file(Path(exc.filename).name if exc.filename else shard.name)
            problems.append(Problem(where, "unreadable", "a readable file", str(exc.strerror)))
    return StoreReport(
        path=ctx.label,
        quick=quick,
        n_shards=len(manifest.shards),
        n_tokens=manifest.n_tokens,
        n_docs=manifest.n_docs,
        blocks_checked=work.blocks_checked,
        blocks_total=work.blocks_total,
        bytes_hashed=work.bytes_hashed,
        seconds=time.monotonic() - started,
        problems=tuple(problems),
    )


def check_megatron_target(
    target: Target,
    quick: bool = False,
    blocks: int = DEFAULT_QUICK_BLOCKS,
    progress: Progress | None = None,
) -> StoreReport:
    """Verify a Megatron prefix (see ``verify.megatron``)."""
    started = time.monotonic()
    chooser = _chooser(target.path, blocks)
    tell = None if progress is None else _megatron_progress(progress)
    plans = [(ref.plan, ref.source, ref.content_hash) for ref in target.plans]
    if isinstance(target.path, str):
        objects = object_store(target.path, target.storage_options)
        found = check_remote_megatron(
            objects, target.path, quick, chooser, tell, target.vocab_size, target.eod_id, plans
        )
    else:
        found = check_megatron(
            target.path, quick, chooser, tell, target.vocab_size, target.eod_id, plans
        )
    return StoreReport(
        path=target.label,
        quick=quick,
        n_shards=1,
        n_tokens=found.n_tokens,
        n_docs=found.n_docs,
        blocks_checked=found.blocks_checked,
        blocks_total=found.blocks_total,
        bytes_hashed=found.bytes_hashed,
        seconds=time.monotonic() - started,
        problems=tuple(Problem(*p) for p in found.problems),
    )


def _chooser(prefix: Path | str, blocks: int) -> Callable[[int], list[int]]:
    name = basename(prefix) if isinstance(prefix, str) else prefix.name
    return lambda n_blocks: quick_blocks(n_blocks, blocks, name)


def _megatron_progress(progress: Progress) -> Callable[[int], None]:
    return lambda n_bytes: progress(n_bytes, 0)


def verify_store(
    store: str | Path,
    quick: bool = False,
    blocks: int = DEFAULT_QUICK_BLOCKS,
    progress: Progress | None = None,
) -> list[Problem]:
    """The problems ``check_store`` finds; an empty list means the store is intact."""
    return list(check_store(store, quick, blocks, progress).problems)


def check_options(
    quick: bool,
    blocks: int | None,
    vocab_size: int | None,
    eod_id: int | None,
    named: Callable[[str], str] = as_parameter,
) -> int:
    """Refuse bad verify options (``named`` spells them in messages: the command line gives its
    flags); returns the blocks per shard a quick check hashes."""
    if not isinstance(quick, bool):
        raise ArgumentError(f"{named('quick')} must be True or False, got {quick!r}")
    if blocks is not None and not quick:
        raise ArgumentError(f"{named('blocks')} applies to {named('quick')} only")
    for name, value in (("blocks", blocks), ("vocab_size", vocab_size), ("eod_id", eod_id)):
        if value is not None and not is_int(value):
            raise ArgumentError(f"{named(name)} must be an integer, got {value!r}")
    blocks = DEFAULT_QUICK_BLOCKS if blocks is None else blocks
    if blocks < 1:
        raise ArgumentError(f"{named('blocks')} must be at least 1, got {blocks}")
    if vocab_size is not None and vocab_size <= 0:
        raise ArgumentError(f"{named('vocab_size')} must be positive, got {vocab_size}")
    if eod_id is not None and eod_id < 0:
        raise ArgumentError(f"{named('eod_id')} must be a token id (>= 0), got {eod_id}")
    if vocab_size is not None and eod_id is not None and eod_id >= vocab_size:
        raise ArgumentError(
            f"{named('eod_id')} {eod_id} is not below {named('vocab_size')} {vocab_size}"
        )
    return blocks


def _with_vocabulary(target: Target, vocab_size: int | None, eod_id: int | None) -> Target:
    """A Megatron target with ``vocab_size``/``eod_id`` where its plan gave none."""
    if target.kind != MEGATRON:
        return target
    return replace(
        target,
        vocab_size=target.vocab_size if target.vocab_size is not None else vocab_size,
        eod_id=target.eod_id if target.eod_id is not None else eod_id,
    )


def verify_paths(
    paths: Iterable[str],
    quick: bool = False,
    blocks: int | None = None,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    progress: ProgressCallback | None = None,
    named: Callable[[str], str] = as_parameter,
    storage_options: dict[str, Any] | None = None,
) -> list[StoreReport]:
    """Check every store, Megatron prefix and plan's store named by ``paths`` (see
    ``find_targets``): one report each, in order. The options are checked first (see
    ``check_options``), then every manifest is read before any hashing; ``progress`` receives
    the bytes and tokens checked."""
    check_callback(progress)
    chosen = check_options(quick, blocks, vocab_size, eod_id, named)
    found = find_targets(paths, storage_options)
    targets = [_with_vocabulary(t, vocab_size, eod_id) for t in found]
    total = 0
    for t in targets:  # an unreadable manifest fails here, before any hashing
        if isinstance(t.path, str) and t.kind == MEGATRON:
            objects = object_store(t.path, t.storage_options)
            total += planned_remote_bytes(objects, t.path, quick, _chooser(t.path, chosen))
        elif isinstance(t.path, str):
            objects = object_store(t.path, t.storage_options)
            total += bytes_to_hash(load_manifest(t.path, objects=objects)[0], quick, chosen)
        elif t.kind == MEGATRON:
            total += planned_bytes(t.path, quick, _chooser(t.path, chosen))
        else:
            total += bytes_to_hash(load_manifest(t.path)[0], quick, chosen)
    with tally(total, "verify", progress) as counting:
        tell = None if counting is None else counting.add
        return [
            check_megatron_target(t, quick, chosen, tell)
            if t.kind == MEGATRON
            else check_store(
                t.path,
                quick,
                chosen,
                tell,
                label=t.label,
                plans=t.plans,
                storage_options=t.storage_options,
            )
            for t in targets
        ]


def _manifest_problems(ctx: _Store) -> list[Problem]:
    m, where = ctx.manifest, ctx.file(MANIFEST_NAME)
    problems = []
    recomputed = content_hash(m.shards, m.dtype)
    if recomputed != m.content_hash:
        problems.append(Problem(where, "content_hash mismatch", m.content_hash, recomputed))
    if not 0 <= m.eod_id < m.vocab_size:
        problems.append(Problem(where, "eod_id out of range", f"< {m.vocab_size}", str(m.eod_id)))
    for shard in m.shards:
        problems += _block_record_problems(ctx, shard, where)
    return problems


def _confinement_problems(ctx: _Store, i: int, shard: ShardInfo) -> list[Problem]:
    """A shard name that is not ``part-NNNNN`` after its place, or a shard file that is not a
    regular file in the store (a symbolic link, anywhere; a directory, a FIFO): the shard is
    then not read."""
    if shard.name != shard_name(i):
        where = ctx.file(MANIFEST_NAME)
        return [Problem(where, f"shards[{i}] name (shard not read)", shard_name(i), shard.name)]
    return [
        problem
        for name in (shard.bin_file, shard.idx_file)
        if (problem := _outside(ctx, name)) is not None
    ]


def _outside(ctx: _Store, name: str) -> Problem | None:
    found = ctx.inside(name)
    if found is None:
        return None
    found = found.removeprefix("is ")
    if found.startswith("a symbolic link"):
        return Problem(ctx.file(name), "not a file of the store (not read)", _INSIDE, found)
    return Problem(ctx.file(name), "unreadable", "a regular file", found)


_INSIDE = "a regular file inside the store"


def _tokenizer_copy_problems(ctx: _Store) -> list[Problem]:
    """The tokenizer copy the manifest names, when there is one: the store's own file."""
    name = ctx.manifest.tokenizer.get("file")
    if not isinstance(name, str):
        return []
    if name not in STORED_NAMES:
        where = ctx.file(MANIFEST_NAME)
        return [Problem(where, "tokenizer.file", " or ".join(STORED_NAMES), repr(name))]
    problem = _outside(ctx, name)
    return [] if problem is None else [problem]


_PROVENANCE_FILES = ("provenance records", "document ids", "id keys", "inputs table")


def _provenance_problems(ctx: _Store, quick: bool) -> list[Problem]:
    """The provenance the manifest records, when it does: its hash follows from the files it
    names, and each file is the store's own, of the recorded size and (not ``quick``) sha256;
    the records' header is the expected array."""
    block = ctx.manifest.provenance
    if block is None:
        return []
    problems = []
    recomputed = provenance_hash(block.inputs_sha256, block.shards, block.version)
    if recomputed != block.provenance_hash:
        where = ctx.file(MANIFEST_NAME)
        problems.append(Problem(where, "provenance_hash mismatch", block.provenance_hash,
                                recomputed))  # fmt: skip
    n_docs = {s.rec_file: s.n_docs for s in ctx.manifest.shards}
    for file in manifest_files(ctx.manifest):
        if file.what not in _PROVENANCE_FILES:
            continue
        outside = _outside(ctx, file.name)
        if outside is not None:
            problems.append(outside)
            continue
        problems += _whole_file_problems(ctx, file, quick, n_docs.get(file.name))
    if not quick and not problems:
        problems += _records_problems(ctx)
    return problems


def _records_problems(ctx: _Store) -> list[Problem]:
    """What the provenance files say, checked where hashes cannot tell (a store whose
    manifest was rewritten to match crafted files): records ascend by (input, record) through
    the store and name an input of the table, ids end in order inside their file, and each
    shard's id keys are the ones its ids give."""
    block = ctx.manifest.provenance
    assert block is not None
    with ctx.open(INPUTS_NAME) as f:
        try:
            n_inputs = len(parse_inputs(f.read(), ctx.file(INPUTS_NAME)))
        except StoreError as exc:
            return [Problem(ctx.file(INPUTS_NAME), "unreadable", "an inputs table", str(exc))]
    last = None
    for shard, files in zip(ctx.manifest.shards, block.shards, strict=True):
        with ctx.open(shard.rec_file) as f:
            at = records_offset(f, shard.n_docs, ctx.file(shard.rec_file))
            f.seek(at)
            rows = np.frombuffer(f.read(), dtype=RECORD, count=shard.n_docs)
        with ctx.open(shard.ids_file) as f:
            ids = f.read()
        found = record_order_problem(rows, last, n_inputs, len(ids))
        if found is not None:
            return [Problem(ctx.file(shard.rec_file), "records", *found)]
        if len(rows):
            last = rows[-1]
        if files.keys_sha256 is None:
            continue
        expected = npy_bytes(id_keys(ids, rows["id_end"]))
        if hashlib.sha256(expected).hexdigest() != files.keys_sha256:
            where = ctx.file(shard.keys_file)
            return [Problem(where, "id keys", "the keys of the shard's ids", "other keys")]
    return []


def _whole_file_problems(
    ctx: _Store, file: StoreFile, quick: bool, n_docs: int | None
) -> list[Problem]:
    """A file checked whole: present, of its size, of its sha256 (not ``quick``) and, for a
    shard's records (``n_docs`` of them), with the expected header."""
    where = ctx.file(file.name)
    try:
        size = ctx.size(file.name)
    except FileNotFoundError:
        return [Problem(where, "missing", f"{file.size} bytes", "no file")]
    problems = []
    if size != file.size:
        problems.append(Problem(where, "size", f"{file.size} bytes", f"{size} bytes"))
    with ctx.open(file.name) as f:
        if not quick and file.sha256 is not None:
            digest = sha256_stream(f, CHUNK_BYTES)
            if digest != file.sha256:
                problems.append(Problem(where, "sha256 mismatch", file.sha256, digest))
            f.seek(0)
        if n_docs is not None:
            try:
                records_offset(f, n_docs, where)
            except StoreError as exc:
                problems.append(Problem(where, "unreadable", f"{n_docs} records", str(exc)))
    return problems


def _block_record_problems(ctx: _Store, shard: ShardInfo, where: str) -> list[Problem]:
    itemsize = ctx.dtype.itemsize
    if not _blocks_usable(shard, itemsize):
        expected = f"a positive multiple of {itemsize}"
        return [Problem(where, f"{shard.name} block_bytes", expected, str(shard.block_bytes))]
    n = _n_blocks(shard.n_tokens * itemsize, shard.block_bytes)
    found = len(shard.block_sha256)
    if found != n:
        return [Problem(where, f"{shard.name} block_sha256 count", str(n), str(found))]
    return []


def _plan_problems(manifest: Manifest, plans: Sequence[PlanRef]) -> list[Problem]:
    return [
        Problem(ref.plan, f"source '{ref.source}' content_hash", ref.content_hash, found)
        for ref in plans
        if ref.content_hash != (found := manifest.content_hash)
    ]


def _check_shard(
    ctx: _Store, shard: ShardInfo, quick: bool, blocks: int, work: _Work
) -> list[Problem]:
    idx, problems = _check_index(ctx, shard)
    where = ctx.file(shard.bin_file)
    expected = shard.n_tokens * ctx.dtype.itemsize
    try:
        size = ctx.size(shard.bin_file)
    except FileNotFoundError:
        return [*problems, Problem(where, "missing", f"{expected} bytes", "no file")]
    if size != expected:
        wanted = f"{expected} bytes ({shard.n_tokens} tokens)"
        problems.append(Problem(where, "size", wanted, f"{size} bytes"))
    if _blocks_usable(shard, ctx.dtype.itemsize):
        work.blocks_total += _n_blocks(expected, shard.block_bytes)
        hashing = _hash_chosen if quick else _hash_whole
        problems += hashing(ctx, shard, blocks, work)
    if idx is not None:
        problems += _check_eod(ctx, shard, idx, size)
    return problems


def _map_npy(f: BinaryIO) -> np.ndarray:
    """The array in the open ``.npy`` file ``f``, memory-mapped; never unpickled."""
    shape, fortran, dtype = read_npy_header(f)
    if dtype.hasobject:
        raise ValueError("an array of Python objects (never unpickled)")
    if 0 in shape:
        return np.zeros(shape, dtype=dtype)
    order: Literal["C", "F"] = "F" if fortran else "C"
    if not _has_fileno(f):  # an object's reader: read whole (an index is small)
        data = f.read()
        count = math.prod(shape)
        if len(data) < count * dtype.itemsize:
            raise ValueError(f"{len(data)} bytes of data do not hold a {shape} array")
        return np.frombuffer(data, dtype=dtype, count=count).reshape(shape, order=order)
    return np.memmap(f, dtype=dtype, mode="r", offset=f.tell(), shape=shape, order=order)


def _has_fileno(f: BinaryIO) -> bool:
    try:
        f.fileno()
    except (OSError, AttributeError, io.UnsupportedOperation):
        return False
    return True


def _check_index(ctx: _Store, shard: ShardInfo) -> tuple[np.ndarray | None, list[Problem]]:
    """Hash, size and structure of the ``.idx.npy``; the starts (memory-mapped) if sound."""
    where = ctx.file(shard.idx_file)
    try:
        size = ctx.size(shard.idx_file)
    except FileNotFoundError:
        return None, [Problem(where, "missing", f"{shard.idx_bytes} bytes", "no file")]
    problems = []
    if size != shard.idx_bytes:
        problems.append(Problem(where, "size", f"{shard.idx_bytes} bytes", f"{size} bytes"))
    idx: np.ndarray | Exception
    with ctx.open(shard.idx_file) as f:
        digest = sha256_stream(f, CHUNK_BYTES)
        f.seek(0)
        try:
            idx = _map_npy(f)
        except (OSError, *NPY_ERRORS) as exc:
            idx = exc
    if digest != shard.idx_sha256:
        problems.append(Problem(where, "sha256 mismatch", shard.idx_sha256, digest))
    if isinstance(idx, BaseException):
        reason = str(idx).splitlines()[0] if str(idx) else type(idx).__name__
        return None, [*problems, Problem(where, "unreadable", "a .npy array", reason)]
    structure = _index_problems(idx, shard, where)
    return (None if structure else idx), problems + structure


def _index_problems(idx: np.ndarray, shard: ShardInfo, where: str) -> list[Problem]:
    if idx.dtype != np.dtype("<i8") or idx.ndim != 1:
        found = f"{idx.dtype} array of shape {idx.shape}"
        return [Problem(where, "document starts", "a 1-D int64 array", found)]
    problems = []
    if len(idx) != shard.n_docs:
        problems.append(Problem(where, "document count", str(shard.n_docs), str(len(idx))))
    if len(idx) == 0:
        if shard.n_tokens:
            problems.append(Problem(where, "document starts", "a start at 0", "none"))
        return problems
    if int(idx[0]) != 0:
        problems.append(Problem(where, "first document start", "0", str(int(idx[0]))))
    return problems + _order_and_range(idx, shard.n_tokens, where)


def _order_and_range(idx: np.ndarray, n_tokens: int, where: str) -> list[Problem]:
    """Strictly ascending and within ``[0, n_tokens)``, checked in chunks."""
    unordered, outside = 0, 0
    first_unordered = first_outside = ""
    for lo in range(0, len(idx), INDEX_CHUNK):
        chunk = np.asarray(idx[max(lo - 1, 0) : lo + INDEX_CHUNK])
        steps = np.flatnonzero(np.diff(chunk) <= 0)
        if steps.size and not unordered:
            i = steps[0] + max(lo - 1, 0)
            first_unordered = f"entry {i + 1} = {int(idx[i + 1])} after {int(idx[i])}"
        unordered += steps.size
        own = chunk[1:] if lo else chunk
        bad = np.flatnonzero((own < 0) | (own >= n_tokens))
        if bad.size and not outside:
            first_outside = f"entry {lo + bad[0]} = {int(own[bad[0]])}"
        outside += bad.size
    problems = []
    if unordered:
        found = f"{unordered} out of order, first {first_unordered}"
        what, expected = "document starts not strictly ascending", "each start above the last"
        problems.append(Problem(where, what, expected, found))
    if outside:
        found = f"{outside} outside, first {first_outside}"
        expected = f"in [0, {n_tokens})"
        problems.append(Problem(where, "document start out of range", expected, found))
    return problems


class _RangeScan:
    """Counts token ids at or above ``limit`` in a byte stream fed in arbitrary pieces."""

    def __init__(self, dtype: np.dtype, limit: int, position: int = 0) -> None:
        self.dtype, self.limit, self.position = dtype, limit, position
        self.carry = b""
        self.count = 0
        self.first: tuple[int, int] | None = None  # (token position, id)

    def feed(self, data: memoryview | bytes) -> None:
        if self.carry:
            data = self.carry + bytes(data)
        whole = len(data) - len(data) % self.dtype.itemsize
        tokens = np.frombuffer(data, dtype=self.dtype, count=whole // self.dtype.itemsize)
        self.carry = bytes(data[whole:])
        if tokens.size and int(tokens.max()) >= self.limit:
            bad = np.flatnonzero(tokens >= self.limit)
            if self.first is None:
                self.first = (self.position + int(bad[0]), int(tokens[bad[0]]))
            self.count += bad.size
        self.position += tokens.size

    def problems(self, where: str) -> list[Problem]:
        if self.first is None:
            return []
        pos, value = self.first
        found = f"{value} at token {pos} ({self.count} out-of-range id(s) in the data read)"
        return [Problem(where, "token id out of range", f"ids < {self.limit}", found)]


Sink = Callable[[memoryview], object]


def _stream(f: io.BufferedReader, n: int, buf: bytearray, sinks: Sequence[Sink]) -> int:
    """Read up to ``n`` bytes in chunks through ``buf``, handing each to ``sinks``; bytes read."""
    view, got = memoryview(buf), 0
    while got < n:
        k = f.readinto(view[: min(len(buf), n - got)])
        if not k:
            break
        for sink in sinks:
            sink(view[:k])
        got += k
    return got


def _hash_whole(ctx: _Store, shard: ShardInfo, _blocks: int, work: _Work) -> list[Problem]:
    """Stream the whole ``.bin`` once: file hash, block hashes and token range."""
    where, bb = ctx.file(shard.bin_file), shard.block_bytes
    whole, scan = hashlib.sha256(), _RangeScan(ctx.dtype, ctx.manifest.vocab_size)
    found: list[tuple[int, str]] = []
    buf = bytearray(min(CHUNK_BYTES, bb))
    with ctx.open(shard.bin_file) as f:
        got = bb
        while got == bb:
            block = hashlib.sha256()
            got = _stream(f, bb, buf, [whole.update, block.update, scan.feed, ctx.tell_data])
            work.bytes_hashed += got
            if got:
                found.append((len(found), block.hexdigest()))
    work.blocks_checked += min(len(found), len(shard.block_sha256))
    problems = []
    if whole.hexdigest() != shard.bin_sha256:
        problems.append(_sha_problem(ctx, shard, where, whole.hexdigest()))
    if len(shard.block_sha256) > 1:  # a single block's hash is the file's: said above
        problems += _block_problems(shard, where, found)
    return problems + scan.problems(where)


def _hash_chosen(ctx: _Store, shard: ShardInfo, blocks: int, work: _Work) -> list[Problem]:
    """Hash and range-check only the blocks ``quick_blocks`` picks."""
    where, bb = ctx.file(shard.bin_file), shard.block_bytes
    chosen = quick_blocks(len(shard.block_sha256), blocks, shard.name)
    found: list[tuple[int, str]] = []
    problems: list[Problem] = []
    buf = bytearray(min(CHUNK_BYTES, bb))
    with ctx.open(shard.bin_file) as f:
        for i in chosen:
            f.seek(i * bb)
            block = hashlib.sha256()
            scan = _RangeScan(ctx.dtype, ctx.manifest.vocab_size, i * bb // ctx.dtype.itemsize)
            work.bytes_hashed += _stream(f, bb, buf, [block.update, scan.feed, ctx.tell_data])
            found.append((i, block.hexdigest()))
            problems += scan.problems(where)
    work.blocks_checked += len(chosen)
    return _block_problems(shard, where, found) + problems


def _sha_problem(ctx: _Store, shard: ShardInfo, where: str, digest: str) -> Problem:
    others = [s.bin_file for s in ctx.manifest.shards if s.bin_sha256 == digest]
    note = f" (the recorded sha256 of {others[0]})" if others else ""
    return Problem(where, "sha256 mismatch", shard.bin_sha256, digest + note)


def _block_problems(shard: ShardInfo, where: str, found: list[tuple[int, str]]) -> list[Problem]:
    return [
        Problem(where, f"block {i} sha256 mismatch", shard.block_sha256[i], digest)
        for i, digest in found
        if i < len(shard.block_sha256) and digest != shard.block_sha256[i]
    ]


def _check_eod(ctx: _Store, shard: ShardInfo, idx: np.ndarray, size: int) -> list[Problem]:
    """The token before each next document start, and the shard's last, is the EOD id."""
    n = min(shard.n_tokens, size // ctx.dtype.itemsize)
    if n == 0 or len(idx) == 0:
        return []
    with ctx.open(shard.bin_file) as f:
        if _has_fileno(f):
            tokens: Any = np.memmap(f, dtype=ctx.dtype, mode="r", shape=(n,))
        else:  # an object: every document end, read in chunks of the stream
            tokens = _ChunkedTokens(f, ctx.dtype, n)
        return _eod_problems(ctx, shard, idx, tokens, n)


@dataclass
class _EndChecks:
    """Documents whose token at one end (``ends``, ``starts``) is not the id ``want``: how many,
    and the first of them, as a finding reads it."""

    verb: str
    want: int
    count: int = 0
    first: str = ""

    def check(self, tokens: Any, lo: int, at: np.ndarray, keep: np.ndarray) -> None:
        """``at``: that end's token of documents ``lo``, ``lo + 1`` …; only those ``keep``
        marks are looked at."""
        values = tokens[at[keep]]
        bad = np.flatnonzero(values != self.want)
        if bad.size and not self.count:
            doc = lo + int(np.flatnonzero(keep)[bad[0]])
            where = int(at[keep][bad[0]])
            self.first = (
                f"document {doc} {self.verb} at token {where} with id {int(values[bad[0]])}"
            )
        self.count += bad.size

    def problems(self, file: str, what: str, expected: str) -> list[Problem]:
        if not self.count:
            return []
        found = f"{self.count} document(s) without it; first: {self.first}"
        return [Problem(file, what, expected, found)]


def _eod_problems(
    ctx: _Store, shard: ShardInfo, idx: np.ndarray, tokens: Any, n: int
) -> list[Problem]:
    """Every document ends with the EOD id and, in a store with a BOS, starts with it."""
    eod, bos = ctx.manifest.eod_id, ctx.manifest.bos_id
    ends, starts = _EndChecks("ends", eod), None if bos is None else _EndChecks("starts", bos)
    for lo in range(0, len(idx), INDEX_CHUNK):
        first = np.asarray(idx[lo : lo + INDEX_CHUNK])
        nxt = np.asarray(idx[lo + 1 : lo + INDEX_CHUNK + 1])
        if lo + INDEX_CHUNK >= len(idx):
            nxt = np.append(nxt, shard.n_tokens)
        ends.check(tokens, lo, nxt - 1, nxt - 1 < n)  # a truncated shard: reported already
        if starts is not None:  # an empty record is the index check's
            starts.check(tokens, lo, first, (first < n) & (first < nxt))
    del tokens
    file = ctx.file(shard.bin_file)
    out = ends.problems(file, "missing end-of-document id", f"id {eod} at every document end")
    if starts is not None:
        expected = f"id {bos} (the manifest's tokenizer.bos_id) at every document start"
        out += starts.problems(file, "missing beginning-of-document id", expected)
    return out


class _ChunkedTokens:
    """The tokens of an object's reader, indexed by ascending positions: each lookup reads the
    chunks that hold them (a document end check streams the shard once more, in order)."""

    def __init__(self, f: BinaryIO, dtype: np.dtype, n: int) -> None:
        self.f, self.dtype, self.n = f, dtype, n
        self.chunk = CHUNK_BYTES // dtype.itemsize

    def __getitem__(self, positions: np.ndarray) -> np.ndarray:
        out = np.empty(len(positions), dtype=self.dtype)
        chunks = positions // self.chunk
        for c in np.unique(chunks).tolist():
            lo = c * self.chunk
            hi = min(self.n, lo + self.chunk)
            self.f.seek(lo * self.dtype.itemsize)
            data = np.frombuffer(self.f.read((hi - lo) * self.dtype.itemsize), dtype=self.dtype)
            rows = chunks == c
            out[rows] = data[positions[rows] - lo]
        return out


__all__ = [
    "DEFAULT_QUICK_BLOCKS",
    "PlanRef",
    "Problem",
    "StoreReport",
    "Target",
    "bytes_to_hash",
    "check_megatron_target",
    "check_options",
    "check_store",
    "find_targets",
    "load_manifest",
    "quick_blocks",
    "verify_paths",
    "verify_store",
]

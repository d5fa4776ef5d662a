"""The plan: a TOML file in, a validated, resolved plan out (repeat table and index hash).

The plan file names the sources (token stores), their weights and repeat budgets, the sequence
length, the seed and the horizon. Resolving it opens each store's manifest, turns the weights
into exact rationals, and computes, per source, how many draws the horizon takes and so how many
passes over its data that is. ``docs/plan.md`` documents the file.

A source is a tokentape store directory or, read in place, a Megatron prefix
(``PREFIX.bin`` + ``PREFIX.idx``; ``format = "megatron"`` or detected), which needs the
vocabulary size and end-of-document id its ``.idx`` does not record (``vocab_size``,
``eod_id``, or a ``tokenizer`` that has them).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.megatron.format import DTYPE_NAMES, INTEGER_CODES
from tokentape._src.megatron.identity import MegatronRecord
from tokentape._src.megatron.source import MegatronSource, megatron_at_url
from tokentape._src.objects.client import is_url, object_store
from tokentape._src.objects.ranged import FetchConfig
from tokentape._src.plan.excision import PlanExcision, new_excision
from tokentape._src.plan.open import (
    FORMATS,
    MEGATRON,
    TOKENTAPE,
    detect_format,
    detect_remote_format,
    vocabulary_checked,
)
from tokentape._src.plan.spec import (
    PlanSpec,
    SourceSpec,
    plan_spec,
    plan_storage_options,
    resolve_tokenizer_spec,
    source_location,
)
from tokentape._src.store.atomic import write_output
from tokentape._src.store.format import Manifest
from tokentape._src.store.reader import Source, SourceManifest, TokenStream, source_at_url
from tokentape._src.store.remote import read_remote_manifest, store_versions
from tokentape._src.tape.blend import (
    MAX_DENOMINATOR,
    MAX_POSITION,
    exact_weights,
    rational_weights,
)
from tokentape._src.tape.excise import (
    MAX_EXCISED,
    Excision,
    base_limit_of,
    draws_at,
    draws_of_samples,
    samples_overlapping,
    sorted_unique,
    sources_at,
)
from tokentape._src.tape.resolve import Tape, as_positions
from tokentape._src.util.checks import (
    as_index,
    check_flag,
    check_int,
    check_number,
    check_path,
    is_int,
    shown,
)
from tokentape._src.util.progress import ProgressCallback
from tokentape._src.util.text import escaped
from tokentape.errors import (
    ArgumentError,
    InputError,
    OutOfRangeError,
    PlanError,
    StoreChanged,
    StoreError,
    TokentapeError,
    _reworded,
)

ALGORITHM_VERSION = 2
"""The version plans are resolved with. 2: a plan file without ``weight_denominator`` takes
its stated weights exactly (the smallest period that makes them exact, up to 2**16); 1 rounded
them over 2**16. A resolved plan records its weights (``weight_units`` over ``denominator``),
and from those the tape is the same function in both: see ``READABLE_VERSIONS``."""
READABLE_VERSIONS = (1, 2)
"""Resolved plans (and data states) of these versions are read: their tape is this code's.
The version stays in the index hash, so a plan re-resolved under another version is another
plan to a resume."""
PLAN_FORMAT = "tokentape.plan"

TOKEN_DTYPES = frozenset({"uint16", "uint32", *(DTYPE_NAMES[code] for code in INTEGER_CODES)})
"""The dtypes a source's token ids may be stored in (a tokentape store's, a Megatron prefix's)."""

_NO_FINGERPRINT = "none"
"""The tokenizer fingerprint of a source whose tokenizer is unknown: compared with nothing."""


@dataclass(frozen=True)
class PlanSource:
    """A source of a resolved plan: its spec, its store's identity, and its share of the tape.

    ``n_samples``, ``draws`` and ``passes`` follow from the plan that holds the source (its
    ``seq_len``, weights and horizon): a ``Plan`` sets them at construction, whatever the
    source given to it says."""

    name: str
    path: str
    weight: float
    max_repeats: float
    weight_units: int  # W_d: the exact weight is weight_units / denominator
    n_tokens: int
    n_samples: int  # (n_tokens - 1) // seq_len: derived, set by the plan
    dtype: str
    content_hash: str
    vocab_size: int
    eod_id: int
    tokenizer_fingerprint: str
    draws: int  # samples drawn over the horizon: derived, set by the plan
    passes: float  # draws / n_samples: derived, set by the plan
    format: str = TOKENTAPE  # "tokentape" (store directory) or "megatron" (prefix)
    tokenizer: str | None = None  # Megatron source: the tokenizer spec, paths made absolute
    megatron: MegatronRecord | None = None
    """Megatron source: both files' keys when the plan identified it, with the identity the
    loader then uses without hashing (None: the files were too recent, or a plan made before
    it was recorded; absent from PLAN.json for a tokentape store)."""
    versions: tuple[tuple[str, str], ...] = ()
    """A tokentape store at an object URL: (file name, version) of each of its objects when
    the plan was made (the ETag, on S3). A streamed object must still have it, and every read
    is pinned to it (``If-Match``): one rewritten since, even at the same size, is refused.
    Not in the index hash (re-uploading the same bytes gives other ETags, not another tape);
    absent from PLAN.json for a local source."""


@dataclass(frozen=True)
class PlanPhase:
    """A phase after the first (the first is the sources' own weights): from position
    ``start`` on, source d has the exact weight ``weight_units[d] / denominator`` (0 allowed)."""

    start: int
    weights: tuple[float, ...]  # the stated weight of each source, in plan order
    weight_units: tuple[int, ...]
    denominator: int


@dataclass(frozen=True)
class Plan:
    """A resolved mixture plan: what the loader, replay and locate open (``PLAN.json``).

    Made by ``tokentape plan --out`` or ``Plan.build`` and read back by ``load_plan``. The
    tape it defines is a pure function of it, identified by ``index_hash``.

    Every field is checked at construction, and the derived ones are computed from the others
    then, never taken from the caller: ``index_hash`` (not an argument) and each source's
    ``n_samples``, ``draws`` and ``passes``. So ``Plan(...)`` and ``dataclasses.replace(plan,
    seed=...)`` always carry the index hash of the tape they define, and a data state refuses
    to resume on them exactly when that tape differs below its ``consumed``.

    Attributes:
        algorithm_version: The version of the tape's algorithm the plan was resolved for (one
            of ``READABLE_VERSIONS``).
        seq_len: Tokens per sample (each window holds ``seq_len + 1``).
        seed: The seed of the blend and of every source's shuffle, in ``[0, 2**63)``.
        denominator: The weights are exact rationals ``weight_units / denominator``: the
            sources' ``weight_units`` sum to it.
        horizon_samples: The planned number of samples (the repeat budgets hold up to it).
        sources: The resolved sources, in plan order (names unique, one vocabulary).
        index_hash: Hash of everything that determines the tape; computed at construction.
        storage_options: fsspec options for the sources at object URLs (no credentials).
        phases: The phases after the first (``[[phase]]`` tables), in order of their starts,
            inside the horizon; the first phase is the sources' own weights, from position 0.
        excisions: What ``excise`` left out, in the order done (``PlanExcision``); the tape
            is the blend's with their positions removed.

    Raises:
        ArgumentError: A field of the wrong type or out of its range (the message names it).
        PlanError: Fields that disagree: weight units that do not sum to their denominator,
            phases out of order or beyond the horizon, a source never drawn, a store with
            fewer than ``seq_len + 1`` tokens, sources of different vocabularies.
    """

    algorithm_version: int
    seq_len: int
    seed: int
    denominator: int
    horizon_samples: int
    sources: tuple[PlanSource, ...]
    index_hash: str = field(init=False)
    """Computed at construction from the fields it covers (``plan_index_hash``)."""
    storage_options: dict[str, Any] = field(default_factory=dict, hash=False)
    """fsspec options for sources at object URLs (the plan file's ``storage_options``; never
    credentials). Not part of the index hash: a store's identity is its content."""
    phases: tuple[PlanPhase, ...] = ()
    excisions: tuple[PlanExcision, ...] = ()

    def __post_init__(self) -> None:
        """Check every field, then compute the derived ones from the others (see the class)."""
        set_field = functools.partial(object.__setattr__, self)
        _check_scalars(self)
        sources = _checked_sources(self.sources, self.seq_len)
        phases = _checked_phases(self.phases, sources, self.horizon_samples)
        set_field("storage_options", _checked_options(self.storage_options))
        units = [s.weight_units for s in sources]
        if sum(units) != self.denominator:
            raise PlanError(
                f"Plan: the sources' weight_units sum to {sum(units)}, not the denominator "
                f"{self.denominator}"
            )
        for d, s in enumerate(sources):
            if not units[d] and not any(p.weight_units[d] for p in phases):
                raise PlanError(f"Plan: source '{s.name}' has weight_units 0 in every phase")
        n_samples = tuple((s.n_tokens - 1) // self.seq_len for s in sources)
        tape = _tape(
            tuple(s.name for s in sources),
            n_samples,
            self.seed,
            ((0, tuple(units)), *((p.start, p.weight_units) for p in phases)),
        )
        excisions = _items("excisions", self.excisions, PlanExcision, "PlanExcision")
        excision = joined_excision(excisions)
        set_field("excisions", excisions)
        self.__dict__["_excision"] = excision  # what the cached property gives: joined once
        for k, e in enumerate(excisions):  # each made on this blend, with the ones before it
            on = plan_index_hash(sources, self.seq_len, self.seed, self.denominator,
                                 self.algorithm_version, phases, excisions[:k])  # fmt: skip
            if e.on != on:
                raise PlanError(
                    f"Plan: excision {k + 1} was made on the plan {e.on[:19]}…, not on this one "
                    f"({on[:19]}…): its positions are another blend's (a phase, the seed or a "
                    "source changed since); excise again on this plan"
                )
        limit = self.horizon_samples
        removed = np.zeros(len(sources), dtype=np.int64)
        if excision is not None:  # the draws of the horizon in base positions, less the excised
            limit = excision.base_limit(self.horizon_samples)
            below = excision.positions[excision.positions < limit]
            removed = np.bincount(sources_at(tape, below), minlength=len(sources))
        derived = []
        for d, s in enumerate(sources):
            draws = int(tape.blend.count(d, limit)) - int(removed[d])
            derived.append(
                replace(s, n_samples=n_samples[d], draws=draws, passes=draws / n_samples[d])
            )
        set_field("sources", tuple(derived))
        set_field("phases", phases)
        set_field("index_hash", expected_index_hash(self))

    @classmethod
    def build(
        cls,
        sources: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
        *,
        seq_len: int,
        seed: int,
        total_tokens: int | str | None = None,
        total_samples: int | str | None = None,
        weight_denominator: int | None = None,
        base_dir: str | os.PathLike[str] = ".",
        storage_options: Mapping[str, Any] | None = None,
        phases: Sequence[Mapping[str, Any]] = (),
        mixed_bos: bool = False,
    ) -> Plan:
        """Resolve a plan given in Python, exactly as ``tokentape plan`` resolves a TOML file.

        The arguments are the plan file's keys (see ``docs/plan.md``): they go through the same
        validation and resolution, so a plan built here has the same index hash and the same
        ``PLAN.json`` as the equivalent TOML file, and is refused for the same reasons.

        Args:
            sources: ``{name: {"path": ..., "weight": ..., ...}}`` (in order), or a list of
                ``[[source]]`` tables each with its ``"name"``. Keys of a source: ``path``,
                ``weight``, ``max_repeats``, ``format``, ``vocab_size``, ``eod_id``,
                ``tokenizer``.
            seq_len: Tokens per sample.
            seed: Seed of the blend and the shuffles, in ``[0, 2**63)``.
            total_tokens: The horizon in tokens (an integer or a count such as ``"2T"``).
            total_samples: The horizon in samples (instead of ``total_tokens``).
            weight_denominator: The period of the exact weights; default: the smallest that
                makes the stated weights exact (60/30/10: 10), up to 2**16, else rounded over
                2**16.
            base_dir: Relative source paths (and tokenizer paths) start here, as they start
                at a plan file's directory.
            storage_options: fsspec options for sources at object URLs (``s3://...``), e.g.
                ``{"endpoint_url": ...}``; recorded in the plan, so no credentials (those come
                from the environment or a profile).
            phases: The phases after the first, as the plan file's ``[[phase]]`` tables:
                ``{"start_tokens": "1.8T", "weights": {"math": 60, ...}}`` (or
                ``start_samples``); a source not named has weight 0 in that phase.
            mixed_bos: Blend stores whose documents start differently (one tokenized with a
                beginning-of-document token, one without, or with another); refused by
                default.

        Returns:
            The resolved plan.

        Raises:
            ArgumentError: An argument of the wrong type (``seq_len`` not an integer, ...),
                ``sources`` is neither a dict of tables nor a list of them, a table of the dict
                also gives a ``name``, or ``base_dir`` is not a path.
            PlanError: A key of a table is missing, unknown or of the wrong type or range, a
                value is out of its range (``seq_len`` 0, ...), the sources disagree
                (tokenizer, vocabulary, beginning-of-document token), or a source would be
                repeated beyond its ``max_repeats``.
            StoreError: A source's store is missing or damaged.
        """
        _check_build_args(
            seq_len, seed, total_tokens, total_samples, weight_denominator, storage_options, phases
        )
        check_flag("mixed_bos", mixed_bos)
        tables: list[dict[str, Any]]
        if isinstance(sources, Mapping):
            tables = []
            for name, table in sources.items():
                if not isinstance(table, Mapping):
                    raise ArgumentError(
                        f"sources[{name!r}]: expected a table (a dict), got {shown(table)}"
                    )
                if "name" in table:
                    raise ArgumentError(
                        f"sources[{name!r}]: give the name as the key only, not as 'name'"
                    )
                tables.append({"name": name, **table})
        elif isinstance(sources, Sequence) and not isinstance(sources, str | bytes):
            if not all(isinstance(t, Mapping) for t in sources):
                raise ArgumentError(
                    f"sources: expected a list of tables (dicts), got {shown(list(sources))}"
                )
            tables = [dict(t) for t in sources]
        else:
            raise ArgumentError(
                f"sources: expected a dict of name -> table or a list of tables, got "
                f"{type(sources).__name__}"
            )
        for table in tables:
            for key in ("path", "tokenizer"):
                if isinstance(table.get(key), os.PathLike):
                    table[key] = os.fspath(table[key])
        keys = {
            "total_tokens": total_tokens,
            "total_samples": total_samples,
            "weight_denominator": weight_denominator,
        }
        data = {"seq_len": seq_len, "seed": seed, "source": tables}
        data |= {k: v for k, v in keys.items() if v is not None}
        if storage_options is not None:
            data["storage_options"] = storage_options
        if phases:
            data["phase"] = [dict(p) for p in phases]
        if mixed_bos:
            data["mixed_bos"] = True
        where = "plan"
        check_path("base_dir", base_dir)
        plan = resolve_plan(plan_spec(data, where, os.fspath(base_dir)), where)
        check_budgets(plan, where)
        return plan

    @property
    def vocab_size(self) -> int:
        """The vocabulary size every source of the plan shares (token ids are below it)."""
        return self.sources[0].vocab_size

    @property
    def eod_id(self) -> int:
        """The end-of-document id every source of the plan shares."""
        return self.sources[0].eod_id

    def tape(self) -> Tape:
        """The tape: position -> (source, epoch, sample), a pure function of the plan.

        Returns:
            The plan's ``Tape`` (``resolve(positions)``, ``position_of(...)``); immutable, and
            the same object for plans of the same tape (built once, see ``_tape``).
        """
        base = _tape(
            tuple(s.name for s in self.sources),
            tuple(s.n_samples for s in self.sources),
            self.seed,
            tuple(zip(self.phase_starts, self.phase_units, strict=True)),
        )
        return base if not self.excisions else base.with_excision(self._excision)

    def excise(
        self,
        from_consumed: int,
        *,
        docs: Sequence[tuple[str, int]] = (),
        ids: Sequence[str] = (),
        positions: Sequence[int] | np.ndarray = (),
        steps: tuple[int, int] | None = None,
    ) -> Plan:
        """This plan with documents, or samples, left out of the run from ``from_consumed`` on.

        The new plan gives the same sample at every position below ``from_consumed``; from
        it on, its sequence is this plan's without every sample that holds a token of one of
        ``docs`` (below the horizon) and without the samples at ``positions``, the others in
        the same order. A run resumes on it from a checkpoint at ``consumed`` up to the first
        position it changes (``excisions[-1].first``). Computed in closed form from the
        documents' draws (as ``locate`` finds them), never by walking the horizon.

        Args:
            from_consumed: The ``consumed`` of the checkpoint the run goes on from.
            docs: Documents to leave out, as (source name, document id).
            ids: Documents to leave out by the id of their record (every document of every
                source with that id; the stores must record provenance).
            positions: Positions of this plan to leave out (each at or after
                ``from_consumed``), e.g. those of logged steps.
            steps: The logged steps ``positions`` came from (first, last), for the record.

        Returns:
            The new plan (its ``excisions`` record this one: what it left out per source).

        Raises:
            ArgumentError: A document or position of the wrong type.
            InputError: An unknown source; an id no document has.
            OutOfRangeError: A document out of range, a position below ``from_consumed``.
            PlanError: Nothing to leave out, or more than ``MAX_EXCISED`` samples in all.
            StoreError: A store that changed since the plan was made.
        """
        c = check_int("from_consumed", from_consumed, 0, MAX_POSITION - 1)
        if isinstance(docs, str | bytes) or not isinstance(docs, Sequence):
            raise ArgumentError(f"docs must be a list of (source, doc) pairs, got {shown(docs)}")
        if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
            raise ArgumentError(f"ids must be a list of ids (text), got {shown(ids)}")
        opened: dict[int, TokenStream] = {}  # each store opened once, for ids and documents
        docs = [*docs, *_docs_with_ids(self, ids, opened)]
        wanted = as_positions(positions)
        if wanted.ndim != 1:
            raise ArgumentError(f"positions must be one-dimensional, got shape {wanted.shape}")
        if wanted.size and int(wanted.max()) >= self.horizon_samples:
            raise OutOfRangeError(
                f"excise: position {int(wanted.max()):,} is at or past the horizon "
                f"({self.horizon_samples:,} samples): an excision covers the plan's horizon"
            )
        if steps is not None and not (
            isinstance(steps, tuple) and len(steps) == 2 and all(is_int(x) for x in steps)
            and 0 <= steps[0] <= steps[1]
        ):  # fmt: skip
            raise ArgumentError(f"steps must be None or (first, last) steps, got {shown(steps)}")
        found = excised_positions(self, c, docs, wanted, opened)
        if not found.size:
            raise PlanError(
                f"excise from consumed {c:,}: nothing to leave out (no sample at or after it, "
                "below the horizon, holds a token of these documents)"
            )
        x = self._excision
        first = int(found[0]) if x is None else int(x.to_new(found[:1])[0][0])
        names = [s.name for s in self.sources]
        sources = sources_at(self.tape(), found)
        named = tuple(dict.fromkeys((str(n), int(d)) for n, d in docs))
        record = new_excision(c, first, self.index_hash, found, sources, names, named, steps)
        return replace(self, excisions=(*self.excisions, record))

    @functools.cached_property
    def _excision(self) -> Excision | None:
        """Every excision's positions, joined (None without one)."""
        return joined_excision(self.excisions)

    @property
    def phase_starts(self) -> tuple[int, ...]:
        """The first position of every phase, the first phase (position 0) included."""
        return (0, *(p.start for p in self.phases))

    @property
    def phase_units(self) -> list[tuple[int, ...]]:
        """Every phase's weight units, the first phase (the sources' weights) included."""
        return [tuple(s.weight_units for s in self.sources), *(p.weight_units for p in self.phases)]

    @property
    def phase_denominators(self) -> tuple[int, ...]:
        """Every phase's period (its units' sum), the first phase's included."""
        return (self.denominator, *(p.denominator for p in self.phases))

    @property
    def phase_spans(self) -> list[tuple[int, int]]:
        """Every phase's positions [start, end) up to the horizon (the last ends there)."""
        ends = (*self.phase_starts[1:], self.horizon_samples)
        return list(zip(self.phase_starts, ends, strict=True))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as ``PLAN.json`` (what ``tokentape plan --out`` writes), atomically.

        Args:
            path: The file to write, or an object URL (``s3://bucket/plans/PLAN.json``);
                replaced whole, a reader sees the old or the new file.

        Raises:
            ArgumentError: ``path`` is not a path.
            OutputError: The file cannot be written (the message names it).
        """
        check_path("path", path)
        write_output(path, self.to_json().encode())

    def to_json(self) -> str:
        """The plan as ``PLAN.json`` text (what ``load_plan`` reads back).

        Returns:
            The JSON text, ending with a newline.
        """
        data = {"format": PLAN_FORMAT, **asdict(self)}
        if not data["storage_options"]:  # PLAN.json of a local plan: as before
            del data["storage_options"]
        if not data["phases"]:  # PLAN.json of a plan in one phase: as before
            del data["phases"]
        if self.excisions:
            data["excisions"] = [e.to_json() for e in self.excisions]
        else:  # PLAN.json of a plan without excisions: as before
            del data["excisions"]
        for source in data["sources"]:
            if source["megatron"] is None:
                del source["megatron"]
            if source["versions"]:
                source["versions"] = dict(source["versions"])
            else:
                del source["versions"]
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _check_build_args(
    seq_len: object,
    seed: object,
    total_tokens: object,
    total_samples: object,
    weight_denominator: object,
    storage_options: object,
    phases: object,
) -> None:
    """The types of ``Plan.build``'s arguments (their values are the plan file's: checked, as
    for a file, by ``plan_spec``)."""
    for name, value in (("seq_len", seq_len), ("seed", seed)):
        if not is_int(value):
            raise ArgumentError(f"{name} must be an integer, got {shown(value)}")
    for name, value in (("total_tokens", total_tokens), ("total_samples", total_samples)):
        if value is not None and not is_int(value) and not isinstance(value, str):
            raise ArgumentError(
                f"{name} must be an integer or a count such as '2T', got {shown(value)}"
            )
    if weight_denominator is not None and not is_int(weight_denominator):
        raise ArgumentError(
            f"weight_denominator must be an integer or None, got {shown(weight_denominator)}"
        )
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise ArgumentError(
            f"storage_options must be a dict of option name -> value, got {shown(storage_options)}"
        )
    if (
        isinstance(phases, str | bytes)
        or not isinstance(phases, Sequence)
        or not all(isinstance(p, Mapping) for p in phases)
    ):
        raise ArgumentError(f"phases must be a list of tables (dicts), got {shown(phases)}")


@functools.lru_cache(maxsize=4)
def _tape(
    names: tuple[str, ...],
    n_samples: tuple[int, ...],
    seed: int,
    phases: tuple[tuple[int, tuple[int, ...]], ...],
) -> Tape:
    """``build_tape``, cached: a plan builds its tape at construction (its sources' draws), and
    the loader, replay and locate ask for the same tape again. A ``Tape`` is immutable (frozen,
    its arrays read-only), so one object serves them all."""
    return build_tape(names, n_samples, seed, phases)


def _check_scalars(plan: Plan) -> None:
    """The plan's own numbers: of their types, in their ranges."""
    version = plan.algorithm_version
    if not is_int(version) or version not in READABLE_VERSIONS:
        raise ArgumentError(
            f"Plan: algorithm_version must be one of {', '.join(map(str, READABLE_VERSIONS))}, "
            f"got {shown(version)}"
        )
    check_int("Plan: seq_len", plan.seq_len, 1, MAX_POSITION)
    check_int("Plan: seed", plan.seed, 0, 2**63 - 1)
    check_int("Plan: denominator", plan.denominator, 1, MAX_DENOMINATOR)
    check_int("Plan: horizon_samples", plan.horizon_samples, 1, MAX_POSITION - 1)


def _items(name: str, value: object, kind: type, what: str) -> tuple[Any, ...]:
    """A tuple (or list) of ``kind``, as a tuple."""
    if not isinstance(value, tuple | list) or not all(isinstance(v, kind) for v in value):
        raise ArgumentError(f"Plan: {name} must be a tuple of {what}, got {shown(value)}")
    return tuple(value)


def _checked_sources(value: object, seq_len: int) -> tuple[PlanSource, ...]:
    """The sources: each field of its type and range, names unique, one vocabulary."""
    sources = _items("sources", value, PlanSource, "PlanSource")
    if not sources:
        raise ArgumentError("Plan: sources must not be empty")
    for i, s in enumerate(sources):
        _check_source(s, f"Plan: sources[{i}]", seq_len)
    names = [s.name for s in sources]
    for name in names:
        if names.count(name) > 1:
            raise PlanError(f"Plan: source name '{name}' appears twice")
    first = sources[0]
    for s in sources[1:]:
        if (s.vocab_size, s.eod_id) != (first.vocab_size, first.eod_id):
            raise PlanError(
                f"Plan: source '{s.name}' has vocab_size {s.vocab_size} / eod_id {s.eod_id}, "
                f"'{first.name}' has {first.vocab_size} / {first.eod_id}"
            )
    return sources


def _check_text(name: str, value: object) -> None:
    if not isinstance(value, str) or not value or not value.isprintable():
        raise ArgumentError(f"{name} must be a non-empty printable string, got {shown(value)}")


def _check_source(s: PlanSource, where: str, seq_len: int) -> None:
    """One source's fields (the derived ones are set by the plan, whatever they are)."""
    _check_text(f"{where}: name", s.name)
    here = f"{where} ('{s.name}')"
    for key in ("path", "content_hash", "tokenizer_fingerprint"):
        _check_text(f"{here}: {key}", getattr(s, key))
    check_number(f"{here}: weight", s.weight, 0)
    check_number(f"{here}: max_repeats", s.max_repeats, 0, positive=True)
    check_int(f"{here}: weight_units", s.weight_units, 0, MAX_DENOMINATOR)
    check_int(f"{here}: vocab_size", s.vocab_size, 1)
    check_int(f"{here}: eod_id", s.eod_id, 0, s.vocab_size - 1)
    check_int(f"{here}: n_tokens", s.n_tokens, 2, MAX_POSITION)
    if not isinstance(s.dtype, str) or s.dtype not in TOKEN_DTYPES:
        raise ArgumentError(
            f"{here}: dtype must be one of {', '.join(sorted(TOKEN_DTYPES))}, got {shown(s.dtype)}"
        )
    if not isinstance(s.format, str) or s.format not in FORMATS:
        raise ArgumentError(
            f"{here}: format must be one of {', '.join(FORMATS)}, got {shown(s.format)}"
        )
    if s.tokenizer is not None:
        _check_text(f"{here}: tokenizer", s.tokenizer)
    if not isinstance(s.versions, tuple) or not all(
        isinstance(v, tuple) and len(v) == 2 and all(isinstance(x, str) and x for x in v)
        for v in s.versions
    ):
        raise ArgumentError(
            f"{here}: versions must be a tuple of (file name, version) pairs of strings, got "
            f"{shown(s.versions)}"
        )
    if s.megatron is not None and not isinstance(s.megatron, MegatronRecord):
        raise ArgumentError(f"{here}: megatron must be a MegatronRecord or None")
    if s.format == TOKENTAPE and (s.tokenizer is not None or s.megatron is not None):
        key = "tokenizer" if s.tokenizer is not None else "megatron"
        raise ArgumentError(f"{here}: {key} applies to a Megatron source, not a tokentape store")
    if (s.weight == 0) != (s.weight_units == 0):
        raise PlanError(
            f"{here}: weight {s.weight:g} and weight_units {s.weight_units}: one is 0, the "
            "other not"
        )
    if s.n_tokens < seq_len + 1:
        raise PlanError(
            f"{here}: n_tokens {s.n_tokens} is fewer than seq_len + 1 = {seq_len + 1}: not one "
            "sample"
        )


def _checked_phases(
    value: object, sources: tuple[PlanSource, ...], horizon: int
) -> tuple[PlanPhase, ...]:
    """The later phases: starts increasing inside the horizon, one weight per source, units
    that sum to their denominator."""
    phases = _items("phases", value, PlanPhase, "PlanPhase")
    checked = []
    before = 0
    for i, p in enumerate(phases):
        where = f"Plan: phases[{i}]"
        check_int(f"{where}: start", p.start, 1, MAX_POSITION - 1)
        check_int(f"{where}: denominator", p.denominator, 1, MAX_DENOMINATOR)
        if not before < p.start < horizon:
            raise PlanError(
                f"{where}: start {p.start} is not after {before} (the phase before) and below "
                f"horizon_samples {horizon}"
            )
        lists = {}
        for key in ("weights", "weight_units"):
            values = getattr(p, key)
            if not isinstance(values, tuple | list) or len(values) != len(sources):
                raise ArgumentError(
                    f"{where}: {key} must hold one value per source ({len(sources)}), got "
                    f"{shown(values)}"
                )
            lists[key] = tuple(values)
        for d, w in enumerate(lists["weights"]):
            check_number(f"{where}: weights[{d}]", w, 0)
        for d, u in enumerate(lists["weight_units"]):
            check_int(f"{where}: weight_units[{d}]", u, 0, MAX_DENOMINATOR)
        units = lists["weight_units"]
        if sum(units) != p.denominator or not any(units):
            raise PlanError(
                f"{where}: weight_units sum to {sum(units)}, not its denominator "
                f"{p.denominator} (one positive at least)"
            )
        if any((w == 0) != (u == 0) for w, u in zip(lists["weights"], units, strict=True)):
            raise PlanError(f"{where}: a weight and its weight_units disagree on 0")
        checked.append(replace(p, **lists))
        before = p.start
    return tuple(checked)


def _checked_options(value: object) -> dict[str, Any]:
    """The storage options: a table of options with text keys, no credentials."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ArgumentError(
            f"Plan: storage_options must be a dict of option name -> value, got {shown(value)}"
        )
    return plan_storage_options(value, "Plan")


def excised_positions(
    plan: Plan,
    c: int,
    docs: Sequence[tuple[str, int]],
    wanted: np.ndarray,
    opened: dict[int, TokenStream],
) -> np.ndarray:
    """The base positions an excision from ``c`` adds to ``plan``'s: the plan's positions
    ``wanted`` and every draw, from ``c`` on, of a sample holding a token of ``docs`` (or of
    an earlier excision's documents), up to the horizon of the excised plan. Each position left
    out brings one more within the horizon, so the draws are searched again in the stretch the
    horizon grew by, until it no longer grows; all of a source's samples at once, pass by
    pass. ``opened``: the plan's stores opened so far, by source (added to)."""
    x = plan._excision
    tape = plan.tape().base
    wanted = sorted_unique(wanted)
    if wanted.size and int(wanted[0]) < c:
        raise OutOfRangeError(f"excise: position {int(wanted[0]):,} is below from_consumed {c:,}")
    added = wanted if x is None else x.to_base(wanted)
    low = c if x is None else x.base_limit(c)
    before = [] if x is None else [x.positions]
    # the earlier excisions' documents too: the horizon grows by what this one leaves out, so
    # their draws in the stretch it grows by must go as well
    earlier = [d for e in plan.excisions for d in e.docs]
    samples = _doc_samples(plan, [*docs, *earlier], opened)
    start, total = low, int(added.size)
    windows: list[np.ndarray] = []  # each window's draws, sorted: later windows lie above
    while samples:
        limit = base_limit_of([*before, added, *windows], plan.horizon_samples)
        if limit <= start:
            break
        total += sum(draws_of_samples(tape, d, k, limit, start) for d, k in samples.items())
        if total > MAX_EXCISED:
            raise PlanError(
                f"excise: over {MAX_EXCISED:,} samples to leave out (the documents' draws "
                f"within the horizon, {total:,} found so far); at most {MAX_EXCISED:,}"
            )
        found = np.concatenate([draws_at(tape, d, k, limit, start)[0] for d, k in samples.items()])
        if x is not None and found.size:
            found = found[x.to_new(found)[1]]  # not those left out already
        windows.append(np.sort(found[~np.isin(found, added)] if added.size else found))
        start = limit
    if not windows:
        return added
    drawn = np.concatenate(windows)
    return sorted_unique(np.concatenate([added, drawn])) if added.size else drawn


def _store(plan: Plan, d: int, opened: dict[int, TokenStream]) -> TokenStream:
    """Source ``d``'s store (``open_planned``), opened once into ``opened``."""
    if d not in opened:
        opened[d] = open_planned(plan, d)
    return opened[d]


def _docs_with_ids(
    plan: Plan, ids: Sequence[str], opened: dict[int, TokenStream]
) -> list[tuple[str, int]]:
    """Every (source, doc) whose record's id is one of ``ids``, in the plan's source order;
    an id no document has is refused, naming it."""
    if not ids:
        return []
    for value in ids:
        if not isinstance(value, str) or not value:
            raise ArgumentError(f"ids must be non-empty text, got {shown(value)}")
    stores = [_store(plan, d, opened) for d in range(len(plan.sources))]
    searched = [(s.name, store) for s, store in zip(plan.sources, stores, strict=True)
                if store.has_provenance]  # fmt: skip
    if not searched:
        raise StoreError("excise: no source of the plan records provenance: cannot find ids")
    found: list[tuple[str, int]] = []
    for value in dict.fromkeys(ids):
        hits = [(name, doc) for name, store in searched for doc in store.find_id(value)]
        if not hits:
            raise InputError(f"excise: no document of the plan's sources has id {shown(value)}")
        found += hits
    return found


def _doc_samples(
    plan: Plan, docs: Sequence[tuple[str, int]], opened: dict[int, TokenStream]
) -> dict[int, np.ndarray]:
    """Source index → the samples (ascending) overlapping any of ``docs`` of that source."""
    names = [s.name for s in plan.sources]
    ranges: dict[int, list[np.ndarray]] = {}
    for item in docs:
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise ArgumentError(f"excise: docs must be (source, doc) pairs, got {shown(item)}")
        name, doc = item
        if name not in names:
            raise InputError(f"excise: unknown source {shown(name)}; the plan has: "
                             f"{', '.join(names)}")  # fmt: skip
        d = names.index(name)
        store = _store(plan, d, opened)
        doc = as_index(f"excise: document of '{name}'", doc)
        if doc >= store.n_docs:
            raise OutOfRangeError(f"excise: source '{name}' has documents 0..{store.n_docs - 1}, "
                                  f"not {doc}")  # fmt: skip
        k = samples_overlapping(store.doc_span(doc), plan.seq_len, plan.sources[d].n_samples)
        ranges.setdefault(d, []).append(np.arange(k.start, k.stop, dtype=np.int64))
    return {d: sorted_unique(np.concatenate(r)) for d, r in ranges.items()}


def open_planned(plan: Plan, index: int, fetch: FetchConfig | None = None) -> TokenStream:
    """Open the store of source ``index``, refusing one that is not (or no longer) the store
    the plan was made with; ``fetch``: how a store in object storage is read."""
    spec = plan.sources[index]
    try:
        store = open_plan_store(spec, plan.storage_options, fetch)
    except TokentapeError as exc:
        raise _reworded(exc, f"plan source '{spec.name}': {exc}") from None
    return check_planned(plan, index, store)


def check_planned(plan: Plan, index: int, store: TokenStream) -> TokenStream:
    """``store`` when it is the one source ``index`` was planned with (same content hash,
    token count and dtype); otherwise an error naming the source and what differs."""
    s, m = plan.sources[index], store.manifest
    if m.content_hash != s.content_hash:
        raise StoreChanged(
            f"store '{s.path}' (source '{s.name}') changed since the plan was made: content "
            f"hash {s.content_hash[:19]}… → {m.content_hash[:19]}…; re-run `tokentape plan`",
            path=s.path,
            planned=s.content_hash,
            found=m.content_hash,
        )
    if (m.n_tokens, m.dtype) != (s.n_tokens, s.dtype):
        raise StoreError(
            f"store '{s.path}' (source '{s.name}') has {m.n_tokens} {m.dtype} tokens, the "
            f"plan says {s.n_tokens} {s.dtype} (edited by hand?); re-run `tokentape plan`"
        )
    return store


def joined_excision(excisions: Sequence[PlanExcision]) -> Excision | None:
    """The positions of every excision as one ``Excision`` (None without one); excisions that
    overlap, or more positions than ``MAX_EXCISED``, are refused."""
    if not excisions:
        return None
    total = sum(e.count for e in excisions)
    if total > MAX_EXCISED:
        raise PlanError(f"Plan: {total:,} excised samples; at most {MAX_EXCISED:,} are kept")
    joined = np.sort(np.concatenate([e.positions for e in excisions]))
    if joined.size > 1 and not bool(np.all(joined[1:] > joined[:-1])):
        raise PlanError("Plan: two excisions leave out the same position (edited by hand?)")
    return Excision(joined)


def build_tape(
    names: Sequence[str],
    n_samples: Sequence[int],
    seed: int,
    phases: Sequence[tuple[int, Sequence[int]]],
) -> Tape:
    """The tape of a plan: ``phases`` is each phase's (start, weight units), the first at 0;
    one phase whose weights are all positive is a plain blend."""
    if len(phases) == 1 and all(u > 0 for u in phases[0][1]):
        return Tape.build(names, n_samples, phases[0][1], seed)
    starts = [start for start, _ in phases]
    return Tape.build_phased(names, n_samples, starts, [units for _, units in phases], seed)


# --- resolving ------------------------------------------------------------------------------


def index_hash(
    seq_len: int,
    seed: int,
    denominator: int,
    sources: list[tuple[str, int, int, str, str]],
    version: int = ALGORITHM_VERSION,
    phases: Sequence[tuple[int, Sequence[int]]] = (),
    excisions: Sequence[Mapping[str, Any]] = (),
) -> str:
    """Hash of the canonical inputs that change the tape (never the horizon or budgets).

    ``sources``: per source, in plan order, (name, weight units W_d, n_tokens, dtype,
    content hash of its store); ``version``: the algorithm version the plan was resolved with;
    ``phases``: each later phase's (start, weight units), hashed only when there are some (a
    plan in one phase hashes as before phases existed); ``excisions``: each excision's
    identity (``PlanExcision.identity``), hashed only when there are some.
    """
    inputs: dict[str, Any] = {
        "algorithm_version": version,
        "seq_len": seq_len,
        "seed": seed,
        "sources": [
            {
                "name": name,
                "weight": f"{w}/{denominator}",
                "n_tokens": n_tokens,
                "dtype": dtype,
                "content": content,
            }
            for name, w, n_tokens, dtype, content in sources
        ],
    }
    if phases:
        inputs["phases"] = [
            {"start": start, "weights": [f"{u}/{sum(units)}" for u in units]}
            for start, units in phases
        ]
    if excisions:
        inputs["excisions"] = [dict(e) for e in excisions]
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def plan_index_hash(
    plan_sources: tuple[PlanSource, ...],
    seq_len: int,
    seed: int,
    den: int,
    version: int = ALGORITHM_VERSION,
    phases: Sequence[PlanPhase] = (),
    excisions: Sequence[PlanExcision] = (),
) -> str:
    rows = [(s.name, s.weight_units, s.n_tokens, s.dtype, s.content_hash) for s in plan_sources]
    later = [(p.start, p.weight_units) for p in phases]
    cut = [e.identity() for e in excisions]
    return index_hash(seq_len, seed, den, rows, version, later, cut)


def expected_index_hash(plan: Plan) -> str:
    """The index hash ``plan``'s fields give: what a plan sets as its ``index_hash`` at
    construction (a hash recorded in a file must match it)."""
    return plan_index_hash(
        plan.sources, plan.seq_len, plan.seed, plan.denominator, plan.algorithm_version,
        plan.phases, plan.excisions,
    )  # fmt: skip


def _bos_words(m: SourceManifest) -> str:
    bos = m.tokenizer.get("bos_id")
    if bos is None:
        return "no beginning-of-document token"
    return f"beginning-of-document id {bos} ('{_escaped(m.tokenizer.get('bos_token'))}')"


def _check_bos(stores: list[tuple[str, SourceManifest]], where: str) -> None:
    """Refuse tokentape stores whose documents start differently (one with a BOS token, one
    without, or with another): the mixture would teach both (a Megatron prefix records no
    BOS and is not compared)."""
    other = _disagreeing(stores, lambda m: m.tokenizer.get("bos_id"))
    if other is not None:
        (name, m), (first_name, first) = other
        raise PlanError(
            f"{where}: source '{name}' starts its documents with {_bos_words(m)}, "
            f"'{first_name}' with {_bos_words(first)}; re-tokenize one of them (tokentape "
            "tokenize --bos, --bos-token or --no-bos), or set mixed_bos = true in the plan "
            "to blend them as they are"
        )


_Named = tuple[str, SourceManifest]


def _disagreeing(
    stores: list[_Named], key: Callable[[SourceManifest], object]
) -> tuple[_Named, _Named] | None:
    """The first of ``stores`` whose ``key`` differs from the first store's, and the first."""
    for name, m in stores[1:]:
        if key(m) != key(stores[0][1]):
            return (name, m), stores[0]
    return None


@dataclass(frozen=True)
class _Opened:
    """What resolving a plan takes from one source: its format and manifest, and what the
    plan records of it (a local Megatron prefix's keys; a bucket store's object versions)."""

    kind: str
    manifest: SourceManifest
    record: MegatronRecord | None = None
    versions: tuple[tuple[str, str], ...] = ()


def _open_source(
    s: SourceSpec,
    path: Path | str,
    progress: ProgressCallback | None,
    storage_options: Mapping[str, Any],
) -> _Opened:
    """Open the source (a Megatron prefix: validated, identified, hashed if no identity is
    current). A store at an object URL: its manifest is read and its objects listed (their
    versions), nothing else; a Megatron prefix there: its sidecar and both objects' sizes."""
    if isinstance(path, str):
        kind = s.format or detect_remote_format(path, storage_options)
        if kind == MEGATRON:
            remote = megatron_at_url(
                path, s.vocab_size, s.eod_id, s.tokenizer, storage_options=storage_options
            )
            return _Opened(kind, remote.manifest)
        if s.tokenizer is not None:
            raise PlanError(
                "'tokenizer' applies to a Megatron source; a tokentape store records its own"
            )
        objects = object_store(path, storage_options)
        manifest = _checked(s, read_remote_manifest(objects, path))
        return _Opened(kind, manifest, versions=store_versions(objects, path, manifest))
    kind = s.format or detect_format(path)
    if kind == MEGATRON:
        source = MegatronSource(path, s.vocab_size, s.eod_id, s.tokenizer, progress=progress)
        return _Opened(kind, source.manifest, source.plan_record())
    if s.tokenizer is not None:
        raise PlanError(
            "'tokenizer' applies to a Megatron source; a tokentape store records its own"
        )
    m = Source(path).manifest  # opened, not only read: shard files missing or cut short refused
    return _Opened(kind, _checked(s, m))


def _checked(s: SourceSpec, m: Manifest) -> Manifest:
    """``m`` when it agrees with the vocabulary the plan states for the source."""
    for key, given in (("vocab_size", s.vocab_size), ("eod_id", s.eod_id)):
        if given is not None and given != getattr(m, key):
            raise PlanError(f"'{key}' is {given} but the store's manifest says {getattr(m, key)}")
    return m


def _escaped(value: object) -> str:
    """``value`` as text for a one-line message (a crafted manifest's escape sequence, a
    newline: escaped)."""
    return escaped(str(value))


def _tokenizer_words(info: Mapping[str, Any]) -> str:
    """A store's tokenizer in a few words: kind, file name, vocabulary size and EOD (id and
    token), every manifest field escaped (see ``_escaped``)."""
    spec = str(info.get("spec", "?"))
    kind = _escaped(info.get("kind", "?"))
    path = spec.removeprefix("tiktoken:").removeprefix("hf:").rstrip("/\\")
    name = "" if kind == "bytes" else f" '{_escaped((os.path.basename(path) or spec)[:60])}'"
    eod = f"EOD {_escaped(info.get('eod_id', '?'))}"
    if info.get("eod_token") is not None:
        eod += f" '{_escaped(str(info['eod_token'])[:60])}'"
    return f"{kind}{name} (vocabulary {_escaped(info.get('vocab_size', '?'))}) and {eod}"


def resolve_plan(
    spec: PlanSpec, where: str = "plan", progress: ProgressCallback | None = None
) -> Plan:
    """Open every source's store, check they agree, and compute the blend and repeat table.
    ``progress`` receives the hashing of a Megatron prefix that has no current identity."""
    manifests: list[tuple[str, SourceManifest]] = []
    paths: list[str] = []
    tokenizers: list[str | None] = []
    opened: list[_Opened] = []
    for s in spec.sources:
        path = source_location(spec.base_dir, s.path)
        tok = s.tokenizer and resolve_tokenizer_spec(s.tokenizer, spec.base_dir)
        try:
            found = _open_source(
                SourceSpec(**{**asdict(s), "tokenizer": tok}), path, progress, spec.storage_options
            )
        except TokentapeError as exc:
            raise _reworded(exc, f"{where}: source '{s.name}': {exc}") from None
        manifests.append((s.name, found.manifest))
        paths.append(path.rstrip("/") if isinstance(path, str) else str(path.resolve()))
        tokenizers.append(tok)
        opened.append(found)
    known = [(n, m) for n, m in manifests if m.tokenizer.get("fingerprint") != _NO_FINGERPRINT]
    other = _disagreeing(known, lambda m: m.tokenizer.get("fingerprint"))
    if other is not None:
        (name, m), (first_name, first) = other
        raise PlanError(
            f"{where}: source '{name}' was tokenized with another tokenizer than "
            f"'{first_name}' ({_escaped(m.tokenizer.get('fingerprint'))} vs "
            f"{_escaped(first.tokenizer.get('fingerprint'))}): '{name}' with "
            f"{_tokenizer_words(m.tokenizer)}, '{first_name}' with "
            f"{_tokenizer_words(first.tokenizer)}; re-tokenize it"
        )
    if not spec.mixed_bos:
        _check_bos([(n, m) for (n, m), o in zip(manifests, opened, strict=True)
                    if o.kind != MEGATRON], where)  # fmt: skip
    other = _disagreeing(manifests, lambda m: (m.vocab_size, m.eod_id))
    if other is not None:
        (name, m), (first_name, first) = other
        raise PlanError(
            f"{where}: source '{name}' has vocabulary {m.vocab_size} / EOD {m.eod_id}, "
            f"'{first_name}' has {first.vocab_size} / {first.eod_id}"
        )
    for s, (_, m) in zip(spec.sources, manifests, strict=True):
        if m.n_tokens < spec.seq_len + 1:
            raise PlanError(
                f"{where}: source '{s.name}' has {m.n_tokens} tokens, fewer than "
                f"seq_len + 1 = {spec.seq_len + 1}: not one sample"
            )
    names = [s.name for s in spec.sources]
    weights, den = _phase_units([s.weight for s in spec.sources], names, spec, where)
    phases = []
    for i, p in enumerate(spec.phases):
        units, period = _phase_units(p.weights, names, spec, f"{where}: phase {i + 2}")
        phases.append(PlanPhase(p.start, p.weights, units, period))
    sources = []
    for i, (s, (_, m)) in enumerate(zip(spec.sources, manifests, strict=True)):
        sources.append(
            PlanSource(
                name=s.name,
                path=paths[i],
                weight=s.weight,
                max_repeats=s.max_repeats,
                weight_units=weights[i],
                n_tokens=m.n_tokens,
                n_samples=0,  # the derived fields: the plan computes them (Plan.__post_init__)
                dtype=m.dtype,
                content_hash=m.content_hash,
                vocab_size=m.vocab_size,
                eod_id=m.eod_id,
                tokenizer_fingerprint=str(m.tokenizer.get("fingerprint")),
                draws=0,
                passes=0.0,
                format=opened[i].kind,
                tokenizer=tokenizers[i],
                megatron=opened[i].record,
                versions=opened[i].versions,
            )
        )
    try:
        return Plan(
            algorithm_version=ALGORITHM_VERSION,
            seq_len=spec.seq_len,
            seed=spec.seed,
            denominator=den,
            horizon_samples=spec.horizon_samples,
            sources=tuple(sources),
            storage_options=dict(spec.storage_options),
            phases=tuple(phases),
        )
    except ArgumentError as exc:  # a value a store's manifest gave: the plan is refused
        raise PlanError(f"{where}: {exc}") from None


def _phase_units(
    stated: Sequence[float], names: Sequence[str], spec: PlanSpec, where: str
) -> tuple[tuple[int, ...], int]:
    """One phase's stated weights as integer units and their period: exactly (or rounded over
    the cap), or over the plan's ``weight_denominator``; a weight of 0 stays 0."""
    drawn = [d for d, w in enumerate(stated) if w]
    positive = [stated[d] for d in drawn]
    drawn_names = [names[d] for d in drawn]
    try:
        if spec.denominator is None:  # the weights as stated, exactly (or rounded over the cap)
            units, den = exact_weights(positive, drawn_names)
        else:
            units, den = rational_weights(positive, drawn_names, spec.denominator), spec.denominator
    except TokentapeError as exc:
        raise _reworded(exc, f"{where}: {exc}") from None
    out = [0] * len(stated)
    for d, u in zip(drawn, units, strict=True):
        out[d] = u
    return tuple(out), den


def open_plan_store(
    source: PlanSource,
    storage_options: Mapping[str, Any] | None = None,
    fetch: FetchConfig | None = None,
) -> TokenStream:
    """Open a resolved plan's source where the plan found it, as the plan read it (a Megatron
    prefix with the plan's vocabulary, EOD id and tokenizer, loaded only when needed and
    checked against the plan's fingerprint).

    A Megatron prefix is never hashed here (every rank of a training run opens it): its
    identity comes from the plan's record while the files' keys match it, else from a current
    sidecar, else the open is refused with the command that records one (at an object URL:
    its sidecar object, else refused)."""
    fingerprint = source.tokenizer_fingerprint if source.tokenizer is not None else None
    if source.format != MEGATRON:
        store = (  # in a bucket: every read pinned to the versions planned
            source_at_url(source.path, storage_options, fetch, dict(source.versions))
            if is_url(source.path)
            else Source(source.path)
        )
        return vocabulary_checked(store, source.path, source.vocab_size, source.eod_id)
    if is_url(source.path):
        return megatron_at_url(
            source.path,
            source.vocab_size,
            source.eod_id,
            source.tokenizer,
            storage_options=storage_options,
            fetch=fetch,
            fingerprint=fingerprint,
        )
    record = source.megatron
    planned = None
    if record is not None:
        identity = record.identity(source.dtype, source.n_tokens, source.content_hash)
        planned = None if identity is None else (record.files, identity)
    return MegatronSource(
        source.path,
        source.vocab_size,
        source.eod_id,
        source.tokenizer,
        planned=planned,
        hash_missing=False,
        fingerprint=fingerprint,
    )


def over_budget(plan: Plan) -> list[PlanSource]:
    """Sources whose planned passes exceed their ``max_repeats``."""
    return [s for s in plan.sources if s.passes > s.max_repeats]


def check_budgets(plan: Plan, where: str) -> None:
    """Refuse a plan that repeats a source beyond its budget."""
    for s in over_budget(plan):
        raise PlanError(
            f"{where}: source '{s.name}' would be read {s.passes:.3f} times over the horizon, "
            f"more than its max_repeats = {s.max_repeats:g}; raise max_repeats to at least "
            f"{math.ceil(s.passes * 1000) / 1000:g}, lower its weight, or shorten the horizon"
        )


__all__ = [
    "ALGORITHM_VERSION",
    "PLAN_FORMAT",
    "READABLE_VERSIONS",
    "TOKEN_DTYPES",
    "Plan",
    "PlanPhase",
    "PlanSource",
    "build_tape",
    "check_budgets",
    "check_planned",
    "expected_index_hash",
    "index_hash",
    "joined_excision",
    "open_plan_store",
    "open_planned",
    "over_budget",
    "plan_index_hash",
    "resolve_plan",
]

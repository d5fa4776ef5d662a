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

import hashlib
import json
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokentape._src.megatron.format import DTYPE_NAMES, INTEGER_CODES
from tokentape._src.megatron.identity import MegatronRecord
from tokentape._src.megatron.source import MegatronManifest, MegatronSource
from tokentape._src.plan.open import FORMATS, MEGATRON, TOKENTAPE, detect_format, open_store
from tokentape._src.store.atomic import write_atomic
from tokentape._src.store.format import Manifest
from tokentape._src.store.reader import Source
from tokentape._src.tape.blend import (
    DEFAULT_DENOMINATOR,
    MAX_DENOMINATOR,
    MAX_POSITION,
    rational_weights,
)
from tokentape._src.tape.resolve import Tape
from tokentape._src.util.progress import ProgressCallback
from tokentape.errors import ArgumentError, PlanError, TokentapeError, _reworded

ALGORITHM_VERSION = 1
PLAN_FORMAT = "tokentape.plan"

_TOP_KEYS = {"seq_len", "seed", "total_tokens", "total_samples", "weight_denominator", "source"}
_SOURCE_KEYS = {
    "name",
    "path",
    "weight",
    "max_repeats",
    "format",
    "vocab_size",
    "eod_id",
    "tokenizer",
}
_NO_FINGERPRINT = "none"
"""The tokenizer fingerprint of a source whose tokenizer is unknown: compared with nothing."""
_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12, "P": 10**15}


@dataclass(frozen=True)
class SourceSpec:
    """One ``[[source]]`` table of the plan file."""

    name: str
    path: str
    """The store directory, relative to the plan file (or absolute)."""
    weight: float
    """Any positive number; weights are normalised."""
    max_repeats: float = 1.0
    """Repeat budget: the most passes over this source's samples the horizon may take."""
    format: str | None = None
    """``tokentape`` (a store directory), ``megatron`` (a ``.bin``/``.idx`` prefix), or None:
    detected from the files."""
    vocab_size: int | None = None
    """Megatron source: ids are below it (a tokentape store: checked against its manifest)."""
    eod_id: int | None = None
    """Megatron source: the end-of-document id every document ends with (a tokentape store:
    checked against its manifest)."""
    tokenizer: str | None = None
    """Megatron source only: the tokenizer spec it was made with (relative paths from the plan
    file); gives vocab_size and eod_id, is compared with the other sources' tokenizers and
    decodes previews."""


@dataclass(frozen=True)
class PlanSpec:
    """The plan file, validated."""

    seq_len: int
    seed: int
    horizon_samples: int
    sources: tuple[SourceSpec, ...]
    denominator: int = DEFAULT_DENOMINATOR
    base_dir: str = "."


@dataclass(frozen=True)
class PlanSource:
    """A source of a resolved plan: its spec, its store's identity, and its share of the tape."""

    name: str
    path: str
    weight: float
    max_repeats: float
    weight_units: int  # W_d: the exact weight is weight_units / denominator
    n_tokens: int
    n_samples: int
    dtype: str
    content_hash: str
    vocab_size: int
    eod_id: int
    tokenizer_fingerprint: str
    draws: int  # samples drawn over the horizon
    passes: float  # draws / n_samples
    format: str = TOKENTAPE  # "tokentape" (store directory) or "megatron" (prefix)
    tokenizer: str | None = None  # Megatron source: the tokenizer spec, paths made absolute
    megatron: MegatronRecord | None = None
    """Megatron source: both files' keys when the plan identified it, with the identity the
    loader then uses without hashing (None: the files were too recent, or a plan made before
    it was recorded; absent from PLAN.json for a tokentape store)."""


@dataclass(frozen=True)
class Plan:
    """A resolved mixture plan: what the loader, replay and locate open (``PLAN.json``).

    Made by ``tokentape plan --out`` or ``Plan.build`` and read back by ``load_plan``. The
    tape it defines is a pure function of it, identified by ``index_hash``.

    Attributes:
        algorithm_version: The version of the tape's algorithm the plan was resolved for.
        seq_len: Tokens per sample (each window holds ``seq_len + 1``).
        seed: The seed of the blend and of every source's shuffle.
        denominator: The weights are exact rationals ``weight_units / denominator``.
        horizon_samples: The planned number of samples (the repeat budgets hold up to it).
        sources: The resolved sources, in plan order.
        index_hash: Hash of everything that determines the tape.
    """

    algorithm_version: int
    seq_len: int
    seed: int
    denominator: int
    horizon_samples: int
    sources: tuple[PlanSource, ...]
    index_hash: str

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
            weight_denominator: The denominator of the exact weights (default 2**20).
            base_dir: Relative source paths (and tokenizer paths) start here, as they start
                at a plan file's directory.

        Returns:
            The resolved plan.

        Raises:
            ArgumentError: ``sources`` is neither a dict of tables nor a list of them.
            PlanError: A key is missing, unknown or of the wrong type or range, the sources
                disagree (tokenizer, vocabulary), or a source would be repeated beyond its
                ``max_repeats``.
            StoreError: A source's store is missing or damaged.
        """
        tables: list[Any]
        if isinstance(sources, Mapping):
            tables = []
            for name, table in sources.items():
                if isinstance(table, Mapping) and "name" in table:
                    raise ArgumentError(
                        f"sources[{name!r}]: give the name as the key only, not as 'name'"
                    )
                tables.append({"name": name, **table} if isinstance(table, Mapping) else table)
        elif isinstance(sources, Sequence) and not isinstance(sources, str | bytes):
            tables = [dict(t) if isinstance(t, Mapping) else t for t in sources]
        else:
            raise ArgumentError(
                f"sources: expected a dict of name -> table or a list of tables, got "
                f"{type(sources).__name__}"
            )
        for table in tables:
            for key in ("path", "tokenizer"):
                if isinstance(table, dict) and isinstance(table.get(key), os.PathLike):
                    table[key] = os.fspath(table[key])
        keys = {
            "total_tokens": total_tokens,
            "total_samples": total_samples,
            "weight_denominator": weight_denominator,
        }
        data = {"seq_len": seq_len, "seed": seed, "source": tables}
        data |= {k: v for k, v in keys.items() if v is not None}
        where = "plan"
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
            The plan's ``Tape`` (``resolve(positions)``, ``position_of(...)``).
        """
        return Tape.build(
            [s.name for s in self.sources],
            [s.n_samples for s in self.sources],
            [s.weight_units for s in self.sources],
            self.seed,
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as ``PLAN.json`` (what ``tokentape plan --out`` writes), atomically.

        Args:
            path: The file to write; replaced whole, a reader sees the old or the new file.

        Raises:
            OutputError: The file cannot be written (the message names it).
        """
        write_atomic(path, self.to_json().encode())

    def to_json(self) -> str:
        """The plan as ``PLAN.json`` text (what ``load_plan`` reads back).

        Returns:
            The JSON text, ending with a newline.
        """
        data = {"format": PLAN_FORMAT, **asdict(self)}
        for source in data["sources"]:
            if source["megatron"] is None:
                del source["megatron"]
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# --- parsing --------------------------------------------------------------------------------


def parse_count(value: Any, where: str) -> int:
    """An integer, or a string such as ``"2T"``, ``"500B"``, ``"1.5M"`` (decimal suffixes)."""
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([KMBGTP]?)\s*", value.upper())
        if not m:
            raise PlanError(f"{where}: '{value}' is not a count (e.g. 2T, 500B, 1.5M)")
        number = float(m.group(1).replace("_", "")) * _SUFFIXES[m.group(2)]
        if number != int(number):
            raise PlanError(f"{where}: '{value}' is not a whole number")
        count = int(number)
    else:
        raise PlanError(f"{where}: expected an integer or a string like '2T'")
    if count <= 0:
        raise PlanError(f"{where}: must be positive, got {count}")
    return count


def _number(table: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    if key not in table:
        if default is None:
            raise PlanError(f"{where}: missing key '{key}'")
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlanError(f"{where}: '{key}' must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise PlanError(f"{where}: '{key}' must be a positive finite number, got {value}")
    return float(value)


def _integer(table: dict[str, Any], key: str, where: str) -> int:
    if key not in table:
        raise PlanError(f"{where}: missing key '{key}'")
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{where}: '{key}' must be an integer, got {value!r}")
    return value


def _unknown(table: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise PlanError(
            f"{where}: unknown key {extra[0][:40]!r}; expected one of {', '.join(sorted(allowed))}"
        )


def _source(table: Any, i: int, where: str) -> SourceSpec:
    if not isinstance(table, dict):
        raise PlanError(f"{where}: source[{i}] must be a table ([[source]])")
    name = table.get("name")
    here = f"{where}: source[{i}]" + (f" ({name[:40]!r})" if isinstance(name, str) else "")
    _unknown(table, _SOURCE_KEYS, here)
    if not isinstance(name, str) or not name.strip() or not name.isprintable():
        raise PlanError(f"{here}: 'name' must be a non-empty string of printable characters")
    path = table.get("path")
    if not isinstance(path, str) or not path:
        raise PlanError(f"{here}: 'path' must be a store directory or a Megatron prefix (a string)")
    kind = table.get("format")
    if kind is not None and kind not in FORMATS:
        raise PlanError(f"{here}: 'format' must be one of {', '.join(FORMATS)}, got {kind!r}")
    tokenizer = table.get("tokenizer")
    if tokenizer is not None and (not isinstance(tokenizer, str) or not tokenizer):
        raise PlanError(f"{here}: 'tokenizer' must be a tokenizer spec (a string)")
    if tokenizer is not None and kind == TOKENTAPE:
        raise PlanError(
            f"{here}: 'tokenizer' applies to a Megatron source; a tokentape store records its own"
        )
    return SourceSpec(
        name=name,
        path=path,
        weight=_number(table, "weight", here),
        max_repeats=_number(table, "max_repeats", here, default=1.0),
        format=kind,
        vocab_size=_integer(table, "vocab_size", here) if "vocab_size" in table else None,
        eod_id=_integer(table, "eod_id", here) if "eod_id" in table else None,
        tokenizer=tokenizer,
    )


def parse_plan(text: str, where: str, base_dir: str = ".") -> PlanSpec:
    """Validate a plan file's TOML text; ``where`` names the file in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"{where}: not valid TOML ({exc})") from None
    return plan_spec(data, where, base_dir)


def plan_spec(data: Any, where: str, base_dir: str = ".") -> PlanSpec:
    """Validate a plan file's content as parsed (the TOML document as a dict); ``where`` names
    it in errors. The TOML route and ``Plan.build`` both come through here."""
    if not isinstance(data, dict):
        raise PlanError(f"{where}: expected a table of plan keys, got {type(data).__name__}")
    _unknown(data, _TOP_KEYS, where)
    seq_len = _integer(data, "seq_len", where)
    if seq_len <= 0:
        raise PlanError(f"{where}: 'seq_len' must be positive, got {seq_len}")
    seed = _integer(data, "seed", where)
    if not 0 <= seed < 2**63:
        raise PlanError(f"{where}: 'seed' must be in [0, 2**63), got {seed}")
    has_tokens, has_samples = "total_tokens" in data, "total_samples" in data
    if has_tokens == has_samples:
        raise PlanError(f"{where}: give exactly one of 'total_tokens' or 'total_samples'")
    if has_tokens:
        tokens = parse_count(data["total_tokens"], f"{where}: 'total_tokens'")
        horizon = -(-tokens // seq_len)
    else:
        horizon = parse_count(data["total_samples"], f"{where}: 'total_samples'")
    if horizon >= MAX_POSITION:
        raise PlanError(f"{where}: the horizon of {horizon} samples exceeds 2**62")
    denominator = data.get("weight_denominator", DEFAULT_DENOMINATOR)
    if isinstance(denominator, bool) or not isinstance(denominator, int):
        raise PlanError(f"{where}: 'weight_denominator' must be an integer")
    if not 1 <= denominator <= MAX_DENOMINATOR:
        raise PlanError(
            f"{where}: 'weight_denominator' must be in [1, {MAX_DENOMINATOR}], got {denominator}"
        )
    raw = data.get("source")
    if not isinstance(raw, list) or not raw:
        raise PlanError(f"{where}: no sources; add [[source]] tables")
    sources = tuple(_source(t, i, where) for i, t in enumerate(raw))
    seen: set[str] = set()
    for s in sources:
        if s.name in seen:
            raise PlanError(f"{where}: source name '{s.name}' appears twice")
        seen.add(s.name)
    return PlanSpec(seq_len, seed, horizon, sources, denominator, base_dir)


def load_plan_spec(path: str | Path) -> PlanSpec:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlanError(f"plan '{path}': no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"plan '{path}': cannot read ({exc})") from None
    return parse_plan(text, str(path), str(p.parent))


# --- resolving ------------------------------------------------------------------------------


def index_hash(
    seq_len: int, seed: int, denominator: int, sources: list[tuple[str, int, int, str, str]]
) -> str:
    """Hash of the canonical inputs that change the tape (never the horizon or budgets).

    ``sources``: per source, in plan order, (name, weight units W_d, n_tokens, dtype,
    content hash of its store).
    """
    inputs = {
        "algorithm_version": ALGORITHM_VERSION,
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
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def plan_index_hash(plan_sources: tuple[PlanSource, ...], seq_len: int, seed: int, den: int) -> str:
    rows = [(s.name, s.weight_units, s.n_tokens, s.dtype, s.content_hash) for s in plan_sources]
    return index_hash(seq_len, seed, den, rows)


def resolve_tokenizer_spec(spec: str, base_dir: str) -> str:
    """A tokenizer spec with its file path made absolute (relative paths from ``base_dir``)."""
    if spec == "bytes":
        return spec
    prefix = next((p for p in ("tiktoken:", "hf:") if spec.startswith(p)), "")
    return prefix + str(Path(base_dir, spec.removeprefix(prefix)).resolve())


def _open_source(
    s: SourceSpec, path: Path, progress: ProgressCallback | None
) -> tuple[str, Manifest | MegatronManifest, MegatronRecord | None]:
    """The source's format and manifest (a Megatron prefix is opened: validated, identified,
    hashed if no identity is current) and, for a Megatron prefix, what the plan records of it."""
    kind = s.format or detect_format(path)
    if kind == MEGATRON:
        source = MegatronSource(path, s.vocab_size, s.eod_id, s.tokenizer, progress=progress)
        return kind, source.manifest, source.plan_record()
    if s.tokenizer is not None:
        raise PlanError(
            "'tokenizer' applies to a Megatron source; a tokentape store records its own"
        )
    m = Source(path).manifest  # opened, not only read: shard files missing or cut short refused
    for key, given in (("vocab_size", s.vocab_size), ("eod_id", s.eod_id)):
        if given is not None and given != getattr(m, key):
            raise PlanError(f"'{key}' is {given} but the store's manifest says {getattr(m, key)}")
    return kind, m, None


def resolve_plan(
    spec: PlanSpec, where: str = "plan", progress: ProgressCallback | None = None
) -> Plan:
    """Open every source's store, check they agree, and compute the blend and repeat table.
    ``progress`` receives the hashing of a Megatron prefix that has no current identity."""
    manifests: list[tuple[str, Manifest | MegatronManifest]] = []
    paths: list[str] = []
    kinds: list[str] = []
    tokenizers: list[str | None] = []
    records: list[MegatronRecord | None] = []
    for s in spec.sources:
        path = Path(spec.base_dir, s.path)
        tok = s.tokenizer and resolve_tokenizer_spec(s.tokenizer, spec.base_dir)
        try:
            kind, manifest, record = _open_source(
                SourceSpec(**{**asdict(s), "tokenizer": tok}), path, progress
            )
        except TokentapeError as exc:
            raise _reworded(exc, f"{where}: source '{s.name}': {exc}") from None
        manifests.append((s.name, manifest))
        paths.append(str(path.resolve()))
        kinds.append(kind)
        tokenizers.append(tok)
        records.append(record)
    known = [(n, m) for n, m in manifests if m.tokenizer.get("fingerprint") != _NO_FINGERPRINT]
    for name, m in known[1:]:
        first_name, first = known[0]
        if m.tokenizer.get("fingerprint") != first.tokenizer.get("fingerprint"):
            raise PlanError(
                f"{where}: source '{name}' was tokenized with another tokenizer than "
                f"'{first_name}' ({m.tokenizer.get('fingerprint')} vs "
                f"{first.tokenizer.get('fingerprint')}); re-tokenize it"
            )
    first_name, first = manifests[0]
    for name, m in manifests[1:]:
        if (m.vocab_size, m.eod_id) != (first.vocab_size, first.eod_id):
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
    try:
        weights = list(rational_weights([s.weight for s in spec.sources], names, spec.denominator))
    except TokentapeError as exc:
        raise _reworded(exc, f"{where}: {exc}") from None
    n_samples = [(m.n_tokens - 1) // spec.seq_len for _, m in manifests]
    tape = Tape.build(names, n_samples, weights, spec.seed)
    sources = []
    for i, (s, (_, m)) in enumerate(zip(spec.sources, manifests, strict=True)):
        draws = tape.blend.count(i, spec.horizon_samples)
        sources.append(
            PlanSource(
                name=s.name,
                path=paths[i],
                weight=s.weight,
                max_repeats=s.max_repeats,
                weight_units=weights[i],
                n_tokens=m.n_tokens,
                n_samples=n_samples[i],
                dtype=m.dtype,
                content_hash=m.content_hash,
                vocab_size=m.vocab_size,
                eod_id=m.eod_id,
                tokenizer_fingerprint=str(m.tokenizer.get("fingerprint")),
                draws=draws,
                passes=draws / n_samples[i],
                format=kinds[i],
                tokenizer=tokenizers[i],
                megatron=records[i],
            )
        )
    return Plan(
        algorithm_version=ALGORITHM_VERSION,
        seq_len=spec.seq_len,
        seed=spec.seed,
        denominator=spec.denominator,
        horizon_samples=spec.horizon_samples,
        sources=tuple(sources),
        index_hash=plan_index_hash(tuple(sources), spec.seq_len, spec.seed, spec.denominator),
    )


def open_plan_store(source: PlanSource) -> Source | MegatronSource:
    """Open a resolved plan's source where the plan found it, as the plan read it (a Megatron
    prefix with the plan's vocabulary, EOD id and tokenizer, loaded only when needed and
    checked against the plan's fingerprint).

    A Megatron prefix is never hashed here (every rank of a training run opens it): its
    identity comes from the plan's record while the files' keys match it, else from a current
    sidecar, else the open is refused with the command that records one."""
    if source.format != MEGATRON:
        return open_store(
            source.path, source.format, vocab_size=source.vocab_size, eod_id=source.eod_id
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
        fingerprint=source.tokenizer_fingerprint if source.tokenizer is not None else None,
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


# --- reading PLAN.json: every field checked for its type and range ------------------------

_INT, _NUMBER, _TEXT = "an integer", "a number", "a string"
_TOKEN_DTYPES = {"uint16", "uint32", *(DTYPE_NAMES[code] for code in INTEGER_CODES)}


def _field_value(data: dict[str, Any], key: str, kind: str, where: str, low: int = 0) -> Any:
    """``data[key]`` checked to be ``kind`` (integers and numbers at least ``low``)."""
    if key not in data:
        raise PlanError(f"{where}: field '{key}' is missing")
    value = data[key]
    if kind == _TEXT:
        ok = isinstance(value, str) and bool(value) and value.isprintable()
        expected = "a non-empty string of printable characters"
    elif kind == _INT:
        ok = type(value) is int and value >= low
        expected = f"an integer >= {low}"
    else:
        ok = type(value) in (int, float) and math.isfinite(value) and value >= low
        expected = f"a finite number >= {low}"
    if not ok:
        shown = json.dumps(value)[:40] if _jsonable(value) else type(value).__name__
        raise PlanError(f"{where}: field '{key}': expected {expected}, found {shown}")
    return value


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _exact_keys(data: dict[str, Any], required: set[str], optional: set[str], where: str) -> None:
    extra = sorted(set(data) - required - optional)
    if extra:
        shown = repr(extra[0]) if len(extra[0]) <= 40 else repr(extra[0][:39] + "…")
        raise PlanError(
            f"{where}: unknown field {shown} (edited by hand, or a newer tokentape?); "
            "re-run `tokentape plan`"
        )
    missing = sorted(required - set(data))
    if missing:
        raise PlanError(f"{where}: field '{missing[0]}' is missing; re-run `tokentape plan`")


_SOURCE_FIELDS: dict[str, tuple[str, int]] = {
    "name": (_TEXT, 0), "path": (_TEXT, 0), "dtype": (_TEXT, 0), "content_hash": (_TEXT, 0),
    "tokenizer_fingerprint": (_TEXT, 0), "weight_units": (_INT, 1), "n_tokens": (_INT, 2),
    "n_samples": (_INT, 1), "vocab_size": (_INT, 1), "eod_id": (_INT, 0), "draws": (_INT, 0),
    "weight": (_NUMBER, 0), "max_repeats": (_NUMBER, 0), "passes": (_NUMBER, 0),
}  # fmt: skip
"""A resolved source's required fields: kind and least value."""
_SOURCE_OPTIONAL = {"format", "tokenizer", "megatron"}


def _plan_source(data: Any, where: str) -> PlanSource:
    if not isinstance(data, dict):
        raise PlanError(f"{where}: expected an object")
    _exact_keys(data, set(_SOURCE_FIELDS), _SOURCE_OPTIONAL, where)
    values = {
        k: _field_value(data, k, kind, where, low) for k, (kind, low) in _SOURCE_FIELDS.items()
    }
    if values["weight"] <= 0 or values["max_repeats"] <= 0:
        raise PlanError(f"{where}: fields 'weight' and 'max_repeats' must be positive")
    if values["eod_id"] >= values["vocab_size"]:
        raise PlanError(
            f"{where}: field 'eod_id': {values['eod_id']} is not below vocab_size "
            f"{values['vocab_size']}"
        )
    dtype = values["dtype"]
    if dtype not in _TOKEN_DTYPES:
        raise PlanError(
            f"{where}: field 'dtype': {dtype[:40]!r} is not one of "
            + ", ".join(sorted(_TOKEN_DTYPES))
        )
    kind = data.get("format", TOKENTAPE)
    if kind not in FORMATS:
        raise PlanError(f"{where}: field 'format': expected one of {', '.join(FORMATS)}")
    tokenizer = data.get("tokenizer")
    if tokenizer is not None and (not isinstance(tokenizer, str) or not tokenizer):
        raise PlanError(f"{where}: field 'tokenizer': expected a tokenizer spec or null")
    if kind == TOKENTAPE and (tokenizer is not None or data.get("megatron") is not None):
        field = "tokenizer" if tokenizer is not None else "megatron"
        raise PlanError(
            f"{where}: field '{field}' applies to a Megatron source, this one is a tokentape "
            "store (edited by hand?); re-run `tokentape plan`"
        )
    record = None
    if data.get("megatron") is not None:
        record = MegatronRecord.from_json(data["megatron"])
        if record is None:
            raise PlanError(
                f"{where}: field 'megatron' is malformed (edited by hand?); re-run `tokentape plan`"
            )
    return PlanSource(**values, format=kind, tokenizer=tokenizer, megatron=record)


_PLAN_KEYS = {
    "algorithm_version", "seq_len", "seed", "denominator", "horizon_samples", "sources",
    "index_hash",
}  # fmt: skip


def _plan_fields(data: dict[str, Any], where: str) -> Plan:
    _exact_keys(data, _PLAN_KEYS, set(), where)
    seq_len = _field_value(data, "seq_len", _INT, where, 1)
    seed = _field_value(data, "seed", _INT, where)
    denominator = _field_value(data, "denominator", _INT, where, 1)
    horizon = _field_value(data, "horizon_samples", _INT, where, 1)
    index = _field_value(data, "index_hash", _TEXT, where)
    if seed >= 2**63:
        raise PlanError(f"{where}: field 'seed': {seed} is not below 2**63")
    if denominator > MAX_DENOMINATOR:
        raise PlanError(f"{where}: field 'denominator': {denominator} exceeds {MAX_DENOMINATOR}")
    if horizon >= MAX_POSITION:
        raise PlanError(f"{where}: field 'horizon_samples': {horizon} is not below 2**62")
    raw_sources = data["sources"]
    if not isinstance(raw_sources, list) or not raw_sources:
        raise PlanError(f"{where}: field 'sources' must be a non-empty list")
    sources = tuple(_plan_source(s, f"{where}: sources[{i}]") for i, s in enumerate(raw_sources))
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise PlanError(f"{where}: source name '{dup}' appears twice")
    if sum(s.weight_units for s in sources) != denominator:
        raise PlanError(
            f"{where}: the sources' weight_units sum to {sum(s.weight_units for s in sources)}, "
            f"not the denominator {denominator} (edited by hand?); re-run `tokentape plan`"
        )
    return Plan(ALGORITHM_VERSION, seq_len, seed, denominator, horizon, sources, index)


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read a resolved plan (``PLAN.json``, from ``tokentape plan --out`` or ``Plan.save``).

    Every field is checked for its type and range, against the others, and the index hash
    against the contents.

    Args:
        path: The ``PLAN.json`` file.

    Returns:
        The plan.

    Raises:
        PlanError: The file is missing, unreadable, not a resolved plan, or edited by hand
            (the message names the field).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"plan '{path}': no such file") from None
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: also bad UTF-8, JSON
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise PlanError(f"plan '{path}': not a readable JSON plan ({why})") from None
    if not isinstance(data, dict) or data.pop("format", None) != PLAN_FORMAT:
        raise PlanError(f"plan '{path}': not a resolved tokentape plan (field 'format')")
    if data.get("algorithm_version") != ALGORITHM_VERSION:
        shown = data.get("algorithm_version")
        shown = shown if type(shown) is int else json.dumps(shown)[:40]
        raise PlanError(
            f"plan '{path}': algorithm_version {shown} is not {ALGORITHM_VERSION}; "
            "re-run `tokentape plan`"
        )
    plan = _plan_fields(data, f"plan '{path}'")
    for s in plan.sources:  # the tape reads n_samples; the hash covers n_tokens and seq_len
        if s.n_samples != max(0, (s.n_tokens - 1) // plan.seq_len):
            raise PlanError(
                f"plan '{path}': source '{s.name}': n_samples {s.n_samples} does not follow from "
                f"n_tokens {s.n_tokens} at seq_len {plan.seq_len} (edited by hand?); re-run "
                "`tokentape plan`"
            )
    expected = plan_index_hash(plan.sources, plan.seq_len, plan.seed, plan.denominator)
    if plan.index_hash != expected:
        raise PlanError(
            f"plan '{path}': index_hash does not match its contents (edited by hand?); "
            "re-run `tokentape plan`"
        )
    return plan

"""A plan as its author states it: the TOML file (or the same tables from Python), checked key
by key into a ``PlanSpec``; nothing is opened."""

from __future__ import annotations

import difflib
import math
import os
import posixpath
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokentape._src.objects.client import check_storage_options, is_url, parent, secret_keys
from tokentape._src.objects.whole import read_whole
from tokentape._src.plan.open import FORMATS, TOKENTAPE
from tokentape._src.tape.blend import (
    MAX_DENOMINATOR,
    MAX_POSITION,
)
from tokentape.errors import PlanError, TokentapeError

_TOP_KEYS = {
    "seq_len",
    "seed",
    "total_tokens",
    "total_samples",
    "weight_denominator",
    "source",
    "storage_options",
    "phase",
    "mixed_bos",
}

_PHASE_KEYS = {"start_tokens", "start_samples", "weights"}


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


_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12, "P": 10**15}


@dataclass(frozen=True)
class SourceSpec:
    """One ``[[source]]`` table of the plan file."""

    name: str
    path: str
    """The store directory, relative to the plan file (or absolute)."""
    weight: float
    """Any number >= 0 (weights are normalised); 0: not drawn before the first phase that
    names the source (a plan with ``[[phase]]`` tables only)."""
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
class PhaseSpec:
    """One ``[[phase]]`` table: from position ``start`` on, the mixture is ``weights``."""

    start: int
    """The phase's first position (samples; ``start_tokens`` rounded up to whole samples)."""
    weights: tuple[float, ...]
    """The stated weight of each source, in plan order (0: a source the table does not name)."""


@dataclass(frozen=True)
class PlanSpec:
    """The plan file, validated."""

    seq_len: int
    seed: int
    horizon_samples: int
    sources: tuple[SourceSpec, ...]
    denominator: int | None = None
    """The period of the weights (``weight_denominator``); None: the smallest that makes the
    stated weights exact, up to ``blend.EXACT_CAP`` (else rounded over it)."""
    base_dir: str = "."
    storage_options: dict[str, Any] = field(default_factory=dict)
    """fsspec options for the sources at object URLs (no credentials: they would be copied
    into PLAN.json)."""
    phases: tuple[PhaseSpec, ...] = ()
    """The ``[[phase]]`` tables after the first phase (the sources' own weights), in order."""
    mixed_bos: bool = False
    """Blend stores whose documents start with different beginning-of-document tokens (or
    some with one and some without); refused by default."""


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


def _number(
    table: dict[str, Any],
    key: str,
    where: str,
    default: float | None = None,
    exact: bool = False,
    zero: bool = False,
) -> float:
    """A positive finite number (``zero``: or 0; ``exact``: an integer is kept as it is, not
    made a float)."""
    if key not in table:
        if default is None:
            raise PlanError(f"{where}: missing key '{key}'")
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlanError(f"{where}: '{key}' must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        digits = len(str(abs(value)))
        raise PlanError(
            f"{where}: '{key}' must be a positive finite number, got an integer of {digits} digits"
        ) from None
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
        kind = "a finite number >= 0" if zero else "a positive finite number"
        raise PlanError(f"{where}: '{key}' must be {kind}, got {value}")
    return value if exact and isinstance(value, int) else number


def _integer(table: dict[str, Any], key: str, where: str) -> int:
    if key not in table:
        raise PlanError(f"{where}: missing key '{key}'")
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{where}: '{key}' must be an integer, got {value!r}")
    return value


def _unknown(table: dict[str, Any], allowed: set[str], where: str) -> None:
    """Refuse a key not in ``allowed``, suggesting the allowed key it is likely a typo of."""
    extra = sorted(str(key) for key in set(table) - allowed)
    if extra:
        close = difflib.get_close_matches(extra[0], sorted(allowed), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise PlanError(
            f"{where}: unknown key {extra[0][:40]!r}{hint}; expected one of "
            f"{', '.join(sorted(allowed))}"
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
        weight=_number(table, "weight", here, exact=True, zero=True),  # stated: read exactly
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
    denominator = data.get("weight_denominator")
    if denominator is not None and (
        isinstance(denominator, bool) or not isinstance(denominator, int)
    ):
        raise PlanError(f"{where}: 'weight_denominator' must be an integer")
    if denominator is not None and not 1 <= denominator <= MAX_DENOMINATOR:
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
    options = plan_storage_options(data.get("storage_options", {}), where)
    phases = _phases(data.get("phase", []), sources, seq_len, horizon, where)
    mixed_bos = data.get("mixed_bos", False)
    if not isinstance(mixed_bos, bool):
        raise PlanError(f"{where}: 'mixed_bos' must be true or false")
    return PlanSpec(
        seq_len, seed, horizon, sources, denominator, base_dir, options, phases, mixed_bos
    )


def _phases(
    raw: Any, sources: tuple[SourceSpec, ...], seq_len: int, horizon: int, where: str
) -> tuple[PhaseSpec, ...]:
    """The ``[[phase]]`` tables, checked: starts increasing inside the horizon, weights of
    known sources, one positive per phase, and every source drawn in some phase."""
    if not isinstance(raw, list):
        raise PlanError(f"{where}: 'phase' must be a list of tables ([[phase]])")
    names = [s.name for s in sources]
    phases: list[PhaseSpec] = []
    for i, table in enumerate(raw):
        here = f"{where}: phase[{i}] (phase {i + 2})"
        if not isinstance(table, dict):
            raise PlanError(f"{here}: must be a table ([[phase]])")
        _unknown(table, _PHASE_KEYS, here)
        if ("start_tokens" in table) == ("start_samples" in table):
            raise PlanError(f"{here}: give exactly one of 'start_tokens' or 'start_samples'")
        if "start_tokens" in table:
            start = -(-parse_count(table["start_tokens"], f"{here}: 'start_tokens'") // seq_len)
        else:
            start = parse_count(table["start_samples"], f"{here}: 'start_samples'")
        before = phases[-1].start if phases else 0
        if start <= before:
            raise PlanError(
                f"{here}: starts at sample {start:,}, not after the phase before it (sample "
                f"{before:,}); phases are listed in the order they start"
            )
        if start >= horizon:
            raise PlanError(
                f"{here}: starts at sample {start:,}, at or beyond the horizon of {horizon:,} "
                "samples: it would never be drawn"
            )
        weights = table.get("weights")
        if not isinstance(weights, dict) or not weights:
            raise PlanError(
                f"{here}: 'weights' must be a table of source name = weight, e.g. "
                f"weights = {{ {names[0]} = 1 }}"
            )
        for name in weights:
            if name not in names:
                raise PlanError(
                    f"{here}: 'weights' names {name[:40]!r}, not a source of the plan "
                    f"({', '.join(names)})"
                )
        stated = tuple(
            _number(weights, n, f"{here}: weights", default=0, exact=True, zero=True) for n in names
        )
        if not any(stated):
            raise PlanError(f"{here}: every weight is 0; a phase draws from one source at least")
        phases.append(PhaseSpec(start, stated))
    if not any(s.weight for s in sources):
        raise PlanError(
            f"{where}: every source has weight 0; the first phase draws from one source at least"
        )
    for d, s in enumerate(sources):
        if not s.weight and not any(p.weights[d] for p in phases):
            raise PlanError(
                f"{where}: source '{s.name}' has weight 0 in every phase: it is never drawn; "
                "give it a weight or drop it"
            )
    return tuple(phases)


def plan_storage_options(value: Any, where: str) -> dict[str, Any]:
    """A plan's ``storage_options`` table; credentials are refused (a plan is copied into
    PLAN.json, which every rank reads): they come from the environment or a profile."""
    try:
        options = check_storage_options(value, f"{where}: 'storage_options'")
    except TokentapeError as exc:
        raise PlanError(str(exc)) from None
    secrets = secret_keys(options)
    if secrets:
        raise PlanError(
            f"{where}: 'storage_options.{secrets[0]}' looks like a credential; a plan is copied "
            "into PLAN.json, so credentials come from the environment (AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY) or a profile"
        )
    return options


def load_plan_spec(path: str | Path) -> PlanSpec:
    """The plan file at ``path`` (or an object URL: its sources' relative paths are then
    taken from the URL's "directory")."""
    try:
        text = read_whole(path).decode("utf-8")
    except FileNotFoundError:
        what = "object" if is_url(path) else "file"
        raise PlanError(f"plan '{path}': no such {what}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"plan '{path}': cannot read ({exc})") from None
    base = parent(str(path)) if is_url(path) else str(Path(path).parent)
    return parse_plan(text, str(path), base)


def source_location(base_dir: str, path: str) -> str | Path:
    """Where a plan's source lives: an object URL as given; a path relative to the plan's
    directory, which may be a URL's."""
    if is_url(path):
        return path
    if is_url(base_dir) and not os.path.isabs(path):
        scheme, _, rest = base_dir.partition("://")
        key = posixpath.normpath(posixpath.join(rest, path))
        if key.partition("/")[0] != rest.partition("/")[0]:
            raise PlanError(f"source path '{path}': outside the bucket of the plan ({base_dir})")
        return f"{scheme}://{key}"
    return Path(base_dir, path)


def resolve_tokenizer_spec(spec: str, base_dir: str) -> str:
    """A tokenizer spec with its file path made absolute (relative paths from ``base_dir``)."""
    if spec == "bytes":
        return spec
    prefix = next((p for p in ("tiktoken:", "hf:") if spec.startswith(p)), "")
    if is_url(spec.removeprefix(prefix)) or (
        is_url(base_dir) and not os.path.isabs(spec.removeprefix(prefix))
    ):
        raise PlanError(
            f"tokenizer '{spec}': a tokenizer is read from a local file; copy it beside the plan "
            "(tokenizers are small) and name that file"
        )
    return prefix + str(Path(base_dir, spec.removeprefix(prefix)).resolve())


__all__ = [
    "PhaseSpec",
    "PlanSpec",
    "SourceSpec",
    "load_plan_spec",
    "parse_count",
    "parse_plan",
    "plan_spec",
    "plan_storage_options",
    "resolve_tokenizer_spec",
    "source_location",
]

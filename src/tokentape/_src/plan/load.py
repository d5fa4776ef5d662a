"""A resolved plan read back from ``PLAN.json`` (untrusted bytes): every field checked for its
type and range, against the others, and the index hash against the contents."""

from __future__ import annotations

import json
import math
import os
import tomllib
from typing import Any

from tokentape._src.megatron.identity import MegatronRecord
from tokentape._src.objects.client import is_url
from tokentape._src.objects.whole import read_whole
from tokentape._src.plan.excision import PlanExcision, parse_excision
from tokentape._src.plan.open import FORMATS, TOKENTAPE
from tokentape._src.plan.plan import (
    ALGORITHM_VERSION,
    PLAN_FORMAT,
    READABLE_VERSIONS,
    TOKEN_DTYPES,
    Plan,
    PlanPhase,
    PlanSource,
)
from tokentape._src.plan.spec import plan_storage_options
from tokentape._src.store.confine import is_plain_name
from tokentape._src.tape.blend import (
    MAX_DENOMINATOR,
    MAX_POSITION,
)
from tokentape._src.util.checks import check_path
from tokentape.errors import ArgumentError, PlanError

_INT, _NUMBER, _TEXT = "an integer", "a number", "a string"


_SOURCE_FIELDS: dict[str, tuple[str, int]] = {
    "name": (_TEXT, 0), "path": (_TEXT, 0), "dtype": (_TEXT, 0), "content_hash": (_TEXT, 0),
    "tokenizer_fingerprint": (_TEXT, 0), "weight_units": (_INT, 0), "n_tokens": (_INT, 2),
    "n_samples": (_INT, 1), "vocab_size": (_INT, 1), "eod_id": (_INT, 0), "draws": (_INT, 0),
    "weight": (_NUMBER, 0), "max_repeats": (_NUMBER, 0), "passes": (_NUMBER, 0),
}  # fmt: skip
"""A resolved source's required fields: kind and least value."""


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


_SOURCE_OPTIONAL = {"format", "tokenizer", "megatron", "versions"}


def _plan_source(data: Any, where: str) -> PlanSource:
    if not isinstance(data, dict):
        raise PlanError(f"{where}: expected an object")
    _exact_keys(data, set(_SOURCE_FIELDS), _SOURCE_OPTIONAL, where)
    values = {
        k: _field_value(data, k, kind, where, low) for k, (kind, low) in _SOURCE_FIELDS.items()
    }
    if values["max_repeats"] <= 0:
        raise PlanError(f"{where}: field 'max_repeats' must be positive")
    if values["n_tokens"] > MAX_POSITION:  # no store holds more; the tape's int64 would wrap
        raise PlanError(f"{where}: field 'n_tokens': {values['n_tokens']} exceeds 2**62")
    if (values["weight"] == 0) != (values["weight_units"] == 0):
        raise PlanError(
            f"{where}: fields 'weight' {values['weight']} and 'weight_units' "
            f"{values['weight_units']}: one is 0, the other not (edited by hand?); re-run "
            "`tokentape plan`"
        )
    if values["eod_id"] >= values["vocab_size"]:
        raise PlanError(
            f"{where}: field 'eod_id': {values['eod_id']} is not below vocab_size "
            f"{values['vocab_size']}"
        )
    dtype = values["dtype"]
    if dtype not in TOKEN_DTYPES:
        raise PlanError(
            f"{where}: field 'dtype': {dtype[:40]!r} is not one of "
            + ", ".join(sorted(TOKEN_DTYPES))
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
    versions = _versions(data.get("versions", {}), where)
    return PlanSource(
        **values, format=kind, tokenizer=tokenizer, megatron=record, versions=versions
    )


def _versions(data: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A bucket store's object versions: an object of plain file names -> version strings."""
    ok = isinstance(data, dict) and all(
        isinstance(k, str) and is_plain_name(k) and isinstance(v, str) and v and v.isprintable()
        for k, v in data.items()
    )
    if not ok:
        raise PlanError(
            f"{where}: field 'versions': expected an object of file name -> version (edited by "
            "hand?); re-run `tokentape plan`"
        )
    return tuple(data.items())


_PLAN_KEYS = {
    "algorithm_version", "seq_len", "seed", "denominator", "horizon_samples", "sources",
    "index_hash",
}  # fmt: skip


def _plan_fields(
    data: dict[str, Any], where: str, version: int = ALGORITHM_VERSION
) -> tuple[Plan, str]:
    """The plan the fields give (its derived fields computed from the others) and the index
    hash the file records."""
    _exact_keys(data, _PLAN_KEYS, {"storage_options", "phases", "excisions"}, where)
    options = plan_storage_options(data.get("storage_options", {}), where)
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
    phases = _plan_phases(data["phases"], len(sources), horizon, where) if "phases" in data else ()
    units = [[s.weight_units for s in sources], *(p.weight_units for p in phases)]
    for d, s in enumerate(sources):
        if not any(u[d] for u in units):
            raise PlanError(
                f"{where}: source '{s.name}' has weight 0 in every phase (edited by hand?); "
                "re-run `tokentape plan`"
            )
    excisions = _plan_excisions(data.get("excisions"), names, where)
    try:
        plan = Plan(
            version, seq_len, seed, denominator, horizon, sources, options, phases, excisions
        )
    except (ArgumentError, PlanError) as exc:  # what the checks above do not cover
        raise PlanError(f"{where}: {exc} (edited by hand?); re-run `tokentape plan`") from None
    return plan, index


def _plan_excisions(raw: Any, names: list[str], where: str) -> tuple[PlanExcision, ...]:
    """The ``excisions`` list (absent: none), each checked against its positions' hash."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise PlanError(f"{where}: field 'excisions' must be a non-empty list (or absent)")
    return tuple(parse_excision(e, names, f"{where}: excisions[{i}]") for i, e in enumerate(raw))


_PHASE_FIELDS = {"start", "weights", "weight_units", "denominator"}


def _plan_phases(raw: Any, n_sources: int, horizon: int, where: str) -> tuple[PlanPhase, ...]:
    """The ``phases`` list: starts increasing inside the horizon, one weight per source."""
    if not isinstance(raw, list) or not raw:
        raise PlanError(f"{where}: field 'phases' must be a non-empty list (or absent)")
    phases: list[PlanPhase] = []
    for i, data in enumerate(raw):
        here = f"{where}: phases[{i}]"
        if not isinstance(data, dict):
            raise PlanError(f"{here}: expected an object")
        _exact_keys(data, _PHASE_FIELDS, set(), here)
        start = _field_value(data, "start", _INT, here, 1)
        den = _field_value(data, "denominator", _INT, here, 1)
        before = phases[-1].start if phases else 0
        if not before < start < horizon:
            raise PlanError(
                f"{here}: field 'start': {start} is not after {before} and below the horizon "
                f"{horizon}; re-run `tokentape plan`"
            )
        lists = {}
        for key, kind in (("weights", _NUMBER), ("weight_units", _INT)):
            values = data[key]
            if not isinstance(values, list) or len(values) != n_sources:
                raise PlanError(f"{here}: field '{key}': expected one value per source")
            lists[key] = [
                _field_value({key: v}, key, kind, f"{here}: {key}[{d}]")
                for d, v in enumerate(values)
            ]
        weights, units = lists["weights"], lists["weight_units"]
        if den > MAX_DENOMINATOR or sum(units) != den or not any(units):
            raise PlanError(
                f"{here}: fields 'weight_units' {units[:8]} and 'denominator' {den}: the units "
                "must sum to the denominator (at most 2**24), one positive at least; re-run "
                "`tokentape plan`"
            )
        if any((w == 0) != (u == 0) for w, u in zip(weights, units, strict=True)):
            raise PlanError(
                f"{here}: a weight and its units disagree on 0; re-run `tokentape plan`"
            )
        phases.append(PlanPhase(start, tuple(weights), tuple(units), den))
    return tuple(phases)


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read a resolved plan (``PLAN.json``, from ``tokentape plan --out`` or ``Plan.save``).

    Every field is checked for its type and range, against the others, and the index hash
    against the contents.

    Args:
        path: The ``PLAN.json`` file, or its object URL (``s3://bucket/plans/PLAN.json``;
            credentials and endpoint from the environment).

    Returns:
        The plan.

    Raises:
        PlanError: The file is missing, unreadable, not a resolved plan, or edited by hand
            (the message names the field).
    """
    check_path("path", path)
    try:
        raw = read_whole(path)
    except FileNotFoundError:
        what = "object" if is_url(path) else "file"
        raise PlanError(f"plan '{path}': no such {what}") from None
    except OSError as exc:
        raise PlanError(f"plan '{path}': not a readable JSON plan ({exc})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # ValueError: also bad UTF-8, JSON
        if _is_spec(path, raw):
            raise PlanError(
                f"plan '{path}': a plan spec (TOML), not a resolved plan: `tokentape plan "
                f"{os.fspath(path)} --out PLAN.json` resolves it (hashing its stores once); "
                "give PLAN.json here"
            ) from None
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise PlanError(f"plan '{path}': not a readable JSON plan ({why})") from None
    if not isinstance(data, dict) or data.pop("format", None) != PLAN_FORMAT:
        raise PlanError(f"plan '{path}': not a resolved tokentape plan (field 'format')")
    version = data.get("algorithm_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        shown = version if type(version) is int else json.dumps(version)[:40]
        raise PlanError(
            f"plan '{path}': algorithm_version {shown} is not one of "
            f"{', '.join(map(str, READABLE_VERSIONS))}; re-run `tokentape plan`"
        )
    plan, recorded = _plan_fields(data, f"plan '{path}'", version)
    # The plan computed its derived fields from the others: the file's must be those.
    _check_derived(path, plan, data["sources"], ["n_samples"])
    if recorded != plan.index_hash:
        raise PlanError(
            f"plan '{path}': index_hash does not match its contents (edited by hand?); "
            "re-run `tokentape plan`"
        )
    _check_derived(path, plan, data["sources"], ["draws", "passes"])
    return plan


def _is_spec(path: str | os.PathLike[str], raw: bytes) -> bool:
    """Whether ``raw`` is a plan spec: TOML with sources (or a ``.toml`` file at all)."""
    if os.fspath(path).lower().endswith(".toml"):
        return True
    try:
        spec = tomllib.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    return "source" in spec


def _check_derived(
    path: str | os.PathLike[str], plan: Plan, recorded: list[dict[str, Any]], keys: list[str]
) -> None:
    """Refuse a file whose sources record other ``keys`` than the plan derived."""
    for given, s in zip(recorded, plan.sources, strict=True):
        follows = {
            "n_samples": f"n_tokens {s.n_tokens} at seq_len {plan.seq_len}",
            "draws": f"the weights over horizon_samples {plan.horizon_samples}",
            "passes": (
                f"draws {s.draws} over n_samples {s.n_samples} (n_tokens {s.n_tokens} at "
                f"seq_len {plan.seq_len})"
            ),
        }
        for key in keys:
            if given[key] != getattr(s, key):
                raise PlanError(
                    f"plan '{path}': source '{s.name}': {key} {given[key]} does not follow from "
                    f"{follows[key]} (edited by hand?); re-run `tokentape plan`"
                )


__all__ = ["load_plan"]

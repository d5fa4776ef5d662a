"""A plan's identity: exactly the inputs its index hash covers, in a form a person can compare,
kept in the data state; and whether a new plan changes any sample the run has already drawn.

A resume on another plan is accepted exactly when the new plan gives the same sample at every
position below ``consumed`` (``past_change``): the same sources drawn there, with the same
stores, seed and seq_len, and the same mixture up to there (a phase appended or edited at or
after ``consumed``, a source that is first drawn later, a longer horizon). The mixture is
compared from the two plans' blends with bounded work (``tape.compat``), never by resolving
the positions below ``consumed``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokentape._src.plan.plan import READABLE_VERSIONS, Plan, build_tape, index_hash
from tokentape._src.tape.blend import MAX_DENOMINATOR, MAX_POSITION
from tokentape._src.tape.compat import first_difference, first_draw
from tokentape._src.tape.excise import Excision
from tokentape._src.tape.resolve import Tape
from tokentape._src.util.text import fmt_int

_IDENTITY_FIELDS = ("weight_units", "n_tokens", "dtype", "content_hash")


def plan_identity(plan: Plan) -> dict[str, Any]:
    """Exactly the inputs the index hash covers, in a form a person can compare."""
    identity: dict[str, Any] = {
        "algorithm_version": plan.algorithm_version,
        "seq_len": plan.seq_len,
        "seed": plan.seed,
        "denominator": plan.denominator,
        "sources": [
            {"name": s.name, **{f: getattr(s, f) for f in _IDENTITY_FIELDS}} for s in plan.sources
        ],
    }
    if plan.phases:  # only then: the identity of a plan in one phase is as it was
        identity["phases"] = [
            {"start": p.start, "weight_units": list(p.weight_units)} for p in plan.phases
        ]
    if plan.excisions:  # likewise
        identity["excisions"] = [e.identity() for e in plan.excisions]
    return identity


def identity_differences(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """What differs between two plan identities: one ``(field, saved, now)`` each, in the order
    of their phrases (``describe_difference``). A field is a top-level key (``seed``, ...),
    ``sources.<name>.<field>``, ``sources`` (a source removed: ``(name, None)``, added:
    ``(None, name)``) or ``source order`` (the two lists of names)."""
    diffs: list[tuple[str, Any, Any]] = [
        (key, old.get(key), new.get(key))
        for key in ("algorithm_version", "seq_len", "seed", "denominator")
        if old.get(key) != new.get(key)
    ]
    old_sources = {s["name"]: s for s in old.get("sources", [])}
    new_sources = {s["name"]: s for s in new.get("sources", [])}
    for name in old_sources.keys() - new_sources.keys():
        diffs.append(("sources", name, None))
    for name in new_sources.keys() - old_sources.keys():
        diffs.append(("sources", None, name))
    for name in old_sources.keys() & new_sources.keys():
        for f in _IDENTITY_FIELDS:
            before, after = old_sources[name].get(f), new_sources[name].get(f)
            if before != after:
                diffs.append((f"sources.{name}.{f}", before, after))
    old_order = [s["name"] for s in old.get("sources", [])]
    new_order = [s["name"] for s in new.get("sources", [])]
    if set(old_order) == set(new_order) and old_order != new_order:
        diffs.append(("source order", old_order, new_order))
    if old.get("phases") != new.get("phases"):
        diffs.append(("phases", _starts(old), _starts(new)))
    if old.get("excisions", []) != new.get("excisions", []):
        diffs.append(("excisions", _cut_at(old), _cut_at(new)))
    return sorted(diffs, key=lambda d: describe_difference(*d))


def describe_difference(field: str, saved: Any, now: Any) -> str:
    """One difference of ``identity_differences`` as a phrase (saved → now)."""
    if field == "sources":
        return f"source '{saved}' removed" if now is None else f"source '{now}' added"
    if field == "source order":
        return f"source order {saved} → {now}"
    if field == "excisions":
        return f"excisions (from consumed: {saved} → {now})"
    if field == "phases":
        if saved == now:
            return f"phases: the weights of a phase changed (starts {saved})"
        return f"phases (their starts: {saved} → {now})"
    if field.startswith("sources."):
        name, f = field.removeprefix("sources.").rsplit(".", 1)
        return f"source '{name}': {f} {saved} → {now}"
    return f"{field}: {saved} → {now}"


def identity_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two plan identities, one phrase each (old → new)."""
    return [describe_difference(*d) for d in identity_differences(old, new)]


def identity_hash(identity: Any) -> str | None:
    """The index hash a plan identity (``plan_identity``) stands for; None when it is not one."""
    keys = {"algorithm_version", "seq_len", "seed", "denominator", "sources"}
    if not isinstance(identity, dict) or set(identity) - {"phases", "excisions"} != keys:
        return None
    ints = [identity[k] for k in ("algorithm_version", "seq_len", "seed", "denominator")]
    sources = identity["sources"]
    if any(type(v) is not int or v.bit_length() > 64 for v in ints):
        return None
    if not isinstance(sources, list):
        return None
    if identity["algorithm_version"] not in READABLE_VERSIONS:
        return None
    rows = []
    for s in sources:
        if not isinstance(s, dict) or set(s) != {"name", *_IDENTITY_FIELDS}:
            return None
        row = (s["name"], s["weight_units"], s["n_tokens"], s["dtype"], s["content_hash"])
        if not all(type(v) is t for v, t in zip(row, (str, int, int, str, str), strict=True)):
            return None
        if not row[0] or not row[0].isprintable() or row[1] < 0:
            return None
        if not identity["seq_len"] + 1 <= row[2] <= MAX_POSITION:  # one sample, a store's size
            return None
        rows.append(row)
    names = [r[0] for r in rows]
    if (
        not rows
        or len(set(names)) != len(names)
        or sum(r[1] for r in rows) != identity["denominator"]
    ):
        return None
    if not 0 < identity["denominator"] <= MAX_DENOMINATOR or identity["seq_len"] < 1:
        return None
    if not 0 <= identity["seed"] < 2**63:
        return None
    phases = _phases(identity.get("phases"), len(rows)) if "phases" in identity else []
    if phases is None:
        return None
    excisions = identity.get("excisions", [])
    if "excisions" in identity and not _excisions_ok(excisions):
        return None
    return index_hash(
        identity["seq_len"],
        identity["seed"],
        identity["denominator"],
        rows,
        identity["algorithm_version"],
        phases,
        excisions,
    )


_EXCISION_KEYS = {"from_consumed": int, "first": int, "count": int, "sha256": str}


def _excisions_ok(value: Any) -> bool:
    """Whether an identity's ``excisions`` is a non-empty list of excision identities."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(e, dict)
            and set(e) == set(_EXCISION_KEYS)
            and all(type(e[k]) is t for k, t in _EXCISION_KEYS.items())
            and 0 <= e["from_consumed"] <= e["first"] < MAX_POSITION
            and e["count"] > 0
            for e in value
        )
    )


def _cut_at(identity: dict[str, Any]) -> list[int]:
    """Where each excision of an identity applies from (its ``from_consumed``)."""
    return [e["from_consumed"] for e in identity.get("excisions", [])]


def _phases(value: Any, n_sources: int) -> list[tuple[int, list[int]]] | None:
    """An identity's ``phases`` as (start, weight units) pairs; None when malformed."""
    if not isinstance(value, list) or not value:
        return None
    out: list[tuple[int, list[int]]] = []
    for p in value:
        if not isinstance(p, dict) or set(p) != {"start", "weight_units"}:
            return None
        start, units = p["start"], p["weight_units"]
        if type(start) is not int or not 0 < start < MAX_POSITION:
            return None
        if out and start <= out[-1][0]:
            return None
        if not isinstance(units, list) or len(units) != n_sources:
            return None
        if any(type(u) is not int or u < 0 for u in units) or not 0 < sum(units) <= MAX_DENOMINATOR:
            return None
        out.append((start, units))
    return out


def _phase_units(identity: dict[str, Any]) -> list[tuple[Any, list[Any]]]:
    """Every phase's (start, weight units), the first (the sources' own, at 0) included."""
    first = (0, [s["weight_units"] for s in identity["sources"]])
    return [first, *((p["start"], p["weight_units"]) for p in identity.get("phases", []))]


def _starts(identity: dict[str, Any]) -> list[Any]:
    """Every phase's start (an identity ``identity_hash`` accepted)."""
    return [start for start, _ in _phase_units(identity)]


def identity_tape(identity: dict[str, Any]) -> Tape:
    """The tape of a plan identity (one ``identity_hash`` accepts)."""
    sources = identity["sources"]
    n_samples = [(s["n_tokens"] - 1) // identity["seq_len"] for s in sources]
    names = [s["name"] for s in sources]
    return build_tape(names, n_samples, identity["seed"], _phase_units(identity))


def past_change(
    old: dict[str, Any], new: dict[str, Any], consumed: int, excised: Excision | None = None
) -> tuple[int, str] | None:
    """None when the plan of identity ``new`` gives the same sample as ``old`` at every position
    below ``consumed``; else the first position that would change and why, in words.

    ``excised``: the positions of the excisions both identities share (``new``'s first ones,
    those ``old`` has), which both tapes leave out of their blends."""
    if consumed <= 0:
        return None
    found = _excision_change(old, new, consumed)
    limit = consumed if excised is None else excised.base_limit(consumed)
    position = _blend_change(old, new, limit)
    if position is not None:
        at = position[0] if excised is None else int(excised.to_new(np.array([position[0]]))[0][0])
        found.append((at, position[1]))
    return min(found) if found else None


def common_excisions(old: dict[str, Any], new: dict[str, Any]) -> int:
    """How many excisions the two identities share, from the first."""
    before, after = old.get("excisions", []), new.get("excisions", [])
    k = 0
    while k < min(len(before), len(after)) and before[k] == after[k]:
        k += 1
    return k


def _excision_change(
    old: dict[str, Any], new: dict[str, Any], consumed: int
) -> list[tuple[int, str]]:
    """Where the excisions of ``new`` change a position below ``consumed`` that ``old``
    drew: after the ones they share, each of ``old``'s that ``new`` drops (the run left out
    its positions) and each that ``new`` adds, from its first position."""
    k = common_excisions(old, new)
    c = fmt_int(consumed)
    found = []
    for i, e in enumerate(old.get("excisions", [])[k:], start=k + 1):
        if e["first"] < consumed:
            found.append((e["first"], f"excision {i} (from consumed "
                          f"{fmt_int(e['from_consumed'])}, first position {fmt_int(e['first'])}"
                          f" < consumed {c}) is dropped or changed"))  # fmt: skip
    for i, e in enumerate(new.get("excisions", [])[k:], start=k + 1):
        if e["first"] < consumed:
            found.append((e["first"], f"excision {i} (from consumed "
                          f"{fmt_int(e['from_consumed'])}) leaves out position "
                          f"{fmt_int(e['first'])}, below consumed {c}: the run trained on it "
                          "already; excise from a checkpoint at or before it"))  # fmt: skip
    return found


def _blend_change(
    old: dict[str, Any], new: dict[str, Any], consumed: int
) -> tuple[int, str] | None:
    """The first base position below ``consumed`` whose sample differs between the two
    identities' blends (the seed, seq_len, a store, the mixture), and why."""
    old_tape, new_tape = identity_tape(old), identity_tape(new)
    found: list[tuple[int, str]] = []
    for key, why in (("seq_len", "changes every sample"), ("seed", "reorders every source")):
        if old[key] != new[key]:
            found.append((0, f"the {key} {why}, from position 0"))
    now = {s["name"]: s for s in new["sources"]}
    for d, s in enumerate(old["sources"]):
        first = first_draw(old_tape, d)
        after = now.get(s["name"])
        if first is None or first >= consumed or after is None:
            continue  # never drawn below consumed (a source removed: the mixture differs)
        if any(s[f] != after[f] for f in _IDENTITY_FIELDS[1:]):
            why = f"the store of source '{s['name']}' changed, and the run drew from it"
            found.append((first, f"{why} from position {first:,}"))
    position = first_difference(old_tape, new_tape, consumed)
    if position is not None:
        was, will = (_name_at(t, position) for t in (old_tape, new_tape))
        drawn = f"position {position:,} would draw '{will}' where the run drew '{was}'"
        found.append((position, f"{_mixture_change(old, new, consumed)}; {drawn}"))
    return min(found) if found else None


def _name_at(tape: Tape, position: int) -> str:
    return tape.names[int(tape.resolve([position]).source[0])]


def _mixture_change(old: dict[str, Any], new: dict[str, Any], consumed: int) -> str:
    """The first phase that starts below ``consumed`` and differs, in words."""
    before, after = _named_phases(old), _named_phases(new)
    c = fmt_int(consumed)
    for k in range(max(len(before), len(after))):
        o = before[k] if k < len(before) else None
        n = after[k] if k < len(after) else None
        reordered = o is not None and n is not None and o == n and list(o[1]) != list(n[1])
        if reordered and o is not None and o[0] < consumed:  # the same weights by name
            return f"phase {k + 1} lists its sources in another order"
        if o == n:
            continue
        if n is not None and n[0] < consumed and (o is None or n[0] < o[0]):
            return f"phase {k + 1} starts at {fmt_int(n[0])} < consumed {c}"
        if o is not None and o[0] < consumed and (n is None or o[0] < n[0]):
            now = "is removed" if n is None else f"would start at {fmt_int(n[0])}"
            return f"phase {k + 1} started at {fmt_int(o[0])} < consumed {c} and {now}"
        if o is not None and n is not None and o[0] < consumed:
            changes = ", ".join(
                f"{name} {o[1].get(name, 0)} → {n[1].get(name, 0)}"
                for name in dict.fromkeys([*o[1], *n[1]])
                if o[1].get(name, 0) != n[1].get(name, 0)
            )
            return f"phase {k + 1} (from {fmt_int(o[0])} < consumed {c}) changes weights: {changes}"
        break
    return "the mixture changes"


def _named_phases(identity: dict[str, Any]) -> list[tuple[int, dict[str, str]]]:
    """Each phase's start and its positive weights by name (as 'units/period')."""
    names = [s["name"] for s in identity["sources"]]
    return [
        (start, {n: f"{u}/{sum(w)}" for n, u in zip(names, w, strict=True) if u})
        for start, w in _phase_units(identity)
    ]


__all__ = [
    "common_excisions",
    "describe_difference",
    "identity_diff",
    "identity_differences",
    "identity_hash",
    "identity_tape",
    "past_change",
    "plan_identity",
]

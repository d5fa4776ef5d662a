"""A plan's excisions as it records them: what each left out, from where, and its positions.

``Plan.excise`` adds one; ``PLAN.json`` lists them under ``excisions`` (absent when there are
none, so a plan without one reads and hashes as before). Each holds the base positions it
left out (``tape.excise``) as checked text, and what they were: the documents or the logged
steps excised and the samples removed per source. The index hash covers each excision's
consumed, first changed position, count and positions' hash; a data state compares those to
decide a resume (``train.identity``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokentape._src.tape.excise import decode_positions, encode_positions, positions_sha256
from tokentape._src.util.checks import shown
from tokentape.errors import PlanError

_KEYS = {"from_consumed", "first", "count", "sha256", "on", "positions", "docs", "steps",
         "removed"}  # fmt: skip


@dataclass(frozen=True)
class PlanExcision:
    """One excision of a plan (``Plan.excise``).

    Attributes:
        from_consumed: The position (``consumed``) it applies from: nothing below changes.
        first: The first position it changes (the first sample it leaves out), counted in the
            positions of the plan before it; a run resumes across it at ``consumed <= first``.
        count: The samples it leaves out (within the plan's horizon).
        sha256: The hash of its base positions (``tape.excise.positions_sha256``).
        on: The index hash of the plan it was made on (with the excisions before it): its
            positions are that blend's, so a plan whose blend differs refuses it.
        positions: Its base positions, ascending (not compared: ``sha256`` stands for them).
        docs: The documents it leaves out, as (source, document id).
        steps: The logged steps whose samples it leaves out (first, last), if so made.
        removed: The samples it leaves out per source, as (source, count).
    """

    from_consumed: int
    first: int
    count: int
    sha256: str
    on: str
    positions: np.ndarray = field(compare=False, hash=False, repr=False)
    docs: tuple[tuple[str, int], ...] = ()
    steps: tuple[int, int] | None = None
    removed: tuple[tuple[str, int], ...] = ()

    def identity(self) -> dict[str, Any]:
        """What the index hash and a data state's identity hold of it."""
        return {"from_consumed": self.from_consumed, "first": self.first,
                "count": self.count, "sha256": self.sha256}  # fmt: skip

    def summary(self) -> dict[str, Any]:
        """Its identity and what it left out (documents, steps, samples per source): what
        ``info PLAN --json`` and ``excise --json`` show of it."""
        return {**self.identity(), **self._left_out()}

    def to_json(self) -> dict[str, Any]:
        """Its entry in ``PLAN.json``: the summary, the plan it was made on, its positions."""
        positions = encode_positions(self.positions)
        return {**self.identity(), "on": self.on, "positions": positions, **self._left_out()}

    def _left_out(self) -> dict[str, Any]:
        steps = None if self.steps is None else list(self.steps)
        return {"docs": [list(d) for d in self.docs], "steps": steps,
                "removed": dict(self.removed)}  # fmt: skip

    @property
    def what(self) -> str:
        """What it left out, in a few words."""
        parts = []
        if self.docs:
            shown_docs = ", ".join(f"{s} {d}" for s, d in self.docs[:3])
            more = f" and {len(self.docs) - 3} more" if len(self.docs) > 3 else ""
            parts.append(f"document{'s' if len(self.docs) != 1 else ''} {shown_docs}{more}")
        if self.steps is not None:
            parts.append(f"the samples of steps {self.steps[0]}..{self.steps[1]}")
        return " and ".join(parts) or "samples"


def _int(data: dict[str, Any], key: str, where: str, low: int = 0) -> int:
    value = data.get(key)
    if type(value) is not int or value < low:
        raise PlanError(f"{where}: field '{key}' must be an integer >= {low}, got {shown(value)}")
    return value


def parse_excision(data: Any, names: list[str], where: str) -> PlanExcision:
    """One entry of ``PLAN.json``'s ``excisions``, checked (positions against their hash)."""
    if not isinstance(data, dict) or set(data) != _KEYS:
        raise PlanError(f"{where}: expected an object with the fields {sorted(_KEYS)}")
    count = _int(data, "count", where, 1)
    sha, on = data["sha256"], data["on"]
    if not isinstance(sha, str) or not isinstance(on, str):
        raise PlanError(f"{where}: fields 'sha256' and 'on' must be text")
    positions = decode_positions(data["positions"], count, sha, f"{where}: positions")
    c, first = _int(data, "from_consumed", where), _int(data, "first", where)
    if first < c:
        raise PlanError(f"{where}: 'first' {first} is below 'from_consumed' {c}")
    docs = data["docs"]
    if not isinstance(docs, list) or not all(
        isinstance(d, list) and len(d) == 2 and d[0] in names and type(d[1]) is int and d[1] >= 0
        for d in docs
    ):
        raise PlanError(f"{where}: field 'docs' must list [source, document] pairs of the plan")
    steps = data["steps"]
    if steps is not None and not (
        isinstance(steps, list) and len(steps) == 2 and all(type(x) is int for x in steps)
        and 0 <= steps[0] <= steps[1]
    ):  # fmt: skip
        raise PlanError(f"{where}: field 'steps' must be null or [first, last]")
    removed = data["removed"]
    if not isinstance(removed, dict) or not all(
        k in names and type(v) is int and v > 0 for k, v in removed.items()
    ) or sum(removed.values()) != count:  # fmt: skip
        raise PlanError(f"{where}: field 'removed' must count the samples per source ({count})")
    return PlanExcision(
        c, first, count, sha, on, positions, tuple((s, d) for s, d in docs),
        None if steps is None else (steps[0], steps[1]), tuple(removed.items()),
    )  # fmt: skip


def new_excision(
    from_consumed: int,
    first: int,
    on: str,
    positions: np.ndarray,
    sources: np.ndarray,
    names: list[str],
    docs: tuple[tuple[str, int], ...] = (),
    steps: tuple[int, int] | None = None,
) -> PlanExcision:
    """The record of an excision of base ``positions`` (drawing from ``sources``)."""
    counts = np.bincount(sources, minlength=len(names)).tolist()
    removed = tuple((n, c) for n, c in zip(names, counts, strict=True) if c)
    return PlanExcision(from_consumed, first, int(positions.size), positions_sha256(positions),
                        on, positions, docs, steps, removed)  # fmt: skip


__all__ = ["PlanExcision", "new_excision", "parse_excision"]

"""The data pipeline's checkpoint state: ``consumed`` and what it must be checked against.

``consumed`` counts samples the optimizer has applied; it moves only when a step is committed.
Beside it: the plan's index hash and identity (what the hash covers, so a refusal can say what
changed), and the batch history (the step and ``consumed`` at which the batch shape changed), so
that any step number maps back to its positions. Everything is JSON-friendly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from os import PathLike
from typing import Any

from tokentape._src.plan.plan import Plan, joined_excision
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.train.identity import (
    common_excisions,
    describe_difference,
    identity_differences,
    identity_hash,
    past_change,
    plan_identity,
)
from tokentape._src.train.partition import BatchConfig
from tokentape._src.util.checks import as_index, check_int, shown
from tokentape.errors import (
    ArgumentError,
    InputError,
    OutOfRangeError,
    ResumeRefused,
    TokentapeError,
    _reworded,
)

STATE_VERSION = 1


def _count(data: dict[str, Any], key: str, where: str, least: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InputError(f"{where}: '{key}' must be an integer >= {least}, got {shown(value)}")
    if value > MAX_POSITION:  # a state may sit at 2**62: every position was consumed
        raise InputError(f"{where}: '{key}' must be at most 2**62, got {shown(value)}")
    return value


def _change(data: Any, where: str) -> BatchChange:
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected an object")
    change = BatchChange(
        step=_count(data, "step", where, 0),
        consumed=_count(data, "consumed", where, 0),
        dp_size=_count(data, "dp_size", where, 1),
        micro=_count(data, "micro", where, 1),
        accum=_count(data, "accum", where, 1),
    )
    try:
        change.config  # noqa: B018 -- a step of more than 2**62 samples is refused here
    except TokentapeError as exc:
        raise _reworded(exc, f"{where}: {exc}") from None
    return change


@dataclass(frozen=True)
class BatchChange:
    """From ``step`` on (with ``consumed`` samples applied before it), steps have this shape."""

    step: int
    consumed: int
    dp_size: int
    micro: int
    accum: int

    @property
    def config(self) -> BatchConfig:
        return BatchConfig(self.dp_size, self.micro, self.accum)


@dataclass(frozen=True)
class PlanChange:
    """At ``step`` (with ``consumed`` samples applied), the run went on under another plan that
    gives the same sample at every position below ``consumed``."""

    step: int
    consumed: int
    old_index_hash: str
    new_index_hash: str


def _plan_change(data: Any, where: str) -> PlanChange:
    if not isinstance(data, dict) or set(data) != {
        "step", "consumed", "old_index_hash", "new_index_hash"
    }:  # fmt: skip
        raise InputError(
            f"{where}: expected an object of step, consumed, old_index_hash, new_index_hash"
        )
    for key in ("old_index_hash", "new_index_hash"):
        value = data[key]
        if not isinstance(value, str) or not value.isprintable() or not 0 < len(value) <= 200:
            raise InputError(f"{where}: '{key}' must be an index hash, got {shown(value)}")
    return PlanChange(
        _count(data, "step", where, 0),
        _count(data, "consumed", where, 0),
        data["old_index_hash"],
        data["new_index_hash"],
    )


@dataclass(frozen=True)
class DataState:
    """The data pipeline's checkpoint state: an immutable snapshot; ``commit`` returns the next.

    Saved with the model (``to_dict``, JSON-friendly) and read back with ``from_dict``; a state
    resumes on its plan, or on another that gives the same sample at every position below
    ``consumed`` (``resume_on``, which records the change).

    Attributes:
        index_hash: The index hash of the plan the state was started on.
        identity: That plan's identity: exactly the inputs the index hash covers (algorithm
            version, seq_len, seed, denominator, and each source's name, weight units, token
            count, dtype and content hash), so that a refusal can name what changed.
        consumed: Samples the optimizer has applied (0 at the start); it moves only on
            ``commit``.
        step: Optimizer steps committed (0 at the start).
        history: The batch shape changes: one ``BatchChange`` (step, ``consumed`` before it and
            the shape) per step at which the shape changed, the first step included; empty
            before the first step. Any step number maps back to its positions through it.
        plan_changes: The plans the run went on under (``resume_on``): one ``PlanChange``
            (step, ``consumed``, old and new index hash) each, in order; empty while the run
            keeps the plan it started on.
    """

    index_hash: str
    identity: dict[str, Any]
    consumed: int = 0
    step: int = 0
    history: tuple[BatchChange, ...] = ()
    plan_changes: tuple[PlanChange, ...] = ()

    def __post_init__(self) -> None:
        """Refuse fields of the wrong type. ``index_hash`` is derived from ``identity``: that
        it is is checked where a state is used (``from_dict``, ``resume_on``), so a state
        made by hand with a stale hash is refused before it resumes anything."""
        if not isinstance(self.identity, dict):
            raise ArgumentError(
                f"DataState: identity must be a plan identity (a dict), got {shown(self.identity)}"
            )
        check_int("DataState: consumed", self.consumed, 0, MAX_POSITION)
        check_int("DataState: step", self.step, 0, MAX_POSITION)
        for name, kind in (("history", BatchChange), ("plan_changes", PlanChange)):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(c, kind) for c in value):
                raise ArgumentError(
                    f"DataState: {name} must be a tuple of {kind.__name__}, got {shown(value)}"
                )

    @classmethod
    def start(cls, plan: Plan) -> DataState:
        """The state at the start of ``plan``: nothing consumed, no step taken.

        Args:
            plan: The plan to train on.

        Returns:
            A state at step 0 with ``plan``'s index hash and identity.

        Raises:
            ArgumentError: ``plan`` is not a ``Plan``.
        """
        return cls(_plan_arg(plan).index_hash, plan_identity(plan))

    def commit(self, config: BatchConfig) -> DataState:
        """The state after one more optimizer step of shape ``config`` was applied.

        Args:
            config: The shape of the step applied; a shape that differs from the last one
                starts a new entry of ``history``.

        Returns:
            The next state: ``consumed`` advanced by ``config.global_batch``, ``step`` by one.

        Raises:
            ArgumentError: ``config`` is not a ``BatchConfig``.
            OutOfRangeError: The step would end beyond position 2**62.
        """
        if not isinstance(config, BatchConfig):
            raise ArgumentError(f"config must be a BatchConfig, got {shown(config)}")
        if self.consumed + config.global_batch > MAX_POSITION:
            raise OutOfRangeError(
                f"commit: a step of {config.global_batch} samples after consumed {self.consumed} "
                "ends beyond position 2**62"
            )
        history = self.history
        if not history or history[-1].config != config:
            change = BatchChange(
                self.step, self.consumed, config.dp_size, config.micro, config.accum
            )
            history = (*history, change)
        return replace(
            self,
            consumed=self.consumed + config.global_batch,
            step=self.step + 1,
            history=history,
        )

    def consumed_before(self, step: int) -> tuple[int, BatchConfig]:
        """``consumed`` at the start of ``step`` and that step's shape.

        Args:
            step: A step already committed: ``0 <= step < self.step``.

        Returns:
            ``(consumed, config)``: the samples applied before ``step`` and its shape.

        Raises:
            ArgumentError: ``step`` is not an integer.
            OutOfRangeError: ``step`` is not in the history.
        """
        step = as_index("step", step)
        if not 0 <= step < self.step:
            raise OutOfRangeError(f"step {step} is not in the history (steps 0..{self.step - 1})")
        change = next(c for c in reversed(self.history) if c.step <= step)
        return change.consumed + (step - change.step) * change.config.global_batch, change.config

    def to_dict(self) -> dict[str, Any]:
        """The state as JSON-friendly data (what ``from_dict`` reads back).

        Returns:
            A dict of ``version``, ``index_hash``, ``identity``, ``consumed``, ``step``,
            ``history`` (a list of objects) and, once the run changed plans, ``plan_changes``.
        """
        data = {
            "version": STATE_VERSION,
            "index_hash": self.index_hash,
            "identity": self.identity,
            "consumed": self.consumed,
            "step": self.step,
            "history": [c.__dict__ for c in self.history],
        }
        if self.plan_changes:  # only then: a run on one plan saves what it always saved
            data["plan_changes"] = [c.__dict__ for c in self.plan_changes]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataState:
        """A saved state, checked field by field and for a consistent batch history.

        Args:
            data: What ``to_dict`` returned (e.g. read back from JSON).

        Returns:
            The state. It is not yet checked against a plan: see ``check_plan``.

        Raises:
            ArgumentError: ``data`` is not a dict.
            InputError: ``data`` is not a state of this version, a field is missing or of the
                wrong type or range, the index hash does not match the identity, or the
                history does not add up to ``step`` and ``consumed``.
        """
        if not isinstance(data, dict):
            raise ArgumentError(
                f"data must be a data state as to_dict() returned it (a dict), got {shown(data)}"
            )
        if data.get("version") != STATE_VERSION:
            raise InputError(f"data state: expected a tokentape state of version {STATE_VERSION}")
        history = data.get("history")
        if not isinstance(history, list):
            raise InputError("data state: 'history' must be a list")
        changes = data.get("plan_changes", [])
        if not isinstance(changes, list) or ("plan_changes" in data and not changes):
            raise InputError("data state: 'plan_changes' must be a non-empty list (or absent)")
        if not isinstance(data.get("index_hash"), str) or not isinstance(
            data.get("identity"), dict
        ):
            raise InputError("data state: 'index_hash' (a string) and 'identity' are required")
        expected = identity_hash(data["identity"])
        if expected is None:
            raise InputError(
                "data state: 'identity' is not a plan identity (algorithm_version, seq_len, seed, "
                "denominator, sources)"
            )
        if expected != data["index_hash"]:
            raise InputError(
                f"data state: 'index_hash' {data['index_hash'][:19]!r}… does not match its "
                f"'identity' (which hashes to {expected[:19]}…): edited or mixed up"
            )
        state = cls(
            index_hash=data["index_hash"],
            identity=dict(data["identity"]),
            consumed=_count(data, "consumed", "data state", 0),
            step=_count(data, "step", "data state", 0),
            history=tuple(_change(c, f"data state: history[{i}]") for i, c in enumerate(history)),
            plan_changes=tuple(
                _plan_change(c, f"data state: plan_changes[{i}]") for i, c in enumerate(changes)
            ),
        )
        state._check_history()
        state._check_plan_changes()
        return state

    def _check_history(self) -> None:
        """The history starts at step 0 and each change (and ``consumed``) follows from the
        steps before it."""
        if not self.history:
            if self.step or self.consumed:
                raise InputError("data state: steps were taken but the history is empty")
            return
        at_step, at_consumed, batch = 0, 0, self.history[0].config.global_batch
        for i, c in enumerate(self.history):
            expected = at_consumed + (c.step - at_step) * batch
            if c.step < at_step or c.step >= self.step or c.consumed != expected:
                raise InputError(
                    f"data state: history[{i}] (step {c.step}, consumed {c.consumed}) does not "
                    f"follow from the steps before it (expected consumed {expected})"
                )
            at_step, at_consumed, batch = c.step, c.consumed, c.config.global_batch
        expected = at_consumed + (self.step - at_step) * batch
        if self.consumed != expected:
            raise InputError(
                f"data state: consumed {self.consumed} does not follow from the history "
                f"(expected {expected} after step {self.step - 1})"
            )

    def _check_plan_changes(self) -> None:
        """Each plan change follows the one before it, at a step the history has, and the last
        one leads to the state's index hash."""
        at_step, index = 0, self.plan_changes[0].old_index_hash if self.plan_changes else ""
        for i, c in enumerate(self.plan_changes):
            where = f"data state: plan_changes[{i}]"
            if c.step < at_step or c.step > self.step or c.old_index_hash != index:
                raise InputError(
                    f"{where}: does not follow the change before it (steps in order, up to "
                    f"step {self.step}, each from the index hash the one before led to)"
                )
            expected = self.consumed if c.step == self.step else self.consumed_before(c.step)[0]
            if c.consumed != expected:
                raise InputError(
                    f"{where}: consumed {c.consumed} is not the history's at step {c.step} "
                    f"({expected})"
                )
            at_step, index = c.step, c.new_index_hash
        if self.plan_changes and index != self.index_hash:
            raise InputError(
                "data state: the last of 'plan_changes' does not lead to its 'index_hash'"
            )

    def resume_on(self, plan: Plan) -> DataState:
        """The state to go on from under ``plan``: this one when it is the plan the state is
        on; else, when ``plan`` gives the same sample at every position below ``consumed``
        (a phase appended or edited at or after ``consumed``, a source first drawn later, a
        longer horizon), this state moved to ``plan`` with the change recorded.

        The plan's index hash is its own (a ``Plan`` computes it from its fields at
        construction, however it was made), so a plan rebuilt by any route resumes as the
        same plan, and a plan changed by any route is compared sample by sample below
        ``consumed``.

        Args:
            plan: The plan to go on under: a ``Plan`` (``load_plan`` reads one from its
                ``PLAN.json``; a path is not accepted here).

        Returns:
            A state on ``plan`` (``plan_changes`` records the change, if any).

        Raises:
            ArgumentError: ``plan`` is not a ``Plan``.
            InputError: This state's ``index_hash`` is not the hash of its ``identity`` (a
                state built by hand; ``from_dict`` refuses such data).
            ResumeRefused: ``plan`` would change a sample below ``consumed``; the message
                names what changes and the first position it changes, and ``differences``
                lists what differs between the plans (seed, a source's content hash, ...).
        """
        _plan_arg(plan)
        if identity_hash(self.identity) != self.index_hash:  # derived: never taken on trust
            raise InputError(
                f"data state: 'index_hash' {shown(self.index_hash)} is not the hash of its "
                "'identity': edited or mixed up"
            )
        if plan.index_hash == self.index_hash:
            return self
        identity = plan_identity(plan)
        shared = plan.excisions[: common_excisions(self.identity, identity)]
        change = past_change(self.identity, identity, self.consumed, joined_excision(shared))
        if change is None:
            record = PlanChange(self.step, self.consumed, self.index_hash, plan.index_hash)
            return replace(
                self,
                index_hash=plan.index_hash,
                identity=identity,
                plan_changes=(*self.plan_changes, record),
            )
        differences = tuple(identity_differences(self.identity, identity))
        diffs = [describe_difference(*d) for d in differences]
        hint = ""
        if self.identity.get("algorithm_version") != plan.algorithm_version:
            hint = (
                f" (a run started under algorithm version {self.identity['algorithm_version']} "
                "resumes on the PLAN.json it started with, which keeps its tape; a plan file "
                "resolved again is another plan)"
            )
        raise ResumeRefused(
            f"refusing to resume at consumed {self.consumed:,}: {change[1]}. The checkpoint's "
            f"index hash {self.index_hash[:19]}… differs from the plan's {plan.index_hash[:19]}…: "
            + "; ".join(diffs)
            + hint,
            differences=differences,
        )

    def check_plan(self, plan: Plan) -> None:
        """Refuse to resume on a plan that changes a sample the run already drew.

        Args:
            plan: The plan to resume on (a ``Plan``).

        Raises:
            ArgumentError: ``plan`` is not a ``Plan``.
            ResumeRefused: See ``resume_on``.
        """
        self.resume_on(plan)


def _plan_arg(plan: object) -> Plan:
    """``plan`` when it is a ``Plan``; a path or anything else is refused, naming ``plan``."""
    if not isinstance(plan, Plan):
        hint = " (load_plan(path) reads a PLAN.json)" if isinstance(plan, str | PathLike) else ""
        raise ArgumentError(f"plan must be a Plan{hint}, got {shown(plan)}")
    return plan


__all__ = ["BatchChange", "DataState", "PlanChange", "identity_hash"]

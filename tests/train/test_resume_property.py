"""Exact resumption, whatever route built the plans: a data state started on one plan resumes on
another exactly when every position below its ``consumed`` gives the same sample on both.

Plans are built by every public route (``Plan.build``, a plan TOML resolved as ``tokentape
plan`` resolves it, ``load_plan`` of a saved PLAN.json, ``Plan(...)`` from fields, and
``dataclasses.replace`` of another plan) and changed by every route too (the plan's inputs
stated again, or ``dataclasses.replace`` of any field: seed, seq_len, horizon, phases,
storage_options, a source's weight, path, content hash or token count). The truth is computed
independently of the index hash: both tapes resolve every position below ``consumed`` to
(source name, epoch, sample), which must agree, with the same store content and seq_len. A
plan rebuilt by any route from the same inputs is the same plan: equal, with the same index
hash and PLAN.json, and resumed on as it is. ``make fuzz`` runs it with many more examples.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import make_store
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan, PlanPhase, PlanSource, resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState
from tokentape.errors import ArgumentError, PlanError, ResumeRefused

pytestmark = pytest.mark.fuzz

EXAMPLES = 50 if settings.default.max_examples <= 100 else settings.default.max_examples
"""Few in the ordinary run (a few seconds); the ``fuzz`` profile's count under ``make fuzz``."""
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
NAMES = ("web", "code", "math")


@dataclasses.dataclass(frozen=True)
class Spec:
    """A plan's inputs as its author states them (absolute store paths)."""

    seq_len: int
    seed: int
    horizon: int
    sources: tuple[tuple[str, str, int], ...]  # (name, path, weight)
    phases: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (start sample, weight per source)
    options: tuple[tuple[str, Any], ...] = ()

    def tables(self) -> dict[str, dict[str, Any]]:
        return {n: {"path": p, "weight": w, "max_repeats": 1000} for n, p, w in self.sources}

    def phase_tables(self) -> list[dict[str, Any]]:
        names = [n for n, _, _ in self.sources]
        return [
            {"start_samples": s, "weights": {n: w for n, w in zip(names, ws, strict=True) if w}}
            for s, ws in self.phases
        ]

    def toml(self) -> str:
        lines = [f"seq_len = {self.seq_len}", f"seed = {self.seed}",
                 f"total_samples = {self.horizon}"]  # fmt: skip
        if self.options:
            lines += ["[storage_options]", *(f"{k} = {json.dumps(v)}" for k, v in self.options)]
        for name, table in self.tables().items():
            lines += ["[[source]]", f'name = "{name}"']
            lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
        for table in self.phase_tables():
            weights = ", ".join(f"{n} = {w}" for n, w in table["weights"].items())
            lines += ["[[phase]]", f"start_samples = {table['start_samples']}",
                      f"weights = {{ {weights} }}"]  # fmt: skip
        return "\n".join(lines) + "\n"


class Routes:
    """Every public way to a plan of a ``Spec``."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._files = itertools.count()

    def build(self, spec: Spec) -> Plan:
        return Plan.build(
            spec.tables(), seq_len=spec.seq_len, seed=spec.seed, total_samples=spec.horizon,
            storage_options=dict(spec.options) or None, phases=spec.phase_tables(),
        )  # fmt: skip

    def toml(self, spec: Spec) -> Plan:
        path = self.scratch / f"plan-{next(self._files)}.toml"
        path.write_text(spec.toml())
        return resolve_plan(load_plan_spec(path), str(path))

    def json(self, spec: Spec) -> Plan:
        path = self.scratch / f"PLAN-{next(self._files)}.json"
        self.build(spec).save(path)
        return load_plan(path)

    def direct(self, spec: Spec) -> Plan:
        """``Plan(...)`` from the fields, the derived ones (``n_samples``, ``draws``,
        ``passes``, the index hash) left for the plan to compute."""
        resolved = self.build(spec)
        sources = tuple(
            PlanSource(**{**vars(s), "n_samples": 0, "draws": 0, "passes": 0.0})
            for s in resolved.sources
        )
        return Plan(
            resolved.algorithm_version, resolved.seq_len, resolved.seed, resolved.denominator,
            resolved.horizon_samples, sources, dict(resolved.storage_options), resolved.phases,
        )  # fmt: skip

    def replace(self, spec: Spec) -> Plan:
        """Another plan (another seed and horizon) made into this one by ``replace``."""
        other = self.build(dataclasses.replace(spec, seed=spec.seed + 1, horizon=spec.horizon + 7))
        return dataclasses.replace(other, seed=spec.seed, horizon_samples=spec.horizon)

    ROUTES = ("build", "toml", "json", "direct", "replace")

    def make(self, route: str, spec: Spec) -> Plan:
        return getattr(self, route)(spec)

    def any_route(self, data: st.DataObject, spec: Spec) -> Plan:
        """The plan of ``spec``, made by a route ``data`` draws."""
        return self.make(data.draw(st.sampled_from(self.ROUTES)), spec)


@pytest.fixture(scope="module")
def stores(mixture_stores: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The three stores, and two stand-ins for 'web': the same token count with other
    content ('wab'), and other content with another token count ('webx')."""
    root = tmp_path_factory.mktemp("resume-property")
    paths = {name: str(mixture_stores / "stores" / name) for name in NAMES}
    for name in ("wab", "webx"):
        paths[name] = str(make_store(root, name, 120))
    (root / "scratch").mkdir()
    paths["scratch"] = str(root / "scratch")
    return paths


# --- strategies ---------------------------------------------------------------------------------


def weights(positive: bool) -> st.SearchStrategy[tuple[int, ...]]:
    w = st.tuples(*(st.integers(0, 4) for _ in NAMES))
    return w.map(lambda t: t if any(t) else (1, *t[1:])) if positive else w


@st.composite
def specs(draw: st.DrawFn, stores: dict[str, str]) -> Spec:
    horizon = draw(st.integers(200, 1500))
    starts = sorted(draw(st.sets(st.integers(1, horizon - 1), max_size=2)))
    first = draw(weights(positive=True))
    later = tuple((s, draw(weights(positive=True))) for s in starts)
    drawn = [any(w[d] for w in (first, *(ws for _, ws in later))) for d in range(len(NAMES))]
    first = tuple(w if drawn[d] else 1 for d, w in enumerate(first))  # each source drawn once
    sources = tuple((n, stores[n], w) for n, w in zip(NAMES, first, strict=True))
    return Spec(
        seq_len=draw(st.sampled_from([8, 16, 24])),
        seed=draw(st.integers(0, 5)),
        horizon=horizon,
        sources=sources,
        phases=later,
        options=draw(st.sampled_from([(), (("anon", True),)])),
    )


@st.composite
def changed_specs(draw: st.DrawFn, spec: Spec, stores: dict[str, str]) -> Spec:
    """``spec`` stated again, as it is or with one of its inputs changed."""
    kind = draw(st.sampled_from(
        ["same", "seed", "seq_len", "horizon", "weights", "phase", "store", "options"]
    ))  # fmt: skip
    if kind == "same":
        return spec
    if kind == "seed":
        return dataclasses.replace(spec, seed=draw(st.integers(0, 5)))
    if kind == "seq_len":
        return dataclasses.replace(spec, seq_len=draw(st.sampled_from([8, 16, 24])))
    if kind == "horizon":
        last = max([s for s, _ in spec.phases], default=0)
        return dataclasses.replace(spec, horizon=draw(st.integers(last + 1, 2000)))
    if kind == "weights":
        new = draw(weights(positive=True))
        drawn = [any(w[d] for w in (new, *(ws for _, ws in spec.phases))) for d in range(3)]
        new = tuple(w if drawn[d] else 1 for d, w in enumerate(new))
        sources = tuple((n, p, w) for (n, p, _), w in zip(spec.sources, new, strict=True))
        return dataclasses.replace(spec, sources=sources)
    if kind == "phase":
        start = draw(st.integers(1, spec.horizon - 1))
        kept = tuple((s, w) for s, w in spec.phases if s != start)
        phases = tuple(sorted({*kept, (start, draw(weights(positive=True)))}))
        if draw(st.booleans()) and spec.phases:  # or drop the last phase instead
            phases = spec.phases[:-1]
        return dataclasses.replace(spec, phases=phases)
    if kind == "store":
        web = draw(st.sampled_from(["wab", "webx"]))
        sources = ((spec.sources[0][0], stores[web], spec.sources[0][2]), *spec.sources[1:])
        return dataclasses.replace(spec, sources=sources)
    options = draw(st.sampled_from([(), (("anon", False),), (("endpoint_url", "http://x"),)]))
    return dataclasses.replace(spec, options=options)


@st.composite
def replaced(draw: st.DrawFn, plan: Plan) -> Plan:
    """``plan`` with one field (or one source's field) replaced: the construction may be
    refused (PlanError, ArgumentError) when the fields no longer agree."""
    kind = draw(st.sampled_from(
        ["seed", "seq_len", "horizon", "options", "phases", "weight", "path", "content",
         "n_tokens", "units"]
    ))  # fmt: skip
    if kind == "seed":
        return dataclasses.replace(plan, seed=draw(st.integers(0, 5)))
    if kind == "seq_len":
        return dataclasses.replace(plan, seq_len=draw(st.sampled_from([8, 12, 16, 24])))
    if kind == "horizon":
        return dataclasses.replace(plan, horizon_samples=draw(st.integers(1, 2000)))
    if kind == "options":
        return dataclasses.replace(plan, storage_options={"anon": draw(st.booleans())})
    if kind == "phases":
        if plan.phases and draw(st.booleans()):
            phases = plan.phases[:-1]
        else:
            units = draw(weights(positive=True))
            start = draw(st.integers(1, plan.horizon_samples - 1))
            phase = PlanPhase(start, tuple(float(u) for u in units), units, sum(units))
            phases = tuple(sorted({*plan.phases, phase}, key=lambda p: p.start))
        return dataclasses.replace(plan, phases=phases)
    d = draw(st.integers(0, len(plan.sources) - 1))
    s = plan.sources[d]
    if kind == "weight":  # the stated weight only: the units (the tape) stay
        change: dict[str, Any] = {"weight": s.weight * 2 if s.weight else 0}
    elif kind == "path":
        change = {"path": s.path + "-moved"}
    elif kind == "content":
        change = {"content_hash": "sha256:" + "0" * 64}
    elif kind == "n_tokens":
        change = {"n_tokens": s.n_tokens + draw(st.sampled_from([-40, -1, 1, 40]))}
    else:  # the units, with the denominator they sum to
        units = draw(st.integers(1, 6)) if s.weight_units else 0
        sources = list(plan.sources)
        sources[d] = dataclasses.replace(s, weight_units=units)
        return dataclasses.replace(
            plan, sources=tuple(sources), denominator=sum(x.weight_units for x in sources)
        )
    sources = list(plan.sources)
    sources[d] = dataclasses.replace(s, **change)
    return dataclasses.replace(plan, sources=tuple(sources))


# --- the truth ----------------------------------------------------------------------------------


def same_samples(a: Plan, b: Plan, consumed: int) -> bool:
    """Whether positions ``[0, consumed)`` give the same samples on both plans: the same source
    (by name), pass and sample, of the same store (content hash, token count and dtype), at the
    same seq_len."""
    if consumed == 0:
        return True
    if a.seq_len != b.seq_len:
        return False
    positions = np.arange(consumed, dtype=np.int64)
    ra, rb = a.tape().resolve(positions), b.tape().resolve(positions)
    keys = []
    for plan, r in ((a, ra), (b, rb)):  # a store is its content: hash, token count, dtype
        store = np.array(
            [f"{s.name}|{s.content_hash}|{s.n_tokens}|{s.dtype}" for s in plan.sources]
        )
        keys.append((store[r.source], r.epoch, r.sample))
    return all(np.array_equal(x, y) for x, y in zip(*keys, strict=True))


def state_at(plan: Plan, cuts: list[int]) -> DataState:
    """The state after steps of the sizes ``cuts`` on ``plan``, read back as a checkpoint."""
    state = DataState.start(plan)
    for size in cuts:
        state = state.commit(BatchConfig(1, size, 1))
    return DataState.from_dict(json.loads(json.dumps(state.to_dict())))


@st.composite
def steps(draw: st.DrawFn) -> list[int]:
    return draw(st.lists(st.integers(1, 900), max_size=3))


# --- the properties -----------------------------------------------------------------------------


@PROPERTY
@given(data=st.data())
def test_the_same_inputs_by_any_route_are_the_same_plan(stores, data):
    routes = Routes(Path(stores["scratch"]))
    spec = data.draw(specs(stores))
    first = routes.any_route(data, spec)
    again = routes.any_route(data, spec)
    assert again == first
    assert again.index_hash == first.index_hash
    assert again.to_json() == first.to_json()
    state = state_at(first, data.draw(steps()))
    assert state.resume_on(again) is state  # the same plan: nothing recorded


@PROPERTY
@given(data=st.data())
def test_a_resume_is_accepted_exactly_when_the_samples_below_consumed_are_the_same(stores, data):
    routes = Routes(Path(stores["scratch"]))
    spec = data.draw(specs(stores))
    old = routes.any_route(data, spec)
    try:
        if data.draw(st.booleans()):
            new = routes.any_route(data, data.draw(changed_specs(spec, stores)))
        else:
            new = data.draw(replaced(old))
    except (PlanError, ArgumentError) as exc:
        event(f"refused at construction: {type(exc).__name__}")
        return  # fields that no longer agree: no plan is made, nothing to resume on
    cuts = data.draw(steps())
    state = state_at(old, cuts)
    same = same_samples(old, new, state.consumed)
    try:
        resumed = state.resume_on(new)
    except ResumeRefused:
        event("resume refused")
        assert not same, "refused, yet every sample below consumed is the same"
        return
    event("resume accepted: " + ("same plan" if new.index_hash == old.index_hash else "change"))
    assert same, "accepted, yet a sample below consumed differs"
    assert resumed.consumed == state.consumed and resumed.index_hash == new.index_hash
    if new.index_hash == old.index_hash:
        assert resumed is state
    else:
        assert resumed.plan_changes[-1].new_index_hash == new.index_hash
    assert resumed.resume_on(new) is resumed


def test_a_replaced_seed_is_refused_by_the_loader_too(stores, tmp_path):
    """The issue's case end to end: ``replace(plan, seed=...)`` kept the old index hash, so a
    loader resumed on it and trained on other samples than the run's below ``consumed``."""
    spec = Spec(16, 1, 600, tuple((n, stores[n], w) for n, w in zip(NAMES, (6, 3, 1), strict=True)))
    plan = Routes(tmp_path).build(spec)
    with Loader(plan, 0, BatchConfig(1, 4), prefetch=0) as loader:
        for _ in range(3):
            loader.step()
            loader.commit()
        saved = loader.state_dict()
    reseeded = dataclasses.replace(plan, seed=2)
    assert reseeded.index_hash != plan.index_hash
    with Loader(reseeded, 0, BatchConfig(1, 4), prefetch=0) as loader:
        with pytest.raises(ResumeRefused, match="seed: 1 → 2"):
            loader.load_state_dict(saved)
        assert loader.state.consumed == 0
    moved = dataclasses.replace(plan, sources=tuple(
        dataclasses.replace(s, path=s.path + "-staged") for s in plan.sources
    ))  # fmt: skip
    assert moved.index_hash == plan.index_hash  # paths are not the tape (stage_plan's case)
    with pytest.raises(TypeError, match="index_hash"):  # not an argument: always computed
        Plan(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)})
    with pytest.raises(ValueError, match="init=False"):
        dataclasses.replace(plan, index_hash=plan.index_hash)

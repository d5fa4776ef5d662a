"""Every public callable checks its arguments' types: an argument of the wrong type raises
``ArgumentError`` naming the parameter, never a ``TypeError``, an ``AttributeError`` from deep
inside, a refusal of another kind, or silence.

One generic test. The public callables are found, not listed: every function of
``tokentape.__all__``, ``tokentape.torch`` and ``tokentape.megatron``, every public class's
constructor and its public methods (inherited ones included, each function once). ``VALID``
gives, per callable, one valid value for each of its parameters; a callable or a parameter
without one fails the test (``EXEMPT`` names the result types and error types, which the
library builds and a caller only reads). Each parameter is then replaced in turn by each value
of ``WRONG`` that its annotation does not admit (``fits``): an ``object()``, a float, a string,
``True``, an int, a list, bytes; the call must raise ``ArgumentError`` whose message names the
parameter. The valid call itself must succeed, so that a refusal comes from the value replaced.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import importlib
import importlib.util
import inspect
import os
import re
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import build, plan_of, random_docs

import tokentape
from tokentape._src.util.progress import Progress
from tokentape.errors import ArgumentError

HAS_TORCH = importlib.util.find_spec("torch") is not None
PUBLIC_MODULES = ["tokentape", "tokentape.megatron"] + (["tokentape.torch"] if HAS_TORCH else [])
PUBLIC_DUNDERS = {"__getitem__", "__getitems__"}
"""Dunder methods that are part of a public class's documented interface."""

WRONG: dict[str, object] = {
    "object()": object(),
    "1.5": 1.5,
    "'x'": "x",
    "True": True,
    "7": 7,
    "[object()]": [object()],
    "b'x'": b"x",
}
"""Values of the wrong type for most parameters; each is tried where the annotation does not
admit it."""

EXEMPT = {
    "tokentape.Batch": "a result: what the loader hands out",
    "tokentape.Step": "a result: what Loader.step() returns",
    "tokentape.Origin": "a result: what Source.provenance() returns",
    "tokentape.DocOrigin": "a result: what Loader.origins() and find_documents() return",
    "tokentape.TokenizeSummary": "a result: what tokenize() returns",
    "tokentape.megatron.ConvertSummary": "a result: what a conversion returns",
    "tokentape.torch.TapeSamples": "a result: what TapeDataset.__getitems__ returns",
}
"""Public classes whose constructor a caller never calls (their methods are still checked).
Error types are exempt too: they are raised, not called."""

UNCHECKED: dict[str, dict[str, str]] = {
    "tokentape.DataState": {
        "index_hash": "derived from identity: checked against it where it is used (resume_on, "
        "from_dict), not at construction, so that tests can craft saved states "
        "(tests/train/test_plan_change.py)",
    },
}
"""Parameters deliberately not checked at the call, with the reason."""


# --- the valid arguments ----------------------------------------------------------------------


class Context:
    """What the valid arguments are made of: small stores, a plan, a Megatron prefix, a
    loader's step; ``fresh()`` is an empty directory for one call's outputs."""

    def __init__(self, root: Path, stores: Path) -> None:
        self.root, self.stores = root, stores
        self._n = 0
        self.plan = plan_of(stores)
        self.plan_path = root / "plan.json"
        self.plan.save(self.plan_path)
        self.config = tokentape.BatchConfig(1, 2, 1)
        self.state = tokentape.DataState.start(self.plan).commit(self.config)
        self.docs = root / "docs.jsonl"
        self.docs.write_text('{"text": "one document"}\n{"text": "and another"}\n')
        self.prefix = root / "meg" / "corpus"
        self.prefix.parent.mkdir()
        build(self.prefix, random_docs(5, 20, 300, 299, max_seqs=1), np.uint16)
        with tokentape.Loader(self.plan, 0, self.config, prefetch=0, segments=True) as loader:
            self.step = loader.step()
        self.step_log = root / "steps.jsonl"
        with tokentape.Loader(self.plan, 0, self.config, step_log=self.step_log) as loader:
            for _ in range(3):
                loader.step()
                loader.commit()
        self.batch = self.step.micro_batches[0]

    def fresh(self) -> Path:
        self._n += 1
        path = self.root / f"call-{self._n}"
        path.mkdir()
        return path

    def loader(self) -> tokentape.Loader:
        return tokentape.Loader(self.plan, 0, self.config, prefetch=0)

    def source(self) -> tokentape.Source:
        return tokentape.open_source(self.stores / "stores" / "web")

    def megatron(self) -> tokentape.MegatronSource:
        return tokentape.MegatronSource(self.prefix, 300, 299)

    def from_megatron_config(self) -> Any:
        out = self.fresh() / "store"
        return tokentape.megatron.FromMegatron(str(self.prefix), str(out), 300, 299)


def _progress(progress: Progress) -> None:
    return None


Args = Callable[[Context], dict[str, Any]]

VALID: dict[str, Args] = {
    "tokentape.BatchConfig": lambda c: {"dp_size": 2, "micro": 2, "accum": 1},
    "tokentape.DataState": lambda c: {
        "index_hash": c.state.index_hash, "identity": c.state.identity, "consumed": 2,
        "step": 1, "history": c.state.history, "plan_changes": (),
    },
    "tokentape.DataState.start": lambda c: {"plan": c.plan},
    "tokentape.DataState.commit": lambda c: {"config": c.config},
    "tokentape.DataState.consumed_before": lambda c: {"step": 0},
    "tokentape.DataState.from_dict": lambda c: {"data": c.state.to_dict()},
    "tokentape.DataState.resume_on": lambda c: {"plan": c.plan},
    "tokentape.DataState.check_plan": lambda c: {"plan": c.plan},
    "tokentape.FetchConfig": lambda c: {"concurrency": 4, "cache_mb": 8.0},
    "tokentape.Loader": lambda c: {
        "plan": c.plan, "dp_rank": 0, "config": c.config, "state": c.state, "prefetch": 0,
        "step_log": c.fresh() / "steps.jsonl", "dtype": np.int32, "segments": False,
        "cache_dir": c.fresh(), "fetch": tokentape.FetchConfig(), "stage": "first",
    },
    "tokentape.Loader.set_config": lambda c: {"config": tokentape.BatchConfig(1, 1, 2)},
    "tokentape.Loader.load_state_dict": lambda c: {"data": c.state.to_dict()},
    "tokentape.Loader.origins": lambda c: {"batch": c.batch},
    "tokentape.MegatronSource": lambda c: {
        "prefix": c.prefix, "vocab_size": 300, "eod_id": 299, "tokenizer": "bytes",
        "check_eod": True, "identify": True, "progress": _progress, "planned": None,
        "hash_missing": True, "fingerprint": None,
    },
    "tokentape.MegatronSource.n_samples": lambda c: {"seq_len": 4},
    "tokentape.MegatronSource.tokens": lambda c: {"start": 0, "stop": 5},
    "tokentape.MegatronSource.window": lambda c: {"k": 1, "seq_len": 4},
    "tokentape.MegatronSource.prefetch": lambda c: {"samples": np.arange(2), "seq_len": 4},
    "tokentape.MegatronSource.windows_into": lambda c: {
        "samples": np.arange(2), "seq_len": 4, "out": np.zeros((2, 5), dtype=np.int64),
        "rows": np.arange(2),
    },
    "tokentape.MegatronSource.segments_into": lambda c: {
        "samples": np.arange(2), "seq_len": 4, "segment": np.zeros((2, 5), dtype=np.int64),
        "position": np.zeros((2, 5), dtype=np.int64),
    },
    "tokentape.MegatronSource.docs_in": lambda c: {"k": 1, "seq_len": 4},
    "tokentape.MegatronSource.doc_span": lambda c: {"i": 1},
    "tokentape.MegatronSource.doc": lambda c: {"i": 1},
    "tokentape.MegatronSource.provenance": lambda c: {"doc": 1},
    "tokentape.MegatronSource.find_id": lambda c: {"value": "doc-1"},
    "tokentape.MegatronSource.find_record": lambda c: {"input": 0, "record": 1},
    "tokentape.MegatronSource.decode": lambda c: {"tokens": [104, 105]},
    "tokentape.Plan": lambda c: {
        "algorithm_version": c.plan.algorithm_version, "seq_len": c.plan.seq_len,
        "seed": c.plan.seed, "denominator": c.plan.denominator,
        "horizon_samples": c.plan.horizon_samples, "sources": c.plan.sources,
        "storage_options": {}, "phases": (), "excisions": (),
    },
    "tokentape.Plan.excise": lambda c: {
        "from_consumed": 3, "docs": (), "ids": (), "positions": [5, 9], "steps": None,
    },
    "tokentape.excise": lambda c: {
        "plan": c.plan, "from_consumed": 3, "docs": [("web", 1)], "ids": (), "steps": None,
        "step_log": None,
    },
    "tokentape.report": lambda c: {
        "step_log": c.step_log, "plan": c.plan, "loss_log": None, "spike_window": 51,
        "spike_z": 6.0, "top": 10,
    },
    "tokentape.find_documents": lambda c: {
        "plan": c.plan, "id": None, "input": "web.jsonl", "record": 2, "source": "web",
    },
    "tokentape.Plan.build": lambda c: {
        "sources": {"web": {"path": "stores/web", "weight": 1}}, "seq_len": 64, "seed": 1,
        "total_tokens": None, "total_samples": 100, "weight_denominator": 4,
        "base_dir": c.stores, "storage_options": {}, "phases": [], "mixed_bos": False,
    },
    "tokentape.Plan.save": lambda c: {"path": c.fresh() / "PLAN.json"},
    "tokentape.Source": lambda c: {"directory": c.stores / "stores" / "web"},
    "tokentape.load_plan": lambda c: {"path": c.plan_path},
    "tokentape.locate": lambda c: {
        "plan": c.plan, "source": "math", "doc": 1, "id": None, "input": None, "record": None,
        "global_batch": 4, "dp": None, "micro": None, "accum": None, "step_log": None,
        "until_step": 3,
    },
    "tokentape.open_source": lambda c: {
        "path": c.stores / "stores" / "web", "format": "tokentape", "vocab_size": 257,
        "eod_id": 256, "tokenizer": None, "progress": _progress, "storage_options": {},
        "fetch": tokentape.FetchConfig(),
    },
    "tokentape.replay": lambda c: {
        "plan": c.plan, "step": 1, "global_batch": None, "dp": 2, "micro": 2, "accum": 1,
        "step_log": None,
    },
    "tokentape.tokenize": lambda c: {
        "inputs": [c.docs], "out": c.fresh() / "store", "tokenizer": "bytes", "id_key": "auto",
        "eod_token": None, "text_key": "text", "filters": ["min-tokens:1"], "workers": 1,
        "executor": "local", "ray_address": None, "dtype": "auto", "shard_mb": 1.0,
        "unit_mb": 1.0, "overwrite": False, "progress": _progress, "storage_options": {},
        "work_dir": None, "on_bad_record": "fail", "max_bad_fraction": 0.01, "bos": False,
        "bos_token": None,
    },
    "tokentape.verify": lambda c: {
        "paths": [c.stores / "stores" / "math"], "quick": True, "blocks": 2,
        "vocab_size": None, "eod_id": None, "storage_options": {},
    },
    "tokentape.Batch.cu_seqlens": lambda c: {"row": 0},
    "tokentape.megatron.FromMegatron": lambda c: {
        "prefix": str(c.prefix), "out": str(c.fresh() / "store"), "vocab_size": 300,
        "eod_id": 299, "tokenizer": None, "eod_token": None, "append_eod": False,
        "dtype": "auto", "shard_mb": 1.0, "overwrite": False,
    },
    "tokentape.megatron.MegatronWriter": lambda c: {
        "prefix": c.fresh() / "out", "dtype": "uint16", "block_bytes": 64,
    },
    "tokentape.megatron.MegatronWriter.add": lambda c: {
        "tokens": np.array([1, 2, 299]), "lengths": np.array([3]),
    },
    "tokentape.megatron.from_megatron": lambda c: {
        "config": c.from_megatron_config(), "progress": _progress,
    },
    "tokentape.megatron.to_megatron": lambda c: {
        "store": c.stores / "stores" / "math", "prefix": c.fresh() / "math", "dtype": "auto",
        "overwrite": False, "progress": _progress, "storage_options": {},
    },
    "tokentape.torch.TapeBatchSampler": lambda c: {
        "dp_rank": 0, "config": c.config, "consumed": 0, "steps": 3,
    },
    "tokentape.torch.TapeBatchSampler.load_state_dict": lambda c: {
        "state": _sampler(c).state_dict(),
    },
    "tokentape.torch.TapeDataset": lambda c: {"plan": c.plan_path, "segments": True},
    "tokentape.torch.TapeDataset.__getitem__": lambda c: {"position": 3},
    "tokentape.torch.TapeDataset.__getitems__": lambda c: {"positions": [3, 4]},
    "tokentape.torch.TapeSamples.__getitem__": lambda c: {"i": 1},
    "tokentape.torch.TapeSampler": lambda c: {
        "dp_rank": 0, "config": c.config, "consumed": 0, "steps": 3,
    },
    "tokentape.torch.check_step": lambda c: {
        "step": c.step, "dp_rank": 0, "model_parallel_size": 1, "group": None, "tp_size": None,
        "device": "cpu",
    },
    "tokentape.torch.collate": lambda c: {"samples": [{"a": 1}, {"a": 2}]},
    "tokentape.torch.to_torch": lambda c: {"batch": c.batch, "pin": False},
}  # fmt: skip


def _sampler(c: Context) -> Any:
    return importlib.import_module("tokentape.torch").TapeBatchSampler(0, c.config, 0, 3)


INSTANCES: dict[str, Callable[[Context], Any]] = {
    "tokentape.Batch": lambda c: c.batch,
    "tokentape.DataState": lambda c: c.state,
    "tokentape.Loader": Context.loader,
    "tokentape.MegatronSource": Context.megatron,
    "tokentape.Plan": lambda c: c.plan,
    "tokentape.megatron.MegatronWriter": lambda c: tokentape.megatron.MegatronWriter(
        c.fresh() / "out", "uint16"
    ),
    "tokentape.torch.TapeBatchSampler": _sampler,
    "tokentape.torch.TapeDataset": lambda c: _dataset(c),
    "tokentape.torch.TapeSamples": lambda c: _dataset(c).__getitems__([3, 4]),
}
"""An instance of each class whose methods take parameters."""

NO_VALID_CALL = {
    "tokentape.MegatronSource.find_id": "a Megatron prefix records no provenance: refused "
    "(tests/tokenize/test_provenance.py finds documents by id in stores)",
    "tokentape.MegatronSource.find_record": "as find_id",
    "tokentape.torch.check_step": "a collective: needs a process group (tests/torch/test_smoke.py)",
}
"""Callables whose valid call cannot run here; their wrong calls still must be refused."""


def _dataset(c: Context) -> Any:
    return importlib.import_module("tokentape.torch").TapeDataset(c.plan, segments=True)


# --- the public callables -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Public:
    """A public callable: its name, the function whose signature it has, and how to call it
    (a class's constructor is the class; a method is called on ``INSTANCES[owner]``)."""

    name: str
    function: Callable[..., Any]
    owner: str | None = None
    attribute: str | None = None
    cls: type | None = None

    def target(self, ctx: Context) -> Callable[..., Any]:
        if self.cls is not None:
            return self.cls
        if self.owner is None:
            return self.function
        owner = _public_object(self.owner)
        member = inspect.getattr_static(owner, self.attribute or "")
        if isinstance(member, classmethod | staticmethod):
            return getattr(owner, self.attribute or "")
        return getattr(INSTANCES[self.owner](ctx), self.attribute or "")


def _public_object(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def public_callables() -> Iterator[Public]:
    seen: set[object] = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for attr in module.__all__:
            obj = getattr(module, attr)
            name = f"{module_name}.{attr}"
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                continue
            if inspect.isclass(obj):
                if name not in EXEMPT and obj not in seen:
                    seen.add(obj)
                    yield Public(name, obj.__init__, cls=obj)
                for method, function in _methods(obj):
                    if function not in seen:
                        seen.add(function)
                        yield Public(f"{name}.{method}", function, name, method)
            elif callable(obj) and obj not in seen:
                seen.add(obj)
                yield Public(name, obj)


def _methods(cls: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    """A class's public methods defined by tokentape (inherited ones included)."""
    names = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("tokentape"):
            continue
        for name, member in vars(klass).items():
            if name in names or (name.startswith("_") and name not in PUBLIC_DUNDERS):
                continue
            names.add(name)
            if isinstance(member, classmethod | staticmethod):
                member = member.__func__
            if inspect.isfunction(member):
                yield name, member


def parameters(public: Public) -> list[str]:
    sig = inspect.signature(public.function)
    return [
        p.name
        for p in sig.parameters.values()
        if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


PUBLIC = list(public_callables())


# --- which values an annotation admits ------------------------------------------------------


def fits(value: object, annotation: Any) -> bool:
    """Whether ``value`` has the type ``annotation`` names. Strictly: a ``bool`` is not an
    ``int`` or a ``float``, a string or bytes is not a sequence of anything, and an array
    parameter admits arrays and lists or scalars of integers (what ``np.asarray`` reads)."""
    if annotation is Any or annotation is object:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is np.ndarray:
        if isinstance(value, np.ndarray):
            return True
        items = value if isinstance(value, list) else [value]
        return all(isinstance(v, int) and not isinstance(v, bool) for v in items)
    if origin is collections.abc.Callable or annotation is collections.abc.Callable:
        return callable(value)
    if origin is not None and isinstance(origin, type):
        if isinstance(value, str | bytes) and origin is not str:
            return False
        if not isinstance(value, origin):
            return False
        if issubclass(origin, collections.abc.Mapping):
            key, item = args if args else (Any, Any)
            return all(fits(k, key) and fits(v, item) for k, v in value.items())
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(
                fits(v, a) for v, a in zip(value, args, strict=False)
            )
        if issubclass(origin, collections.abc.Iterable) and args:
            return all(fits(v, args[0]) for v in value)
        return True
    if isinstance(annotation, type) and getattr(annotation, "_is_protocol", False):
        members = [*vars(annotation).get("__annotations__", {}), *vars(annotation)]
        return all(hasattr(value, m) for m in members if not m.startswith("_"))
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    raise AssertionError(f"fits: unknown annotation {annotation!r}")


def _hints(public: Public) -> dict[str, Any]:
    return typing.get_type_hints(public.function)


# --- the test -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory, mixture_stores: Path) -> Context:
    return Context(tmp_path_factory.mktemp("argtypes"), mixture_stores)


def _close(result: object) -> None:
    """Let go of what a call returned that holds threads or files."""
    for name in ("close", "abort"):
        method = getattr(result, name, None)
        if callable(method) and not isinstance(result, type):
            method()
            return


def _names(message: str, parameter: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(parameter)}(?![\w-])", message) is not None


def test_every_public_callable_has_valid_arguments_for_every_parameter():
    """The table is complete: a new public callable or parameter fails here until it has a
    valid example (and so is covered by the test below)."""
    missing = []
    for public in PUBLIC:
        names = parameters(public)
        if not names:
            continue
        if public.name not in VALID:
            missing.append(f"{public.name}: no entry in VALID (parameters {names})")
            continue
        if public.owner is not None and public.owner not in INSTANCES:
            member = inspect.getattr_static(_public_object(public.owner), public.attribute or "")
            if not isinstance(member, classmethod | staticmethod):
                missing.append(f"{public.name}: no instance of {public.owner} in INSTANCES")
    assert missing == []
    stale = set(VALID) - {p.name for p in PUBLIC}
    assert not stale, f"VALID names callables that are not public (any more): {sorted(stale)}"


@pytest.mark.parametrize("public", [p for p in PUBLIC if parameters(p)], ids=lambda p: p.name)
def test_an_argument_of_the_wrong_type_is_an_argument_error_naming_it(ctx, public):
    if public.name not in VALID:
        pytest.fail(f"{public.name}: no entry in VALID")
    hints = _hints(public)
    names = parameters(public)
    valid = VALID[public.name](ctx)
    assert set(valid) == set(names), f"VALID[{public.name!r}] must give exactly {names}"
    for name in names:
        assert fits(valid[name], hints.get(name, Any)), f"{public.name}: valid {name} misfits"
    if public.name not in NO_VALID_CALL:
        _close(public.target(ctx)(**valid))
    failures: dict[str, list[str]] = {}
    for name in names:
        for label, wrong in WRONG.items():
            if fits(wrong, hints.get(name, Any)):
                continue
            args = VALID[public.name](ctx) | {name: wrong}
            try:
                _close(public.target(ctx)(**args))
            except ArgumentError as exc:
                if _names(str(exc), name):
                    continue
                got = f"ArgumentError not naming it: {exc}"
            except Exception as exc:  # what the test reports
                got = f"{type(exc).__name__}: {str(exc)[:160]}"
            else:
                got = "accepted"
            failures.setdefault(name, []).append(f"{name}={label}: {got}")
    for name in UNCHECKED.get(public.name, {}):
        assert name in failures, f"{public.name}: {name} is checked now: remove it from UNCHECKED"
        del failures[name]
    assert not failures, "\n".join(line for lines in failures.values() for line in lines)


def test_resume_on_a_path_names_the_plan_parameter(ctx):
    """The issue's case: ``DataState.resume_on("plan.json")`` was an ``AttributeError``."""
    state = tokentape.DataState.start(ctx.plan)
    for given in (str(ctx.plan_path), ctx.plan_path, os.fspath(ctx.plan_path).encode()):
        with pytest.raises(ArgumentError, match=r"^plan must be a Plan"):
            state.resume_on(given)
        with pytest.raises(ArgumentError, match=r"^plan must be a Plan"):
            state.check_plan(given)

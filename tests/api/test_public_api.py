"""The public surface: what ``tokentape``, ``tokentape.torch`` and ``tokentape.megatron`` export,
each name documented (Google style: every parameter under ``Args:``), nothing internal shown
by ``help(tokentape)``, and the library functions doing what the commands do."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pydoc
import re
import subprocess
import sys

import pytest

import tokentape

PUBLIC_MODULES = ["tokentape", "tokentape.torch", "tokentape.megatron"]
EXPECTED = {
    "load_plan", "Plan", "Loader", "BatchConfig", "DataState", "Step", "Batch", "open_source",
    "Source", "MegatronSource", "tokenize", "TokenizeSummary", "replay", "locate",
    "verify", "__version__", "TokentapeError",
}  # fmt: skip


def exported() -> list[tuple[str, str, object]]:
    if importlib.util.find_spec("torch") is None:
        modules = [m for m in PUBLIC_MODULES if m != "tokentape.torch"]
    else:
        modules = PUBLIC_MODULES
    rows = []
    for name in modules:
        module = importlib.import_module(name)
        rows += [(name, n, getattr(module, n)) for n in module.__all__ if n != "__version__"]
    return rows


EXPORTED_IDS = [f"{module}.{name}" for module, name, _ in exported()]
"""Stable ids (an object's repr holds its address, which differs between pytest-xdist workers)."""


def callables_of(obj: object) -> list[tuple[str, object]]:
    """The function itself, or a class's ``__init__`` and its public methods defined by us."""
    if not inspect.isclass(obj):
        return [("", obj)] if callable(obj) else []
    found = []
    for name, member in vars(obj).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, classmethod | staticmethod):
            member = member.__func__
        if inspect.isfunction(member) and member.__module__.startswith("tokentape"):
            found.append((name, member))
    return found


def parameters(func: object) -> list[str]:
    skip = {"self", "cls"}
    sig = inspect.signature(func)  # type: ignore[arg-type]
    return [p for p in sig.parameters if p not in skip and not p.startswith("_")]


def described(doc: str, section: str) -> set[str]:
    """The names a Google-style docstring describes under ``section`` (``Args``)."""
    found = re.search(rf"^{section}:\n((?:[ \t]+.*\n?|\n)*)", doc, re.M)
    if found is None:
        return set()
    return set(re.findall(r"^\s+\**(\w+)(?: \(.*?\))?:", found.group(1), re.M))


def undocumented_args(owner: object, func: object) -> list[str]:
    """Parameters of ``func`` not described under ``Args:`` (a class documents ``__init__``'s
    in its own docstring, a dataclass its fields under ``Attributes:``)."""
    doc = inspect.getdoc(func) or ""
    names = described(doc, "Args")
    if getattr(func, "__name__", "") == "__init__":
        own = inspect.getdoc(owner) or ""
        names |= described(own, "Args") | described(own, "Attributes")
    return [p for p in parameters(func) if p not in names]


def test_the_api_the_issue_asks_for_is_exported():
    assert set(tokentape.__all__) >= EXPECTED
    for name in tokentape.__all__:
        assert hasattr(tokentape, name), name
    assert tokentape.Batch is importlib.import_module("tokentape._src.train.batch").Batch
    assert {"to_torch", "TapeSampler", "TapeDataset"} <= set(
        importlib.import_module("tokentape.torch").__all__
    )


def test_error_types_are_exported():
    errors = importlib.import_module("tokentape.errors")
    for name, obj in vars(errors).items():
        if (
            inspect.isclass(obj)
            and issubclass(obj, Exception)
            and obj.__module__ == errors.__name__
        ):
            assert getattr(tokentape, name, None) is obj, name
            assert name in tokentape.__all__, name


@pytest.mark.parametrize(("module", "name", "obj"), exported(), ids=EXPORTED_IDS)
def test_every_exported_name_has_a_docstring(module, name, obj):
    if not (inspect.isclass(obj) or callable(obj)):
        return
    assert (inspect.getdoc(obj) or "").strip(), f"{module}.{name}"


OWN = {"tokentape._src.api", "tokentape._src.plan.plan"}
"""Modules whose exported functions also have ``Returns:`` and ``Raises:`` sections."""


@pytest.mark.parametrize(("module", "name", "obj"), exported(), ids=EXPORTED_IDS)
def test_parameters_are_documented_under_args(module, name, obj):
    missing = {
        f"{name}.{m}" if m else name: undocumented_args(obj, f)
        for m, f in callables_of(obj)
        if getattr(f, "__module__", "") in OWN or getattr(obj, "__module__", "") in OWN
    }
    assert not {k: v for k, v in missing.items() if v}, module
    for m, f in callables_of(obj):
        if getattr(f, "__module__", "") not in OWN or m == "__init__":
            continue
        doc = inspect.getdoc(f) or ""
        returns = inspect.signature(f).return_annotation  # type: ignore[arg-type]
        if returns not in ("None", None, inspect.Signature.empty) and not isinstance(f, property):
            assert "\nReturns:\n" in doc, f"{name}.{m}: no Returns: section"
        if parameters(f):
            assert "\nRaises:\n" in doc, f"{name}.{m}: no Raises: section"


def test_help_shows_the_public_api_and_nothing_internal():
    text = pydoc.render_doc(tokentape, renderer=pydoc.plaintext)
    contents = text.split("PACKAGE CONTENTS\n", 1)[1].split("\n\n", 1)[0].split()
    assert [c for c in contents if c != "(package)"] == [
        "__main__", "_src", "errors", "megatron", "torch",
    ]  # fmt: skip
    for internal in ("demo", "report", "plot", "cli", "render"):
        assert internal not in contents
    for name in ("load_plan", "Loader", "tokenize", "replay", "locate", "verify", "Plan"):
        assert name in text


def test_import_tokentape_imports_neither_torch_nor_the_cli():
    code = (
        "import sys, tokentape; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('tokentape._src.cli')"
        " or m.startswith('tokentape._src.demo') or m.startswith('tokentape._src.render')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_jobs_load_on_first_use():
    """A training process imports tokentape without the tokenizer's input readers (pyarrow)
    or the audits; ``tokentape.tokenize`` and the audits load when first used."""
    code = (
        "import sys, tokentape; "
        "heavy = lambda: sorted(m for m in sys.modules if m == 'pyarrow' or m.startswith("
        "('tokentape._src.api', 'tokentape._src.audit', 'tokentape._src.tokenize.driver'))); "
        "print(heavy()); tokentape.tokenize; tokentape.verify; print(heavy()); "
        "from tokentape import replay, TokenizeSummary; print(replay.__module__, "
        "TokenizeSummary.__module__, 'verify' in dir(tokentape))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after, names = out.stdout.splitlines()
    assert before == "[]"
    assert "'pyarrow'" in after and "'tokentape._src.api'" in after
    assert names == "tokentape._src.api tokentape._src.tokenize.driver True"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        tokentape.nothing  # noqa: B018


def test_parameters_are_documented_everywhere():
    """Every exported callable, in every module, describes each of its parameters under
    ``Args:`` (a class may describe ``__init__``'s in its own docstring, a dataclass its fields
    under ``Attributes:``)."""
    undocumented = {
        f"{module}.{name}" + (f".{m}" if m else ""): undocumented_args(obj, f)
        for module, name, obj in exported()
        for m, f in callables_of(obj)
    }
    assert {k: v for k, v in undocumented.items() if v} == {}

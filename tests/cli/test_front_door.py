"""One front door: the command line and the public functions check their arguments and build
their settings in the same functions of ``tokentape._src.api`` (``tokenize_config``,
``replay_shape``, ``locate_shape``, ``verify_stores``), each error worded for its reader: the
command line's names its flags, the Python function's its parameters.

Each test wraps one of those functions with a spy (which calls through) and runs the command,
then the public function: both must reach it, with the same arguments; a refusal it raises
reaches the command line as exit 2 and one line, word for word.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, small_plan_json, write_docs

import tokentape
from tokentape._src import api
from tokentape._src.cli.wording import FLAGS
from tokentape._src.plan.load import load_plan
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig
from tokentape.errors import ArgumentError, OutOfRangeError, TokentapeError


@dataclass
class Spy:
    """The calls of one shared function of ``api``: their arguments, and what each raised."""

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    returned: list[Any] = field(default_factory=list)
    raised: list[TokentapeError] = field(default_factory=list)

    def arguments(self, i: int) -> dict[str, Any]:
        """Call ``i``'s keyword arguments, paths as strings, without its wording."""
        _, kwargs = self.calls[i]
        return {k: _text(v) for k, v in kwargs.items() if k != "wording"}


def _text(value: object) -> object:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, list | tuple):
        return [_text(v) for v in value]
    return value


def spy(monkeypatch: pytest.MonkeyPatch, name: str) -> Spy:
    """Wrap ``api.<name>``: the command line and the public functions call it through
    ``api``."""
    real: Callable[..., Any] = getattr(api, name)
    seen = Spy()

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        seen.calls.append((args, kwargs))
        try:
            result = real(*args, **kwargs)
        except TokentapeError as exc:
            seen.raised.append(exc)
            raise
        seen.returned.append(result)
        return result

    monkeypatch.setattr(api, name, wrapper)
    return seen


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small stores and their plan (``plan.json``), a 3-step log and a text corpus."""
    root = tmp_path_factory.mktemp("front-door")
    plan_path = small_plan_json(root)
    with Loader(load_plan(plan_path), 0, BatchConfig(2, 2, 1), step_log=root / "steps.jsonl") as ld:
        for _ in range(3):
            ld.step()
            ld.commit()
    write_docs(root / "docs.jsonl", "web", 30)
    return root


def _wording(seen: Spy, i: int) -> api.Wording:
    return seen.calls[i][1]["wording"]


# --- the same function, the same arguments ----------------------------------------------------


def test_tokenize_flags_and_parameters_build_the_config_in_one_place(root, tmp_path, capsys,
                                                                     monkeypatch):  # fmt: skip
    seen = spy(monkeypatch, "tokenize_config")
    docs = root / "docs.jsonl"
    code, out, err = cli(
        capsys, "tokenize", docs, "--out", tmp_path / "cli", "--filter", "min-tokens:2",
        "--filter", "unique-lines", "--text-key", "text", "--dtype", "uint32", "--shard-mb", 1,
        "--unit-mb", 0.5, "--json",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    assert json.loads(out)["dtype"] == "uint32"
    tokentape.tokenize(
        docs, tmp_path / "py", filters=["min-tokens:2", "unique-lines"], text_key="text",
        dtype="uint32", shard_mb=1.0, unit_mb=0.5,
    )  # fmt: skip
    assert len(seen.calls) == 2
    assert _wording(seen, 0) is FLAGS and _wording(seen, 1) is api.PYTHON
    by_flags, by_parameters = seen.arguments(0), seen.arguments(1)
    assert seen.calls[0][0] == ([str(docs)], str(tmp_path / "cli"))
    assert by_flags["filters"] == ["min-tokens:2", "unique-lines"]
    assert (by_flags["dtype"], by_flags["shard_mb"], by_flags["unit_mb"]) == ("uint32", 1.0, 0.5)
    for name in ("filters", "text_key", "dtype", "shard_mb", "unit_mb"):
        assert by_flags[name] == by_parameters[name], name
    # the settings built differ only where the calls did: the output directory
    by_cli, by_python = seen.returned
    assert by_cli.out == str(tmp_path / "cli") and by_python.out == str(tmp_path / "py")
    assert dataclasses.replace(by_cli, out=by_python.out) == by_python


def test_replay_flags_and_parameters_reach_the_same_check(root, capsys, monkeypatch):
    seen = spy(monkeypatch, "replay_shape")
    plan = root / "plan.json"
    code, _, err = cli(
        capsys, "replay", plan, "--step", 3, "--dp", 2, "--micro", 2, "--accum", 2, "--json"
    )
    assert (code, err) == (0, "")
    tokentape.replay(plan, 3, dp=2, micro=2, accum=2)
    assert len(seen.calls) == 2
    assert _wording(seen, 0) is FLAGS and _wording(seen, 1) is api.PYTHON
    assert [args[1] for args, _ in seen.calls] == [3, 3]  # the step
    shape = {"global_batch": None, "dp": 2, "micro": 2, "accum": 2, "log": None}
    assert seen.arguments(0) == seen.arguments(1) == shape


def test_locate_flags_and_parameters_reach_the_same_check(root, capsys, monkeypatch):
    seen = spy(monkeypatch, "locate_shape")
    plan, log = root / "plan.json", root / "steps.jsonl"
    code, _, err = cli(capsys, "locate", plan, "math", 3, "--log", log, "--until-step", 2)
    assert (code, err) == (0, "")
    tokentape.locate(plan, "math", 3, step_log=log, until_step=2)
    assert len(seen.calls) == 2
    assert _wording(seen, 0) is FLAGS and _wording(seen, 1) is api.PYTHON
    shape = {
        "global_batch": None, "dp": None, "micro": None, "accum": None, "log": str(log),
        "until_step": 2,
    }  # fmt: skip
    assert seen.arguments(0) == seen.arguments(1) == shape


def test_verify_flags_and_parameters_reach_the_same_function(root, capsys, monkeypatch):
    seen = spy(monkeypatch, "verify_stores")
    store = root / "stores" / "math"
    code, _, err = cli(capsys, "verify", store, "--quick", "--blocks", 2, "--json")
    assert (code, err) == (0, "")
    tokentape.verify(store, quick=True, blocks=2)
    assert len(seen.calls) == 2
    assert _wording(seen, 0) is FLAGS and _wording(seen, 1) is api.PYTHON
    assert [[str(p) for p in args[0]] for args, _ in seen.calls] == [[str(store)]] * 2
    by_flags, by_parameters = seen.arguments(0), seen.arguments(1)
    assert by_flags.pop("progress") is None  # no terminal under test: nothing drawn
    assert by_flags.pop("storage_options") == {} and by_parameters.pop("storage_options") is None
    assert by_flags == by_parameters == {"blocks": 2, "vocab_size": None, "eod_id": None}
    assert [[r.ok for r in reports] for reports in seen.returned] == [[True], [True]]


# --- one check, two wordings --------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    id: str
    function: str
    """The shared function of ``api`` that refuses."""
    argv: tuple[str, ...]
    """The command line (``{r}``: the fixtures' directory)."""
    flags: str
    """The command line's message (``{r}`` as above)."""
    call: Callable[[Path], Any]
    """The public function's call."""
    parameters: str
    """Its message."""
    exc: type[TokentapeError] = ArgumentError


TOKENIZE = ("tokenize", "{r}/docs.jsonl", "--out", "{r}/never")
REFUSALS = [
    Refusal(
        "tokenize-workers", "tokenize_config", (*TOKENIZE, "--workers", "0"),
        "--workers must be between 1 and 65,536, got 0",
        lambda r: tokentape.tokenize(r / "docs.jsonl", r / "never", workers=0),
        "workers must be between 1 and 65,536, got 0",
    ),
    Refusal(
        "tokenize-ray-address", "tokenize_config", (*TOKENIZE, "--ray-address", "head:6379"),
        "--ray-address needs --executor ray",
        lambda r: tokentape.tokenize(r / "docs.jsonl", r / "never", ray_address="head:6379"),
        "ray_address needs executor ray",
    ),
    Refusal(
        "tokenize-input-empty", "tokenize_config", ("tokenize", "", "--out", "{r}/never"),
        "input must not be empty",
        lambda r: tokentape.tokenize([""], r / "never"),
        "inputs must not be empty",
    ),
    Refusal(
        "tokenize-filter-empty", "tokenize_config", (*TOKENIZE, "--filter", ""),
        "--filter must not be empty",
        lambda r: tokentape.tokenize(r / "docs.jsonl", r / "never", filters=[""]),
        "filters must not be empty",
    ),
    Refusal(
        "replay-no-shape", "replay_shape", ("replay", "{r}/plan.json", "--step", "1"),
        FLAGS.replay_without_shape,
        lambda r: tokentape.replay(r / "plan.json", 1),
        api.PYTHON.replay_without_shape,
    ),
    Refusal(
        "replay-step-negative", "replay_shape",
        ("replay", "{r}/plan.json", "--step", "-1", "--global-batch", "4"),
        "--step must be >= 0, got -1",
        lambda r: tokentape.replay(r / "plan.json", -1, global_batch=4),
        "step must be >= 0, got -1",
        OutOfRangeError,
    ),
    Refusal(
        "replay-beyond-log", "replay_shape",
        ("replay", "{r}/plan.json", "--step", "5", "--log", "{r}/steps.jsonl"),
        "--step 5: beyond the step log {r}/steps.jsonl, which ends at step 2",
        lambda r: tokentape.replay(r / "plan.json", 5, step_log=str(r / "steps.jsonl")),
        "step 5: beyond the step log {r}/steps.jsonl, which ends at step 2",
        OutOfRangeError,
    ),
    Refusal(
        "replay-two-shapes", "replay_shape",
        ("replay", "{r}/plan.json", "--step", "1", "--global-batch", "4", "--dp", "2"),
        "give one of --global-batch, --dp/--micro/--accum or --log, not --global-batch and --dp",
        lambda r: tokentape.replay(r / "plan.json", 1, global_batch=4, dp=2),
        "give one of global_batch, dp/micro/accum or step_log, not global_batch and dp",
    ),
    Refusal(
        "locate-until-no-shape", "locate_shape",
        ("locate", "{r}/plan.json", "math", "3", "--until-step", "3"),
        FLAGS.until_step_without_shape,
        lambda r: tokentape.locate(r / "plan.json", "math", 3, until_step=3),
        api.PYTHON.until_step_without_shape,
    ),
    Refusal(
        "locate-micro-alone", "locate_shape",
        ("locate", "{r}/plan.json", "math", "3", "--micro", "2"),
        "--micro given: --dp and --micro go together",
        lambda r: tokentape.locate(r / "plan.json", "math", 3, micro=2),
        "micro given: dp and micro go together",
    ),
    Refusal(
        "verify-blocks-without-quick", "verify_stores",
        ("verify", "{r}/stores/math", "--blocks", "2"),
        "--blocks applies to --quick only",
        lambda r: tokentape.verify(r / "stores" / "math", blocks=2),
        "blocks applies to quick only",
    ),
]  # fmt: skip


@pytest.mark.parametrize("refusal", REFUSALS, ids=[r.id for r in REFUSALS])
def test_a_refusal_of_the_shared_check_is_one_line_in_each_wording(
    refusal, root, capsys, monkeypatch
):
    seen = spy(monkeypatch, refusal.function)
    argv = [a.replace("{r}", str(root)) for a in refusal.argv]
    code, out, err = cli(capsys, *argv)
    flags = refusal.flags.replace("{r}", str(root))
    assert (code, out, err) == (2, "", f"tokentape: error: {flags}\n")
    assert [str(e) for e in seen.raised] == [flags]  # raised by the shared function
    assert _wording(seen, 0) is FLAGS
    with pytest.raises(refusal.exc) as caught:
        refusal.call(root)
    assert str(caught.value) == refusal.parameters.replace("{r}", str(root))
    assert seen.raised[-1] is caught.value and _wording(seen, 1) is api.PYTHON
    assert not (root / "never").exists()

"""The error types a trainer catches: each raised where it belongs, through the public API, still
a ``TokentapeError``, and intact (type, message, data) after a pickle round trip and after a
real process boundary."""

from __future__ import annotations

import multiprocessing
import pickle
from pathlib import Path

import pytest
from helpers import write_docs

import tokentape
from tokentape import (
    ArgumentError,
    BatchConfig,
    DataState,
    InputError,
    Loader,
    OutOfRangeError,
    OutputError,
    Plan,
    PlanError,
    ResumeRefused,
    StoreChanged,
    StoreError,
    TokentapeError,
)
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.store.lock import output_lock

CONFIG = BatchConfig(dp_size=1, micro=2, accum=1)


def _roundtrip(exc: TokentapeError) -> TokentapeError:
    """``exc`` pickled and unpickled (our own object: what a worker process sends back)."""
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is type(exc)
    assert str(again) == str(exc) and again.args == exc.args
    assert vars(again) == vars(exc)
    return again


def _store(root: Path, name: str, n: int, edit: str = "", overwrite: bool = False) -> Path:
    write_docs(root / f"{name}.jsonl", name, n, edit)
    out = root / "stores" / name
    tokentape.tokenize(root / f"{name}.jsonl", out, overwrite=overwrite)
    return out


def _plan(root: Path, seed: int = 1234, web_weight: float = 60) -> Plan:
    return Plan.build(
        sources={
            "web": {"path": "stores/web", "weight": web_weight, "max_repeats": 20},
            "code": {"path": "stores/code", "weight": 40, "max_repeats": 20},
        },
        seq_len=32,
        seed=seed,
        total_samples=200,
        base_dir=root,
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("errors")
    _store(root, "web", 40)
    _store(root, "code", 20)
    return root


# --- ResumeRefused ------------------------------------------------------------------------------


def test_resume_on_a_plan_with_another_seed_is_refused_naming_the_seed(root):
    saved = DataState.start(_plan(root, seed=1234)).commit(CONFIG).to_dict()
    other = _plan(root, seed=7)
    with pytest.raises(ResumeRefused) as info:
        Loader(other, 0, CONFIG, state=DataState.from_dict(saved))
    e = info.value
    assert isinstance(e, TokentapeError) and not isinstance(e, ValueError)
    assert e.differences == (("seed", 1234, 7),)
    assert "refusing to resume" in str(e) and str(e).endswith(": seed: 1234 → 7")
    again = _roundtrip(e)
    assert again.differences == (("seed", 1234, 7),)


def test_resume_refused_by_load_state_dict_names_every_difference(root):
    saved = DataState.start(_plan(root)).commit(CONFIG).to_dict()
    other = _plan(root, seed=99, web_weight=70)
    with Loader(other, 0, CONFIG) as loader, pytest.raises(ResumeRefused) as info:
        loader.load_state_dict(saved)
    e = info.value
    fields = {field: (old, new) for field, old, new in e.differences}
    assert fields["seed"] == (1234, 99)
    # Exact weights: 60/40 is 3/2 over 5, 70/40 is 7/4 over 11.
    assert fields["denominator"] == (5, 11)
    assert fields["sources.web.weight_units"] == (3, 7)
    assert fields["sources.code.weight_units"] == (2, 4)
    # the message is built from the same data: every difference, in the same order
    message = str(e)
    assert "source 'web': weight_units 3 → 7" in message
    assert "seed: 1234 → 99" in message
    assert [field for field, _, _ in e.differences] == [
        "denominator",
        "seed",
        "sources.code.weight_units",
        "sources.web.weight_units",
    ]
    positions = [message.index(p) for p in ("seed:", "source 'code'", "source 'web'")]
    assert message.index("denominator") < positions[0]
    assert positions == sorted(positions)
    assert _roundtrip(e).differences == e.differences


def test_a_malformed_saved_state_is_an_input_error_not_a_refused_resume(root):
    saved = DataState.start(_plan(root)).to_dict()
    saved["consumed"] = -1
    with pytest.raises(InputError, match="data state: 'consumed' must be an integer >= 0"):
        DataState.from_dict(saved)


# --- StoreChanged and StoreError ----------------------------------------------------------------


def test_a_store_rewritten_after_planning_raises_store_changed(tmp_path):
    _store(tmp_path, "web", 40)
    _store(tmp_path, "code", 20)
    plan = _plan(tmp_path)
    planned = plan.sources[0].content_hash
    _store(tmp_path, "web", 40, edit="rewritten", overwrite=True)
    found = tokentape.open_source(tmp_path / "stores" / "web").manifest.content_hash
    assert found != planned
    with pytest.raises(StoreChanged) as info:
        Loader(plan, 0, CONFIG)
    e = info.value
    assert isinstance(e, StoreError) and isinstance(e, TokentapeError)
    assert (e.path, e.planned, e.found) == (plan.sources[0].path, planned, found)
    assert "changed since the plan was made" in str(e)
    again = _roundtrip(e)
    assert (again.path, again.planned, again.found) == (e.path, planned, found)


def test_a_damaged_manifest_or_shard_raises_store_error(tmp_path):
    store = _store(tmp_path, "web", 40)
    shard = next(p for p in sorted(store.iterdir()) if p.suffix == ".bin")
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 2)
    with pytest.raises(StoreError, match="the store is damaged") as info:
        tokentape.open_source(store)
    assert not isinstance(info.value, StoreChanged | InputError)
    _roundtrip(info.value)

    (store / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match="not valid JSON") as info:
        tokentape.open_source(store)
    _roundtrip(info.value)
    with pytest.raises(StoreError, match="no such directory"):
        tokentape.open_source(tmp_path / "nowhere")


# --- PlanError ----------------------------------------------------------------------------------


def test_an_invalid_plan_raises_plan_error(root, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('seq_len = "long"\nseed = 1\ntotal_samples = 10\n')
    with pytest.raises(PlanError, match="'seq_len' must be an integer") as info:
        load_plan_spec(bad)
    _roundtrip(info.value)
    bad.write_text("seq_len = = 1\n")
    with pytest.raises(PlanError, match="not valid TOML"):
        load_plan_spec(bad)

    with pytest.raises(PlanError, match="'seq_len' must be positive") as info:
        Plan.build(sources={"web": {"path": "stores/web"}}, seq_len=0, seed=1, base_dir=root)
    assert not isinstance(info.value, ValueError)

    with pytest.raises(PlanError, match="more than its max_repeats"):
        Plan.build(
            sources={"web": {"path": "stores/web", "weight": 1, "max_repeats": 1}},
            seq_len=32,
            seed=1,
            total_samples=10_000,
            base_dir=root,
        )

    edited = tmp_path / "PLAN.json"
    edited.write_text(_plan(root).to_json().replace('"seed": 1234', '"seed": 1235'))
    with pytest.raises(PlanError, match="index_hash does not match its contents"):
        tokentape.load_plan(edited)


def test_a_step_log_of_another_plan_raises_plan_error(root, tmp_path):
    log = tmp_path / "steps.jsonl"
    with Loader(_plan(root), 0, CONFIG, step_log=log) as loader:
        loader.step()
        loader.commit()
        loader.state_dict()
    with pytest.raises(PlanError, match="it belongs to another plan") as info:
        tokentape.replay(_plan(root, seed=5), 0, step_log=log)
    _roundtrip(info.value)


# --- OutputError --------------------------------------------------------------------------------


def test_a_second_writer_while_the_lock_is_held_raises_output_error(tmp_path):
    write_docs(tmp_path / "in.jsonl", "x", 5)
    out = tmp_path / "store"
    with output_lock(out, "someone else"), pytest.raises(OutputError) as info:
        tokentape.tokenize(tmp_path / "in.jsonl", out)
    assert "is being written by" in str(info.value)
    _roundtrip(info.value)
    assert not out.exists()  # refused at once, nothing written


def test_an_output_that_is_not_ours_raises_output_error(tmp_path):
    write_docs(tmp_path / "in.jsonl", "x", 5)
    out = tmp_path / "store"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not empty and not a tokentape store"):
        tokentape.tokenize(tmp_path / "in.jsonl", out)
    assert (out / "notes.txt").read_text() == "mine"


# --- InputError, ArgumentError, OutOfRangeError ---------------------------------------------------


def test_a_bad_filter_or_input_raises_input_error(tmp_path):
    write_docs(tmp_path / "in.jsonl", "x", 5)
    with pytest.raises(InputError, match="unknown filter") as info:
        tokentape.tokenize(tmp_path / "in.jsonl", tmp_path / "out", filters=["shortest-first"])
    assert isinstance(info.value, ValueError) and isinstance(info.value, TokentapeError)
    _roundtrip(info.value)
    with pytest.raises(InputError, match="no such file or directory"):
        tokentape.tokenize(tmp_path / "missing.jsonl", tmp_path / "out")
    with pytest.raises(InputError, match="unknown tokenizer spec"):
        tokentape.tokenize(tmp_path / "in.jsonl", tmp_path / "out", tokenizer="nonsense:x")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": \n')
    with pytest.raises(InputError, match="invalid JSON"):
        tokentape.tokenize(tmp_path / "bad.jsonl", tmp_path / "out")


def test_an_input_error_met_with_worker_processes_is_an_input_error(tmp_path):
    """Whichever process meets the bad line (this one or a helper, which sends its exception
    object back: see the process-boundary test below), the caller gets an InputError."""
    inputs = []
    for i in range(8):
        path = tmp_path / f"in{i}.jsonl"
        path.write_text('{"text": "fine"}\n' * 50 + ('{"text": 3}\n' if i % 2 else ""))
        inputs.append(path)
    with pytest.raises(InputError, match="field 'text' is int, expected a string"):
        tokentape.tokenize(inputs, tmp_path / "out", workers=3, unit_mb=0.0001)


def test_misuse_raises_argument_error_an_input_error_and_a_value_error(root):
    with pytest.raises(ArgumentError) as info:
        BatchConfig(dp_size=0, micro=1, accum=1)
    e = info.value
    assert isinstance(e, InputError) and isinstance(e, ValueError)
    assert isinstance(e, TokentapeError)
    _roundtrip(e)
    with pytest.raises(ValueError, match="dp_rank must be in"):
        Loader(_plan(root), 3, BatchConfig(dp_size=2, micro=1, accum=1))
    source = tokentape.open_source(root / "stores" / "web")
    with pytest.raises(OutOfRangeError) as info:
        source.doc(source.n_docs)
    assert isinstance(info.value, IndexError) and isinstance(info.value, InputError)
    _roundtrip(info.value)


# --- the types themselves -------------------------------------------------------------------------


def test_every_type_is_built_from_one_message_and_survives_a_process_boundary():
    plain = [InputError, ArgumentError, OutOfRangeError, PlanError, StoreError, OutputError]
    for cls in [*plain, StoreChanged, ResumeRefused]:
        e = cls("one line")
        assert str(e) == "one line" and isinstance(e, TokentapeError)
        _roundtrip(e)
    assert StoreChanged("m").planned is None and ResumeRefused("m").differences == ()
    changed = StoreChanged("m", path="stores/web", planned="sha256:aa", found="sha256:bb")
    refused = ResumeRefused("m", differences=(("source order", ["a", "b"], ["b", "a"]),))
    with multiprocessing.get_context("fork").Pool(1) as pool:
        for exc in (changed, refused):
            with pytest.raises(type(exc)) as info:
                pool.apply(_raise, (exc,))
            assert vars(info.value) == vars(exc) and str(info.value) == "m"


def _raise(exc: BaseException) -> None:
    raise exc


def test_document_positions_are_checked_before_reading(root):
    """An out-of-range sample through the public Source: OutOfRangeError names the range."""
    source = tokentape.open_source(root / "stores" / "web")
    with pytest.raises(OutOfRangeError, match=r"not in \[0, "):
        source.window(10**9, 32)


def _all_internal_modules() -> list[str]:
    """Every module below ``tokentape._src``, imported."""
    import importlib
    import pkgutil

    import tokentape._src as internals

    names = [m.name for m in pkgutil.walk_packages(internals.__path__, "tokentape._src.")]
    for name in names:
        importlib.import_module(name)
    return names


def test_every_error_type_is_defined_in_errors_exported_and_documented():
    """One place for the error types: none defined elsewhere (a module of ``_src``), each one
    exported by ``tokentape`` and named in docs/errors.md."""
    import inspect
    import sys

    import tokentape.errors as errors

    strays = []
    for name in _all_internal_modules():
        for attr, obj in vars(sys.modules[name]).items():
            ours = inspect.isclass(obj) and issubclass(obj, TokentapeError)
            if ours and obj.__module__ != "tokentape.errors":
                strays.append(f"{name}.{attr}")
    assert strays == []
    defined = [
        obj
        for obj in vars(errors).values()
        if inspect.isclass(obj) and issubclass(obj, TokentapeError)
    ]
    assert len(defined) >= 15
    docs = (Path(__file__).parents[2] / "docs" / "errors.md").read_text()
    for cls in defined:
        assert getattr(tokentape, cls.__name__) is cls and cls.__name__ in tokentape.__all__
        assert f"`{cls.__name__}`" in docs, cls.__name__

"""Plan files: validation, repeat table, budget refusal, index hash, PLAN.json round trip, the
stated weights read exactly (decimals and integers as written) by default."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import PLAN, SIZES, make_store, plan_of, write_docs

from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan, index_hash
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.program import main
from tokentape._src.render.text import plan_text
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState
from tokentape.errors import PlanError, ResumeRefused, TokentapeError


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("plan")
    for name, n in SIZES.items():
        make_store(root, name, n)
    return root


def test_repeat_table(stores):
    plan = plan_of(stores)  # weights 60 / 30 / 10, no weight_denominator: exactly as stated
    assert [s.name for s in plan.sources] == ["web", "code", "math"]
    assert [s.weight_units for s in plan.sources] == [6, 3, 1] and plan.denominator == 10
    assert [s.draws for s in plan.sources] == [1200, 600, 200]  # 2000 x 6/10, 3/10, 1/10
    for s in plan.sources:
        assert s.n_samples == (s.n_tokens - 1) // 64
        assert s.passes == pytest.approx(s.draws / s.n_samples)
    # An explicit weight_denominator rounds over it, as before exact weights were the default.
    rounded = plan_of(
        stores, PLAN.replace("seed = 1234", "seed = 1234\nweight_denominator = 65536")
    )
    assert sum(s.weight_units for s in rounded.sources) == rounded.denominator == 2**16
    assert sum(s.draws for s in rounded.sources) == rounded.horizon_samples == 2000
    for s, w in zip(rounded.sources, (0.6, 0.3, 0.1), strict=True):
        assert abs(s.draws - 2000 * s.weight_units / 2**16) < 1
        assert abs(s.weight_units / 2**16 - w) < 1 / 2**16
    assert rounded.index_hash != plan.index_hash


def test_total_tokens_horizon_and_suffixes(stores):
    text = PLAN.replace("total_samples = 2000", 'total_tokens = "0.128M"')
    assert plan_of(stores, text).horizon_samples == 2000  # 128,000 / 64
    text = PLAN.replace("total_samples = 2000", "total_tokens = 128001")
    assert plan_of(stores, text).horizon_samples == 2001  # rounded up


def test_budget_refusal_names_the_source(stores, tmp_path, capsys):
    shutil.copytree(stores / "stores", tmp_path / "stores")
    (tmp_path / "mix.toml").write_text(PLAN.replace("max_repeats = 40", "max_repeats = 1.5"))
    assert main(["plan", str(tmp_path / "mix.toml"), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "source 'math' would be read" in err and "max_repeats = 1.5" in err
    assert not (tmp_path / "p.json").exists()
    (tmp_path / "mix.toml").write_text(PLAN)
    assert main(["plan", str(tmp_path / "mix.toml"), "--out", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    plan = load_plan(tmp_path / "p.json")
    assert plan.index_hash in out and "math" in out
    assert plan == plan_of(tmp_path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("seq_len = 64", "seq_len = 0"), "'seq_len' must be positive"),
        (("seed = 1234", "seed = -1"), "'seed' must be in"),
        (
            ("weight = 60", "weight = -1"),
            "source[0] ('web'): 'weight' must be a finite number >= 0",
        ),
        (("weight = 60", "weight = nan"), "'weight' must be a finite number >= 0"),
        (("weight = 60", "weight = 0"), "source 'web' has weight 0 in every phase"),
        (("weight = 60", 'weight = "sixty"'), "'weight' must be a number"),
        (("weight = 60", "wieght = 60"), "source[0] ('web'): unknown key 'wieght'"),
        (('name = "code"', 'name = "web"'), "source name 'web' appears twice"),
        (("seed = 1234\n", ""), "missing key 'seed'"),
        (("total_samples = 2000", ""), "exactly one of 'total_tokens' or 'total_samples'"),
        (("total_samples = 2000", 'total_samples = "2X"'), "is not a count"),
        (('path = "stores/math"', 'path = "stores/nope"'), "source 'math': store"),
        (("seq_len = 64", "seq_len = 100000"), "fewer than seq_len + 1"),
        (("[[source]]", "colour = 1\n[[source]]"), "unknown key 'colour'"),
    ],
)
def test_plan_errors(stores, edit, message):
    text = PLAN.replace(edit[0], edit[1], 1)
    with pytest.raises(TokentapeError) as info:
        plan_of(stores, text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_weight_that_rounds_to_zero_is_refused(stores):
    text = PLAN.replace("weight = 10", "weight = 0.00001")
    with pytest.raises(TokentapeError, match="'math'"):
        plan_of(stores, text)


def test_stores_with_different_tokenizers_are_refused(stores, tmp_path, hf_tokenizer_json):
    shutil.copytree(stores / "stores", tmp_path / "stores")
    shutil.rmtree(tmp_path / "stores" / "math")
    write_docs(tmp_path / "math.jsonl", "math", 15)
    config = TokenizeConfig(
        inputs=(str(tmp_path / "math.jsonl"),),
        out=str(tmp_path / "stores" / "math"),
        tokenizer=str(hf_tokenizer_json),
    )
    tokenize(config)
    with pytest.raises(TokentapeError, match="source 'math' was tokenized with another tokenizer"):
        plan_of(tmp_path)


def test_missing_plan_file(tmp_path):
    with pytest.raises(TokentapeError, match="no such file"):
        load_plan_spec(tmp_path / "nope.toml")


def test_index_hash_changes_when_and_only_when_a_tape_input_changes(stores, tmp_path):
    base = plan_of(stores).index_hash
    same = [
        PLAN.replace("total_samples = 2000", "total_samples = 999999"),  # the horizon
        PLAN.replace("max_repeats = 40", "max_repeats = 400"),  # a budget
        PLAN.replace("weight = 60", "weight = 120").replace("weight = 30", "weight = 60")
        .replace("weight = 10", "weight = 20"),  # the same shares
    ]  # fmt: skip
    for text in same:
        assert plan_of(stores, text).index_hash == base
    changed = [
        PLAN.replace("seq_len = 64", "seq_len = 32"),
        PLAN.replace("seed = 1234", "seed = 1235"),
        PLAN.replace("weight = 60", "weight = 61"),
        PLAN.replace('name = "web"', 'name = "web2"'),
    ]
    hashes = {plan_of(stores, text).index_hash for text in changed}
    assert len(hashes) == 4 and base not in hashes
    # Source order.
    blocks = PLAN.split("[[source]]")
    reordered = blocks[0] + "[[source]]" + blocks[2] + "[[source]]" + blocks[1]
    reordered += "[[source]]" + blocks[3]
    assert plan_of(stores, reordered).index_hash not in hashes | {base}
    # One token of one store: re-tokenize 'code' with one character changed.
    shutil.copytree(stores / "stores", tmp_path / "stores")
    shutil.rmtree(tmp_path / "stores" / "code")
    make_store(tmp_path, "code", SIZES["code"], edit="!")
    assert plan_of(tmp_path).index_hash not in hashes | {base}


def test_edited_plan_json_is_refused(stores, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(plan_of(stores).to_json())
    data = json.loads(path.read_text())
    data["seed"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(TokentapeError, match="index_hash does not match"):
        load_plan(path)


def test_an_edited_sample_count_is_refused(stores, tmp_path):
    """n_samples drives the tape but is not hashed (it follows from n_tokens and seq_len)."""
    path = tmp_path / "p.json"
    path.write_text(plan_of(stores).to_json())
    data = json.loads(path.read_text())
    data["sources"][1]["n_samples"] -= 1
    path.write_text(json.dumps(data))
    with pytest.raises(TokentapeError, match=r"source 'code': n_samples \d+ does not follow"):
        load_plan(path)


def test_plot_draws_a_png(stores, tmp_path):
    pytest.importorskip("matplotlib")
    shutil.copytree(stores / "stores", tmp_path / "stores")
    (tmp_path / "mix.toml").write_text(PLAN)
    assert main(["plan", str(tmp_path / "mix.toml"), "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(colour="red"), "unknown field 'colour'"),
        (lambda d: d["sources"][0].update(colour="red"), "sources[0]: unknown field 'colour'"),
        (
            lambda d: d.update(horizon_samples=2000.5),
            "field 'horizon_samples': expected an integer",
        ),
        (
            lambda d: d.update(horizon_samples="2000"),
            "field 'horizon_samples': expected an integer",
        ),
        (
            lambda d: d.update(horizon_samples=2**62),
            "'horizon_samples': 4611686018427387904 is not",
        ),
        (lambda d: d.pop("seed"), "field 'seed' is missing"),
        (lambda d: d["sources"][1].update(n_tokens="8044"), "sources[1]: field 'n_tokens'"),
        (lambda d: d["sources"][0].update(eod_id=999), "field 'eod_id': 999 is not below"),
        (lambda d: d.update(sources=[]), "field 'sources' must be a non-empty list"),
    ],
)
def test_a_malformed_plan_json_names_the_field(stores, tmp_path, edit, message):
    """Every field is checked for its type and range, and no Python error text leaks out."""
    path = tmp_path / "p.json"
    data = json.loads(plan_of(stores).to_json())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(TokentapeError) as info:
        load_plan(path)
    text = str(info.value)
    assert message in text and "\n" not in text and "__init__" not in text, text
    assert text.startswith(f"plan '{path}'"), text


def test_a_forged_plan_json_with_a_matching_hash_is_refused(stores, tmp_path):
    """Weight units that do not sum to the denominator change the tape's period: refused even
    when the index hash was recomputed to match."""
    from tokentape._src.plan.plan import plan_index_hash

    plan = plan_of(stores)
    data = json.loads(plan.to_json())
    data["sources"][0]["weight_units"] = 1
    forged = [replace(s, weight_units=1) if i == 0 else s for i, s in enumerate(plan.sources)]
    data["index_hash"] = plan_index_hash(tuple(forged), plan.seq_len, plan.seed, plan.denominator)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TokentapeError, match="weight_units sum to"):
        load_plan(path)


def test_plot_in_an_unknown_format_writes_nothing(stores, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    shutil.copytree(stores / "stores", tmp_path / "stores")
    (tmp_path / "mix.toml").write_text(PLAN)
    out, plot = tmp_path / "p.json", tmp_path / "p.xyz"
    assert main(["plan", str(tmp_path / "mix.toml"), "--out", str(out), "--plot", str(plot)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown image format 'xyz'" in err, err
    assert not out.exists() and not plot.exists()


@pytest.mark.parametrize("bad", ["out", "plot"])
def test_an_output_that_cannot_be_written_writes_neither(stores, tmp_path, capsys, bad):
    """--out was written, then --plot into a missing directory failed (exit 2, a file left);
    both are checked before either is written."""
    pytest.importorskip("matplotlib")
    shutil.copytree(stores / "stores", tmp_path / "stores")
    (tmp_path / "mix.toml").write_text(PLAN)
    out, plot = tmp_path / "p.json", tmp_path / "p.png"
    if bad == "out":
        out = tmp_path / "nodir" / "p.json"
    else:
        plot = tmp_path / "nodir" / "p.png"
    assert main(["plan", str(tmp_path / "mix.toml"), "--out", str(out), "--plot", str(plot)]) == 2
    err = capsys.readouterr().err
    missing = out if bad == "out" else plot
    assert err == f"tokentape: error: '{missing}': No such file or directory\n"
    assert not out.exists() and not plot.exists()


def test_plot_leaves_a_callers_figures_open(stores, tmp_path):
    """draw_plan closed every open figure (plt.close('all')), a notebook's included."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from tokentape._src.render.plot import plot_plan

    mine = plt.figure()
    try:
        plot_plan(plan_of(stores), tmp_path / "p.svg")
        assert plt.fignum_exists(mine.number)
        assert (tmp_path / "p.svg").read_bytes().lstrip().startswith(b"<?xml")
    finally:
        plt.close(mine)


# --- Plan.build: the same plan from Python ------------------------------------------------

BUILT_SOURCES = {
    "web": {"path": "stores/web", "weight": 60, "max_repeats": 8},
    "code": {"path": "stores/code", "weight": 30, "max_repeats": 6},
    "math": {"path": "stores/math", "weight": 10, "max_repeats": 40},
}


def test_plan_built_in_python_is_the_toml_plan_byte_for_byte(stores, tmp_path, capsys):
    (stores / "mix.toml").write_text(PLAN)
    assert main(["plan", str(stores / "mix.toml"), "--out", str(tmp_path / "cli.json")]) == 0
    capsys.readouterr()
    built = Plan.build(BUILT_SOURCES, seq_len=64, seed=1234, total_samples=2000, base_dir=stores)
    listed = Plan.build(
        [{"name": n, **t} for n, t in BUILT_SOURCES.items()],
        seq_len=64,
        seed=1234,
        total_tokens="0.128M",
        base_dir=str(stores),
    )
    assert built == listed == load_plan(tmp_path / "cli.json")
    built.save(tmp_path / "built.json")
    assert (tmp_path / "built.json").read_bytes() == (tmp_path / "cli.json").read_bytes()
    assert load_plan(tmp_path / "built.json").index_hash == built.index_hash
    assert not [p for p in tmp_path.iterdir() if p.name not in {"cli.json", "built.json"}]
    assert built.vocab_size == built.sources[0].vocab_size == 257  # bytes tokenizer
    assert built.eod_id == 256


def test_plan_build_refuses_what_the_toml_route_refuses(stores):
    base = {"seq_len": 64, "seed": 1234, "total_samples": 2000, "base_dir": stores}
    bad_weight = {**BUILT_SOURCES, "web": {"path": "stores/web", "weight": -1}}
    typo = {**BUILT_SOURCES, "web": {"path": "stores/web", "wieght": 60}}
    over = {**BUILT_SOURCES, "math": {"path": "stores/math", "weight": 10, "max_repeats": 1.5}}
    cases = [
        (bad_weight, base, "source[0] ('web'): 'weight' must be a finite number >= 0"),
        (typo, base, "source[0] ('web'): unknown key 'wieght'"),
        (over, base, "source 'math' would be read"),
        (BUILT_SOURCES, {**base, "seed": -1}, "'seed' must be in"),
        (BUILT_SOURCES, {**base, "total_tokens": 10}, "exactly one of 'total_tokens'"),
        ({"web": {"path": "stores/nope", "weight": 1}}, base, "source 'web': store"),
        ({}, base, "no sources"),
        ({"web": {"name": "web", "path": "stores/web", "weight": 1}}, base, "as the key only"),
        ("stores/web", base, "sources: expected a dict"),
    ]
    for sources, kwargs, message in cases:
        with pytest.raises(TokentapeError, match=None) as info:
            Plan.build(sources, **kwargs)
        assert message in str(info.value), (message, str(info.value))


def test_plan_save_failure_names_the_file_and_writes_nothing(stores, tmp_path):
    plan = Plan.build(BUILT_SOURCES, seq_len=64, seed=1234, total_samples=2000, base_dir=stores)
    with pytest.raises(TokentapeError, match="No such file or directory"):
        plan.save(tmp_path / "missing" / "plan.json")
    assert list(tmp_path.iterdir()) == []


def test_a_version_1_plan_and_its_data_state_still_load_with_the_same_tape(stores, tmp_path):
    """Version 2 changed how a plan file's weights are resolved, not the tape of a resolved
    plan: a PLAN.json written by version 1 (weights rounded over 2^16, its index hash over
    version 1) loads, keeps its index hash, and maps every position as the same weights do
    under version 2; its data state resumes. Another version is refused."""
    explicit = plan_of(
        stores, PLAN.replace("seed = 1234", "seed = 1234\nweight_denominator = 65536")
    )
    rows = [(s.name, s.weight_units, s.n_tokens, s.dtype, s.content_hash) for s in explicit.sources]
    old_hash = index_hash(explicit.seq_len, explicit.seed, explicit.denominator, rows, version=1)
    data = json.loads(explicit.to_json())
    data |= {"algorithm_version": 1, "index_hash": old_hash}
    (tmp_path / "v1.json").write_text(json.dumps(data))
    v1 = load_plan(tmp_path / "v1.json")
    assert (v1.algorithm_version, v1.index_hash) == (1, old_hash) != (2, explicit.index_hash)
    positions = np.arange(0, 50_000, 7)
    a, b = v1.tape().resolve(positions), explicit.tape().resolve(positions)
    assert np.array_equal(a.source, b.source) and np.array_equal(a.sample, b.sample)
    start = DataState.start(v1).commit(BatchConfig(1, 50_000))
    state = DataState.from_dict(json.loads(json.dumps(start.to_dict())))
    assert state.index_hash == old_hash
    state.check_plan(load_plan(tmp_path / "v1.json"))  # resumes
    # Re-resolved under version 2 with the same weights: another index hash, the same tape.
    assert state.resume_on(explicit).plan_changes[0].new_index_hash == explicit.index_hash
    # Re-resolved under version 2 without weight_denominator: the exact weights, another tape.
    exact = plan_of(stores)
    p = np.arange(50_000)
    first = int(np.flatnonzero(v1.tape().resolve(p).source != exact.tape().resolve(p).source)[0])
    message = rf"position {first:,} would draw .* where the run drew .*resumes on the PLAN\.json it"
    with pytest.raises(ResumeRefused, match=message):
        state.check_plan(exact)
    data["algorithm_version"] = 3
    (tmp_path / "v3.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match="algorithm_version 3 is not one of 1, 2"):
        load_plan(tmp_path / "v3.json")


def test_the_plan_table_says_whether_the_weights_are_exact(stores, tmp_path, capsys):
    shutil.copytree(stores / "stores", tmp_path / "stores")
    cases = [
        (PLAN, "exact rationals over 10: the stated weights exactly"),
        (
            PLAN.replace("weight = 10\n", "weight = 10.00001\n"),
            "over 65,536: the stated weights rounded",
        ),
    ]
    for text, expected in cases:
        (tmp_path / "mix.toml").write_text(text)
        assert main(["plan", str(tmp_path / "mix.toml")]) == 0
        assert expected in capsys.readouterr().out


# --- exact stated weights (the default) in plan files -----------------------------------------


def _two(a: object, b: object) -> str:
    """A plan of two sources (web, code) with weights written as ``a`` and ``b``."""
    return (
        "seq_len = 64\nseed = 1\ntotal_samples = 100\n"
        f'[[source]]\nname = "web"\npath = "stores/web"\nweight = {a}\nmax_repeats = 1e9\n'
        f'[[source]]\nname = "code"\npath = "stores/code"\nweight = {b}\nmax_repeats = 1e9\n'
    )


def _weights_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith("weights"))


def test_stated_decimal_weights_are_exact_end_to_end(stores):
    text = PLAN.replace("weight = 60", "weight = 0.55").replace("weight = 30", "weight = 0.3")
    plan = plan_of(stores, text.replace("weight = 10\n", "weight = 0.15\n"))
    assert ([s.weight_units for s in plan.sources], plan.denominator) == ([11, 6, 3], 20)
    assert "over 20: the stated weights exactly" in _weights_line(plan_text(plan))
    # ints and floats mixed, exponents: the decimals as written
    mixed = plan_of(stores, _two("6e1", 30))
    assert ([s.weight_units for s in mixed.sources], mixed.denominator) == ([2, 1], 3)
    tiny = plan_of(stores, _two("1e-7", "2e-7"))
    assert ([s.weight_units for s in tiny.sources], tiny.denominator) == ([1, 2], 3)


def test_a_plan_file_claiming_the_other_version_is_refused_or_has_the_same_tape(stores, tmp_path):
    """The version is in the index hash: flipping it without the hash is refused; with the hash
    recomputed it loads, but the tape follows from weight_units/denominator alone, so no plan
    file of one version passes for the other with a different tape."""
    plan = plan_of(stores)  # version 2, 6/3/1 over 10
    data = json.loads(plan.to_json())
    data["algorithm_version"] = 1
    (tmp_path / "flip.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match="index_hash does not match"):
        load_plan(tmp_path / "flip.json")
    rows = [(s.name, s.weight_units, s.n_tokens, s.dtype, s.content_hash) for s in plan.sources]
    data["index_hash"] = index_hash(plan.seq_len, plan.seed, plan.denominator, rows, version=1)
    (tmp_path / "v1.json").write_text(json.dumps(data))
    v1 = load_plan(tmp_path / "v1.json")
    assert v1.algorithm_version == 1 and v1.index_hash != plan.index_hash
    p = np.arange(0, 5000)
    a, b = v1.tape().resolve(p), plan.tape().resolve(p)
    assert np.array_equal(a.source, b.source) and np.array_equal(a.sample, b.sample)
    # The same tape under either version: a run resumes on the other (the change recorded).
    state = DataState.start(v1).commit(BatchConfig(1, 5000))
    moved = state.resume_on(plan)
    assert moved.index_hash == plan.index_hash and len(moved.plan_changes) == 1


def test_integer_weights_beyond_two_to_the_53_are_read_as_written(stores):
    plan = plan_of(stores, _two(9_007_199_254_740_995, 27_021_597_764_222_985))
    assert ([s.weight_units for s in plan.sources], plan.denominator) == ([1, 3], 4)
    unequal = plan_of(stores, _two(9_007_199_254_740_993, 9_007_199_254_740_992))
    assert "the stated weights exactly" not in _weights_line(plan_text(unequal))


def test_a_weight_lost_to_the_fallback_rounding_names_weight_denominator(stores):
    with pytest.raises(PlanError) as info:
        plan_of(stores, _two(1, "1e-7"))
    assert "weight_denominator" in str(info.value)


def test_the_target_share_of_huge_weights(stores):
    plan = plan_of(stores, _two("1e308", "1e308"))
    assert plan.denominator == 2
    assert plan_text(plan).count("50.0000%") == 4  # target and effective share, both sources

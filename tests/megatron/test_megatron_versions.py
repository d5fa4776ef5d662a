"""Caches of two megatron-core versions, each built by that version itself
(tests/tools/mcore_cache.py in its own Python): the project's (0.16.1, the layout of 0.7 and
later) and 0.6.0 (its own virtual environment, ``make mcore06``: no split in the file names,
another blend size). For every sample tokentape reads the tokens the version's own dataset
returned and finds the documents its GPTDataset reported.

``.ci/run`` sets ``TOKENTAPE_REQUIRE_MCORE06=1``: there a missing 0.6.0 environment fails
rather than skips.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from tokentape._src.audit.megatron_locate import dataset_map, landings
from tokentape._src.megatron.select import RunQuery, open_run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "tools" / "mcore_cache.py"
MCORE06 = Path(
    os.environ.get("TOKENTAPE_MCORE06_PYTHON", ROOT / ".venv-mcore06" / "bin" / "python")
)

pytestmark = [pytest.mark.megatron]


def _python(which: str) -> str:
    if which == "0.6.0":
        if not MCORE06.exists():
            if os.environ.get("TOKENTAPE_REQUIRE_MCORE06") == "1":
                pytest.fail(f"{MCORE06}: missing (make mcore06 builds it)")
            pytest.skip(f"megatron-core 0.6.0's environment is absent ({MCORE06}; make mcore06)")
        return str(MCORE06)
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("megatron-core (the megatron extra) is not installed")
    return sys.executable


@pytest.fixture(scope="module", params=["0.6.0", "project"])
def built(request, tmp_path_factory):
    python = _python(request.param)
    out = tmp_path_factory.mktemp(f"mcore-{request.param}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [python, str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((out / "meta.json").read_text())
    expected = dict(np.load(out / "expected.npz", allow_pickle=False))
    if request.param == "0.6.0":
        assert meta["version"] == "0.6.0"
        assert not list((out / "blend" / "cache").glob("*-train-*")), "not the old layout"
    return out, meta, expected


def _check_tokens(run, expected, name, length=None):
    tokens = expected[f"{name}.tokens"]
    assert len(run) == (len(tokens) if length is None else length), name
    for g in range(len(run)):
        d, j = run.resolve(g)
        text, _ = run.datasets[d].text(j)
        assert np.array_equal(text[:-1], tokens[g]), (name, g)
        assert d == expected[f"{name}.dataset"][g]


def _prefixes(paths):
    return tuple(Path(p) for p in paths)


@pytest.mark.parametrize("split", ["train", "valid"])
def test_a_blend_read_as_the_version_built_it(built, split):
    out, meta, expected = built
    query = RunQuery((out / "blend" / "cache",), _prefixes(meta["prefixes"]), split=split)
    _check_tokens(open_run(query), expected, f"blend.{split}")


def test_a_single_prefix(built):
    out, meta, expected = built
    query = RunQuery((out / "single" / "cache",), _prefixes(meta["prefixes"][2:]))
    run = open_run(query)
    assert run.dataset_index is None and run.datasets[0].epochs > 1
    _check_tokens(run, expected, "single.train")


def test_a_blend_never_saved_rebuilt_with_the_versions_sizes(built):
    _out, meta, expected = built
    case = meta["nocache"]
    prefixes = _prefixes(case["prefixes"])
    default = Path(f"{prefixes[0]}") / "cache" / "GPTDataset_indices"
    query = RunQuery((default,), prefixes, weights=tuple(case["weights"]), samples=case["samples"])
    run = open_run(query)
    assert run.rebuilt
    # the samples the run asked for (megatron-core built a few more, as many as its version's
    # sizes say: 0.6.0 more than 0.16.1)
    assert len(expected["nocache.train.tokens"]) >= case["samples"]
    _check_tokens(run, expected, "nocache.train", length=case["samples"])


def test_locate_finds_what_the_version_reported(built, tmp_path):
    out, meta, expected = built
    run = open_run(RunQuery((out / "blend" / "cache",), _prefixes(meta["prefixes"])))
    docs, offsets = expected["blend.train.docs"], expected["blend.train.offsets"]
    scan = defaultdict(list)
    for g in range(len(offsets) - 1):
        d = int(expected["blend.train.dataset"][g])
        for doc in docs[offsets[g] : offsets[g + 1]].tolist():
            scan[(d, doc)].append(g)
    for d in range(len(run.datasets)):
        m, _ = dataset_map(run, d, tmp_path)
        ds = run.datasets[d]
        for doc in range(ds.begin, ds.end):
            found = sorted(h.g for h in landings(run, d, doc, m) if h.g is not None)
            assert found == sorted(scan.get((d, doc), [])), (d, doc)

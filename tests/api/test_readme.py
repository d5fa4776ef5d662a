"""Every ```python block of the README and the docs runs as written, in a directory holding what
the blocks name (stores, ``mix.json``, a run's step log, the built-in corpora); the README's
Train section is examples/train_mixture.py; no text teaches an internal module."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tokentape
from tokentape._src.corpora import write_builtin_corpora

ROOT = Path(__file__).parents[2]
DOCS = [
    "README.md",
    "docs/plan.md",
    "docs/audit.md",
    "docs/locate.md",
    "docs/report.md",
    "docs/train.md",
    "docs/errors.md",
]
"""The pages with Python blocks to run (docs/errors.md shows interpreter sessions instead)."""
TORCH = {"README.md", "docs/train.md"}
TRAIN_ARGV = ["train_mixture.py", "corpora", "run-mixture", "3"]
"""The README's Train block is the example script: it reads its arguments from ``sys.argv``."""


def python_blocks(doc: str) -> list[tuple[int, str]]:
    """(line number, code) of each ```python block of ``doc``."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    blocks = []
    for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M):
        blocks.append((text[: m.start()].count("\n") + 2, m.group(1)))
    return blocks


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """What the blocks name, built with the public API: the built-in corpora; ``data/web``
    and ``stores/web`` (as the README's tokenize block makes it), ``stores/math``;
    ``mix.json`` over them; a run's step log ``run/steps.jsonl`` and loss log
    ``run/loss.jsonl`` (a trainer's: a decaying loss, per source)."""
    root = tmp_path_factory.mktemp("readme")
    corpora = write_builtin_corpora(root / "corpora")
    shutil.copytree(corpora["prose"], root / "data" / "web")
    with contextlib.chdir(root):  # the README's call, so that the block finds its store made
        tokentape.tokenize("data/web/", "stores/web", filters=["min-tokens:16"], workers=2)
    tokentape.tokenize(corpora["notes"], root / "stores" / "math")
    sources = {"web": {"path": "stores/web", "weight": 60}}
    sources["math"] = {"path": "stores/math", "weight": 5, "max_repeats": 4.0}
    plan = tokentape.Plan.build(sources, seq_len=64, seed=1234, total_samples=20_000, base_dir=root)
    plan.save(root / "mix.json")
    config = tokentape.BatchConfig(dp_size=1, micro=4, accum=2)
    (root / "run").mkdir()
    with tokentape.Loader(plan, 0, config, step_log=root / "run" / "steps.jsonl") as loader:
        with open(root / "run" / "loss.jsonl", "w") as losses:
            for i in range(10):
                loader.step()
                loader.commit()
                by = {"web": 3.0 - 0.1 * i, "math": 3.2 - 0.1 * i}
                line = {"step": i, "loss": 3.1 - 0.1 * i, "loss_by_source": by}
                losses.write(json.dumps(line) + "\n")
        loader.state_dict()
    return root


def _cases() -> list:
    torch = [pytest.mark.slow, pytest.mark.torch]  # these pages train a model
    return [
        pytest.param(doc, id=doc.removeprefix("docs/"), marks=torch if doc in TORCH else [])
        for doc in DOCS
    ]


@pytest.mark.parametrize("doc", _cases())
def test_python_blocks_run_as_written(doc, workdir, monkeypatch):
    if doc in TORCH:
        pytest.importorskip("torch")
    blocks = python_blocks(doc)
    assert blocks, f"{doc} has no python block"
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "argv", TRAIN_ARGV)
    namespace: dict = {"__name__": "__main__"}  # one namespace per page, block after block
    for line, code in blocks:
        exec(compile(code, f"{doc}:{line}", "exec"), namespace)
    if doc == "README.md":  # the blocks did what the text around them says
        assert namespace["summary"].n_docs > 0 and namespace["summary"].status == "already complete"
        assert [s.name for s in namespace["plan"].sources] == ["prose", "code", "notes"]
        assert namespace["loader"].state.step == 3
        assert (workdir / "run-mixture" / "ckpt.npz").is_file()
        assert namespace["found"].position.size > 0 and namespace["replayed"].step == 7


def test_readme_train_section_is_the_example():
    code = (ROOT / "examples" / "train_mixture.py").read_text(encoding="utf-8")
    body = code.splitlines()[ast.parse(code).body[0].end_lineno :]
    shown = [c for _, c in python_blocks("README.md") if "loader.commit()" in c]
    assert shown == ["\n".join(body).strip("\n") + "\n"]


def test_the_example_fits_in_25_lines():
    """The training loop: every line after the docstring and the imports, blank ones aside."""
    code = (ROOT / "examples" / "train_mixture.py").read_text(encoding="utf-8")
    tree = ast.parse(code)
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    body = code.splitlines()[imports[-1].end_lineno :]
    assert len([x for x in body if x.strip()]) <= 25


def test_readme_starts_with_what_it_is_then_make_demo_and_make_test():
    """The title, one paragraph saying what tokentape is and why, then the two commands,
    within the first screen."""
    paragraphs = (ROOT / "README.md").read_text(encoding="utf-8").split("\n\n")
    assert paragraphs[0] == "# tokentape"
    assert "data pipeline for LLM pretraining" in paragraphs[1] and "```" not in paragraphs[1]
    commands = paragraphs[2].splitlines()
    assert commands[0] == "```sh" and commands[-1] == "```", paragraphs[2]
    assert [c.split()[:2] for c in commands[1:-1]] == [["make", "demo"], ["make", "test"]]
    assert len("\n\n".join(paragraphs[:3]).splitlines()) <= 12


def _quick_start() -> str:
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Quick start", 1)[1]
    return re.search(r"^```sh\n(.*?)^```$", section, re.S | re.M).group(1)


@pytest.mark.slow
@pytest.mark.torch
def test_the_quick_start_runs_as_written(tmp_path):
    """The README's quick start, line by line in a fresh directory beside the examples, with
    the environment's commands on the PATH (as after ``source .venv/bin/activate``)."""
    pytest.importorskip("torch")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", _quick_start()], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    steps = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in steps] == list(range(9))
    assert "resumed at step 6" in done.stdout and "step               7" in done.stdout
    assert "tokens hash matches what the loader logged" in done.stdout
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


CONTRIBUTORS = {"docs/architecture.md"}
"""The map of the internal packages: the one page that names them (and imports none)."""
TEXTS = [
    "README.md",
    *sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "docs").glob("*.md")
        if str(p.relative_to(ROOT)) not in CONTRIBUTORS
    ),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").iterdir() if p.is_file()),
]
PUBLIC = {"tokentape", "tokentape.torch", "tokentape.megatron", "tokentape.errors"}


def test_the_contributors_map_names_every_internal_package_and_imports_none():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert not re.findall(r"^\s*(?:from|import) tokentape", text, re.M)
    packages = [p.name for p in (ROOT / "src" / "tokentape" / "_src").iterdir() if p.is_dir()]
    modules = [p.stem for p in (ROOT / "src" / "tokentape" / "_src").glob("*.py")]
    for name in {*packages, *modules} - {"__init__", "__pycache__"}:
        assert f"`{name}`" in text, name


def test_the_contributors_map_lists_the_test_folders_as_they_are():
    """docs/architecture.md's "Tests mirror the packages" names exactly the folders that hold
    tests, and every internal package has a test folder of its name (but ``render`` and
    ``util``, tested through their callers)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Tests mirror the packages", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`tests/(\w+)`", section))
    holding = {p.parent.name for p in (ROOT / "tests").glob("*/test_*.py")}
    assert listed - {"tools"} == holding
    packages = {p.name for p in (ROOT / "src" / "tokentape" / "_src").iterdir() if p.is_dir()}
    untested_alone = {"__pycache__", "render", "util"}
    assert packages - untested_alone - holding == set()


@pytest.mark.parametrize("path", TEXTS)
def test_no_text_teaches_an_internal_module(path):
    text = (ROOT / path).read_text(encoding="utf-8")
    assert "tokentape._src" not in text, path
    imports = re.findall(r"^\s*(?:from|import) (tokentape[\w.]*)", text, re.M)
    assert set(imports) <= PUBLIC, path

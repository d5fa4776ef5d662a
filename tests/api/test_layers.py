"""The import contract (.importlinter) holds, and it is not decorative: a copy of the package
with one backward import planted in it fails ``lint-imports``, naming the import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = [
    pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed"),
    pytest.mark.subprocess,
    pytest.mark.slow,
]


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root / "src")}  # ahead of the editable install
    return subprocess.run(
        [str(LINT), "--config", str(root / ".importlinter"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", root / ".importlinter")
    return root


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        # the store may not know the command line
        ("store/format.py", "from tokentape._src.cli import app", "tokentape._src.cli"),
        # nor may the pure tape read files
        ("tape/blend.py", "import pathlib", "pure index math"),
        # nor the plan the training runtime
        ("plan/open.py", "from tokentape._src.train import loader", "tokentape._src.train"),
        # object storage is format-blind: it may not know the store
        ("objects/ranged.py", "from tokentape._src.store import format", "tokentape._src.store"),
        # the loader, staging and verification run without torch
        ("train/loader.py", "import torch", "Only the torch integration imports torch"),
        ("stage/stage.py", "import torch", "Only the torch integration imports torch"),
        ("verify/stores.py", "import torch", "Only the torch integration imports torch"),
        # one door to object storage
        ("stage/fetch.py", "import fsspec", "Only the object-storage package talks"),
    ],
)
def test_a_backward_import_breaks_the_contract(tmp_path, module, planted, broken):
    root = _copy(tmp_path)
    assert _lint(root).returncode == 0  # the copy, untouched, keeps every contract
    path = root / "src" / "tokentape" / "_src" / module
    text = path.read_text()
    head, sep, rest = text.partition("\nfrom __future__ import annotations\n")
    path.write_text(head + sep + planted + "  # noqa\n" + rest)
    result = _lint(root)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout and broken in result.stdout


def test_the_repository_keeps_its_contracts():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout

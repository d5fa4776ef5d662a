"""The package is typed for its users (PEP 561: ``py.typed``): mypy run on a user's script
against the installed package sees tokentape's own types, not ``Any``. Without the marker the
same script gets ``Any`` everywhere and an import error, which is what this test would see."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

SCRIPT = """\
import tokentape

plan = tokentape.load_plan("mix.json")
loader = tokentape.Loader(plan, 0, tokentape.BatchConfig(dp_size=1, micro=2, accum=1))
step = loader.step()
reveal_type(plan)
reveal_type(loader)
reveal_type(step)
reveal_type(step.micro_batches[0])
reveal_type(tokentape.replay("mix.json", 7, global_batch=8))
"""

EXPECTED = [
    "tokentape._src.plan.plan.Plan",
    "tokentape._src.train.loader.Loader",
    "tokentape._src.train.loader.Step",
    "tokentape._src.train.batch.Batch",
    "tokentape._src.audit.replay.Replayed",
]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy (dev extra) absent")
def test_a_users_script_gets_real_types(tmp_path):
    (tmp_path / "user.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "user.py"],
        cwd=tmp_path,  # the package comes from the install, not from this repository's src/
        capture_output=True,
        text=True,
        timeout=300,
    )
    revealed = re.findall(r'Revealed type is "([^"]*)"', done.stdout)
    assert len(revealed) == len(EXPECTED), done.stdout
    for got, want in zip(revealed, EXPECTED, strict=True):
        assert want in got and "Any" not in got.replace("Any, ...", ""), (got, want)
    assert "Success: no issues found" in done.stdout, done.stdout

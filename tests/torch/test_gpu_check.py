"""benchmarks/gpu_check.py: one line and exit 2 without a GPU (checked everywhere, with CUDA
hidden); the real run, on small settings, where a CUDA device is present."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.subprocess]

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu_check.py"


def _run(*args: str, hide_cuda: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    if hide_cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)  # fmt: skip


def test_without_cuda_one_line_exit_2_and_nothing_built(tmp_path):
    out = tmp_path / "out"
    done = _run("--out", str(out), hide_cuda=True)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("gpu-check: no CUDA device (torch.cuda.is_available() is False)")
    assert not out.exists()  # refused before building anything


@pytest.mark.slow
def test_bad_argument_one_line_exit_2(tmp_path):
    done = _run("--steps", "0", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr == "gpu-check: error: --steps must be at least 1\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_import_does_not_touch_cuda():
    code = (
        "import importlib.util, sys, torch\n"
        f"spec = importlib.util.spec_from_file_location('gpu_check', {str(SCRIPT)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['gpu_check'] = module\n"
        "spec.loader.exec_module(module)\n"
        "print(callable(module.main), torch.cuda.is_initialized())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_run_reports_overlap_wait_and_both_rank_checks(tmp_path):
    args = ["--out", str(tmp_path / "gpu"), "--steps", "6", "--warmup", "2", "--micro", "2"]
    args += ["--accum", "2", "--width", "32", "--smoke-steps", "2", "--json"]
    done = _run(*args, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    train = result["train"]
    assert (train["steps"], train["micro"], train["accum"], train["seq_len"]) == (6, 2, 2, 256)
    assert train["steps_per_s"] > 0 and train["tokens_per_s"] > 0
    assert 0.0 <= train["copy_hidden_pct"] <= 100.0
    assert train["copy_ms_mean"] > 0 and train["compute_ms_mean"] > 0
    assert 0.0 <= train["data_wait_ms_p50"] <= train["data_wait_ms_max"]
    assert result["smoke"]["rc"] == 0 and result["smoke"]["verdict"].startswith("OK")
    over_nccl = result["smoke_nccl"]
    assert (
        over_nccl["rc"] == 0
        and over_nccl["verdict"].startswith("OK")
        and "(nccl)" in over_nccl["verdict"]
    )
    assert result["nccl"] == {"ok": True, "verdict": "OK: 2 steps, world 1"}
    again = _run(*args[:-1], timeout=600)  # the plan is reused; the table is printed
    assert again.returncode == 0, again.stdout + again.stderr
    assert "copy_hidden_pct" in again.stdout and "check_step over NCCL" in again.stdout

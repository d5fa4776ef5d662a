"""The README's main command, end to end: ``tokentape demo`` tells the whole story."""

from __future__ import annotations

import pytest

from tokentape._src.program import main


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_demo_runs_and_every_check_holds(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--workers", "2"]) == 0
    out = capsys.readouterr().out
    for n in range(1, 15):
        assert f"== {n}. " in out
    assert "identical: yes" in out
    assert out.count("[ok]") == 4 and "FAILED" not in out
    assert "it is the planted log dump: yes" in out
    assert "tokens hash matches what the loader logged" in out
    assert "refused: refusing to resume" in out and "source 'prose': content_hash" in out
    # the excision: named by id, left out from the checkpoint before the spike, the resume
    # accepted, no later step holds it, the earlier steps replay as logged
    assert "$ tokentape locate" in out and "--id logdump/healthd" in out
    assert "resume at step 50 on it: accepted" in out
    line = next(x for x in out.splitlines() if "replayed on the excised plan: no window" in x)
    assert line.endswith(": yes")
    assert "steps 0..49 replayed on it give the tokens hash the run logged: yes" in out
    assert "excised         from consumed 1,600 on: never trained after" in out
    # the annealing phase: appended at consumed and accepted, the past replays the same under
    # the newer plan, and the same phase moved before consumed is refused
    assert "resume at step 60 on it: accepted" in out
    assert "the tokens hash the loader logged: yes" in out
    assert "refused: refusing to resume at consumed 2,240: phase 2 starts at 960 < consumed" in out

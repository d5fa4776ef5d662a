"""The soak's tokenize campaign: SIGKILL ``tokentape tokenize --workers 2`` (the whole process
group: the pool workers too) at random moments, rerun it to completion, and compare the store,
every file, byte for byte with a reference store tokenized once without kills."""

from __future__ import annotations

import filecmp
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soak_procs import CLI, Child, child_env

# Driver points where a run can be made to SIGKILL itself (TOKENTAPE_CRASH_AT): the narrow
# windows — assembling shards, just before and just after the manifest — a timed kill rarely hits.
CRASH_POINTS = ("mid-assembly", "before-manifest", "after-manifest", "after-unit")
OPTIONS = ["--workers", "2", "--shard-mb", "0.25", "--unit-mb", "0.25", "--filter", "unique-lines"]


@dataclass
class TokenizeReport:
    kills: int = 0  # timed SIGKILLs of a running tokenize (process group)
    crash_point_kills: int = 0  # runs that SIGKILLed themselves at a named point
    kills_after_manifest: int = 0  # the killed run had already written manifest.json
    finished_before_kill: int = 0  # runs that completed before their kill time
    runs: int = 0
    reference_seconds: float = 0.0
    stores_compared: int = 0
    identical: int = 0
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def tree(root: Path) -> dict[str, Path]:
    """Every file and directory below ``root`` (hidden ones too), by relative path."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            found[str(p.relative_to(root)) + ("/" if name in dirnames else "")] = p
    return found


def differences(store: Path, reference: Path) -> list[str]:
    """How ``store`` differs from ``reference``: missing or extra paths, differing bytes."""
    a, b = tree(store), tree(reference)
    diffs = [f"extra {p}" for p in sorted(a.keys() - b.keys())]
    diffs += [f"missing {p}" for p in sorted(b.keys() - a.keys())]
    for p in sorted(a.keys() & b.keys()):
        if not p.endswith("/") and not filecmp.cmp(a[p], b[p], shallow=False):
            diffs.append(f"differs {p}")
    return diffs


def manifest_consistent(store: Path, reference: Path) -> list[str]:
    """A killed run that left a manifest: every file the reference has beside its manifest
    (shards, indexes, tokenizer, manifest) is there, with the reference's bytes — a reader
    opening the store at that moment sees the complete store."""
    diffs = []
    for p in sorted(x.name for x in reference.iterdir()):
        mine = store / p
        if not mine.is_file() or not filecmp.cmp(mine, reference / p, shallow=False):
            diffs.append(p)
    return diffs


def kill_delay(rng: random.Random, t: float) -> float:
    """A fifth during start-up, half anywhere in a run of ``t`` seconds, the rest near its end
    (assembling the shards, writing the manifest, removing the work directory)."""
    u = rng.random()
    if u < 0.2:
        return rng.uniform(0.0, 0.3)
    if u < 0.7:
        return rng.uniform(0.3, t)
    return rng.uniform(0.75 * t, 1.1 * t)


def run_campaign(
    root: Path, inputs: list[Path], kills: int, rng: random.Random, progress: Any
) -> TokenizeReport:
    rep = TokenizeReport()
    env = child_env()

    def tokenize(out: Path, log: Path, crash_at: str | None = None) -> Child:
        rep.runs += 1
        cmd = [sys.executable, "-c", CLI, "tokenize", *map(str, inputs), "--out", str(out)]
        extra = {"TOKENTAPE_CRASH_AT": crash_at} if crash_at else {}
        return Child([*cmd, *OPTIONS, "--json"], log, child_env(**extra) if extra else env)

    reference = root / "reference" / "store"
    reference.parent.mkdir(parents=True)
    t0 = time.monotonic()
    child = tokenize(reference, root / "reference.out")
    result = child.run(kill_after=None)
    rep.reference_seconds = round(time.monotonic() - t0, 2)
    if result.killed or result.returncode != 0:
        rep.problems.append(f"the reference run exited {result.returncode}: {child.tail()}")
        return rep
    progress(f"tokenize: reference store in {rep.reference_seconds} s")
    crash_quota = max(1, kills // 5)  # besides the timed kills: a fifth as many at crash points
    cycle = 0
    started = time.monotonic()
    while rep.kills < kills or rep.crash_point_kills < crash_quota:
        cycle += 1
        if cycle > 10 * (kills + crash_quota) + 20:  # runs always finish first, or hooks gone
            rep.problems.append(
                f"after {cycle - 1} cycles only {rep.kills} timed and {rep.crash_point_kills} "
                "crash-point kills landed"
            )
            return rep
        out = root / f"cycle-{cycle}" / "store"
        out.parent.mkdir()
        for attempt in range(rng.randint(1, 3)):
            timed = rep.kills < kills and (
                rep.crash_point_kills >= crash_quota or rng.random() < 0.8
            )
            point = None if timed else rng.choice(CRASH_POINTS)
            child = tokenize(out, out.parent / "run.out", point)
            t = rep.reference_seconds * (0.6 if attempt else 1.0)  # a resumed run is shorter
            result = child.run(kill_after=kill_delay(rng, t) if timed else 60)
            if result.strays:
                rep.problems.append(f"cycle {cycle}: {result.strays} processes survived the kill")
            if timed and not result.killed:
                rep.finished_before_kill += 1
                if result.returncode != 0:
                    rep.problems.append(
                        f"cycle {cycle}: exited {result.returncode}: {child.tail()}"
                    )
                break
            if not timed and result.killed:
                rep.problems.append(f"cycle {cycle}: a run hung (TOKENTAPE_CRASH_AT={point})")
                break
            if not timed and result.returncode == 0:
                break  # the point was not reached (nothing left to do there): complete
            # Killed: by us, at a crash point (-9), or a pool worker at "after-unit" (the
            # driver then exits 2, saying to rerun).
            rep.kills += timed
            rep.crash_point_kills += not timed
            if (out / "manifest.json").exists():
                rep.kills_after_manifest += 1
                bad = manifest_consistent(out, reference)
                if bad:
                    rep.problems.append(f"cycle {cycle}: manifest present but {bad[:3]} not final")
        child = tokenize(out, out.parent / "final.out")
        result = child.run(kill_after=600)
        if result.killed or result.returncode != 0:
            rep.problems.append(
                f"cycle {cycle}: the rerun {'timed out' if result.killed else 'failed'} "
                f"({result.returncode}): {child.tail()}"
            )
        else:
            rep.stores_compared += 1
            diffs = differences(out, reference)
            rep.identical += not diffs
            if diffs:
                rep.problems.append(
                    f"cycle {cycle}: store differs: {diffs[:5]}; the rerun said {child.tail()}"
                )
        shutil.rmtree(out.parent, ignore_errors=True)
        if len(rep.problems) > 10:
            return rep
        if cycle % 10 == 0:
            progress(
                f"tokenize: {rep.kills}/{kills} kills (+{rep.crash_point_kills} at crash points), "
                f"{rep.identical}/{rep.stores_compared} stores identical, "
                f"{time.monotonic() - started:.0f} s"
            )
    return rep

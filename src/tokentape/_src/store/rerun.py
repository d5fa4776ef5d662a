"""What differs between a finished store and a tokenize job asked to write over it.

A job is identified by the hash of its settings and inputs (``tokenize.job.job_identity``); the
manifest records most of them. A rerun that differs is refused (without ``--overwrite``), and
the refusal names what differs, by the command-line flag that sets it: ``--filter: [] ->
["unique-lines"]``, an input added, removed or grown.
"""

from __future__ import annotations

import json
from typing import Any

from tokentape._src.store.format import Manifest

SHOWN = 3
"""Input files named in a refusal; the rest are counted."""


def _short(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _inputs(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    before = {f.get("path"): f for f in old if isinstance(f, dict)}
    after = {f.get("path"): f for f in new}
    notes = [f"+{path}" for path in after if path not in before]
    notes += [f"-{path}" for path in before if path not in after]
    for path, f in after.items():
        was = before.get(path)
        if was is None:
            continue
        if was.get("size") != f.get("size"):
            notes.append(f"{path} {was.get('size')} -> {f.get('size')} bytes")
        elif was.get("id_key") != f.get("id_key"):
            notes.append(f"{path} --id-key {was.get('id_key')} -> {f.get('id_key')}")
    if not notes and list(before) != list(after):
        notes.append("the same files in another order")
    more = f" and {len(notes) - SHOWN} more" if len(notes) > SHOWN else ""
    return [f"INPUT: {', '.join(str(n) for n in notes[:SHOWN])}{more}"] if notes else []


def differences(manifest: Manifest, identity: dict[str, Any], tokenizer: str) -> list[str]:
    """What the job ``identity`` (tokenizer spec ``tokenizer``) changes against the store of
    ``manifest``, each as ``FLAG: old -> new``."""
    out = []
    recorded = manifest.tokenizer if isinstance(manifest.tokenizer, dict) else {}
    if recorded.get("fingerprint") != identity.get("tokenizer"):
        out.append(f"--tokenizer: {recorded.get('spec')} -> {tokenizer}")
    inputs = manifest.inputs if isinstance(manifest.inputs, dict) else {}
    filters = manifest.filters.get("config") if isinstance(manifest.filters, dict) else None
    for flag, old, new in (
        ("--filter", filters, identity.get("filters")),
        ("--dtype", manifest.dtype, identity.get("dtype")),
        ("--text-key", inputs.get("text_key"), identity.get("text_key")),
        ("--unit-mb", inputs.get("unit_bytes"), identity.get("unit_bytes")),
        ("--bos", manifest.bos_id, identity.get("bos_id")),
    ):
        if old != new:
            out.append(f"{flag}: {_short(old)} -> {_short(new)}")
    files = inputs.get("files")
    out += _inputs(files if isinstance(files, list) else [], identity.get("inputs", []))
    return out


def other_job(where: str, manifest: Manifest, identity: dict[str, Any], tokenizer: str) -> str:
    """The refusal of a rerun with other settings or inputs over ``manifest``'s store."""
    changed = differences(manifest, identity, tokenizer)
    what = "; ".join(changed) if changed else "another --shard-mb or store format"
    return (
        f"{where}: holds a store made from other inputs or settings ({what}); pass "
        "--overwrite to replace it"
    )

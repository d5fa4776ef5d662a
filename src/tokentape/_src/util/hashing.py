"""A content hash of JSON-ready data that does not depend on key order or spacing."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_hash(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


__all__ = ["canonical_hash"]

"""tokentape: a deterministic, replayable data pipeline for LLM pretraining.

Token stores (``tokenize``, ``open_source``) -> a mixture plan (``Plan.build``, ``load_plan``)
-> its tape -> the training loader (``Loader``, ``BatchConfig``, ``DataState``) -> audits of a
run (``replay``, ``locate``, ``find_documents``, ``verify``) and its remedy (``excise``).
``tokentape.torch`` gives torch tensors, a sampler and a dataset; ``tokentape.megatron`` reads
and converts Megatron-LM data. Everything else (``tokentape._src``) is internal and may change.
"""

import importlib
from typing import TYPE_CHECKING, Any

from tokentape.errors import (
    ArgumentError,
    ArgumentTypeError,
    CacheLocked,
    IndexOutOfRange,
    InputError,
    ObjectStorageError,
    OutOfRangeError,
    OutputError,
    OutputLocked,
    PlanError,
    ResumeRefused,
    StoreChanged,
    StoreError,
    TokentapeError,
    WriteFailed,
)

if TYPE_CHECKING:
    from tokentape._src.api import (
        excise,
        find_documents,
        locate,
        replay,
        report,
        tokenize,
        verify,
    )
    from tokentape._src.megatron.source import MegatronSource
    from tokentape._src.objects.ranged import FetchConfig
    from tokentape._src.plan.load import load_plan
    from tokentape._src.plan.open import open_source
    from tokentape._src.plan.plan import Plan
    from tokentape._src.store.origins import Origin
    from tokentape._src.store.reader import Source
    from tokentape._src.tokenize.driver import TokenizeSummary
    from tokentape._src.train.batch import Batch, DocOrigin
    from tokentape._src.train.loader import Loader, Step
    from tokentape._src.train.partition import BatchConfig
    from tokentape._src.train.state import DataState
    from tokentape._src.util.version import __version__

_LAZY = {
    "MegatronSource": "tokentape._src.megatron.source",
    "load_plan": "tokentape._src.plan.load",
    "open_source": "tokentape._src.plan.open",
    "Plan": "tokentape._src.plan.plan",
    "Origin": "tokentape._src.store.origins",
    "Source": "tokentape._src.store.reader",
    "FetchConfig": "tokentape._src.objects.ranged",
    "Batch": "tokentape._src.train.batch",
    "DocOrigin": "tokentape._src.train.batch",
    "Loader": "tokentape._src.train.loader",
    "Step": "tokentape._src.train.loader",
    "BatchConfig": "tokentape._src.train.partition",
    "DataState": "tokentape._src.train.state",
    "tokenize": "tokentape._src.api",
    "replay": "tokentape._src.api",
    "locate": "tokentape._src.api",
    "find_documents": "tokentape._src.api",
    "excise": "tokentape._src.api",
    "report": "tokentape._src.api",
    "verify": "tokentape._src.api",
    "TokenizeSummary": "tokentape._src.tokenize.driver",
    "__version__": "tokentape._src.util.version",
}
"""Where each public name lives: loaded on first use. A training process loads the loader and
the plan, never the tokenizer's input readers (pyarrow, zstandard) or the audits; a tokenizing
helper process (which imports this package first) loads none of the training side."""


def __getattr__(name: str) -> Any:
    """Load a public name (``_LAZY``) on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'tokentape' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "Batch",
    "BatchConfig",
    "CacheLocked",
    "DataState",
    "DocOrigin",
    "FetchConfig",
    "IndexOutOfRange",
    "InputError",
    "Loader",
    "MegatronSource",
    "ObjectStorageError",
    "Origin",
    "OutOfRangeError",
    "OutputError",
    "OutputLocked",
    "Plan",
    "PlanError",
    "ResumeRefused",
    "Source",
    "Step",
    "StoreChanged",
    "StoreError",
    "TokenizeSummary",
    "TokentapeError",
    "WriteFailed",
    "__version__",
    "excise",
    "find_documents",
    "load_plan",
    "locate",
    "open_source",
    "replay",
    "report",
    "tokenize",
    "verify",
]

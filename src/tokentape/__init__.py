"""tokentape: a deterministic, replayable data pipeline for LLM pretraining."""

from tokentape._src.megatron.source import MegatronSource
from tokentape._src.plan.open import open_store
from tokentape._src.store.reader import Source, open_source
from tokentape._src.util.version import __version__
from tokentape.errors import TokentapeError

__all__ = [
    "MegatronSource",
    "Source",
    "TokentapeError",
    "__version__",
    "open_source",
    "open_store",
]

"""tokentape: a deterministic, replayable data pipeline for LLM pretraining."""

__version__ = "0.1.0"

from tokentape.errors import TokentapeError
from tokentape.store.megatron_source import MegatronSource
from tokentape.store.open import open_store
from tokentape.store.reader import Source, open_source

__all__ = [
    "MegatronSource",
    "Source",
    "TokentapeError",
    "__version__",
    "open_source",
    "open_store",
]

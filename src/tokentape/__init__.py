"""tokentape: a deterministic, replayable data pipeline for LLM pretraining."""

__version__ = "0.1.0"

from tokentape.errors import TokentapeError
from tokentape.store.reader import Source, open_source

__all__ = ["Source", "TokentapeError", "__version__", "open_source"]

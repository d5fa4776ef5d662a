"""tokentape: a deterministic, replayable data pipeline for LLM pretraining."""

from tokentape.errors import TokentapeError

__version__ = "0.1.0"

__all__ = ["TokentapeError", "__version__"]

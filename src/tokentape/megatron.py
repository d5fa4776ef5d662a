"""Megatron-LM indexed datasets (a ``PREFIX.bin`` and ``PREFIX.idx`` pair) as tokentape sources.

A plan may name a Megatron prefix as a source (``format = "megatron"``); ``MegatronSource``
reads one directly, and ``to_megatron`` / ``from_megatron`` convert a tokentape store to a
prefix and back, byte-exact.
"""

from tokentape._src.megatron.convert import ConvertSummary, FromMegatron, from_megatron, to_megatron
from tokentape._src.megatron.format import MegatronWriter
from tokentape._src.megatron.source import MegatronSource

__all__ = [
    "ConvertSummary",
    "FromMegatron",
    "MegatronSource",
    "MegatronWriter",
    "from_megatron",
    "to_megatron",
]

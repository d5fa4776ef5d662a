"""The tape: pure index math from a global position to (source, sample)."""

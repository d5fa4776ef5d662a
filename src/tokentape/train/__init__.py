"""Training runtime: which positions each rank reads, and (to come) the loader and its state."""

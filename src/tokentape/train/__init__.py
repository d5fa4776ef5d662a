"""Training runtime: the data-parallel partition, the loader and its checkpoint state, the step
log, and checks of ranks in real process groups."""

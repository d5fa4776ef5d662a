# megatron-core's blending rule, compiled (_cgreedy.c): see its header comment.
ABI: int

def blend(weights: bytes, size: int, which: object, nth: object) -> None: ...

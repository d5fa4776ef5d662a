# The compiled walk (_cwalk.c): see its header comment.
ABI: int

def walk(
    values: object,
    group: object | None,
    keys: object,
    halves: object,
    bounds: object,
    rounds: int,
    forward: bool,
) -> None: ...
def split(
    positions: object,
    table: object,
    rank: object,
    weights: object,
    n: object,
    source: object,
    epoch: object,
    offset: object,
    first: object,
    last: object,
) -> None: ...

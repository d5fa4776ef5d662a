"""A keyed bijection on [0, n): the per-pass shuffle of one source's samples.

A balanced Feistel network permutes ``[0, 4**h)`` for the smallest ``h >= 1`` with
``4**h >= n``; cycle walking (apply it again until the value lands below ``n``) restricts it to
a bijection of ``[0, n)`` for every ``n``. The domain is under ``4 * n``, so a value walks fewer
than four times on average. The inverse runs the rounds backwards and walks the same way: going
back along the cycle, the first value below ``n`` is the one that started the forward walk.

Round keys come from BLAKE2b over a length-prefixed encoding of (``ALGORITHM``, seed, source
name, epoch), so distinct tuples never share an encoding. The round function is a finaliser of
``half + key`` without its last xor-shift, of which the top ``h`` bits are kept: for halves of
up to 16 bits (n <= 2**32) on 32-bit words with murmur3's fmix32 constants and the low 32 bits
of each key, above that on 64-bit words with splitmix64's. Everything is explicit ``np.uint32``
/ ``np.uint64`` (wrapping), so results are identical on every machine. Changing anything here
changes every tape: bump ``ALGORITHM`` (and the tape's algorithm version) if you do.

Known limits, harmless for shuffling: over all keys, the permutations of a tiny domain (n <= 4)
are within about 0.005 total variation of uniform after 8 rounds, and when n = 4**h (h >= 2) only
even permutations occur, as with any Feistel network.

The walk runs in a small compiled kernel (``_cwalk.c``) where the install could build it,
else in numpy; both compute the same arithmetic and give identical results (``kernel()``
says which one runs; the tests compare them).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from types import ModuleType
from typing import cast, overload

import numpy as np

from tokentape.errors import ArgumentError, ArgumentTypeError, IndexOutOfRange

KERNEL_ABI = 2
"""The compiled module's interface version this code calls (``ABI`` in ``_cwalk.c``)."""

try:
    from tokentape._src.tape import _cwalk
except ImportError:  # not built in this install: the numpy path, identical results
    _cwalk = None  # type: ignore[assignment]
    KERNEL_NOTE = "the C loop is not built in this install"
else:
    KERNEL_NOTE = ""
    if getattr(_cwalk, "ABI", None) != KERNEL_ABI:  # a build older than this code
        _cwalk = None  # type: ignore[assignment]
        KERNEL_NOTE = "the C loop was built for another version: reinstall (pip install -e .)"
        logging.getLogger(__name__).warning("tokentape: %s; using numpy", KERNEL_NOTE)

_kernel: ModuleType | None = _cwalk
"""The compiled walk, or None for the numpy path (benchmarks and tests set it to compare)."""


def kernel() -> str:
    """Which walk runs: ``"compiled"`` (the C kernel) or ``"numpy"`` (``KERNEL_NOTE`` says
    why)."""
    return "compiled" if _kernel is not None else "numpy"


ALGORITHM = "tokentape-perm-v1"
"""Domain-separation tag hashed into the keys; part of the tape's algorithm version."""

ROUNDS = 8
"""Feistel rounds (Luby-Rackoff needs 4; the extra rounds buy margin for a non-ideal F)."""

MAX_N = 2**63
"""Largest supported domain: every permuted value fits an int64."""

NARROW_HALF_BITS = 16
"""Up to this half width (n <= 2**32) the network runs on 32-bit words, twice as fast."""

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class _Word:
    """The word the network runs on, and its round function's constants."""

    dtype: type[np.unsignedinteger]
    bits: int
    c1: np.unsignedinteger
    c2: np.unsignedinteger
    s1: np.unsignedinteger
    s2: np.unsignedinteger


# 64-bit: the splitmix64 finaliser's constants; 32-bit: murmur3's fmix32 constants.
_WIDE = _Word(
    np.uint64, 64, np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB),
    np.uint64(30), np.uint64(27),
)  # fmt: skip
_NARROW = _Word(
    np.uint32, 32, np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35), np.uint32(16), np.uint32(13)
)
_BLOCK = 1 << 15  # elements per block: a round's working arrays stay in the L2 cache
SCALAR_MAX = 4  # up to this many values, the network runs in Python integers (no numpy calls)


def half_bits_for(n: int) -> int:
    """The smallest ``h >= 1`` with ``4**h >= n``: the Feistel domain is ``2 * h`` bits."""
    return max(1, ((n - 1).bit_length() + 1) // 2)


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def round_keys(seed: int, name: str, epoch: int, rounds: int = ROUNDS) -> tuple[int, ...]:
    """The 64-bit round keys for (seed, source name, epoch), from BLAKE2b."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ArgumentTypeError(f"permutation: seed must be an int, got {seed!r}")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ArgumentError(f"permutation: epoch must be an int >= 0, got {epoch!r}")
    if not isinstance(name, str):
        raise ArgumentTypeError(f"permutation: name must be a str, got {name!r}")
    message = b"".join(
        _field(part)
        for part in (
            ALGORITHM.encode("ascii"),
            str(seed).encode("ascii"),
            name.encode("utf-8"),
            str(epoch).encode("ascii"),
        )
    )
    digest = hashlib.blake2b(message, digest_size=8 * rounds).digest()
    return tuple(int.from_bytes(digest[8 * i : 8 * i + 8], "little") for i in range(rounds))


def _round(
    half: np.ndarray, key: np.unsignedinteger | np.ndarray, word: _Word,
    out_shift: np.unsignedinteger | np.ndarray, z: np.ndarray, tmp: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """F(half, key) into ``z``: a well-mixed ``h``-bit value (``tmp`` is scratch).

    (half + key) mod 2**bits, then xor-shift, multiply, xor-shift, multiply (a
    splitmix64 / fmix32 finaliser without its last xor-shift, which barely touches the top
    bits), keeping the top ``h`` bits.
    """
    np.add(half, key, out=z)
    np.right_shift(z, word.s1, out=tmp)
    z ^= tmp
    z *= word.c1
    np.right_shift(z, word.s2, out=tmp)
    z ^= tmp
    z *= word.c2
    z >>= out_shift
    return z


def _feistel(
    v: np.ndarray, keys: Sequence[np.unsignedinteger | np.ndarray], h: int | np.ndarray,
    word: _Word, forward: bool,
) -> np.ndarray:  # fmt: skip
    """One pass of the network (or its inverse) over ``[0, 4**h)``; ``v`` has ``word.dtype``.
    A key is one word for every value, or an array of per-value words; ``h`` is one half width
    for every value, or an array of per-value widths (values of several domains at once)."""
    shift: np.unsignedinteger | np.ndarray
    low: np.unsignedinteger | np.ndarray
    out_shift: np.unsignedinteger | np.ndarray
    if isinstance(h, np.ndarray):
        shift = h
        low = (word.dtype(1) << h) - word.dtype(1)
        out_shift = word.dtype(word.bits) - h
    else:
        shift, low = word.dtype(h), word.dtype((1 << h) - 1)
        out_shift = word.dtype(word.bits - h)
    left: np.ndarray = v >> shift
    right = v & low
    spare = np.empty_like(v)
    tmp = np.empty_like(v)
    if forward:  # (L, R) -> (R, L ^ F(R))
        for key in keys:
            f = _round(right, key, word, out_shift, spare, tmp)
            f ^= left
            left, right, spare = right, f, left
    else:  # (L, R) -> (R ^ F(L), L)
        for key in reversed(keys):
            f = _round(left, key, word, out_shift, spare, tmp)
            f ^= right
            left, right, spare = f, left, right
    left <<= shift
    left |= right
    return left


@dataclass(frozen=True)
class Permutation:
    """A bijection of ``[0, n)``; call it on ints or integer arrays, ``inverse`` undoes it."""

    n: int
    keys: tuple[int, ...]
    half_bits: int

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise ArgumentError(f"permutation: n must be an int in [1, 2**63], got {self.n!r}")
        if len(self.keys) < 4 or not all(
            isinstance(k, int) and 0 <= k <= _MASK64 for k in self.keys
        ):
            raise ArgumentError("permutation: keys must be at least 4 ints in [0, 2**64)")
        if self.half_bits != half_bits_for(self.n):
            raise ArgumentError(
                f"permutation: half_bits must be {half_bits_for(self.n)} for n={self.n}"
            )

    @classmethod
    def for_epoch(cls, n: int, seed: int, name: str, epoch: int) -> Permutation:
        """The shuffle of pass ``epoch`` over source ``name``'s ``n`` samples under ``seed``."""
        half = half_bits_for(n) if type(n) is int else 1  # a bad n: __post_init__ names it
        return cls(n, round_keys(seed, name, epoch), half)

    @overload
    def __call__(self, x: int | np.integer) -> int: ...
    @overload
    def __call__(self, x: np.ndarray) -> np.ndarray: ...
    def __call__(self, x: np.ndarray | int | np.integer) -> np.ndarray | int:
        """Index -> permuted index (int in, int out; array in, int64 array of its shape out)."""
        return self._apply(x, forward=True)

    @overload
    def inverse(self, y: int | np.integer) -> int: ...
    @overload
    def inverse(self, y: np.ndarray) -> np.ndarray: ...
    def inverse(self, y: np.ndarray | int | np.integer) -> np.ndarray | int:
        """Permuted index -> index: ``inverse(self(x)) == x``."""
        return self._apply(y, forward=False)

    def _apply(self, x: np.ndarray | int | np.integer, forward: bool) -> np.ndarray | int:
        if isinstance(x, bool | np.bool_):
            raise ArgumentTypeError("permutation: indices must be integers, not booleans")
        if isinstance(x, int | np.integer):
            value = int(x)
            if not 0 <= value < self.n:
                raise IndexOutOfRange(f"permutation: index {value} is outside [0, {self.n})")
            return int(self._walk(np.array([value], dtype=self._word.dtype), forward)[0])
        a = np.asarray(x)
        if a.size == 0:
            return np.zeros(a.shape, dtype=np.int64)
        if a.dtype.kind not in "iu":
            raise ArgumentTypeError(
                f"permutation: indices must be an integer array, got dtype {a.dtype}"
            )
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi >= self.n:
            raise IndexOutOfRange(
                f"permutation: indices must be in [0, {self.n}), got [{lo}, {hi}]"
            )
        if _kernel is not None and a.size > SCALAR_MAX:
            out = a.astype(np.int64).reshape(-1)  # a copy, walked in place
            _kernel.walk(out, None, *self._kernel_tables, len(self.keys), forward)
            return out.reshape(a.shape)
        v = a.astype(self._word.dtype).reshape(-1)
        return self._walk(v, forward).astype(np.int64).reshape(a.shape)

    @cached_property
    def _kernel_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The compiled walk's (keys, half widths, bounds) for this one domain."""
        return _tables([self])

    @property
    def _word(self) -> _Word:
        return _NARROW if self.half_bits <= NARROW_HALF_BITS else _WIDE

    def _walk(self, v: np.ndarray, forward: bool) -> np.ndarray:
        """Cycle walking: re-apply the network to the values still outside [0, n).

        The first pass runs block by block (cache-sized); the values that left [0, n) are then
        walked together, so the geometric tail costs a few large calls, not many tiny ones.
        A handful of values go through the same network in Python integers instead: numpy's
        per-call overhead would cost more than the arithmetic.
        """
        word = self._word
        if v.size <= SCALAR_MAX:
            return np.array([self._walk_int(int(x), forward) for x in v], dtype=word.dtype)
        keys = self._word_keys()
        out = self._blocks(v, keys, word, forward)
        if self.n >= 1 << (2 * self.half_bits):  # the domain is [0, n): nothing to walk
            return out
        n = word.dtype(self.n)
        todo = np.flatnonzero(out >= n)
        while todo.size:
            walked = self._blocks(out[todo], keys, word, forward)
            out[todo] = walked
            todo = todo[walked >= n]
        return out

    def _word_keys(self) -> tuple[np.unsignedinteger, ...]:
        """The round keys cut to the network's word."""
        word = self._word
        return tuple(word.dtype(k & ((1 << word.bits) - 1)) for k in self.keys)

    def _walk_int(self, x: int, forward: bool) -> int:
        """``_walk`` of one value, in Python integers (the same network, bit for bit)."""
        word, h = self._word, self.half_bits
        mask, low = (1 << word.bits) - 1, (1 << h) - 1
        c1, c2, s1, s2 = int(word.c1), int(word.c2), int(word.s1), int(word.s2)
        out_shift = word.bits - h
        keys = [k & mask for k in self.keys]

        def f(half: int, key: int) -> int:
            z = (half + key) & mask
            z = ((z ^ (z >> s1)) * c1) & mask
            z = ((z ^ (z >> s2)) * c2) & mask
            return z >> out_shift

        while True:
            left, right = x >> h, x & low
            if forward:
                for key in keys:
                    left, right = right, left ^ f(right, key)
            else:
                for key in reversed(keys):
                    left, right = right ^ f(left, key), left
            x = (left << h) | right
            if x < self.n:
                return x

    def _blocks(
        self, v: np.ndarray, keys: tuple[np.unsignedinteger, ...], word: _Word, forward: bool
    ) -> np.ndarray:
        h = self.half_bits
        if v.size <= _BLOCK:
            return _feistel(v, keys, h, word, forward)
        out = np.empty_like(v)
        for start in range(0, v.size, _BLOCK):
            block = v[start : start + _BLOCK]
            out[start : start + _BLOCK] = _feistel(block, keys, h, word, forward)
        return out


DENSE_SPAN = 1 << 20
"""``unique_inverse`` counts instead of sorting when the values span fewer than this."""


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for integers (flattened): by counting when
    they span a small range (pass numbers, domain indices), in linear time, else by sorting."""
    values = np.asarray(values).reshape(-1)
    if not values.size:
        return values[:0].astype(np.int64), np.zeros(0, dtype=np.intp)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo >= DENSE_SPAN:
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(-1)
    shifted = (values - lo).astype(np.intp, copy=False)
    present = np.bincount(shifted, minlength=hi - lo + 1) > 0
    rank = np.cumsum(present, dtype=np.intp) - 1
    return np.flatnonzero(present) + lo, rank[shifted]


@lru_cache(maxsize=4096)
def cached_permutation(n: int, seed: int, name: str, epoch: int) -> Permutation:
    """``Permutation.for_epoch``, its round keys derived once per (n, seed, name, epoch)."""
    return Permutation.for_epoch(n, seed, name, epoch)


SCALAR_TAIL = 8
"""When this few values are left to cycle-walk, they finish in Python integers."""

SCALAR_BATCH = 32
"""Up to this many values, a walk runs in Python integers from the start (about 3 µs a value
and pass, where numpy's dozens of calls per pass cost more)."""

MERGE_BELOW = 2048
"""A domain with fewer values than this shares one walk with the other small ones (per-value
keys: fewer numpy calls); one with more walks alone (scalar keys, in cache-sized blocks)."""


def permute_many(
    seed: int,
    domains: Sequence[tuple[int, str, int]],
    group: np.ndarray,
    x: np.ndarray,
    forward: bool = True,
) -> np.ndarray:
    """``x[i]`` through the permutation of ``domains[group[i]]`` (or its inverse), every
    domain an (n, source name, epoch) under ``seed``: for all ``i`` in one vectorised walk, each
    value with its own domain's round keys and width. Equal to calling
    ``Permutation.for_epoch(n, seed, name, epoch)`` per domain: one call of the compiled
    walk, or on the numpy path a few numpy calls per round for all the domains together
    instead of per domain (what a small batch pays)."""
    x = np.asarray(x, dtype=np.int64).reshape(-1)
    group = np.asarray(group, dtype=np.intp).reshape(-1)
    out = np.empty_like(x)
    if x.size == 0:
        return out
    if _kernel is not None and domains:
        perms = [cached_permutation(n, seed, name, e) for n, name, e in domains]
        out[:] = x
        try:  # the kernel checks every value and domain index itself
            _kernel.walk(out, np.ascontiguousarray(group, dtype=np.int64), *_tables(perms),
                         len(perms[0].keys), forward)  # fmt: skip
        except ValueError:
            _check_indices(domains, group, x)  # names the bad index
            raise
        return out
    _check_indices(domains, group, x)
    halves = [half_bits_for(n) for n, _, _ in domains]
    counts = np.bincount(group, minlength=len(domains))
    large = counts >= MERGE_BELOW
    rest: list[np.ndarray] = [np.flatnonzero(~large[group])] if not large.all() else []
    for g in np.flatnonzero(large).tolist():  # many values: a first pass on their own
        n, name, e = domains[g]
        perm = cached_permutation(n, seed, name, e)
        word = perm._word
        rows = np.flatnonzero(group == g)
        once = perm._blocks(x[rows].astype(word.dtype), perm._word_keys(), word, forward)
        out[rows] = once
        if n < 1 << (2 * halves[g]):  # the values that left [0, n) walk on with the rest
            rest.append(rows[once >= word.dtype(n)])
    rows = np.concatenate(rest) if len(rest) > 1 else (rest[0] if rest else group[:0])
    if not rows.size:
        return out
    values = np.where(large[group[rows]], out[rows], x[rows])
    # The rest share walks: all of them in one (per-value widths) when they are few, else one
    # walk per width (a width for every value: fewer memory streams per numpy call).
    few = rows.size < MERGE_BELOW
    kinds = [(h <= NARROW_HALF_BITS, 0 if few else h) for h in halves]
    kind_ids = {k: i for i, k in enumerate(sorted(set(kinds)))}
    kind_of = np.array([kind_ids[k] for k in kinds])[group[rows]]
    for kind, i in kind_ids.items():
        picked = np.flatnonzero(kind_of == i) if len(kind_ids) > 1 else None
        if picked is not None and not picked.size:
            continue
        at = rows if picked is None else rows[picked]
        word = _NARROW if kind[0] else _WIDE
        sub_values = values if picked is None else values[picked]
        out[at] = _walk_many(seed, domains, halves, word, group[at], sub_values, forward)
    return out


def _check_indices(
    domains: Sequence[tuple[int, str, int]], group: np.ndarray, x: np.ndarray
) -> None:
    """Refuse an index outside its domain (or a domain index outside ``domains``)."""
    if group.size and (int(group.min()) < 0 or int(group.max()) >= len(domains)):
        raise ArgumentError(f"permutation: domain indices must be in [0, {len(domains)})")
    top = np.array([n - 1 for n, _, _ in domains], dtype=np.int64)  # n itself may be 2**63
    if int(x.min()) < 0 or bool(np.any(x > top[group])):
        bad = int(np.flatnonzero((x < 0) | (x > top[group]))[0])
        raise IndexOutOfRange(
            f"permutation: index {int(x[bad])} is outside [0, {int(top[group[bad]]) + 1})"
        )


def _tables(perms: Sequence[Permutation]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The compiled walk's tables for domains ``perms``: round keys (domains x rounds, all
    with the same number of rounds), half widths and bounds."""
    keys = np.array([p.keys for p in perms], dtype=np.uint64).reshape(-1)
    halves = np.array([p.half_bits for p in perms], dtype=np.int64)
    bounds = np.array([p.n for p in perms], dtype=np.uint64)
    return keys, halves, bounds


def _walk_many(
    seed: int,
    domains: Sequence[tuple[int, str, int]],
    halves: Sequence[int],
    word: _Word,
    group: np.ndarray,
    x: np.ndarray,
    forward: bool,
) -> np.ndarray:
    """``permute_many`` of values whose domains all run on ``word``."""
    if x.size <= SCALAR_BATCH:  # a handful: Python integers beat numpy's per-call cost
        each = [domains[g] for g in group.tolist()]
        return np.array(_walk_ints(seed, each, x.tolist(), forward), dtype=np.int64)
    mask = (1 << word.bits) - 1
    present, local = unique_inverse(group)  # the domains met, renumbered
    mine = [domains[g] for g in present.tolist()]
    widths = [halves[g] for g in present.tolist()]
    # A domain of exactly 4**h values needs no walk (and n = 2**32 does not fit the word).
    full = [n >= 1 << (2 * hb) for (n, _, _), hb in zip(mine, widths, strict=True)]
    one = len(mine) == 1
    h: int | np.ndarray = widths[0]
    bound: np.unsignedinteger | np.ndarray = word.dtype(min(mine[0][0], mask))
    if one:  # a single domain: scalar keys
        n0, name0, e0 = mine[0]
        keys: list[np.unsignedinteger | np.ndarray] = list(
            cached_permutation(n0, seed, name0, e0)._word_keys()
        )
    else:
        table = np.array(
            [[k & mask for k in cached_permutation(n, seed, name, e).keys] for n, name, e in mine],
            dtype=word.dtype,
        )
        if local.size > _BLOCK // 8:  # one contiguous array per round: unit-stride reads
            keys = [np.ascontiguousarray(column)[local] for column in table.T]
        else:  # few values: one gather, a view per round (fewer numpy calls)
            keys = list(table[local].T)
        if len(set(widths)) > 1:
            h = np.array(widths, dtype=word.dtype)[local]
        if len({n for n, _, _ in mine}) > 1:
            bound = np.array([min(n, mask) for n, _, _ in mine], dtype=word.dtype)[local]
    out = _feistel(x.astype(word.dtype), keys, h, word, forward)
    todo = np.flatnonzero(out >= bound)
    if any(full):
        todo = todo[~np.array(full)[local[todo]]]
    while todo.size > SCALAR_TAIL:  # cycle walking, each value with its own domain
        walked = _feistel(
            out[todo],
            # several domains: every key is an array of per-value words (see above)
            keys if one else [cast(np.ndarray, k)[todo] for k in keys],
            h[todo] if isinstance(h, np.ndarray) else h,
            word,
            forward,
        )
        out[todo] = walked
        todo = todo[walked >= (bound[todo] if isinstance(bound, np.ndarray) else bound)]
    if todo.size:  # the last few: numpy's per-call cost would exceed the work
        last = [mine[g] for g in local[todo].tolist()]
        out[todo] = _walk_ints(seed, last, out[todo].tolist(), forward)
    return out.astype(np.int64)


def _walk_ints(
    seed: int, domains: Sequence[tuple[int, str, int]], values: list[int], forward: bool
) -> list[int]:
    """``values[i]`` walked through the permutation of ``domains[i]`` in Python integers."""
    return [
        cached_permutation(n, seed, name, e)._walk_int(v, forward)
        for (n, name, e), v in zip(domains, values, strict=True)
    ]


def permute_epochs(
    n: int, seed: int, name: str, epochs: np.ndarray, x: np.ndarray, forward: bool = True
) -> np.ndarray:
    """``x[i]`` through the permutation of pass ``epochs[i]`` (or its inverse), for all ``i`` in
    one vectorised walk (``permute_many`` over the passes present)."""
    x = np.asarray(x, dtype=np.int64)
    epochs = np.broadcast_to(np.asarray(epochs, dtype=np.int64), x.shape)
    if x.size == 0:
        return np.zeros(x.shape, dtype=np.int64)
    uniq, which = unique_inverse(epochs)
    domains = [(n, name, e) for e in uniq.tolist()]
    return permute_many(seed, domains, which.reshape(-1), x.reshape(-1), forward).reshape(x.shape)


@overload
def permute(n: int, seed: int, name: str, epoch: int, x: int | np.integer) -> int: ...
@overload
def permute(n: int, seed: int, name: str, epoch: int, x: np.ndarray) -> np.ndarray: ...
def permute(
    n: int, seed: int, name: str, epoch: int, x: np.ndarray | int | np.integer
) -> np.ndarray | int:
    """``Permutation.for_epoch(n, seed, name, epoch)(x)``."""
    return Permutation.for_epoch(n, seed, name, epoch)(x)


__all__ = [
    "KERNEL_NOTE",
    "MAX_N",
    "MERGE_BELOW",
    "ROUNDS",
    "SCALAR_MAX",
    "Permutation",
    "cached_permutation",
    "half_bits_for",
    "kernel",
    "permute",
    "permute_epochs",
    "permute_many",
    "round_keys",
    "unique_inverse",
]

"""Excision at the tape (tape.excise): a tape with base positions left out from C on.

Properties, each against a brute-force reading of the base tape (positions resolved one by
one and filtered in Python, never the closed forms under test): (a) every position below C
resolves as before; (c) from C on, the excised tape is the base sequence with the excised
positions removed, in order; (b) excising every draw of some samples leaves none of them from
C on; and the maps between base and excised positions invert each other. The positions are
stored in a plan as text; damaged or crafted text is refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokentape._src.tape.excise import (
    MAX_EXCISED,
    Excision,
    decode_positions,
    encode_positions,
    positions_sha256,
)
from tokentape._src.tape.resolve import Tape
from tokentape.errors import PlanError

SPAN = 600
"""Base positions a case looks at."""


@st.composite
def cases(draw):
    """(tape, C, excised base positions >= C): 1-3 sources of 1-40 samples, weights 1-5, in
    one or two phases; up to 40 positions excised below ``SPAN``."""
    n = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    weights = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    seed = draw(st.integers(0, 2**32))
    names = [f"s{d}" for d in range(n)]
    if draw(st.booleans()):
        tape = Tape.build(names, sizes, weights, seed)
    else:
        later = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
        later[0] += 1
        start = draw(st.integers(1, SPAN))
        tape = Tape.build_phased(names, sizes, [0, start], [weights, later], seed)
    c = draw(st.integers(0, SPAN))
    excised = draw(st.lists(st.integers(c, SPAN + 50), max_size=40, unique=True))
    return tape, c, np.array(sorted(excised), dtype=np.int64)


def _triples(tape: Tape, positions) -> list[tuple[int, int, int]]:
    """(source, epoch, sample) of each position, resolved one at a time."""
    out = []
    for p in positions:
        r = tape.resolve(np.array([p]))
        out.append((int(r.source[0]), int(r.epoch[0]), int(r.sample[0])))
    return out


def _as_triples(r) -> list[tuple[int, int, int]]:
    return list(zip(r.source.tolist(), r.epoch.tolist(), r.sample.tolist(), strict=True))


@given(cases())
def test_nothing_below_c_changes_and_the_rest_is_the_base_minus_the_excised(case):
    tape, c, excised = case
    cut = tape.with_excision(Excision(excised))
    # (a) below C, the same samples
    assert _as_triples(cut.resolve(np.arange(c))) == _as_triples(tape.resolve(np.arange(c)))
    # (c) from C on: the base positions not excised, in order (brute force)
    kept = [p for p in range(c, SPAN + 100) if p not in set(excised.tolist())]
    want = _triples(tape, kept[: SPAN // 2])
    assert _as_triples(cut.resolve(np.arange(c, c + len(want)))) == want
    assert _as_triples(cut.resolve_range(c, len(want))) == want
    scattered = np.arange(c, c + len(want))[::-3].copy()  # out of order, with gaps
    assert _as_triples(cut.resolve(scattered)) == [want[q - c] for q in scattered.tolist()]


@given(cases())
def test_base_and_excised_positions_map_to_each_other(case):
    _, _, excised = case
    x = Excision(excised)
    q = np.arange(SPAN)
    p = x.to_base(q)
    assert not np.isin(p, excised).any() and np.all(np.diff(p) > 0)
    back, kept = x.to_new(p)
    assert kept.all() and np.array_equal(back, q)
    _, kept = x.to_new(excised)
    assert not kept.any()
    for limit in (0, 1, SPAN // 2, SPAN):
        base = x.base_limit(limit)
        assert base - int(np.count_nonzero(excised < base)) == limit


@given(cases(), st.data())
def test_excising_every_draw_of_samples_leaves_none_of_them(case, data):
    """(b): the positions of some samples (every pass, below a limit), excised from C on:
    no position from C on below the limit draws one of them; position_of of the excised tape
    finds each kept draw where resolve puts it, and none for an excised one."""
    tape, c, _ = case
    d = data.draw(st.integers(0, len(tape.names) - 1))
    n = tape.n_samples[d]
    chosen = sorted(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True)))
    limit = SPAN
    base = _triples(tape, range(limit))
    hits = [p for p, t in enumerate(base) if t[0] == d and t[2] in chosen]
    excised = np.array([p for p in hits if p >= c], dtype=np.int64)
    cut = tape.with_excision(Excision(excised))
    new_limit = limit - excised.size
    after = _as_triples(cut.resolve(np.arange(c, new_limit)))
    assert not [t for t in after if t[0] == d and t[2] in chosen]
    for p in hits:
        epoch, sample = base[p][1], base[p][2]
        q = int(cut.position_of(d, sample, epoch)[0])
        if p in set(excised.tolist()):
            assert q == -1
        else:
            assert _triples(cut, [q]) == [base[p]]


def test_positions_round_trip_as_text_and_damage_is_refused():
    x = np.array([0, 5, 6, 1000, 2**61], dtype=np.int64)
    text, sha = encode_positions(x), positions_sha256(x)
    assert np.array_equal(decode_positions(text, 5, sha, "plan"), x)
    with pytest.raises(PlanError, match="sha256"):
        decode_positions(text, 5, positions_sha256(x[:4]), "plan")
    with pytest.raises(PlanError, match="do not hold 4"):
        decode_positions(text, 4, sha, "plan")
    with pytest.raises(PlanError, match="not readable"):
        decode_positions("not base64!", 5, sha, "plan")
    down = encode_positions(np.array([5, 3]))  # crafted: differences that go back
    with pytest.raises(PlanError, match="ascending"):
        decode_positions(down, 2, positions_sha256(np.array([5, 3])), "plan")
    with pytest.raises(PlanError, match="count"):
        decode_positions(text, MAX_EXCISED + 1, sha, "plan")
    with pytest.raises(PlanError, match="ascending"):
        Excision(np.array([3, 3]))

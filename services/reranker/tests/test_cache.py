from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.reranker.cache import ScoreCache, pair_key


def test_the_least_recently_used_pair_leaves_first() -> None:
    cache = ScoreCache(2)
    a, b, c = (pair_key("q", t) for t in "abc")
    cache.put(a, (1.0, False))
    cache.put(b, (2.0, True))
    assert cache.get(a) == (1.0, False)  # a is now the most recent
    cache.put(c, (3.0, False))
    assert cache.get(b) is None and cache.get(a) == (1.0, False) and cache.get(c) == (3.0, False)
    assert len(cache) == 2


def test_a_cache_of_no_pairs_keeps_nothing() -> None:
    cache = ScoreCache(0)
    cache.put(pair_key("q", "p"), (1.0, False))
    assert len(cache) == 0 and cache.get(pair_key("q", "p")) is None


@given(st.text(max_size=20), st.text(max_size=20), st.text(max_size=20), st.text(max_size=20))
def test_different_pairs_have_different_keys(q1: str, p1: str, q2: str, p2: str) -> None:
    # Where the query ends is part of the key: ("ab", "c") is not ("a", "bc").
    assert (pair_key(q1, p1) == pair_key(q2, p2)) == ((q1, p1) == (q2, p2))

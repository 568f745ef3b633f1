"""The terms a long BM25 query searches. A query of a paragraph or a page (the gateway takes up
to ``gateway_max_query_chars``) has hundreds of distinct terms, and a boolean query of them all
costs a posting list walk per term for little: most of them are common words whose IDF is near
zero. Above ``sparse_max_query_terms`` distinct terms the query keeps the most salient ones.

Salient means rare: BM25 weighs a term by its IDF, which falls as more chunks hold it, so the
terms fewest chunks hold carry most of the score a chunk can get. Among equally rare terms the
longer one is kept (a long word is more specific than a short one), then the one that comes
first in the query, so the choice is deterministic. Terms no chunk holds are kept last: they
match nothing (the BM25 leg reports them as unknown words instead).

Linear: one document-frequency lookup per distinct term and a bounded heap (n log limit).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence


def salient_terms(terms: Sequence[str], limit: int, doc_freq: Callable[[str], int]) -> list[str]:
    """At most ``limit`` of ``terms`` (analysed query terms, query order; repeats dropped), in
    query order: all of them when they fit, else the rarest by ``doc_freq`` (how many chunks
    hold a term), the longest first among equally rare ones, then the first in the query; terms
    no chunk holds come last. ``doc_freq`` is called once per distinct term, and only when
    the terms do not fit."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    distinct = list(dict.fromkeys(terms))
    if len(distinct) <= limit:
        return distinct

    def rank(item: tuple[int, str]) -> tuple[bool, int, int, int]:
        position, term = item
        held_by = doc_freq(term)
        return (held_by <= 0, held_by, -len(term), position)

    chosen = heapq.nsmallest(limit, enumerate(distinct), key=rank)
    return [term for _, term in sorted(chosen)]

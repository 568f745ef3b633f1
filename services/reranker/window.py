"""Which part of a long passage the cross-encoder reads.

A pair holds at most ``max_tokens``: a passage longer than its room loses tokens. Keeping the
head is what BERT models are usually served with, but the sentence that answers a query is as
likely to sit at the end of an abstract. ``overlap`` windows keep the passage's first tokens (its
title or opening, which say what it is about) and, for the rest of the room, the contiguous span
holding the most of the query's content tokens. The choice is one pass over the passage's tokens
(a sliding count): linear in its length, whatever the text.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

from tokenizers import Tokenizer

from meshkit.text.answering import STOPWORDS

WindowPolicy = Literal["head", "overlap"]


def content_ids(tokenizer: Tokenizer, query_ids: Sequence[int]) -> frozenset[int]:
    """The query tokens worth matching: whole words of two or more letters or digits, not
    stopwords, which say nothing about where a passage treats the query (the tokenizer's pieces
    are lower-cased words; pieces such as ``##ation`` match too much to locate anything)."""
    wanted = set()
    for token_id in query_ids:
        token = tokenizer.id_to_token(token_id)
        if token and len(token) > 1 and token.isalnum() and token not in STOPWORDS:
            wanted.add(token_id)
    return frozenset(wanted)


def best_start(passage_ids: Sequence[int], wanted: Collection[int], room: int, after: int) -> int:
    """Start of the ``room``-token span at or after ``after`` holding the most ``wanted`` tokens.
    Spans that tie with the first best one and follow it directly hold the same matches: the
    middle one is taken, so the matches sit in context rather than at an edge. Without any match
    the head is kept."""
    last = len(passage_ids) - room
    if last <= after or not wanted:
        return after
    hits = [1 if token in wanted else 0 for token in passage_ids]
    count = sum(hits[after : after + room])
    best, best_count, plateau_end = after, count, after
    for start in range(after + 1, last + 1):
        count += hits[start + room - 1] - hits[start - 1]
        if count > best_count:
            best, best_count, plateau_end = start, count, start
        elif count == best_count and plateau_end == start - 1:
            plateau_end = start
    if best_count == 0:
        return after
    return (best + plateau_end) // 2


def word_start(tokenizer: Tokenizer, passage_ids: Sequence[int], start: int, floor: int) -> int:
    """``start`` moved back to the first piece of its word (a window must not open on ``##ing``),
    never before ``floor``; a few steps at most: words are short."""
    while start > floor and (tokenizer.id_to_token(passage_ids[start]) or "").startswith("##"):
        start -= 1
    return start

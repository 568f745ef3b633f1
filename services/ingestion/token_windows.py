"""Token units of one section and the cuts the chunker (services/ingestion/chunking.py) makes
with them: ``Units`` (token offsets, giant [UNK] tokens split into cuttable pseudo-tokens),
``Piece`` (a span and its token count), the windows an oversized paragraph is cut into
(sentence starts, word boundaries, overlap) and the halving of a span that still does not fit.
"""

from __future__ import annotations

import operator
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from services.ingestion.markdown_sections import WHITESPACE_RE, strip_span

# WordPiece maps any word longer than 100 chars to a single [UNK]: such a "token" is cut
# into pseudo-tokens of this many chars so that chunk boundaries can fall inside it.
MAX_UNIT_CHARS = 100
# Sections longer than this are encoded in pieces of at most this many chars (see Chunker._units).
TOKENIZE_PIECE_CHARS = 65_536
# Where a new sentence (or line) starts: after terminal punctuation plus optional closing
# quotes/brackets and whitespace, after CJK full stops, and after a line break.
_SENTENCE_START_RE = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*\s+|[\u3002\uff01\uff1f]\s*|\n\s*")


@dataclass(frozen=True)
class Piece:
    start: int
    end: int
    tokens: int
    # Whether ``tokens`` is the span's true count: the tokenizer splits words at whitespace
    # and punctuation and normalises char by char, so a span cut at word boundaries re-encodes
    # to exactly the section pass's tokens; a cut inside a word may not.
    exact: bool


class Units:
    """Token start/end offsets (absolute, into the markdown) of one section, with giant
    [UNK] tokens split into cuttable pseudo-tokens."""

    def __init__(
        self, offsets: list[tuple[int, int]], tokens: list[str], base: int, *, estimated: bool = False
    ) -> None:
        self.starts = [base + a for a, _ in offsets]
        self.ends = [base + b for _, b in offsets]
        self.tokens = tokens
        giants = bool(offsets) and max(map(operator.sub, self.ends, self.starts)) > MAX_UNIT_CHARS
        if giants:
            self._split_giants()
        # Pseudo-tokens (or a section encoded in pieces) make unit counts estimates, not token
        # counts: the chunks are then re-encoded before they are trusted.
        self.has_giants = giants or estimated

    def _split_giants(self) -> None:
        starts: list[int] = []
        ends: list[int] = []
        tokens: list[str] = []
        for a, b, token in zip(self.starts, self.ends, self.tokens, strict=True):
            if b - a <= MAX_UNIT_CHARS:
                starts.append(a)
                ends.append(b)
                tokens.append(token)
                continue
            for piece_start in range(a, b, MAX_UNIT_CHARS):
                starts.append(piece_start)
                ends.append(min(b, piece_start + MAX_UNIT_CHARS))
                # Marked as a word continuation: cutting there splits the word.
                tokens.append(token if piece_start == a else "##")
        self.starts, self.ends, self.tokens = starts, ends, tokens

    def word_start(self, k: int) -> bool:
        return not self.tokens[k].startswith("##")

    def count(self, start: int, end: int) -> int:
        """Units that start within [start, end)."""
        return bisect_left(self.starts, end) - bisect_left(self.starts, start)

    def gap_before(self, k: int) -> bool:
        return k > 0 and self.starts[k] > self.ends[k - 1]


def tokenize_pieces(text: str) -> list[tuple[int, int]]:
    """``text`` cut into spans of at most TOKENIZE_PIECE_CHARS, each ending after the last
    whitespace in its second half when there is one."""
    pieces = []
    start = 0
    while start < len(text):
        end = start + TOKENIZE_PIECE_CHARS
        if end < len(text):
            blank = max(text.rfind(c, start + TOKENIZE_PIECE_CHARS // 2, end) for c in " \n\t")
            end = blank + 1 if blank >= 0 else end
        pieces.append((start, min(end, len(text))))
        start = end
    return pieces


def find_sentence_starts(markdown: str, units: Units, start: int, end: int, lo: int, hi: int) -> list[int]:
    """Unit indices in (lo, hi) at which a sentence or line begins, ascending."""
    found: list[int] = []
    for match in _SENTENCE_START_RE.finditer(markdown, start, end):
        k = bisect_left(units.starts, match.end(), lo, hi)
        if lo < k < hi and (not found or found[-1] != k):
            found.append(k)
    return found


def cut_before(units: Units, i: int, limit: int, hi: int, sentence_starts: list[int]) -> int:
    """Where window [i, ...) ends: at most ``limit``, not before its midpoint if avoidable."""
    floor = i + (limit - i) // 2
    s = bisect_right(sentence_starts, limit) - 1
    if s >= 0 and sentence_starts[s] > floor:
        return sentence_starts[s]
    for k in range(limit, floor, -1):
        if units.gap_before(k):
            return k
    for k in range(limit, floor, -1):
        if units.word_start(k) and units.starts[k] > units.starts[i]:
            return k
    # Several units can share a start offset (Hangul syllables decompose into jamo tokens):
    # never end a window before it has covered a character.
    k = limit
    while k < hi and units.starts[k] <= units.starts[i]:
        k += 1
    return k


def next_window_start(units: Units, i: int, j: int, overlap: int, sentence_starts: list[int]) -> int:
    """Where the window after [i, j) starts: ``overlap`` units back from j (at most half the
    window, so that windows shortened by the char cap still advance), moved forward to a
    sentence start or word start; never at or before i."""
    target = max(i + 1, j - min(overlap, (j - i) // 2))
    if overlap == 0 or target >= j:
        return j
    s = bisect_left(sentence_starts, target)
    if s < len(sentence_starts) and sentence_starts[s] < j:
        return _advancing(units, i, sentence_starts[s], j)
    for k in range(target, j):
        if units.gap_before(k):
            return _advancing(units, i, k, j)
    for k in range(target, j):
        if units.word_start(k):
            return _advancing(units, i, k, j)
    return _advancing(units, i, target, j)


def _advancing(units: Units, i: int, k: int, j: int) -> int:
    # A start at the same char as the previous window's would repeat it: no overlap then.
    return k if units.starts[k] > units.starts[i] else j


def window_piece(markdown: str, units: Units, i: int, j: int, lo: int, start: int, end: int) -> Piece:
    """Windows span from their first unit to the next window's first unit, so the chars
    between units (spaces, zero-width chars the tokenizer drops) are kept too."""
    a = start if i == lo else units.starts[i]
    b = end if j >= len(units.starts) or units.starts[j] >= end else units.starts[j]
    a, b = strip_span(markdown, a, b)
    clean_start = i == lo or units.word_start(i)
    clean_end = j >= len(units.starts) or units.starts[j] >= end or units.word_start(j)
    return Piece(a, b, j - i, clean_start and clean_end and not units.has_giants)


def halve(markdown: str, start: int, end: int) -> list[tuple[int, int]]:
    """Split a span at the whitespace nearest its middle (or the middle itself)."""
    mid = (start + end) // 2
    candidates = [max(markdown.rfind(c, start + 1, mid + 1) for c in " \n\t")]
    after = WHITESPACE_RE.search(markdown, mid, end - 1)
    if after is not None:
        candidates.append(after.start())
    inside = [c for c in candidates if start < c < end]
    cut = min(inside, key=lambda c: abs(c - mid)) if inside else max(start + 1, mid)
    halves = [strip_span(markdown, start, cut), strip_span(markdown, cut, end)]
    return [(a, b) for a, b in halves if a < b]

"""Shared text handling of the deterministic planner: quoted spans, word tokens and the word
lists that tell content words from function words."""

from __future__ import annotations

import re
from dataclasses import dataclass


def word_set(words: str) -> frozenset[str]:
    """A word list written as whitespace-separated text, for readability."""
    return frozenset(words.split())


# Function words dropped from keyword-form queries. Negations are deliberately absent: dropping
# "not" from "aspirin does not reduce fever" would turn a query into its opposite.
STOPWORDS = word_set(
    """
    a about above after again against am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has
    have having he her here hers herself him himself his i if in into is it its itself just me more
    most my myself of off on once only or other our ours ourselves out over own same she should so
    some such than that the their theirs them themselves then there these they this those through
    to too under until up very was we were while will with would you your yours yourself yourselves
    what which who whom whose when where why how also may might must shall via per whether
    what's who's where's when's how's it's that's there's here's i'm i've i'd i'll you're we're
    they're let's
    """
)
NEGATIONS = frozenset({"not", "no", "nor", "never", "without", "cannot"})

# Nouns that name the kind of answer wanted, not its topic ("an overview of X"). Request verbs
# ("tell me", "list") are only framing at the start of a query, so they are stripped there.
META_WORDS = frozenset({"please", "overview", "summary", "information", "info", "details", "explanation"})

# Quoted spans: straight double quotes, curly quotes, backticks, and straight single quotes that
# are not apostrophes (a quote glued to a letter on its outer side is "don't", "Alzheimer's").
# A span is an opening quote, at least one char, and the matching closing quote on the same line:
# what the regex  "([^"\n]+)" | \u201c([^\u201d\n]+)\u201d | \u2018([^\u2019\n]+)\u2019 |
# `([^`\n]+)` | (?<![\w'])'([^'\n]+)'(?![\w'])  finds, leftmost first. That regex is quadratic on a line of
# unclosed curly quotes (each one scans to the line end), so quoted_spans scans instead.
_OPENING_QUOTES = re.compile("[\"\u201c\u2018`']")
_CLOSING_QUOTE = {'"': '"', "\u201c": "\u201d", "\u2018": "\u2019", "`": "`", "'": "'"}
_WORD_OR_QUOTE = re.compile(r"[\w']")
# Characters trimmed from both ends of a whitespace-separated token.
_EDGE_PUNCT = "\"'\u201c\u201d\u2018\u2019`()[]{}<>,;:!?."
# Closing quotes and brackets after a word; what precedes them decides whether a clause ends.
_CLOSERS = "\"'\u201d\u2019`)]}>"


@dataclass(frozen=True)
class Token:
    """A whitespace-separated word with its edge punctuation trimmed."""

    text: str
    # First token of the query or of a sentence: its capital letter says nothing about it.
    sentence_initial: bool
    # Punctuation that ended the raw token (",", "?", ...) breaks a phrase after it.
    ends_clause: bool

    @property
    def lower(self) -> str:
        # Curly apostrophes folded so "what\u2019s" is the stopword "what's".
        return self.text.lower().replace("\u2019", "'")

    def is_function_word(self) -> bool:
        return self.lower in STOPWORDS and self.lower not in NEGATIONS


@dataclass(frozen=True)
class Segment:
    """A run of the query: either a quoted phrase (kept whole) or plain text."""

    text: str
    quoted: bool


def collapse_spaces(text: str) -> str:
    return " ".join(text.split())


class _NextIndex:
    """``text.find(char, start)`` for starts that (mostly) grow: a found index is reused until
    the start passes it, so the scans over one text add up to linear time."""

    def __init__(self, text: str, char: str) -> None:
        self._text = text
        self._char = char
        self._searched_from = len(text) + 1
        self._found = -1

    def at_or_after(self, start: int) -> int:
        if self._searched_from > start or 0 <= self._found < start:
            self._found = self._text.find(self._char, start)
            self._searched_from = start
        return self._found


def quoted_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each quoted span of ``text``, quotes included, leftmost first and not
    overlapping (see _OPENING_QUOTES), in linear time."""
    closing = {char: _NextIndex(text, char) for char in set(_CLOSING_QUOTE.values())}
    newline = _NextIndex(text, "\n")
    spans: list[tuple[int, int]] = []
    pos = 0
    while (opening := _OPENING_QUOTES.search(text, pos)) is not None:
        start = opening.start()
        end = closing[_CLOSING_QUOTE[text[start]]].at_or_after(start + 1)
        line_end = newline.at_or_after(start + 1)
        closed = end > start + 1 and (line_end < 0 or end < line_end)
        if closed and text[start] == "'":
            closed = not _word_or_quote_at(text, start - 1) and not _word_or_quote_at(text, end + 1)
        if closed:
            spans.append((start, end + 1))
            pos = end + 1
        else:
            pos = start + 1
    return spans


def _word_or_quote_at(text: str, index: int) -> bool:
    return 0 <= index < len(text) and _WORD_OR_QUOTE.match(text, index) is not None


def quoted_phrases(query: str) -> list[str]:
    return [p for p in (collapse_spaces(query[a + 1 : b - 1]) for a, b in quoted_spans(query)) if p]


def split_quoted(query: str) -> list[Segment]:
    """The query in order, with quoted phrases as their own segments (quotes removed)."""
    segments: list[Segment] = []
    last = 0
    for start, end in quoted_spans(query):
        if start > last:
            segments.append(Segment(query[last:start], quoted=False))
        body = collapse_spaces(query[start + 1 : end - 1])
        if body:
            segments.append(Segment(body, quoted=True))
        last = end
    if last < len(query):
        segments.append(Segment(query[last:], quoted=False))
    return segments


def without_quoted(query: str) -> str:
    """The query with quoted spans blanked out, so no other rule looks inside a quoted phrase.

    A sentence break stands in for each span: what follows a quote is not sentence-initial,
    but it is not glued to what came before it either.
    """
    pieces: list[str] = []
    last = 0
    for start, end in quoted_spans(query):
        pieces += [query[last:start], " , "]
        last = end
    pieces.append(query[last:])
    return "".join(pieces)


def tokens(text: str) -> list[Token]:
    result: list[Token] = []
    sentence_start = True
    for raw in text.split():
        word = raw.strip(_EDGE_PUNCT)
        trailing = raw[len(raw.rstrip(_EDGE_PUNCT)) :]
        if word:
            result.append(Token(word, sentence_start, ends_clause=bool(trailing.strip(_CLOSERS))))
            sentence_start = False
        if trailing.rstrip(_CLOSERS).endswith((".", "!", "?", ":")):
            sentence_start = True
    return result


def word_key(text: str) -> str:
    """Comparison key: lower-cased word characters only, so "IL-6?" and "il 6" are the same query."""
    return " ".join(re.findall(r"\w+", text.lower()))

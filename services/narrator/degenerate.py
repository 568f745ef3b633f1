r"""Degenerate generation: a phrase looping in the model's text ("is a high-end, high-end,
high-end", "the the the the", a clause said three times running), which greedy decoding in small
models falls into. Such a sentence cites a source and shares its words, so the support check
passes it; this check refuses it.

What counts: a stretch of word tokens (``\w+``, lower-cased, citation markers left out; so
``note_`` and ``note`` differ, as they do in code) that repeats with a period of p tokens,
1 <= p <= MAX_PERIOD, over at least ``min_span(p)`` tokens:

- period 1: 4 copies ("the the the the"). Three occur in real text: "MAP kinase kinase kinase"
  (a protein family), "protein protein protein", "Status status = Status..." in code.
- period 2: 3 whole copies ("high-end, high-end, high-end"). Two and a half occur in real text:
  "10.0, 10.0, 10.4", LaTeX's "{\text{A}} - {\text{O}}" in SciFact, Kotlin's
  "Flow<RouteNote>): Flow<RouteNote>".
- period 3 and more: 3 copies but the last token, so "X, and X, and X" counts (its third copy
  lacks the trailing "and"). No sentence of the corpora below holds even two and a half copies
  of a phrase of 3 tokens or more, nor does any whole abstract or page.
- a phrase of numbers only never counts: "0.0.0.0", "1.1, 1.1, 1.1", rows of zeros.
- MAX_PERIOD is 16 tokens: a loop over a longer stretch is a whole clause or sentence, which
  the narrator's loop watch stops after 48 repeated characters (the sentence it was cut in is
  dropped, see verify.py) and the repeat check drops when it is said again.

Measured with ``python -m services.narrator.tests.corpus_sentences``: over the 49,985 sentences
of the 5,183 SciFact abstracts and the 15,134 of the 111 grpc-docs Markdown pages (11,973 lines
and sentences as an answer is split, so prose, list items, table rows and code lines as
written, and 3,161 evidence sentences), it fires on none, and on none of the documents taken
whole (the whole-answer check). The nearest misses are one token short (the ones named above).

Time: each token is compared only with the earlier positions of the same token among the last
MAX_PERIOD tokens (a dict of positions), so n tokens cost at most n x MAX_PERIOD steps however
they repeat (a run of numbers, which can never count, is skipped outright); no regular
expression backtracks. RepeatGate applies the same watch to the streamed text, so a loop is
held back before it is shown.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

MAX_PERIOD = 16
# The last tokens a watch keeps: a repeat is reported as soon as it is long enough, so it never
# spans more than this, and a repeat in progress starts among them.
_WINDOW = 3 * MAX_PERIOD
_CITATION = r"\[\d{1,3}(?:\s*,\s*\d{1,3})*\]"
# The stream's scan: a citation marker (not a word of the sentence: "X [1], X [1]" and
# "X [1], X [2]" loop alike), a word or a table bar, or a sentence end (a stop, closers or
# markers, then a space; or a line break). A bar counts as a token unlike any other, so no
# repeat runs across table cells: "| N/A | N/A | N/A | N/A |" is a row, not a loop.
_SCAN = re.compile(
    rf"(?P<cite>{_CITATION})|(?P<word>\w+|\|)|(?P<end>[.!?](?:[\"')\]]|{_CITATION})*(?=\s)|\n)"
)
_WORD_GROUP, _END_GROUP = _SCAN.groupindex["word"], _SCAN.groupindex["end"]
# For whole texts: a marker (no group) or a word or bar (the group).
_WORDS = re.compile(rf"{_CITATION}|(\w+|\|)")
_BAR = "|"
_UNMATCHABLE = "\x00"
# A citation marker still being written at the end of the streamed text: "[1, 2".
_OPEN_CITATION = re.compile(r"\[[\d,\s]*\Z")
_OPEN_CITATION_CHARS = 24
# The streamed text's last chars, which a later delta may still change the meaning of (a word
# being written, a stop whose closing quotes go on), are scanned again with the next delta.
_LOOKBACK = 64
# Text held back longer than this (a repeat in progress strung out over junk) is shown anyway.
_MAX_HELD_CHARS = 2000


def min_span(period: int) -> int:
    """Tokens a period-``period`` repeat must cover to count (see the module docstring)."""
    if period == 1:
        return 4
    if period == 2:
        return 6
    return 3 * period - 1


_MIN_SPAN = [0, *(min_span(p) for p in range(1, MAX_PERIOD + 1))]


@dataclass(frozen=True)
class Repeat:
    """A looping stretch: ``phrase`` (its first copy's tokens) repeated from token ``start``
    to ``end`` (exclusive)."""

    phrase: str
    period: int
    start: int
    end: int

    @property
    def copies(self) -> float:
        return (self.end - self.start) / self.period

    def describe(self) -> str:
        return f'"{self.phrase}" repeated {self.copies:.3g} times'


class RepeatWatch:
    """The check over tokens pushed one by one. ``held_from`` is where a repeat in progress
    (not yet long enough to count) has its second copy start, so a stream can hold that text
    back until the repeat either breaks off or counts."""

    def __init__(self) -> None:
        self.count = 0
        self.held_from: int | None = None
        self._window: deque[str] = deque(maxlen=_WINDOW)
        # Each token's last position, and for each of the last _WINDOW positions the one before
        # it holding the same token: the earlier matches of a token, nearest first.
        self._last: dict[str, int] = {}
        self._previous: list[int] = [-1] * _WINDOW
        # Period -> tokens matched so far by the run of tok[i] == tok[i - period] ending at the
        # last token (a period absent here has no run).
        self._runs: dict[int, int] = {}
        self._trailing_digits = 0

    def push(self, token: str) -> Repeat | None:
        """Add the next token; the repeat it completes, if it completes one."""
        i = self.count
        self.count = i + 1
        self._window.append(token)
        j = self._last.get(token, -1)
        self._last[token] = i
        self._previous[i % _WINDOW] = j
        digits = self._trailing_digits = self._trailing_digits + 1 if token.isdigit() else 0
        if j < 0 or i - j > MAX_PERIOD or digits >= MAX_PERIOD:
            # No earlier match: every run breaks. Or every phrase this token could end is numbers
            # only, so none counts, and no run outlives the next word (not one of the last
            # MAX_PERIOD tokens).
            if self._runs:
                self._runs = {}
            self.held_from = None
            return None
        runs = self._runs
        continued: dict[int, int] = {}
        held: int | None = None
        found: Repeat | None = None
        while j >= 0 and i - j <= MAX_PERIOD:
            period = i - j
            run = continued[period] = runs.get(period, 0) + 1
            if digits < period:  # else the phrase is numbers only
                start = i + 1 - run
                if held is None or start < held:
                    held = start
                if found is None and run + period >= _MIN_SPAN[period]:
                    found = self._repeat(period, start - period, i + 1)
            j = self._previous[j % _WINDOW]
        self._runs = continued
        self.held_from = held
        return found

    def may_match(self, prefix: str) -> bool:
        """Whether a word that starts with ``prefix`` (still being written) could extend or
        start a repeat: it would have to equal one of the last MAX_PERIOD tokens."""
        recent = islice(reversed(self._window), MAX_PERIOD)
        return any(token.startswith(prefix) for token in recent)

    def _repeat(self, period: int, start: int, end: int) -> Repeat:
        first = start - (self.count - len(self._window))
        phrase = " ".join(self._window[k] for k in range(first, first + period))
        return Repeat(phrase, period, start, end)


def words(text: str) -> list[str]:
    """The tokens the check compares: words and numbers, lower-cased, markers left out, each
    table bar a token of its own (see unmatchable)."""
    found = [word for word in _WORDS.findall(text.lower()) if word]
    if _BAR in text:
        found = [unmatchable(i) if word == _BAR else word for i, word in enumerate(found)]
    return found


def unmatchable(index: int) -> str:
    """The token standing at token ``index`` for what must match nothing (a table bar): equal
    to no other token (no word holds a NUL), so every run across it breaks."""
    return f"{_UNMATCHABLE}{index}"


def first_repeat(tokens: Sequence[str]) -> Repeat | None:
    """The first looping stretch of ``tokens``, or None."""
    # Any stretch that counts holds some token three times (see min_span), so two repeats at
    # least: most sentences have fewer, and a set is far cheaper than the watch.
    if len(tokens) - len(set(tokens)) < 2 or max(Counter(tokens).values()) < 3:
        return None
    watch = RepeatWatch()
    for token in tokens:
        hit = watch.push(token)
        if hit is not None:
            return hit
    return None


def find_repeat(text: str) -> Repeat | None:
    """The first looping stretch of ``text`` (a sentence), or None."""
    return first_repeat(words(text))


def repeats(tokens: Sequence[str]) -> list[Repeat]:
    """Every looping stretch of ``tokens``, each extended to where it stops repeating, in
    order; linear in the number of tokens."""
    found: list[Repeat] = []
    watch, offset, i = RepeatWatch(), 0, 0
    while i < len(tokens):
        hit = watch.push(tokens[i])
        i += 1
        if hit is None:
            continue
        end = i
        while end < len(tokens) and tokens[end] == tokens[end - hit.period]:
            end += 1
        found.append(Repeat(hit.phrase, hit.period, offset + hit.start, end))
        watch, offset, i = RepeatWatch(), end, end
    return found


def looping_sentences(sentences: Sequence[Sequence[str]]) -> dict[int, Repeat]:
    """The sentences (each as its tokens, see words; by index) that take part in a phrase
    looping across sentence boundaries (an answer degenerate as a whole, though no sentence is
    alone): those holding a token of the loop past its first copy, which stays."""
    tokens: list[str] = []
    owner: list[int] = []
    for index, found in enumerate(sentences):
        if any(token.startswith(_UNMATCHABLE) for token in found):
            # Numbered within their sentence: renumbered within the answer, to stay unequal.
            found = [
                unmatchable(len(tokens) + k) if t.startswith(_UNMATCHABLE) else t for k, t in enumerate(found)
            ]
        tokens += found
        owner += [index] * len(found)
    looping: dict[int, Repeat] = {}
    for repeat in repeats(tokens):
        for k in range(repeat.start + repeat.period, repeat.end):
            looping.setdefault(owner[k], repeat)
    return looping


class RepeatGate:
    """The check applied to the answer's text as it streams, sentence by sentence: ``feed``
    returns what may be shown now. Text that may be the second copy of a phrase is held until
    the repeat breaks off (then shown) or counts (then it and the rest of its sentence are never
    shown); ``flush`` ends the stream. Boundaries are looser than verify.py's sentences (any
    stop before a space), which can only split a loop, never join prose into one.

    Linear in the stream, whatever its deltas: text is scanned once, but for the last
    _LOOKBACK chars, which may still change meaning (a word being written, a stop whose closers
    go on); a longer word is taken as it stands, and held text over _MAX_HELD_CHARS is shown."""

    def __init__(self) -> None:
        self.found: list[Repeat] = []
        self._text = ""  # the stream from self._base on
        self._base = 0
        self._scanned = 0  # relative: text before it is tokenised
        self._shown = 0  # relative: text before it is shown or dropped
        self._dropping = False
        # The word at the end of the text, still being written (its relative start and text),
        # and where the last word too long to wait for was cut (absolute).
        self._partial: tuple[int, str] | None = None
        self._long_word_end = -1
        self._watch = RepeatWatch()
        # Absolute offsets of the watch's last tokens (a held repeat starts among them).
        self._starts: deque[int] = deque(maxlen=_WINDOW)

    def feed(self, text: str) -> str:
        self._text += text
        return self._advance(final=False)

    def flush(self) -> str:
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        out: list[str] = []
        text = self._text
        limit = len(text) if final else self._settled_end()
        self._scan(text, limit, final, out)
        if not final:
            # What lies this far back can no longer change: never scanned again.
            self._scanned = max(self._scanned, limit - _LOOKBACK)
        if self._dropping:
            self._shown = max(self._shown, len(text) if final else self._scanned)
        else:
            held = None if final else self._held_offset()
            if held is not None and len(text) - held > _MAX_HELD_CHARS:
                held = None
            end = len(text) if held is None else max(held, self._shown)
            out.append(text[self._shown : end])
            self._shown = end
        self._trim()
        return "".join(out)

    def _scan(self, text: str, limit: int, final: bool, out: list[str]) -> None:
        """Tokenise ``text`` from where the scan stopped to ``limit``, watching each sentence's
        words (the per-token loop of the stream: kept to locals and plain calls)."""
        self._partial = None
        scanned = self._scanned
        for match in _SCAN.finditer(text, scanned, limit):
            start, end = match.span()
            kind = match.lastindex
            if kind == _WORD_GROUP:
                word = match.group(kind).lower()
                unfinished = not final and end == len(text)
                if unfinished and end - start < _LOOKBACK:
                    self._partial = (start, word)
                    break
                # A word too long to wait for, and the rest of it, compare with nothing.
                whole = not unfinished and self._base + start != self._long_word_end
                if unfinished:
                    self._long_word_end = self._base + end
                if not self._dropping:
                    self._starts.append(self._base + start)
                    count = self._watch.count
                    hit = self._watch.push(word if whole and word != _BAR else unmatchable(count))
                    if hit is not None:
                        self._drop_from(hit, out)
            elif kind == _END_GROUP:
                self._on_sentence_end(match)
            scanned = end
        self._scanned = scanned

    def _settled_end(self) -> int:
        """Where the text stops being tokenisable now: before a citation marker still open."""
        text = self._text
        bracket = text.rfind("[", max(self._scanned, len(text) - _OPEN_CITATION_CHARS))
        if bracket >= 0 and _OPEN_CITATION.match(text, bracket):
            return bracket
        return len(text)

    def _drop_from(self, hit: Repeat, out: list[str]) -> None:
        """``hit`` counts: the text is shown up to where the repeating started (its first copy
        was fine on its own), and the rest of the sentence is dropped."""
        second_copy = self._token_offset(hit.start + hit.period)
        cut = max(second_copy, self._shown)
        out.append(self._text[self._shown : cut])
        self._shown = cut
        self._dropping = True
        self.found.append(hit)

    def _on_sentence_end(self, match: re.Match[str]) -> None:
        if self._dropping:
            # Dropped through its stop; the space or line break after it is kept.
            stop = match.start() if match.group(_END_GROUP) == "\n" else match.end()
            self._shown = max(self._shown, stop)
            self._dropping = False
        self._watch = RepeatWatch()
        self._starts.clear()

    def _token_offset(self, index: int) -> int:
        """The relative offset of the watch's token ``index`` (one of its last _WINDOW)."""
        return self._starts[index - (self._watch.count - len(self._starts))] - self._base

    def _held_offset(self) -> int | None:
        """Where the text that may still turn out to repeat starts: a repeat in progress, or
        else the word being written when it could match a recent one."""
        held = self._watch.held_from
        if held is not None:
            return self._token_offset(held)
        if self._partial is not None and self._watch.may_match(self._partial[1]):
            return self._partial[0]
        return None

    def _trim(self) -> None:
        done = min(self._scanned, self._shown)
        if done:
            self._text = self._text[done:]
            self._base += done
            self._scanned -= done
            self._shown -= done

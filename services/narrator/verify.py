"""Citation binding and verification of the model's text (pure functions).

Every sentence must cite, by number, a source the request gave and be supported by that
source's facts; anything else is dropped and reported. A sentence the model left uncited is
bound to the source whose facts hold most of its content words, when they hold enough of them
(small models follow "cite every sentence" loosely; what they wrote may still be grounded), and
dropped otherwise. A sentence in which a phrase loops ("high-end, high-end, high-end"), the
sentence a looping reply was stopped in, and sentences that loop together are dropped as
degenerate (see degenerate.py). The reply's envelope and reasoning are taken off first (see
envelope.py)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from meshkit.text.answering import cited_numbers, content_words, coverage, split_sentences, strip_citations
from services.narrator.degenerate import first_repeat, looping_sentences, words
from services.narrator.envelope import clean_output
from services.narrator.model import Fact, Rejection, RejectReason, Sentence, SupportCheck

# What the prompt asks the model to reply when the facts do not answer the question.
NOT_FOUND_MARKER = "NOT_IN_DOCUMENTS"

_LIST_ITEM = re.compile(r"^\s*(?:[-*\u2022]|\d{1,2}[.)])\s+")
_STOPS = ".!?"
_CLOSERS = "\"')]"
_NOT_WORD = re.compile(r"[^A-Z0-9]+")
_WORD = re.compile(r"\w")
_TOKEN = re.compile(r"[^\W_]+")
# An uncited sentence is bound to a source only when it says something checkable: this many
# content words at least ("Yes." or "No." cannot be bound to anything).
MIN_BINDABLE_WORDS = 3


@dataclass(frozen=True)
class Verification:
    sentences: list[Sentence]
    rejected: list[Rejection]
    # The model said the facts do not answer the question (the marker).
    not_found: bool


def is_not_found_marker(sentence: str) -> bool:
    """Whether ``sentence`` is the not-found marker, however the model dressed it (bold, quotes,
    spaces instead of underscores, a trailing period or citation)."""
    return NOT_FOUND_MARKER in _NOT_WORD.sub("_", strip_citations(sentence).upper())


def with_citation(text: str, numbers: Iterable[int]) -> str:
    """``text`` ending with one normalised marker before its final punctuation: "X is Y [1, 3]."."""
    body = strip_citations(text)
    end = _final_punctuation_start(body)
    punctuation = body[end:] if end is not None else "."
    body = body[:end].rstrip() if end is not None else body
    marker = ", ".join(str(n) for n in numbers)
    return f"{body} [{marker}]{punctuation}"


def _final_punctuation_start(text: str) -> int | None:
    """Where ``text``'s final punctuation starts: stops then closing quotes or brackets at its
    very end ("[.!?]+[\"')\\]]*$"), found from the end; None when it has none. (The regex,
    retried from every char of a long run of stops, is quadratic.)"""
    closers_start = len(text.rstrip(_CLOSERS))
    stops_start = len(text[:closers_start].rstrip(_STOPS))
    return stops_start if stops_start < closers_start else None


def normalised(sentence: str) -> str:
    """What a sentence says, for the repeat check: lower-cased words and numbers only, so the same
    sentence with another final stop, citation, case or spacing is the same sentence."""
    return " ".join(_TOKEN.findall(strip_citations(sentence).lower()))


def support_texts(facts: Iterable[Fact]) -> dict[int, str]:
    """Each source number's facts, concatenated: what a sentence citing it may say."""
    texts: dict[int, list[str]] = {}
    for fact in facts:
        texts.setdefault(fact.source, []).append(fact.text)
    return {number: " ".join(parts) for number, parts in texts.items()}


def answer_sentences(text: str) -> list[str]:
    """The sentences of an answer; lines are split first so list items stand on their own, and
    fragments without words (stray markers, rules) do not count as sentences."""
    sentences: list[str] = []
    for line in text.splitlines():
        for piece in split_sentences(_LIST_ITEM.sub("", line)):
            if _WORD.search(strip_citations(piece)):
                sentences.append(piece)
            elif sentences and cited_numbers(piece):
                # A marker left on its own line cites the sentence before it.
                sentences[-1] = f"{sentences[-1]} {piece}"
    return sentences


def bind(sentence: str, supports: Mapping[int, str], min_coverage: float) -> int | None:
    """The source whose facts hold the largest share (at least ``min_coverage``) of an uncited
    sentence's content words; None when none does or the sentence says too little to check."""
    body = strip_citations(sentence)
    if len(content_words(body)) < MIN_BINDABLE_WORDS:
        return None
    best, best_coverage = None, min_coverage
    for number in sorted(supports):
        share = coverage(body, supports[number])
        if share >= best_coverage and (best is None or share > best_coverage):
            best, best_coverage = number, share
    return best


def is_unfinished(sentence: str) -> bool:
    """Whether ``sentence`` (its citations aside) lacks final punctuation: cut mid-way."""
    return _final_punctuation_start(strip_citations(sentence)) is None


def verify(
    text: str,
    source_count: int,
    supports: Mapping[int, str],
    min_support: float,
    bind_support: float,
    *,
    looped: bool = False,
) -> Verification:
    """The model's reply (``text``, as written) checked sentence by sentence against the request's
    ``source_count`` sources and ``supports`` (see support_texts); uncited sentences are bound at
    ``bind_support`` (see bind). ``looped``: the reply was stopped because it had started
    repeating itself, so an unfinished last sentence is where the loop was cut."""
    kept: list[Sentence] = []
    kept_words: list[list[str]] = []
    rejected: list[Rejection] = []
    said: set[str] = set()
    not_found = False
    sentences = answer_sentences(clean_output(text))
    for index, sentence in enumerate(sentences):
        if is_not_found_marker(sentence):
            not_found = True
            continue
        body = normalised(sentence)
        if body in said:
            rejected.append(Rejection(sentence, RejectReason.REPEATED))
            continue
        if looped and index == len(sentences) - 1 and is_unfinished(sentence):
            rejected.append(Rejection(sentence, _cut_in_loop(body, said)))
            continue
        tokens = words(sentence)
        if first_repeat(tokens) is not None:
            rejected.append(Rejection(sentence, RejectReason.DEGENERATE))
            continue
        said.add(body)
        numbers = cited_numbers(sentence)
        if not numbers:
            bound = bind(sentence, supports, bind_support)
            numbers = [bound] if bound is not None else []
        valid = [n for n in numbers if 1 <= n <= source_count]
        support = (
            coverage(strip_citations(sentence), " ".join(supports.get(n, "") for n in valid))
            if valid
            else 0.0
        )
        reason = _rejection(numbers, valid, support, min_support)
        if reason is not None:
            rejected.append(Rejection(sentence, reason))
            continue
        kept.append(Sentence(with_citation(sentence, valid), tuple(valid), SupportCheck.LEXICAL, support))
        kept_words.append(tokens)
    kept, looping = _without_looping(kept, kept_words)
    return Verification(kept, rejected + looping, not_found)


def _cut_in_loop(body: str, said: set[str]) -> RejectReason:
    """Why the sentence a looping reply was stopped in goes: the start of a sentence said
    before (the reply was saying it again), or else a loop within itself, cut mid-way."""
    if any(earlier.startswith(body) for earlier in said):
        return RejectReason.REPEATED
    return RejectReason.DEGENERATE


def _without_looping(
    kept: list[Sentence], kept_words: list[list[str]]
) -> tuple[list[Sentence], list[Rejection]]:
    """The kept sentences (and their words) less those looping together: a phrase repeating
    across sentence boundaries, though no sentence repeats it alone (the whole answer checked
    as one text)."""
    looping = looping_sentences(kept_words)
    if not looping:
        return kept, []
    dropped = [Rejection(s.text, RejectReason.DEGENERATE) for i, s in enumerate(kept) if i in looping]
    return [s for i, s in enumerate(kept) if i not in looping], dropped


def _rejection(
    numbers: Sequence[int], valid: Sequence[int], support: float, min_support: float
) -> RejectReason | None:
    if not numbers:
        return RejectReason.UNCITED
    if not valid:
        return RejectReason.UNKNOWN_SOURCE
    if support < min_support:
        return RejectReason.UNSUPPORTED
    return None

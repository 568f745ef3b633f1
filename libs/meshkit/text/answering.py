"""Text helpers shared by the answering stages (extractor, narrator, gateway, evaluation):
sentence splitting, citation markers ([1], [2, 3]) and the content words that support checks
and rationale matching compare. Plain functions over strings, no model."""

from __future__ import annotations

import re

# A sentence ends at . ! or ? (then any closing quotes and citation markers) followed by space
# and an upper-case letter, digit, quote or bracket; "e.g.", "et al." or an initial before a
# capital do not end one (the abbreviation rule below).
_SENTENCE_END = re.compile(r"(?<=[.!?])(?:[\"')\]]|\s*\[\d{1,3}(?:\s*,\s*\d{1,3})*\])*\s+(?=[\"'(\[A-Z0-9])")
_NO_SPLIT_BEFORE = re.compile(
    r"(?:\b(?:e\.g|i\.e|et al|vs|Fig|Figs|No|Dr|Mr|Mrs|Ms|St|approx|ca)\.|\b[A-Z]\.)$"
)
# The longest text _NO_SPLIT_BEFORE can match ("approx."): only that much before a candidate
# end is looked at, so a run of abbreviations costs linear time, not a rescan per candidate.
_ABBREVIATION_CHARS = 7
# [1] [1,2] [1, 2] [1][2]: numbers only, so "[Smith 2020]" or "[citation needed]" are left alone.
CITATION = re.compile(r"\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]")
# A marker with the whitespace before it. The match may only start where a whitespace run
# starts: a plain leading "\s*" would be retried from every char of a long run (quadratic).
_SPACED_CITATION = re.compile(r"(?<!\s)\s*" + CITATION.pattern)
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9\-]*")
_STOPWORD_TEXT = """a an and are as at be been being but by can could did do does for from had has have how
i if in into is it its may might more most no not of on or our should so such than that the their them
then there these they this those to was we were what when where which while who whom why will with
would you your also between both each other over under about after before during only same very all
any some"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, stripped, empty ones dropped. A blank line always ends a
    sentence (a heading or title line has no full stop)."""
    return [s for paragraph in _PARAGRAPH_BREAK.split(text) for s in _paragraph_sentences(paragraph)]


def _paragraph_sentences(text: str) -> list[str]:
    pieces: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        # Closing quotes and citation markers after the stop belong to the sentence they end.
        if _NO_SPLIT_BEFORE.search(text, max(start, match.start() - _ABBREVIATION_CHARS), match.start()):
            continue
        pieces.append(text[start : match.end()])
        start = match.end()
    pieces.append(text[start:])
    return [" ".join(p.split()) for p in pieces if p.strip()]


def cited_numbers(sentence: str) -> list[int]:
    """Citation numbers in ``sentence``, in order of first appearance, without repeats."""
    numbers: list[int] = []
    for match in CITATION.finditer(sentence):
        for part in match.group(1).split(","):
            number = int(part)
            if number not in numbers:
                numbers.append(number)
    return numbers


def strip_citations(sentence: str) -> str:
    """``sentence`` without its citation markers (and the space before them)."""
    return _SPACED_CITATION.sub("", sentence).strip()


def content_word_list(text: str) -> list[str]:
    """Lower-cased words of ``text`` that carry meaning (stopwords and 1-letter tokens out), in
    order of first appearance, without repeats."""
    words = (m.group(0).lower() for m in _WORD.finditer(text))
    return list(dict.fromkeys(w for w in words if len(w) > 1 and w not in STOPWORDS))


def content_words(text: str) -> set[str]:
    """Lower-cased words of ``text`` that carry meaning (stopwords and 1-letter tokens out)."""
    return set(content_word_list(text))


def coverage(part: str, whole: str) -> float:
    """Share of ``part``'s content words found in ``whole`` (1.0 when part has none)."""
    words = content_words(part)
    if not words:
        return 1.0
    return len(words & content_words(whole)) / len(words)


def estimate_tokens(text: str) -> int:
    """A tokenizer-free token estimate (about 4 characters per token in English), for budgets."""
    return (len(text) + 3) // 4


# Every "the evidence does not answer" text (answered=false) starts with this phrase, so callers
# and evaluations recognise it without parsing; the reason follows after a colon.
NOT_FOUND_PHRASE = "The documents do not say"
NO_EVIDENCE_REASON = "none of the retrieved passages addresses this question"


def not_found_text(reason: str) -> str:
    return f"{NOT_FOUND_PHRASE}: {reason}."

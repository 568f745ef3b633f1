"""Hard keywords: the parts of a query that must match verbatim for a passage to be about it.

Dense retrieval blurs "IL-6" into "IL-8" and "ERR_CONN_RESET" into any network error; the
exact leg exists for those. Only terms with a strong surface signal qualify, in priority order:
quoted phrases, identifiers and codes, all-caps acronyms, then capitalised names that are not
capitalised merely for starting a sentence. Plain English yields none, which is fine: the
gateway then skips the exact leg.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from services.planner.text import STOPWORDS, Token, quoted_phrases, tokens, without_quoted, word_set

MAX_KEYWORD_CHARS = 200  # the sparse service's limit per keyword

# Numbers with a unit or ordinal suffix ("1990s", "5mg", "2nd") and number-word compounds
# ("3-year", "0-dimensional", "2nd-line") mix letters and digits but are ordinary words, not identifiers.
_NUMBER_WITH_SUFFIX = re.compile(r"^\d+(?:[.,]\d+)?[a-z]{0,3}(?:-[a-z]+)*$")
_HAS_LETTER = re.compile(r"[A-Za-z]")
_HAS_DIGIT = re.compile(r"\d")
_CAMEL = re.compile(r"[a-z][A-Z]")
# Lower-case prefix + short acronym ("mRNA", "siRNAs", "mtDNA"): a common term of art, not a
# name. Longer ones ("ureABIEFGH", a gene cluster) are specific.
_PREFIXED_ACRONYM = re.compile(r"^[a-z]{1,3}[A-Z]{2,4}s?$")
_SNAKE = re.compile(r"^[A-Za-z0-9]+(?:_[A-Za-z0-9]+)+$")
# Dotted names need a segment of 2+ letters so "e.g" and "U.S" stay out.
_DOTTED = re.compile(r"^[A-Za-z_][\w-]*(?:\.[\w-]+)+$")
_VERSION = re.compile(r"^v\d+(?:\.\d+)*$|^\d+(?:\.\d+){2,}$", re.IGNORECASE)
_PATH = re.compile(r"^(?:~?/[\w.-]+)+/?$|^[a-z][a-z0-9+.-]*://\S+$", re.IGNORECASE)
_LONG_NUMBER = re.compile(r"^\d{5,}$")
_ACRONYM = re.compile(r"^[A-Z][A-Z&]*[A-Z]s?$")
_ROMAN = re.compile(r"^[IVXLCDM]+$")
_CAPITALISED = re.compile(r"^[A-Z][a-z]+(?:[-'][A-Za-z]+)*$")
# A plain number right after one of these words is a code ("error 404", "exit code 137").
_CODE_WORDS = frozenset({"error", "code", "status", "errno", "exit", "http", "port"})

# Capitalised for emphasis or by convention, not names.
_COMMON_CAPS = word_set(
    """
    ok no nor am pm vs etc ie eg faq tldr diy asap fyi btw
    all any not only never always must new best free top
    """
)
_CALENDAR = word_set(
    """
    monday tuesday wednesday thursday friday saturday sunday january february march april may june
    july august september october november december
    """
)


def extract_keywords(query: str, limit: int) -> list[str]:
    """Hard keywords of ``query`` in priority order, at most ``limit``, each at most 200 chars."""
    words = tokens(without_quoted(query))
    candidates = [
        *quoted_phrases(query),
        *identifiers(words),
        *acronyms(words, shouting=_is_shouting(words)),
        *capitalised_names(words),
    ]
    return _dedupe(_fit(c) for c in candidates)[:limit]


def verbatim_keywords(query: str, limit: int) -> list[str]:
    """Only the strongest signals, quoted phrases and identifiers: terms no reading of the
    query can dispute, so the LLM planner keeps them whatever the model says."""
    words = tokens(without_quoted(query))
    return _dedupe(_fit(c) for c in [*quoted_phrases(query), *identifiers(words)])[:limit]


def identifiers(words: list[Token]) -> list[str]:
    found = []
    previous = ""
    for token in words:
        if is_identifier(token.text) or (previous in _CODE_WORDS and token.text.isdigit()):
            found.append(token.text)
        previous = token.lower
    return found


def is_identifier(word: str) -> bool:
    if _PATH.match(word) or _VERSION.match(word) or _LONG_NUMBER.match(word):
        return True
    if _SNAKE.match(word) and _HAS_LETTER.search(word):
        return True
    if _DOTTED.match(word) and any(len(re.sub(r"\W", "", s)) >= 2 for s in word.split(".")):
        return True
    if _CAMEL.search(word) and not _PREFIXED_ACRONYM.match(word):
        return True
    mixed = bool(_HAS_LETTER.search(word) and _HAS_DIGIT.search(word))
    return mixed and not _NUMBER_WITH_SUFFIX.match(word)


def acronyms(words: list[Token], shouting: bool) -> list[str]:
    # In an all-caps query every word looks like an acronym; none can be told apart.
    if shouting:
        return []
    return [
        t.text
        for t in words
        if _ACRONYM.match(t.text)
        and not _ROMAN.match(t.text)
        and t.lower not in STOPWORDS
        and t.lower not in _COMMON_CAPS
    ]


def capitalised_names(words: list[Token]) -> list[str]:
    """Runs of capitalised words ("Stanford University"). A run that starts a sentence counts
    only with two or more words: one capital there is just grammar."""
    if _is_title_case(words):
        return []
    names = []
    run: list[Token] = []
    for token in [*words, None]:
        if token is not None and _is_name_word(token) and not (run and run[-1].ends_clause):
            run.append(token)
            continue
        if run and (len(run) > 1 or not run[0].sentence_initial):
            names.append(" ".join(t.text for t in run))
        run = [token] if token is not None and _is_name_word(token) else []
    return names


def names_something(token: Token) -> bool:
    """The token is a name, acronym or identifier on its own (a capital that merely starts a
    sentence does not count): what a follow-up like "what about Java?" swaps for another."""
    if is_identifier(token.text) or (_ACRONYM.match(token.text) and not _ROMAN.match(token.text)):
        return token.lower not in STOPWORDS and token.lower not in _COMMON_CAPS
    return not token.sentence_initial and _is_name_word(token)


def _is_name_word(token: Token) -> bool:
    return (
        bool(_CAPITALISED.match(token.text))
        and token.lower not in STOPWORDS
        and token.lower not in _COMMON_CAPS
        and token.lower not in _CALENDAR
    )


def _is_shouting(words: list[Token]) -> bool:
    letters = [t.text for t in words if t.text.isalpha() and len(t.text) > 1]
    return len(letters) >= 3 and all(w.isupper() for w in letters)


def _is_title_case(words: list[Token]) -> bool:
    """Headline-style queries ("How To Configure Nginx On Ubuntu") capitalise every word, so
    capitals say nothing there. Prose never capitalises a function word mid-sentence."""
    inner = [t for t in words if not t.sentence_initial and t.text.isalpha()]
    if any(t.lower in STOPWORDS and t.text[0].isupper() and t.text[1:].islower() for t in inner):
        return True
    long_words = [t for t in inner if len(t.text) >= 4]
    return len(long_words) >= 3 and all(t.text[0].isupper() for t in long_words)


def _fit(keyword: str) -> str:
    """Cut an over-long keyword (a quoted paragraph) at a word boundary: a prefix of a verbatim
    phrase is still verbatim, and a whole-word cut keeps it usable by token-level matching."""
    if len(keyword) <= MAX_KEYWORD_CHARS:
        return keyword
    cut = keyword[: MAX_KEYWORD_CHARS + 1]
    space = cut.rfind(" ")
    return cut[:space] if space > 0 else keyword[:MAX_KEYWORD_CHARS]


def _dedupe(keywords: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    result = []
    for keyword in keywords:
        key = keyword.lower()
        if keyword and key not in seen:
            seen.add(key)
            result.append(keyword)
    return result

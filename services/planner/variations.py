"""Semantic variations without a language model: rewrites built from the query's own words.

Each rewrite is a query a person could have typed, so the dense index sees plausible input:
- statement form: a question without its question framing ("What are the side effects of
  metformin?" -> "the side effects of metformin"), closer to how passages are written;
- keyword form: the content words in their original order, quoted phrases kept whole;
- focus form: the keyword form without phrases that only frame the topic ("role", "effects").
Rewrites that come out the same as an earlier one (same words, ignoring case and
punctuation) or that hold no content word are dropped, so a plan may have fewer variations
than allowed; it always has the original query first.
"""

from __future__ import annotations

import re

from services.planner.text import META_WORDS, Segment, Token, split_quoted, tokens, word_key, word_set

_REQUEST_PREFIX = re.compile(
    r"""^(?:(?:please|hey|hi)[,\s]+)*
    (?:(?:can|could|would|will)\s+you\s+(?:please\s+)?)?
    (?:(?:tell|show|give)\s+me\s+(?:about\s+)?
      | (?:explain|describe|summari[sz]e)\s+
      # "list all X" is a request, "List comprehension in Python" is a topic.
      | (?:list|find|name|give|show)\s+(?=(?:all|every|each|any|some|the|a|an|me)\b)
      | i\s+(?:want|would\s+like|'d\s+like|need)\s+to\s+know\s+(?:about\s+)?
    )?""",
    re.IGNORECASE | re.VERBOSE,
)
_QUESTION_PREFIX = re.compile(
    r"""^(?:(?:what|who|where|how|when)'s\s+
      | (?:what|which|who|whom|whose|when|where|why|how)
        (?:\s+(?:many|much|long|often|far|old|big))?\s+
        (?:(?:is|are|was|were|do|does|did|can|could|should|would|will|has|have|had)\s+)?
      | (?:is|are|was|were|do|does|did|can|could|should|would|will|has|have|had)\s+
    )""",
    re.IGNORECASE | re.VERBOSE,
)
_LOOKS_LIKE_QUESTION = re.compile(
    r"\?\s*$|^\s*(?:what|which|who|whom|whose|when|where|why|how|is|are|was|were|do|does|did|can|could"
    r"|should|would|will|has|have|had|please|tell|show|give|explain|describe|summari[sz]e|list)\b",
    re.IGNORECASE,
)

# Nouns that only frame a topic: a phrase made of nothing else adds no retrieval signal.
_FRAMING_NOUNS = word_set(
    """
    role roles effect effects impact impacts influence type types kind kinds sort sorts way ways
    use uses purpose meaning definition difference differences relationship relationships relation
    relations example examples reason reasons aspect aspects thing things factor factors
    """
)


def make_variations(query: str, limit: int) -> list[str]:
    """The original query first, then distinct rewrites, at most ``limit`` in all."""
    original = query.strip()
    candidates = [statement_form(original), keyword_form(original), focus_form(original)]
    variations = [original]
    seen = {word_key(original)}
    for candidate in candidates:
        key = word_key(candidate)
        if len(variations) >= limit:
            break
        if candidate and key and key not in seen and has_content(candidate):
            seen.add(key)
            variations.append(candidate)
    return variations


def statement_form(query: str) -> str:
    if not _LOOKS_LIKE_QUESTION.search(query):
        return ""
    text = _REQUEST_PREFIX.sub("", query.strip(), count=1)
    text = _QUESTION_PREFIX.sub("", text, count=1)
    return " ".join(text.rstrip(" ?!.").split())


def keyword_form(query: str) -> str:
    return " ".join(" ".join(phrase) for phrase in _content_phrases(query))


def focus_form(query: str) -> str:
    kept = [p for p in _content_phrases(query) if not all(w.lower() in _FRAMING_NOUNS for w in p)]
    return " ".join(" ".join(phrase) for phrase in kept)


def _content_phrases(query: str) -> list[list[str]]:
    return [[token.text for token in run] for run in content_runs(query)]


def content_runs(query: str) -> list[list[Token]]:
    """Runs of content words after the request framing, split at function words and clause
    punctuation; a quoted phrase is one run of its own, kept verbatim as one token."""
    runs: list[list[Token]] = []
    for segment in split_quoted(_REQUEST_PREFIX.sub("", query.strip(), count=1)):
        if segment.quoted:
            runs.append([Token(segment.text, sentence_initial=False, ends_clause=True)])
        else:
            runs.extend(_plain_runs(segment))
    return runs


def _plain_runs(segment: Segment) -> list[list[Token]]:
    runs: list[list[Token]] = []
    run: list[Token] = []
    for token in tokens(segment.text):
        if _is_content(token):
            run.append(token)
        elif run:
            runs.append(run)
            run = []
        if token.ends_clause and run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    return runs


def _is_content(token: Token) -> bool:
    return not token.is_function_word() and token.lower not in META_WORDS


def has_content(text: str) -> bool:
    return any(_is_content(t) for t in tokens(text))

"""Precise or exhaustive: how wide the candidate pools of a query should be.

Broad asks (overviews, summaries, comparisons, histories, lists, long multi-part questions)
need more candidates because their answer is spread over many passages; targeted facts
(short questions, identifiers, quoted phrases) are answered by a few, and a smaller pool keeps
noise out of fusion and reranking. Ties go to precise, the cheaper choice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.planner.plan import Strategy

# Phrasings that ask for breadth. "all"/"every" count only inside a listing request, because
# claims like "All stem cells divide" are targeted statements; likewise "compare" but not
# "X is higher compared to Y", a single finding.
_BROAD_CUES = re.compile(
    r"""\b(?:
        overview | summar(?:y|ies|ize|ise|izing|ising) | sum\s+up
      | compare | comparing | comparisons? | contrast | versus | vs\.?(?=\s)
      | differences?\s+between | pros\s+and\s+cons | advantages\s+and\s+disadvantages
      | (?:history|evolution|timeline|landscape|survey)\s+of
      | everything\s+(?:about|on|regarding)
      | (?:list|show|give|find|name|enumerate|collect|get)(?:\s+me)?\s+(?:all|every)
      | all\s+(?:the\s+|of\s+the\s+)?(?:ways|types|kinds|options|methods|examples|instances|mentions
            |references|times|cases|places|causes|reasons|steps|documents|notes|sources)
      | list\s+of | enumerate
      | (?:what|which)\s+are\s+(?:the|some|all|common|main|different|various|typical|known)\b
      | (?:what|which)\s+(?:kinds|types|sorts|categories)\s+of
      | (?:examples|categories)\s+of
      | ways\s+(?:to|of|in\s+which)
      | state\s+of\s+the\s+art | in\s+general | walk\s+me\s+through
    )\b""",
    re.IGNORECASE | re.VERBOSE,
)
# Open-ended asks: broad on their own only together with another sign (a long or multi-part
# query), since "explain what p53 does" still wants one fact.
_OPEN_ENDED = re.compile(
    r"""\b(?:
        tell\s+me\s+about | explain | describe | discuss | in\s+detail | in\s+depth
      | relationships?\s+(?:between|among) | what\s+do\s+we\s+know\s+about
    )\b""",
    re.IGNORECASE | re.VERBOSE,
)
_LEADING_LIST = re.compile(r"^\s*(?:please\s+)?list\s+(?:all|every|each|the|some|me|any)\b", re.IGNORECASE)
# Short questions of these shapes ask for one fact.
_FACTUAL_OPENER = re.compile(
    r"""^\s*(?:
        (?:who|when|where|which|whose|whom)\b
      | what\s+(?:is|was|does|did)\b
      | how\s+(?:many|much|long|old|often|far|big)\b
      | (?:is|are|was|were|does|do|did|can|has|have|had)\s
    )""",
    re.IGNORECASE | re.VERBOSE,
)
_CLAUSE_BREAK = re.compile(r"[,;]|\b(?:and|or|as\s+well\s+as|while|whereas|but)\b", re.IGNORECASE)
_NUMBER = re.compile(r"\b\d+(?:[.,]\d+)?\b")

LONG_QUERY_WORDS = 30
SHORT_QUERY_WORDS = 12
MULTI_CLAUSE_BREAKS = 3
MULTI_CLAUSE_MIN_WORDS = 16


@dataclass(frozen=True)
class StrategyChoice:
    strategy: Strategy
    # Why, for logs and for tuning the heuristics.
    reasons: tuple[str, ...]


def choose_strategy(query: str, has_specific_terms: bool) -> StrategyChoice:
    """``has_specific_terms``: the query holds an identifier, code or quoted phrase."""
    words = len(query.split())
    broad: dict[str, int] = {}
    precise: dict[str, int] = {}
    cue = _BROAD_CUES.search(query) or _LEADING_LIST.search(query)
    if cue:
        # An explicit ask for breadth wins over one precise sign ("compare IL-6 and IL-8").
        broad[f"cue:{' '.join(cue.group(0).lower().split())}"] = 2
    elif hint := _OPEN_ENDED.search(query):
        broad[f"open-ended:{' '.join(hint.group(0).lower().split())}"] = 1
    if words >= LONG_QUERY_WORDS:
        broad["long"] = 1
    if words >= MULTI_CLAUSE_MIN_WORDS and len(_CLAUSE_BREAK.findall(query)) >= MULTI_CLAUSE_BREAKS:
        broad["multi-clause"] = 1
    if query.count("?") >= 2:
        # Two questions may be one fact and a follow-up; three or more ask for a survey.
        broad["several questions"] = min(query.count("?") - 1, 2)
    if has_specific_terms or _NUMBER.search(query):
        precise["specific terms"] = 1
    if words <= SHORT_QUERY_WORDS and _FACTUAL_OPENER.search(query):
        precise["short factual question"] = 1
    broad_score, precise_score = sum(broad.values()), sum(precise.values())
    if broad_score >= 2 and broad_score > precise_score:
        return StrategyChoice(Strategy.EXHAUSTIVE, tuple(broad))
    return StrategyChoice(Strategy.PRECISE, tuple(precise) or ("default",))

"""The LLM planner: strategy, variations, keywords and (in fusion mode) a HyDE passage from one
structured LLM call, post-processed so a weak model cannot make a plan worse than the rules do.

The local model is tiny (SmolLM2-135M, ~2000 tokens per request), so the prompt is a few lines
and every list in the JSON schema is bounded (maxItems, maxLength): under guided decoding an
unbounded list loops until max_tokens. Parsing is lenient (over-long lists are capped here,
not rejected) and any LLMError, invalid output included, gives the deterministic plan with a
``Fallback`` saying why.

Post-processing rules:
- strategy: the caller's when fixed; else exhaustive when the model or the rules find the
  question broad, precise when both find it targeted. The rules catch explicit breadth cues
  ("overview", "compare", "list all") that the small model misses (greedy decoding favours the
  first enum value); the model may catch broad asks without such cues. A pool too small loses
  answers, one too large only costs time. The pool size follows the strategy.
- variations: the original query first, then the model's rewrites that share a content word
  with the query (the model echoes its instructions: "overview", "exhaustive"), then the
  deterministic rewrites to fill what is left; empty ones, ones over ``MAX_VARIATION_CHARS``,
  ones without a content word and repeats (same words, ignoring case and punctuation) are
  dropped.
- keywords: the deterministic quoted phrases and identifiers first (verbatim by construction;
  the model tends to mangle "ERR_CONN_RESET" or drop a quote), then the model's keywords that
  occur in the query as whole words (case-insensitive; kept in the query's own spelling, since
  the exact leg matches them verbatim), at most ``MAX_KEYWORD_WORDS`` words, not only function
  words. A keyword the query does not contain is a guess, and a guess in the exact leg only
  pulls in noise, so it is dropped.
- hyde: asked for only in fusion mode, trimmed to two sentences and dropped when it shares no
  content word with the query (see ``hyde.py``; fusion then asks once more, by plain chat).
- question (asked for only when the conversation has a user turn): the question condensed to
  stand alone, searched instead of the question as asked. It must keep every content word of
  the question, be at most ``MAX_QUESTION_CHARS`` long and not loop ("cluster cluster
  cluster..."); anything else is invalid output, and the deterministic plan (with its own
  follow-up rewrite, ``followup.py``) is given with a fallback. Every rule below then applies
  to the condensed question, not the one asked.
- sub_queries (asked for only for exhaustive questions: "compare X and Y", "list all...",
  "which ... support ..."): up to ``MAX_SUB_QUERIES`` simpler searches that together answer
  the question. They come right after the searched query among the variations (the gateway
  searches every variation on the dense leg and fuses the lists), kept under the same rules
  as the model's rewrites.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, WithJsonSchema, create_model

from meshkit.llm.factory import LLM, LLMError
from meshkit.text.answering import content_words
from services.planner import metrics
from services.planner.deterministic import DeterministicPlanner
from services.planner.hyde import MAX_PASSAGE_CHARS, on_topic, prompt_query, trim_passage
from services.planner.keywords import MAX_KEYWORD_CHARS, verbatim_keywords
from services.planner.plan import Fallback, HydeMode, PlanInput, RetrievalPlan, Strategy, Turn
from services.planner.text import collapse_spaces, tokens, word_key
from services.planner.variations import has_content, make_variations

log = logging.getLogger(__name__)

MAX_VARIATION_CHARS = 300
MAX_KEYWORD_WORDS = 5
# Schema bound on one keyword: long enough for a name or a code, short enough to stop a loop.
SCHEMA_KEYWORD_CHARS = 100
# Completion budget: the JSON frame, then per list entry; generous enough for the schema's
# maxLength bounds to be reached without cutting the JSON short.
BASE_TOKENS = 48
TOKENS_PER_VARIATION = 64
TOKENS_PER_KEYWORD = 16
HYDE_TOKENS = 112
QUESTION_TOKENS = 96
TOKENS_PER_SUB_QUERY = 48
# A condensed question: one sentence, a little longer than most questions.
MAX_QUESTION_CHARS = 300
MAX_SUB_QUERIES = 3
# The conversation in the prompt: the last few turns, each cut short (the small model's context
# is ~2000 tokens, and the last turns carry the topic).
PROMPT_TURNS = 4
PROMPT_TURN_CHARS = 240
# A condensed question longer than this many words that repeats most of them is a decoding loop.
LOOP_MIN_WORDS = 8

SYSTEM_PROMPT = "You turn a question into a search plan. Reply with JSON only."


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


_StrategyField = Annotated[Literal["precise", "exhaustive"], BeforeValidator(_lower)]
# Bounded in the schema sent to the server, not in validation: an over-long entry is dropped by
# post-processing instead of sinking the whole reply.
_VariationField = Annotated[str, WithJsonSchema({"type": "string", "maxLength": MAX_VARIATION_CHARS})]
_KeywordField = Annotated[str, WithJsonSchema({"type": "string", "maxLength": SCHEMA_KEYWORD_CHARS})]
_HydeField = Annotated[str, WithJsonSchema({"type": "string", "maxLength": MAX_PASSAGE_CHARS})]
_QuestionField = Annotated[str, WithJsonSchema({"type": "string", "maxLength": MAX_QUESTION_CHARS})]
# Asks for a comparison, an enumeration or every item with a property: several searches, one
# per part, find more of the answer than one. Bounded repetition only (linear time).
_DECOMPOSABLE = re.compile(
    r"""\b(?:
        compare | comparing | versus | vs\.? | differences?\s+between
      | (?:list|name|enumerate)\s+(?:all|every|each)
      | which\s+(?:[\w-]+\s+){0,4}(?:supports?|has|have|uses?|allows?|provides?|offers?|includes?)
    )(?!\w)""",
    re.IGNORECASE | re.VERBOSE,
)


@functools.lru_cache(maxsize=64)
def plan_schema(
    variations: int, keywords: int, hyde: bool, question: bool = False, sub_queries: int = 0
) -> type[BaseModel]:
    """The reply's JSON schema; only the fields this request needs, so the model writes no more."""
    fields: dict[str, Any] = {}
    if question:
        # First, so the rest of the plan is written for the condensed question.
        fields["question"] = (_QuestionField, ...)
    fields["strategy"] = (_StrategyField, ...)
    if sub_queries:
        fields["sub_queries"] = (
            list[_VariationField],
            Field(default_factory=list, json_schema_extra={"maxItems": sub_queries}),
        )
    if variations:
        fields["variations"] = (
            list[_VariationField],
            Field(json_schema_extra={"maxItems": variations}),
        )
    fields["keywords"] = (
        list[_KeywordField],
        Field(json_schema_extra={"maxItems": keywords}),
    )
    if hyde:
        fields["hyde"] = (_HydeField, ...)
    model: type[BaseModel] = create_model("SearchPlan", **fields)
    return model


def plan_messages(
    query: str,
    variations: int,
    keywords: int,
    hyde: bool,
    history: tuple[Turn, ...] = (),
    sub_queries: int = 0,
) -> list[dict[str, str]]:
    # Terse "key = what" lines: the small model copies whole instruction sentences into its
    # answer, and the fewer prompt tokens the more of the shared context is left to reply in.
    lines = []
    if history:
        lines.append("Conversation:")
        lines.extend(_prompt_turn(turn) for turn in history[-PROMPT_TURNS:])
    lines += [f"Question: {prompt_query(query)}", "Reply with JSON:"]
    if history:
        lines.append("question = the question rewritten to make sense without the conversation")
    lines.append('strategy = "precise" (one fact) or "exhaustive" (overview, list, comparison)')
    if sub_queries:
        lines.append(f"sub_queries = up to {sub_queries} simpler searches, one per thing compared or listed")
    if variations:
        lines.append(f"variations = the question reworded, {variations} ways")
    lines.append(f"keywords = up to {keywords} names or codes from the question")
    if hyde:
        lines.append("hyde = a short answer, 1-2 sentences")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]


def _prompt_turn(turn: Turn) -> str:
    text = collapse_spaces(turn.content[: PROMPT_TURN_CHARS * 2])
    if len(text) > PROMPT_TURN_CHARS:
        text = text[: PROMPT_TURN_CHARS - 1].rstrip() + "…"
    return f"{'User' if turn.user else 'Assistant'}: {text}"


class LLMPlanner:
    name = "llm"

    def __init__(self, llm: LLM, fallback: DeterministicPlanner, max_keywords: int, timeout_s: float) -> None:
        self.llm = llm
        self.fallback = fallback
        self.max_keywords = max_keywords
        self.timeout_s = timeout_s

    async def plan(self, request: PlanInput) -> RetrievalPlan:
        variations = request.max_variations - 1
        hyde = request.hyde_mode is HydeMode.FUSION
        history = tuple(request.history) if any(turn.user for turn in request.history) else ()
        sub_queries = self._sub_queries_wanted(request)
        schema = plan_schema(variations, self.max_keywords, hyde, bool(history), sub_queries)
        max_tokens = (
            BASE_TOKENS
            + TOKENS_PER_VARIATION * variations
            + TOKENS_PER_KEYWORD * self.max_keywords
            + (HYDE_TOKENS if hyde else 0)
            + (QUESTION_TOKENS if history else 0)
            + TOKENS_PER_SUB_QUERY * sub_queries
        )
        messages = plan_messages(request.query, variations, self.max_keywords, hyde, history, sub_queries)
        try:
            reply = await self.llm.structured(messages, schema, max_tokens=max_tokens, timeout=self.timeout_s)
            return self.post_process(request, reply.model_dump())
        except LLMError as exc:
            return self._fall_back(request, exc)

    def _sub_queries_wanted(self, request: PlanInput) -> int:
        """How many sub-queries to ask for: some only for an exhaustive question, and no more
        than the variations left after the searched query."""
        room = min(MAX_SUB_QUERIES, request.max_variations - 1)
        if room <= 0:
            return 0
        broad = (request.strategy or self.fallback.choose_strategy(request.query)) is Strategy.EXHAUSTIVE
        return room if broad or _DECOMPOSABLE.search(request.query) else 0

    def _sub_queries(self, request: PlanInput, query: str, reply: dict[str, Any]) -> list[str]:
        """The model's distinct, on-topic sub-queries, no more than were asked for (the model
        may write more than the schema allows)."""
        found: dict[str, str] = {}
        for text in _texts(reply.get("sub_queries")):
            if on_topic(text, query):
                found.setdefault(word_key(text), text)
        return list(found.values())[: self._sub_queries_wanted(request)]

    def post_process(self, request: PlanInput, reply: dict[str, Any]) -> RetrievalPlan:
        """The plan from the model's reply; raises LLMError (invalid_output) when its condensed
        question cannot be used."""
        query = request.query
        if "question" in reply:
            query = standalone_question(query, reply["question"])
        strategy = request.strategy or self._strategy(request.query, Strategy(reply["strategy"]))
        passage = trim_passage(_text(reply.get("hyde"))) if request.hyde_mode is HydeMode.FUSION else ""
        if not on_topic(passage, query):
            passage = ""
        rewrites = [*self._sub_queries(request, query, reply), *_texts(reply.get("variations"))]
        return RetrievalPlan(
            strategy=strategy,
            pool_size=self.fallback.pools.for_strategy(strategy),
            variations=tuple(_variations(query, rewrites, request.max_variations)),
            hard_keywords=tuple(self._keywords(query, _texts(reply.get("keywords")))),
            hyde_passage=passage,
            hyde_mode=HydeMode.FUSION if passage else HydeMode.OFF,
            planner=self.name,
        )

    def _strategy(self, query: str, suggested: Strategy) -> Strategy:
        # The question as asked: a condensed one may drop the cue ("compare") the rules look for.
        if suggested is Strategy.EXHAUSTIVE:
            return suggested
        return self.fallback.choose_strategy(query)

    def _fall_back(self, request: PlanInput, exc: LLMError) -> RetrievalPlan:
        metrics.FALLBACKS.labels(exc.reason).inc()
        log.warning(
            "llm plan failed, deterministic plan given", extra={"reason": exc.reason, "error": exc.message}
        )
        plan = self.fallback.plan_sync(request)
        return dataclasses.replace(plan, fallback=Fallback(exc.reason, exc.message))

    def _keywords(self, query: str, suggested: list[str]) -> list[str]:
        result = verbatim_keywords(query, self.max_keywords)
        seen = {k.lower() for k in result}
        for keyword in suggested:
            found = _in_query(query, keyword)
            if len(result) >= self.max_keywords:
                break
            if found and found.lower() not in seen and _usable_keyword(found):
                seen.add(found.lower())
                result.append(found)
        return result


def standalone_question(query: str, condensed: Any) -> str:
    """The model's condensed form of ``query``, checked; raises LLMError (invalid_output) when
    it is empty, too long, loops or lost a content word of the question."""
    text = collapse_spaces(_text(condensed).strip(" \t\n\"'\u201c\u201d"))
    text = re.sub(r"^(?:standalone\s+)?question\s*:\s*", "", text, count=1, flags=re.IGNORECASE)
    if not text:
        raise LLMError("invalid_output", "the model wrote no standalone question")
    if len(text) > MAX_QUESTION_CHARS:
        raise LLMError("invalid_output", f"the standalone question is over {MAX_QUESTION_CHARS} characters")
    words = [t.lower for t in tokens(text)]
    if len(words) > LOOP_MIN_WORDS and len(set(words)) * 2 < len(words):
        raise LLMError("invalid_output", "the standalone question repeats itself")
    lost = content_words(query) - content_words(text)
    if lost:
        raise LLMError("invalid_output", f"the standalone question lost {len(lost)} word(s) of the question")
    return text


def _variations(query: str, rewrites: list[str], limit: int) -> list[str]:
    original = query.strip()
    result = [original]
    seen = {word_key(original)}
    model_rewrites = [r for r in rewrites if on_topic(r, original)]
    for candidate in [*model_rewrites, *make_variations(original, limit)[1:]]:
        if len(result) >= limit:
            break
        key = word_key(candidate)
        if key and key not in seen and len(candidate) <= MAX_VARIATION_CHARS and has_content(candidate):
            seen.add(key)
            result.append(candidate)
    return result


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _texts(value: Any) -> list[str]:
    return [collapse_spaces(v) for v in value or [] if isinstance(v, str) and v.strip()]


def _in_query(query: str, keyword: str) -> str:
    """``keyword`` as the query spells it, when the query holds it as whole words; "" if not."""
    words = keyword.strip(" \"'`").split()
    # Found words are spelt as the keyword's, so one too long for _usable_keyword is dropped
    # here, before its pattern is built: the search costs the query's length times the pattern's.
    joined = " ".join(words)
    if not words or len(joined) > MAX_KEYWORD_CHARS or len(tokens(joined)) > MAX_KEYWORD_WORDS:
        return ""
    pattern = r"(?<!\w)" + r"\s+".join(re.escape(w) for w in words) + r"(?!\w)"
    match = re.search(pattern, query, re.IGNORECASE)
    return collapse_spaces(match.group(0)) if match else ""


def _usable_keyword(keyword: str) -> bool:
    words = tokens(keyword)
    return (
        len(keyword) <= MAX_KEYWORD_CHARS
        and len(words) <= MAX_KEYWORD_WORDS
        and any(not t.is_function_word() for t in words)
    )

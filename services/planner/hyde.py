"""HyDE: a short hypothetical passage that answers the query, searched with as one more dense
query (Gao et al., 2022), so a question still finds content written in other words.

When is HyDE served (the rule the servicer applies):
- An LLM is *configured* when ``build_spec`` is given one, or when the settings ask for one
  (``planner_mode=llm`` or ``planner_hyde_mode`` not ``off``); ``make_llm`` then builds it.
  Without one nothing here runs: every plan says HyDE is off, whatever was asked, and the
  Hyde RPC answers FAILED_PRECONDITION. A request cannot conjure an LLM the operator did not
  configure (and tests stay hermetic: nothing dials a default address unasked).
- The mode is the request's ``hyde_mode``, else ``planner_hyde_mode``.
- ``off``: no passage. ``supplement``: no passage in the plan; the gateway asks the Hyde RPC
  later, only when its first results are weak. ``fusion``: the plan carries a passage. The LLM
  planner writes it in its one structured call; the deterministic planner (or an LLM plan that
  came without a usable one) gets it from one plain chat call, which the small model handles
  better than JSON. This is how deterministic mode still serves HyDE.
- A fusion plan says ``fusion`` only with a passage in hand. When none could be written, it
  says ``off``: the LLM failed on this very query, so the gateway should not wait on it again.
  No second call is made when the first showed the LLM unreachable (unavailable, deadline,
  breaker open) or when too little of ``planner_llm_timeout_s`` is left: that setting bounds
  the LLM work of one Plan request as a whole.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time

from meshkit.llm.factory import LLM, LLMError
from meshkit.text.answering import content_words, split_sentences
from services.planner import metrics
from services.planner.plan import HydeMode, PlanInput, Planner, RetrievalPlan

log = logging.getLogger(__name__)

MAX_PASSAGE_SENTENCES = 2
# About two long sentences; a bound on what is embedded, whatever the model writes.
MAX_PASSAGE_CHARS = 400
HYDE_MAX_TOKENS = 96
# Below this, a second LLM call for the passage would be cut off before it could finish.
MIN_HYDE_SECONDS = 1.0
# The question as a prompt shows it: a long one (the gateway takes a paragraph or a page) is cut
# to its opening, about 500 tokens, so the small model's ~2000-token context keeps room to reply.
PROMPT_QUERY_CHARS = 2000
# Reasons that say the LLM cannot answer right now, not that it answered badly.
UNREACHABLE = frozenset({"unavailable", "deadline", "breaker_open"})

_LABEL = re.compile(r"^\s*(?:(?:hypothetical\s+)?passage|answer)\s*:\s*", re.IGNORECASE)
_WRAPPING = " \t\n\"'\u201c\u201d"
_TERMINAL = re.compile(r"[.!?][\"')\]\u201d\u2019]*$")


def resolve_hyde_mode(requested: HydeMode | None, default: str, llm_configured: bool) -> HydeMode:
    if not llm_configured:
        return HydeMode.OFF
    return requested if requested is not None else HydeMode(default)


def on_topic(text: str, query: str) -> bool:
    """``text`` shares a content word with ``query``. The small model often echoes its
    instructions ("a short answer") or drifts; a rewrite or passage about the query names some
    of it. A query without content words leaves nothing to check."""
    wanted = content_words(query)
    return not wanted or bool(wanted & content_words(text))


def trim_passage(text: str) -> str:
    """At most two whole sentences of ``text`` and ``MAX_PASSAGE_CHARS``, without a label
    ("Answer:") or wrapping quotes; "" when nothing is left."""
    text = " ".join(_LABEL.sub("", text.strip(_WRAPPING), count=1).split()).strip(_WRAPPING)
    sentences = split_sentences(text)
    if len(sentences) > 1 and not _TERMINAL.search(sentences[-1]):
        # The model ran out of tokens mid-sentence: a fragment reads as noise to the embedder.
        sentences.pop()
    passage = " ".join(sentences[:MAX_PASSAGE_SENTENCES])
    if len(passage) <= MAX_PASSAGE_CHARS:
        return passage
    cut = passage[: MAX_PASSAGE_CHARS + 1]
    space = cut.rfind(" ")
    return cut[:space] if space > 0 else passage[:MAX_PASSAGE_CHARS]


class HydeWriter:
    """One plain chat call for a passage; raises LLMError (invalid_output when the model wrote
    nothing usable)."""

    def __init__(self, llm: LLM, timeout_s: float) -> None:
        self.llm = llm
        self.timeout_s = timeout_s

    async def write(self, query: str, timeout_s: float | None = None) -> str:
        reply = await self.llm.chat(
            hyde_messages(query),
            max_tokens=HYDE_MAX_TOKENS,
            timeout=timeout_s if timeout_s is not None else self.timeout_s,
        )
        passage = trim_passage(reply)
        if not passage:
            raise LLMError("invalid_output", "the model wrote no passage", raw=reply)
        if not on_topic(passage, query):
            raise LLMError("invalid_output", "the passage shares no word with the query", raw=reply)
        return passage


def prompt_query(query: str) -> str:
    """``query`` as a prompt quotes it: stripped, and cut to PROMPT_QUERY_CHARS."""
    text = query.strip()
    if len(text) <= PROMPT_QUERY_CHARS:
        return text
    return text[: PROMPT_QUERY_CHARS - 1].rstrip() + "\u2026"


def hyde_messages(query: str) -> list[dict[str, str]]:
    return [
        {
            "role": "user",
            "content": "Write one or two sentences that answer the question, as a passage in a "
            f"document would. No preamble.\n\nQuestion: {prompt_query(query)}",
        }
    ]


class WithHyde:
    """Wraps a planner so the plan's HyDE fields say what the gateway should do (the rule in
    the module docstring). Used only when an LLM is configured."""

    def __init__(self, planner: Planner, writer: HydeWriter) -> None:
        self.planner = planner
        self.writer = writer
        self.name = planner.name

    async def plan(self, request: PlanInput) -> RetrievalPlan:
        started = time.monotonic()
        plan = await self.planner.plan(request)
        mode = request.hyde_mode or HydeMode.OFF
        if mode is not HydeMode.FUSION:
            return dataclasses.replace(plan, hyde_mode=mode, hyde_passage="")
        passage = plan.hyde_passage
        if passage:
            metrics.HYDE.labels("plan", "ok").inc()
        else:
            passage = await self._fresh_passage(plan.searched_query, plan, time.monotonic() - started)
        mode = HydeMode.FUSION if passage else HydeMode.OFF
        return dataclasses.replace(plan, hyde_mode=mode, hyde_passage=passage)

    async def _fresh_passage(self, query: str, plan: RetrievalPlan, elapsed_s: float) -> str:
        left = self.writer.timeout_s - elapsed_s
        if (plan.fallback and plan.fallback.reason in UNREACHABLE) or left < MIN_HYDE_SECONDS:
            metrics.HYDE.labels("plan", "skipped").inc()
            return ""
        try:
            passage = await self.writer.write(query, timeout_s=left)
        except LLMError as exc:
            metrics.HYDE.labels("plan", exc.reason).inc()
            log.warning("no HyDE passage, fusion off", extra={"reason": exc.reason, "error": exc.message})
            return ""
        metrics.HYDE.labels("plan", "ok").inc()
        return passage

"""The fact extractor (services/extractor)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from meshkit.settings.llm import LLMSettings


class ExtractorSettings(LLMSettings):
    """The fact extractor: the map step of answering."""

    extractor_mode: Literal["llm", "extractive"] = Field(
        "llm", description="Default mode: llm (extractive per batch when it fails) or extractive."
    )
    extractor_batch_size: int = Field(10, ge=1, description="Passages per LLM call (the seeds use 10).")
    extractor_max_batch_size: int = Field(20, ge=1, description="Largest batch_size a caller may ask for.")
    extractor_llm_concurrency: int = Field(
        2, ge=1, description="LLM calls in flight per request (match the LLM server's parallel slots)."
    )
    extractor_max_passages: int = Field(100, ge=1, description="Passages one Extract call may carry.")
    extractor_max_passage_chars: int = Field(32_768, ge=1, description="Longest passage, in characters.")
    extractor_max_query_chars: int = Field(2000, ge=1, description="Longest query, in characters.")
    extractor_passage_chars_in_prompt: int = Field(
        1200, ge=100, description="Characters of each passage shown to the LLM (its context is small)."
    )
    extractor_prompt_chars: int = Field(
        4800,
        ge=500,
        description="Characters of passages (or facts) in one LLM prompt, all together: each passage gets "
        "the smaller of its share and extractor_passage_chars_in_prompt (SmolLM2 has ~2000 tokens per slot).",
    )
    extractor_max_facts: int = Field(20, ge=1, description="Facts returned when the caller asks for 0.")
    extractor_facts_per_source: int = Field(
        1, ge=1, description="Facts kept per document after dedup (the seeds keep the best one)."
    )
    extractor_relevance_gate: bool = Field(
        True, description="Ask the LLM which facts bear on the question (with the seeds' keep-rules)."
    )
    extractor_context_budget_tokens: int = Field(
        1500, ge=100, description="Estimated tokens the facts may take; over it they are summarised."
    )
    extractor_max_summary_rounds: int = Field(
        3, ge=1, description="Summarisation rounds before the lowest-scored facts are dropped to fit."
    )
    extractor_sentences_per_passage: int = Field(
        2, ge=1, description="Extractive mode: best sentences taken from each passage."
    )
    extractor_max_tokens: int = Field(400, ge=16, description="Completion limit of one extraction call.")

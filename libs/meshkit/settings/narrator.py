"""The narrator (services/narrator)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from meshkit.settings.llm import LLMSettings


class NarratorSettings(LLMSettings):
    """The narrator: the reduce step, cited synthesis and verification."""

    narrator_mode: Literal["llm", "extractive"] = Field(
        "llm", description="Default mode: llm (extractive when it fails) or extractive."
    )
    narrator_max_query_chars: int = Field(2000, ge=1, description="Longest query, in characters.")
    narrator_max_sources: int = Field(100, ge=1, description="Sources one request may carry.")
    narrator_max_facts: int = Field(100, ge=1, description="Facts one request may carry.")
    narrator_max_fact_chars: int = Field(4000, ge=1, description="Longest fact, in characters.")
    narrator_max_snippet_chars: int = Field(2000, ge=1, description="Longest source snippet, in characters.")
    narrator_max_history_turns: int = Field(20, ge=0, description="Most chat-history turns accepted.")
    narrator_max_history_chars: int = Field(32_000, ge=0, description="Longest history accepted, in total.")
    narrator_history_prompt_chars: int = Field(
        2000, ge=0, description="History shown to the LLM: the most recent turns that fit."
    )
    narrator_max_tokens: int = Field(300, ge=16, description="Completion limit of the answer.")
    narrator_max_tokens_limit: int = Field(2048, ge=16, description="Largest max_tokens a caller may ask.")
    narrator_extractive_facts: int = Field(
        3, ge=1, description="Facts an extractive answer states (the best ones, each cited)."
    )
    narrator_min_support: float = Field(
        0.4,
        ge=0,
        le=1,
        description="Share of a sentence's content words that must appear in the facts it cites; less is "
        "unsupported and dropped.",
    )
    narrator_bind_support: float = Field(
        0.5,
        ge=0,
        le=1,
        description="An uncited sentence is bound to the source whose facts hold this share of its content "
        "words (the best one); less and it is dropped as uncited.",
    )
    narrator_contradictions: bool = Field(
        True, description="Ask the LLM whether the cited sources disagree (one more call)."
    )
    narrator_prompt_fact_chars: int = Field(
        4000,
        ge=100,
        description="Facts shown to the LLM, in characters: the best that fit (small models have small "
        "contexts); verification still checks against every fact.",
    )

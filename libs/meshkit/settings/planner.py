"""The planner service (services/planner)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from meshkit.settings.llm import LLMSettings


class PlannerSettings(LLMSettings):
    planner_mode: Literal["deterministic", "llm"] = Field(
        "deterministic",
        description="llm: variations, keywords, strategy and HyDE from the LLM tier, falling back to the "
        "deterministic plan on any failure.",
    )
    planner_hyde_mode: Literal["off", "fusion", "supplement"] = Field(
        "off",
        description="Default HyDE mode (needs an LLM): fusion always searches with a hypothetical passage, "
        "supplement only when the plain search is weak.",
    )
    planner_llm_timeout_s: float = Field(
        8.0, gt=0, description="Longest wait for the LLM's plan or HyDE passage before falling back."
    )
    planner_precise_pool: int = Field(50, ge=1, description="Candidates per leg, precise plans.")
    planner_exhaustive_pool: int = Field(80, ge=1, description="Candidates per leg, exhaustive plans.")
    planner_default_variations: int = Field(
        3,
        ge=1,
        description="Dense queries of an LLM plan when the caller asks for 0 (the original counts; 1: only "
        "it): the LLM's rephrasings and sub-queries of exhaustive questions.",
    )
    planner_deterministic_variations: int = Field(
        1,
        ge=1,
        description="Dense queries of a deterministic plan when the caller asks for 0. Its rule-based "
        "rephrasings matched the question alone within noise on SciFact train and the grpc-docs questions "
        "(docs/BENCHMARKS.md) at twice or three times the embedding and index work.",
    )
    planner_max_variations: int = Field(8, ge=1, description="Largest max_variations a caller may ask for.")
    planner_max_keywords: int = Field(8, ge=1, description="Most hard keywords in one plan.")
    planner_max_query_chars: int = Field(
        16_000, ge=1, description="Longest query accepted, in characters (>= the gateway's)."
    )
    planner_max_history_turns: int = Field(
        20, ge=0, description="Most conversation turns in a Plan request (keep >= the gateway's)."
    )
    planner_max_history_chars: int = Field(
        32_000,
        ge=0,
        description="Longest conversation in a Plan request, all turns together (keep >= the gateway's).",
    )

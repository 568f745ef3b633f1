"""Prometheus metrics of the extractor's own work (RPC counts and client calls come from meshkit,
LLM latency and tokens from meshkit.llm.openai_compat)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

FACTS = Counter(
    "ragmesh_extractor_facts", "Facts returned, by origin (llm, extractive, snippet, summary).", ["origin"]
)
ISSUES = Counter("ragmesh_extractor_issues", "Problems that did not stop an extraction, by kind.", ["kind"])
LLM_CALLS = Counter(
    "ragmesh_extractor_llm_calls",
    "LLM calls by purpose (map, gate, summary) and outcome (ok or the LLMError reason).",
    ["purpose", "outcome"],
)
FALLBACKS = Counter(
    "ragmesh_extractor_fallbacks",
    "Work done the degraded way, by reason: a batch answered extractively (the LLMError reason, "
    "or skipped when the LLM was given up) and lexical scoring when the embedder failed (embedder).",
    ["reason"],
)
GATED_OUT = Counter("ragmesh_extractor_gated_out", "Facts dropped by the relevance gate.")
REQUEST_SECONDS = Histogram(
    "ragmesh_extractor_request_seconds",
    "Extract latency, by the mode actually used (llm, extractive).",
    ["mode"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
)

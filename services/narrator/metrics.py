"""Prometheus metrics of the narrator's own work (RPC counts come from meshkit)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

ANSWERS = Counter(
    "ragmesh_narrator_answers_total",
    "Answers given, by the mode actually used and whether the evidence answered the question.",
    ["mode", "answered"],
)
SENTENCES_REJECTED = Counter(
    "ragmesh_narrator_sentences_rejected_total",
    "Sentences of the model's answer that verification dropped, by reason.",
    ["reason"],
)
FALLBACKS = Counter(
    "ragmesh_narrator_fallbacks_total",
    "LLM answers replaced by the extractive one, by the LLM error reason.",
    ["reason"],
)
CONTRADICTION_CHECKS = Counter(
    "ragmesh_narrator_contradiction_checks_total",
    "Contradiction checks, by outcome (found, none, skipped: too little time left).",
    ["outcome"],
)
FIRST_DELTA_SECONDS = Histogram(
    "ragmesh_narrator_first_delta_seconds",
    "From the request to the first streamed text of the LLM's answer.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30),
)
REQUEST_SECONDS = Histogram(
    "ragmesh_narrator_request_seconds",
    "Time to the final answer, by the mode actually used.",
    ["mode"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60),
)
LOOPS_STOPPED = Counter(
    "ragmesh_narrator_loops_stopped_total",
    "LLM answers stopped early because they began repeating themselves.",
)
DEGENERATE_HELD_BACK = Counter(
    "ragmesh_narrator_degenerate_held_back_total",
    "Looping phrases (degenerate generation) held back from the streamed text; their sentences "
    "are dropped from the answer.",
)

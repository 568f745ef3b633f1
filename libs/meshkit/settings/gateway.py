"""The gateway (services/gateway): search, ask, the evidence gate."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr

from meshkit.settings.mesh import MeshSettings
from meshkit.settings.model_calibration import ModelCalibration, load_model_calibration


class GatewaySettings(MeshSettings):
    gateway_max_query_chars: int = Field(16_000, ge=1, description="Longest query accepted, in characters.")
    gateway_max_top_k: int = Field(100, ge=1, description="Largest top_k accepted.")
    gateway_max_variations: int = Field(8, ge=1, description="Largest max_variations accepted.")
    gateway_max_pool_size: int = Field(
        1000, ge=1, description="Largest candidate pool per leg (keep <= the index and sparse max top_k)."
    )
    gateway_max_doc_ids: int = Field(
        10_000, ge=1, description="Most doc_ids in a search filter (keep <= the sparse and index limits)."
    )
    gateway_max_keywords: int = Field(32, ge=1, description="Most plan keywords sent to the exact leg.")
    gateway_rrf_k: int = Field(
        10, ge=1, description="Default RRF constant k (SciFact train: 10 beat the classic 60 by 0.013)."
    )
    gateway_weight_dense: float = Field(1.0, ge=0, description="Default RRF weight of the dense leg.")
    gateway_weight_bm25: float = Field(1.0, ge=0, description="Default RRF weight of the BM25 leg.")
    gateway_weight_exact: float = Field(
        0.4, ge=0, description="Default RRF weight of the exact leg (tuned on SciFact train)."
    )
    gateway_dense_combine: Literal["rrf", "max"] = Field(
        "rrf", description="How the dense leg merges its query variations: RRF of ranks or max cosine."
    )
    gateway_planner: Literal["auto", "local", "service"] = Field(
        "auto",
        description="Where plans are made. local: the deterministic planner runs in the gateway process "
        "(no network hop; pool sizes, keyword and variation counts from the RAGMESH_PLANNER_* settings the "
        "gateway sees), and only requests asking for HyDE go to the planner service; service: every plan "
        "from the planner service (BM25 and the question's dense search start while it plans); auto: service "
        "when those settings configure an LLM (RAGMESH_PLANNER_MODE=llm or RAGMESH_PLANNER_HYDE_MODE not "
        "off), else local.",
    )
    gateway_planner_timeout_s: float = Field(
        2.0, gt=0, description="Longest wait for a plan (also capped to a share of the caller's deadline)."
    )
    gateway_finish_reserve_s: float = Field(
        0.1, ge=0, description="Deadline time kept back from the legs for fusion and hydration."
    )
    gateway_hydrate_sparse_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Share of the time left when hydration starts that the sparse service's GetChunks "
        "may take; when it fails or is late the rest goes to the index shards' stored payload (a "
        "degradation with fallback INDEX_PAYLOAD).",
    )
    gateway_rerank: bool = Field(
        True, description="Rerank fused candidates by default (per request: rerank)."
    )
    gateway_rerank_candidates_precise: int = Field(
        35, ge=1, description="Candidates reranked, precise plans."
    )
    gateway_rerank_candidates_exhaustive: int = Field(
        60, ge=1, description="Candidates reranked, exhaustive plans."
    )
    gateway_max_rerank_candidates: int = Field(
        200, ge=1, description="Largest rerank_candidates accepted (keep <= reranker_max_passages)."
    )
    gateway_rerank_share: float = Field(
        0.6, gt=0, le=1, description="Share of the caller's deadline kept from the legs for reranking."
    )
    gateway_hyde_min_results: int = Field(
        3, ge=0, description="Supplement HyDE: a plain search with fewer results than this is weak."
    )
    gateway_answer_mode: Literal["llm", "extractive"] = Field(
        "llm", description="Default Ask mode: llm (extractive when the LLM fails) or extractive."
    )
    gateway_ask_passages: int = Field(10, ge=1, description="Passages read for evidence by default.")
    gateway_ask_max_passages: int = Field(50, ge=1, description="Largest passages an Ask may ask for.")
    gateway_ask_sentence_check: bool = Field(
        True,
        description="Score the passages' sentences against the question and the answer's sentences against "
        "their citations with the reranker's cross-encoder (the evidence gate, extractive answers, support "
        "checks); off or reranker down: the lexical checks alone, with a reranker degradation.",
    )
    gateway_ask_sentence_passages: int = Field(
        6, ge=1, description="Passages (best first) whose sentences the cross-encoder scores for an Ask."
    )
    gateway_ask_sentence_pairs: int = Field(
        48,
        ge=1,
        description="Most (question, sentence) pairs scored per Ask; over it, the sentences sharing most "
        "words with the question are kept. Bounds the cost: ~1 s per 60 pairs per CPU core.",
    )
    gateway_ask_llm_cite_strongest: bool = Field(
        True,
        description="LLM mode: an answer that, after the support check, cites none of the passages the "
        "judged extractive answer would cite is replaced by that answer (narrator invalid_output "
        "degradation). Turn off for an LLM that is trusted to weigh the evidence itself.",
    )
    gateway_ask_max_facts: int = Field(10, ge=1, description="Most facts an Ask passes on and returns.")
    gateway_ask_max_cited: int = Field(2, ge=1, description="Most passages an extractive answer cites.")
    gateway_ask_sentences_per_passage: int = Field(
        2, ge=1, description="Most sentences an extractive answer states from one passage."
    )
    gateway_ask_support_pairs: int = Field(
        16, ge=1, description="Passage sentences scored per answer sentence or fact in the support check."
    )
    gateway_ask_timeout_s: float = Field(120.0, gt=0, description="Deadline of an Ask whose caller set none.")
    gateway_ask_search_share: float = Field(
        0.35, gt=0, lt=1, description="Share of an Ask's deadline the search (plan to rerank) may use."
    )
    gateway_ask_extract_share: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Share of what is left after the search for extraction; narration gets the rest.",
    )
    gateway_max_history_turns: int = Field(20, ge=0, description="Most chat-history turns in an Ask.")
    gateway_max_history_chars: int = Field(
        32_000, ge=0, description="Longest chat history in an Ask, all turns together."
    )
    gateway_legacy_path_segments: str = Field(
        "",
        description="Comma-separated source path segments (e.g. legacy,v1-archive) that mark a page as "
        "legacy: its results rank after the current ones returned with them. Front matter deprecated: "
        "true, legacy: true or status: deprecated/legacy/archived marks a page so whatever this says.",
    )
    gateway_collection_cache_s: float = Field(
        2.0,
        gt=0,
        description="Seconds a collection record (its embedder and serving generation, read from NATS KV) "
        "is reused before it is read again: a reindex switch reaches every gateway within this.",
    )
    gateway_max_request_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest inbound request message (the largest legal one, 10k doc_ids and a full history, "
        "is ~3 MiB); larger gets RESOURCE_EXHAUSTED before it is parsed.",
    )
    gateway_model_calibration_file: str = Field(
        "",
        description="JSON file of the models' calibration (thresholds in the cross-encoder's log-odds and "
        "the embedder's cosines; meshkit.settings.model_calibration). Empty: the shipped models' values. "
        "`ragmesh config --calibration` prints the one in force.",
    )

    # The calibration in force, read from gateway_model_calibration_file once.
    _calibration: ModelCalibration | None = PrivateAttr(default=None)

    @property
    def calibration(self) -> ModelCalibration:
        if self._calibration is None:
            self._calibration = load_model_calibration(self.gateway_model_calibration_file)
        return self._calibration

    def with_calibration(self, **changes: Any) -> GatewaySettings:
        """These settings with some of the calibration's values changed (the tuning tools, tests)."""
        copy = self.model_copy()
        copy._calibration = ModelCalibration(**{**self.calibration.model_dump(), **changes})
        return copy

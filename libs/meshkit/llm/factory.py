"""The LLM tier as the answering stages see it: the ``LLM`` protocol (chat, structured, stream),
``LLMError`` with a typed reason (unavailable, deadline, breaker_open, error, invalid_output),
which callers turn into a degradation (skip the LLM stage), and ``make_llm``, which picks the
configured backend: an OpenAI-compatible server (meshkit.llm.openai_compat, the default) or an
in-process vLLM engine (meshkit.llm.vllm). Parsing a model's reply into JSON or a validated
schema is meshkit.llm.replies.
"""

from __future__ import annotations

from meshkit.llm.common import LLM as LLM
from meshkit.llm.common import LLMError as LLMError
from meshkit.llm.common import Messages as Messages
from meshkit.llm.common import ModelT as ModelT
from meshkit.settings import LLMSettings


def make_llm(settings: LLMSettings, *, target: str = "llm") -> LLM:
    """The configured LLM backend: an OpenAI-compatible server (default) or, on GPU images, an
    in-process vLLM engine (each imported only when configured, so CPU installs never need vllm)."""
    if settings.llm_backend == "vllm":
        from meshkit.llm.vllm import VLLMEngineLLM

        return VLLMEngineLLM(settings)
    from meshkit.llm.openai_compat import OpenAICompatibleLLM

    return OpenAICompatibleLLM(settings, target=target)

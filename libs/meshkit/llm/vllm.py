"""The in-process vLLM backend of the LLM tier (``RAGMESH_LLM_BACKEND=vllm``), for GPU images:
the extractor or narrator process owns the engine instead of calling a vLLM server over HTTP.

vllm is a CUDA-only wheel that pins its own torch, so it is imported here, only when this
backend is configured; CPU installs and CI never load this module. The engine applies the
model's chat template, streams text as it is decoded, and constrains structured replies to
the JSON schema with its own structured-output support; failures surface as ``LLMError``
like the HTTP backend's, so callers degrade the same way.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from meshkit.llm.common import LLMError, Messages, ModelT
from meshkit.llm.replies import parse_structured
from meshkit.rpc.client import remaining_budget
from meshkit.settings import LLMSettings

log = logging.getLogger("meshkit.llm.vllm")

_request_ids = itertools.count()


def _import_vllm() -> Any:
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise LLMError(
            "unavailable",
            "RAGMESH_LLM_BACKEND=vllm needs the vllm package (GPU images: docker/Dockerfile.llm); "
            "on CPU use the default openai backend with an OpenAI-compatible server",
        ) from exc


def _json_constraint(schema: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams keywords that constrain the output to ``schema``: the structured-outputs
    API of recent vLLM releases, guided decoding on older ones."""
    params = importlib.import_module("vllm.sampling_params")
    if hasattr(params, "StructuredOutputsParams"):
        return {"structured_outputs": params.StructuredOutputsParams(json=schema)}
    return {"guided_decoding": params.GuidedDecodingParams(json=schema)}


class VLLMEngineLLM:
    """The ``meshkit.llm.factory.LLM`` protocol over an in-process ``AsyncLLMEngine``."""

    def __init__(self, settings: LLMSettings) -> None:
        if not settings.llm_vllm_model:
            raise LLMError("error", "RAGMESH_LLM_VLLM_MODEL must name the model to load")
        self.settings = settings
        self._vllm = _import_vllm()
        args = self._vllm.AsyncEngineArgs(
            model=settings.llm_vllm_model,
            gpu_memory_utilization=settings.llm_vllm_gpu_memory_utilization,
            max_model_len=settings.llm_vllm_max_model_len,
        )
        self.engine = self._vllm.AsyncLLMEngine.from_engine_args(args)
        self._tokenizer: Any = None

    async def aclose(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()

    async def chat(
        self,
        messages: Messages,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> str:
        return "".join(
            [
                d
                async for d in self.stream(
                    messages, max_tokens=max_tokens, temperature=temperature, timeout=timeout
                )
            ]
        )

    async def structured(
        self,
        messages: Messages,
        schema: type[ModelT],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> ModelT:
        constraint = _json_constraint(schema.model_json_schema())
        text = "".join(
            [
                d
                async for d in self._generate(
                    messages,
                    max_tokens=max_tokens,
                    temperature=temperature,
                    timeout=timeout,
                    extra=constraint,
                )
            ]
        )
        return parse_structured(text, schema)

    def stream(
        self,
        messages: Messages,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[str]:
        return self._generate(
            messages, max_tokens=max_tokens, temperature=temperature, timeout=timeout, extra={}
        )

    async def _prompt(self, messages: Messages) -> str:
        if self._tokenizer is None:
            self._tokenizer = await self.engine.get_tokenizer()
        prompt: str = self._tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
        )
        return prompt

    async def _generate(
        self,
        messages: Messages,
        *,
        max_tokens: int | None,
        temperature: float | None,
        timeout: float | None,
        extra: dict[str, Any],
    ) -> AsyncIterator[str]:
        """Text deltas of one generation; the engine reports cumulative text, so each step
        yields what is new. The deadline caps the whole generation and aborts it in the engine."""
        deadline = time.monotonic() + remaining_budget(
            timeout if timeout is not None else self.settings.llm_timeout_s
        )
        sampling = self._vllm.SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else self.settings.llm_max_tokens,
            temperature=temperature if temperature is not None else self.settings.llm_temperature,
            **extra,
        )
        request_id = f"ragmesh-{next(_request_ids)}"
        sent = 0
        outputs = self.engine.generate(await self._prompt(messages), sampling, request_id)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LLMError("deadline", "the generation outlived the deadline")
                try:
                    async with asyncio.timeout(left):
                        output = await anext(outputs)
                except StopAsyncIteration:
                    return
                except TimeoutError as exc:
                    raise LLMError("deadline", "the generation outlived the deadline") from exc
                text = output.outputs[0].text
                if len(text) > sent:
                    yield text[sent:]
                    sent = len(text)
        except LLMError:
            await self.engine.abort(request_id)
            raise
        except Exception as exc:  # the engine's own errors (dead engine, bad request)
            log.exception("vllm generation failed")
            raise LLMError("error", f"the vLLM engine failed ({type(exc).__name__})") from exc

"""Stage 6 of ``make gpu-check`` (bench.gpu_check): one streamed request through the project's
narrator service, started in this process against the LLM server, timed to the first token and
to the end; a failure of the server itself fails the stage."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from bench.gpu_stages import StageFailed

# Reasons the narrator gives when the LLM server itself failed (not the model's wording).
SERVING_FAILURES = ("unavailable", "deadline", "breaker_open", "error")
# The narrator request: a question, three sources and their facts (text of our own).
NARRATOR_QUERY = "Does vitamin D supplementation reduce the risk of fractures in older adults?"
NARRATOR_FACTS = (
    "In a trial of 2,686 adults aged 65 to 85, 100,000 IU of vitamin D every four months for five "
    "years reduced fractures by 22 percent compared with placebo.",
    "A meta-analysis of trials giving vitamin D without calcium found no reduction in hip fractures.",
    "Daily vitamin D with calcium lowered the rate of hip fractures among women living in care homes.",
)


async def narrate_once(base_url: str, model: str, timeout: float) -> dict[str, Any]:
    """One NarrateStream call to the project's narrator service, started here with its LLM at
    ``base_url`` (RAGMESH_LLM_BASE_URL, as a deployment sets it)."""
    from grpc import aio

    from meshkit.rpc.server import start_service
    from meshkit.settings import NarratorSettings
    from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc
    from services.narrator.servicer import build_spec

    os.environ["RAGMESH_LLM_BASE_URL"] = base_url
    os.environ["RAGMESH_LLM_MODEL"] = model
    settings = NarratorSettings(port=0, log_format="text", llm_timeout_s=max(5.0, timeout - 5))
    spec, _ = build_spec(settings)
    running = await start_service(spec, settings)
    request = narrator_pb2.NarrateRequest(
        query=NARRATOR_QUERY,
        sources=[
            narrator_pb2.Source(id=f"c{i}", doc_id=f"d{i}", title=f"Study {i}", snippet=fact[:200])
            for i, fact in enumerate(NARRATOR_FACTS, 1)
        ],
        facts=[
            narrator_pb2.Fact(text=fact, source=i, score=1.0 - i / 10)
            for i, fact in enumerate(NARRATOR_FACTS, 1)
        ],
        mode=narrator_pb2.NARRATION_MODE_LLM,
    )
    first: float | None = None
    deltas = 0
    answer = None
    try:
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = narrator_pb2_grpc.NarratorServiceStub(channel)
            started = time.perf_counter()
            stream = stub.NarrateStream(narrator_pb2.NarrateStreamRequest(request=request), timeout=timeout)
            async for event in stream:
                if event.HasField("answer"):
                    answer = event.answer
                    break
                deltas += 1
                if first is None:
                    first = time.perf_counter() - started
            total = time.perf_counter() - started
    finally:
        await running.stop(0)
    if answer is None:
        raise StageFailed("the narrator's stream ended without an answer")
    return narration_result(first, total, deltas, answer)


def narration_result(first: float | None, total: float, deltas: int, answer: Any) -> dict[str, Any]:
    """The narrator stage's data; StageFailed when the LLM server itself failed (the narrator
    then answers extractively and says why). An answer the verifier rejected is the small
    model's wording, not a serving failure: it passes, with the reason shown."""
    from ragmesh.narrator.v1 import narrator_pb2

    reason = answer.degraded_reason
    data = {
        "ttft_ms": round(first * 1000, 1) if first is not None else None,
        "total_ms": round(total * 1000, 1),
        "deltas": deltas,
        "mode": "llm" if answer.mode == narrator_pb2.NARRATION_MODE_LLM else "extractive",
        "answered": answer.answered,
        "degraded_reason": reason,
        "answer": answer.text[:300],
    }
    if reason.startswith(SERVING_FAILURES):
        raise StageFailed(f"the narrator could not use the LLM: {reason} | {json.dumps(data)}")
    return data

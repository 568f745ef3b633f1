"""One request's access to the LLM: it counts calls, stops calling once the LLM is down or
the caller's deadline is near, and remembers why, so the remaining work degrades to the
extractive path instead of overrunning."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

from meshkit.llm.factory import LLM, LLMError, Messages
from meshkit.rpc.client import remaining_budget
from services.extractor.metrics import LLM_CALLS

ModelT = TypeVar("ModelT", bound=BaseModel)

# Failures that say the LLM server is unwell or too slow: calling it again in this request
# would only repeat them. "error" and "invalid_output" concern one prompt; others may work.
DOWN_REASONS = frozenset({"unavailable", "deadline", "breaker_open"})
# Caller-deadline time kept back from the LLM for the extractive fallback and the reply.
FALLBACK_RESERVE_S = 0.5


class LLMSkipped(Exception):
    """The guard did not call the LLM: it is down, or too little time is left."""


class LLMGuard:
    def __init__(self, llm: LLM, timeout_s: float, reserve_s: float = FALLBACK_RESERVE_S) -> None:
        self._llm = llm
        self._timeout_s = timeout_s
        self._reserve_s = reserve_s
        self.calls = 0
        # Why the LLM was given up for this request, "<reason>: <detail>" with an LLMError reason
        # ("" while it is still usable).
        self.down_reason = ""

    def _call_timeout(self) -> float:
        left = remaining_budget(None) - self._reserve_s
        if left <= 0 and not self.down_reason:
            self.down_reason = (
                f"deadline: less than {self._reserve_s:g}s left for the llm before the caller's deadline"
            )
        return min(self._timeout_s, left)

    @property
    def usable(self) -> bool:
        """Whether the LLM may still be called; gives it up when the deadline is too near."""
        self._call_timeout()
        return not self.down_reason

    async def structured(
        self, messages: Messages, schema: type[ModelT], *, purpose: str, max_tokens: int
    ) -> ModelT:
        """The LLM's reply as ``schema``; LLMSkipped without calling when the LLM is given up,
        LLMError when the call fails (a DOWN_REASONS failure gives the LLM up)."""
        timeout = self._call_timeout()
        if self.down_reason:
            raise LLMSkipped(self.down_reason)
        self.calls += 1
        try:
            reply = await self._llm.structured(messages, schema, max_tokens=max_tokens, timeout=timeout)
        except LLMError as exc:
            LLM_CALLS.labels(purpose, exc.reason).inc()
            if exc.reason in DOWN_REASONS and not self.down_reason:
                self.down_reason = f"{exc.reason}: llm {exc.message}"
            raise
        LLM_CALLS.labels(purpose, "ok").inc()
        return reply

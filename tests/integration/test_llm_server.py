"""The LLM tier's client against the real local default server: llama.cpp (xllamacpp) serving
SmolLM2 on loopback, as `ragmesh up` starts it. Chat, JSON-schema structured output validated by
pydantic, streaming, and a server killed mid-stream ending the stream with an error instead of a
hang (on a server of its own, so the stack's keeps serving)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from pydantic import BaseModel, Field

from meshkit.llm.factory import LLMError
from meshkit.llm.openai_compat import OpenAICompatibleLLM
from meshkit.settings import LLMSettings
from ragmesh_cli.procutil import free_ports
from ragmesh_cli.stack import Stack

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 60.0


class Server:
    def __init__(self, tmp: str) -> None:
        (self.port,) = free_ports(1)
        env = {**os.environ, "RAGMESH_HOST": "127.0.0.1", "RAGMESH_PORT": str(self.port)}
        self.log = open(os.path.join(tmp, f"llm-{self.port}.log"), "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services.llm"], env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llm server exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise RuntimeError("llm server not healthy in time")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def base_url(stack: Stack) -> str:
    if "llm" not in stack.services:
        pytest.skip("the llm server is not in this checkout")
    return stack.client_env()["RAGMESH_LLM_BASE_URL"]


def client(base_url: str, **overrides: object) -> OpenAICompatibleLLM:
    return OpenAICompatibleLLM(LLMSettings(llm_base_url=base_url, llm_timeout_s=60, **overrides))


class Keywords(BaseModel):
    # Bounded: the schema becomes the server's grammar, and a 135M model decoding greedily
    # repeats list items until max_tokens cuts the JSON (which the client reports as
    # invalid_output, the outcome callers fall back on).
    keywords: list[str] = Field(min_length=1, max_length=3)
    count: int


QUESTION = [{"role": "user", "content": "List three keywords about volcanoes."}]


async def test_chat_answers(base_url: str) -> None:
    async with client(base_url) as llm:
        text = await llm.chat([{"role": "user", "content": "Say hello."}], max_tokens=16)
    assert text.strip()


async def test_structured_output_is_a_validated_model(base_url: str) -> None:
    async with client(base_url) as llm:
        reply = await llm.structured(QUESTION, Keywords, max_tokens=96)
    assert isinstance(reply, Keywords)
    assert all(isinstance(k, str) for k in reply.keywords) and isinstance(reply.count, int)


async def test_stream_yields_deltas(base_url: str) -> None:
    async with client(base_url) as llm:
        deltas = [d async for d in llm.stream(QUESTION, max_tokens=32)]
    assert len(deltas) > 1 and "".join(deltas).strip()


async def test_server_killed_mid_stream_ends_the_stream_with_an_error(tmp_path: object) -> None:
    victim = Server(str(tmp_path))
    started = time.monotonic()
    received: list[str] = []
    try:
        async with client(victim.base_url, llm_retry_attempts=1) as llm:
            with pytest.raises(LLMError) as caught:
                async for delta in llm.stream(QUESTION, max_tokens=400):
                    received.append(delta)
                    if len(received) == 3:
                        victim.process.kill()
    finally:
        victim.stop(signal.SIGKILL)
    assert caught.value.reason in ("unavailable", "deadline")
    assert len(received) >= 3
    assert time.monotonic() - started < 30

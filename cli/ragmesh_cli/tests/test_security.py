"""The CLI's side of security: ``ragmesh keys new/check``, and channels that carry the API key
(--api-key or RAGMESH_API_KEY) to a guarded server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from meshkit.rpc.auth import READ, KeyStore, Rule, parse_keys
from meshkit.rpc.server import RunningService, ServiceSpec, start_service
from meshkit.settings import MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh_cli import channels
from ragmesh_cli import main as cli_main
from ragmesh_cli.main import main


def new_key(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["keys", "new", "--json", *args]) == 0
    minted: dict[str, Any] = json.loads(capsys.readouterr().out)
    return minted


def test_keys_new_prints_the_key_once_and_an_entry_with_its_digest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    minted = new_key(capsys, "--name", "app", "--read", "docs,faq", "--write", "docs", "--rate", "20")
    key, entry = minted["api_key"], minted["entry"]
    assert key not in json.dumps(entry)
    assert entry["rate"] == {"per_second": 20.0, "burst": 20}
    (parsed,) = parse_keys(json.dumps({"keys": [entry]}), "t")
    assert KeyStore([parsed]).match(key) is not None
    assert (parsed.read, parsed.write) == ({"docs", "faq"}, {"docs"})

    assert main(["keys", "new", "--name", "plain", "--read", "*"]) == 0
    out = capsys.readouterr().out
    assert "shown once" in out and '"sha256"' in out and "rate" not in out


def test_keys_new_refuses_bad_grants(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "new", "--name", "x"]) == 1
    assert "grant nothing" in capsys.readouterr().err
    assert main(["keys", "new", "--name", "x", "--read", "Not Valid"]) == 1
    assert "read" in capsys.readouterr().err


def test_keys_check_validates_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = new_key(capsys, "--name", "app", "--read", "docs")["entry"]
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [entry]}))
    assert main(["keys", "check", str(path)]) == 0
    assert "app: read ['docs']" in capsys.readouterr().out
    path.write_text(json.dumps({"keys": [entry, entry]}))
    assert main(["keys", "check", str(path)]) == 1
    assert "appears twice" in capsys.readouterr().err


class Echo(embedder_pb2_grpc.EmbedderServiceServicer):
    async def Embed(self, request: Any, context: aio.ServicerContext) -> embedder_pb2.EmbedResponse:
        return embedder_pb2.EmbedResponse(model="ok")


@pytest.fixture
async def guarded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> AsyncIterator[tuple[str, str]]:
    minted = new_key(capsys, "--name", "cli", "--read", "*")
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [minted["entry"]]}))
    spec = ServiceSpec(
        name="cli-guarded",
        grpc_services=["ragmesh.embedder.v1.EmbedderService"],
        register=lambda s: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(Echo(), s),
        access={"Embed": Rule(READ)},
    )
    running: RunningService = await start_service(
        spec, MeshSettings(host="127.0.0.1", port=0, api_keys_file=path)
    )
    try:
        yield f"127.0.0.1:{running.port}", minted["api_key"]
    finally:
        await running.stop(0)


@pytest.fixture(autouse=True)
def no_key_override() -> Iterator[None]:
    yield
    channels.use_api_key(None)


async def embed(address: str) -> str:
    async with channels.open_channel(address) as channel:
        reply = await embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(
            embedder_pb2.EmbedRequest(), timeout=5
        )
    return reply.model


async def test_channels_carry_the_api_key(guarded: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    address, key = guarded
    monkeypatch.delenv("RAGMESH_API_KEY", raising=False)
    with pytest.raises(aio.AioRpcError) as err:
        await embed(address)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    monkeypatch.setenv("RAGMESH_API_KEY", key)
    assert await embed(address) == "ok"
    channels.use_api_key("rmk_wrong")  # --api-key wins over the environment
    with pytest.raises(aio.AioRpcError) as err:
        await embed(address)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_api_key_option_reaches_the_channels_of_that_command_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAGMESH_API_KEY", raising=False)
    seen: list[str] = []

    def command(args: Any) -> int:
        seen.append(channels.api_key())
        return 0

    monkeypatch.setattr(cli_main, "cmd_config", command)
    assert main(["--api-key", "rmk_from-flag", "config", "--json"]) == 0
    assert seen == ["rmk_from-flag"]
    # Gone once the command returned: the next command in this process does not inherit it.
    assert channels.api_key() == ""


def add_countdown(server: aio.Server) -> None:
    async def count(request: bytes, context: aio.ServicerContext) -> AsyncIterator[bytes]:
        for i in range(int(request.decode())):
            yield str(i).encode()

    handler = grpc.method_handlers_generic_handler(
        "test.Stream", {"Count": grpc.unary_stream_rpc_method_handler(count)}
    )
    server.add_generic_rpc_handlers((handler,))


async def test_streaming_calls_carry_the_api_key_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A streamed answer (ragmesh ask: AskStream) is checked like any call: the key must ride on it.
    minted = new_key(capsys, "--name", "cli", "--read", "*")
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [minted["entry"]]}))
    spec = ServiceSpec(
        name="cli-guarded-stream",
        grpc_services=[],
        register=add_countdown,
        access={"Count": Rule(READ)},
    )
    running = await start_service(spec, MeshSettings(host="127.0.0.1", port=0, api_keys_file=path))
    monkeypatch.setenv("RAGMESH_API_KEY", minted["api_key"])
    try:
        async with channels.open_channel(f"127.0.0.1:{running.port}") as channel:
            count = channel.unary_stream("/test.Stream/Count")
            assert [item async for item in count(b"3", timeout=5)] == [b"0", b"1", b"2"]
    finally:
        await running.stop(0)

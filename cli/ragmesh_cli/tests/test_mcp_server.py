"""``ragmesh mcp --http``: the key check in front of the MCP app, against a fake ingestion API
that accepts one key (the mesh decides which keys are valid; the MCP server asks it)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_cli.mcp_clients import Clients, key_from_headers
from ragmesh_cli.mcp_server import KeyCheck, RequireMeshKey, listener

GOOD = "rmk_good"


class Ingestion(ingestion_pb2_grpc.IngestionServiceServicer):
    def __init__(self, auth: bool) -> None:
        self.auth, self.calls = auth, 0

    def ListCollections(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls += 1
        metadata = dict(context.invocation_metadata())
        if self.auth and metadata.get("authorization") != f"Bearer {GOOD}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown API key")
        return ingestion_pb2.ListCollectionsResponse(collections=["docs"])


def _serve(auth: bool) -> tuple[grpc.Server, Ingestion, str]:
    servicer = Ingestion(auth)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    ingestion_pb2_grpc.add_IngestionServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, servicer, f"127.0.0.1:{port}"


@pytest.fixture(params=[True, False], ids=["auth-on", "auth-off"])
def mesh(request: pytest.FixtureRequest) -> Iterator[tuple[Ingestion, str]]:
    server, servicer, address = _serve(request.param)
    yield servicer, address
    server.stop(None)


async def _inner(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"mcp"})


async def _post(address: str, headers: dict[str, str], check: KeyCheck | None = None) -> httpx.Response:
    clients = Clients(address, address, None, http=True)
    app = RequireMeshKey(_inner, check or KeyCheck(clients))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        return await http.post("/mcp", headers=headers, json={})


async def test_requests_need_a_key_the_mesh_accepts(mesh: tuple[Ingestion, str]) -> None:
    servicer, address = mesh
    anonymous = await _post(address, {})
    wrong = await _post(address, {"authorization": "Bearer rmk_bad"})
    good = await _post(address, {"authorization": f"Bearer {GOOD}"})
    via_header = await _post(address, {"x-api-key": GOOD})
    assert good.status_code == via_header.status_code == 200 and good.text == "mcp"
    if servicer.auth:
        assert anonymous.status_code == wrong.status_code == 401
        assert "API key" in anonymous.json()["error"]
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
    else:  # a mesh with auth off refuses nobody, as its gateway would not
        assert anonymous.status_code == wrong.status_code == 200


async def test_verdicts_are_cached(mesh: tuple[Ingestion, str]) -> None:
    servicer, address = mesh
    check = KeyCheck(Clients(address, address, None, http=True))
    for _ in range(3):
        await _post(address, {"authorization": f"Bearer {GOOD}"}, check)
    assert servicer.calls == 1


async def test_an_unreachable_mesh_answers_503() -> None:
    server, _, address = _serve(True)
    server.stop(None)
    response = await _post(address, {"authorization": f"Bearer {GOOD}"})
    assert response.status_code == 503


def test_key_from_headers() -> None:
    assert key_from_headers({"authorization": "Bearer  k1 "}) == "k1"
    assert key_from_headers({"authorization": "Basic abc"}) is None
    assert key_from_headers({"x-api-key": "k2"}) == "k2"
    assert key_from_headers(None) is None


def test_a_listener_takes_keys_in_plain_text_only_on_loopback_or_when_told(tmp_path: Path) -> None:
    assert listener("127.0.0.1:8765", None, None).url == "http://127.0.0.1:8765/mcp"
    assert listener("localhost:8765", None, None).host == "localhost"
    assert listener("[::1]:8765", None, None).url == "http://[::1]:8765/mcp"
    for public in ("0.0.0.0:8765", "10.1.2.3:8765", "mcp.example.com:8765"):
        with pytest.raises(ValueError, match="plain text"):
            listener(public, None, None)
        assert listener(public, None, None, allow_plaintext=True).tls_cert is None
    cert, key = tmp_path / "mcp.crt", tmp_path / "mcp.key"
    cert.write_text("pem"), key.write_text("pem")
    served = listener("0.0.0.0:8765", str(cert), str(key))
    assert served.url == "https://0.0.0.0:8765/mcp" and served.tls_key == key
    with pytest.raises(ValueError, match="go together"):
        listener("0.0.0.0:8765", str(cert), None)
    with pytest.raises(ValueError, match="no such file"):
        listener("0.0.0.0:8765", str(cert), str(tmp_path / "missing.key"))
    with pytest.raises(ValueError, match="HOST:PORT"):
        listener("8765", None, None)

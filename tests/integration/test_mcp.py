"""``ragmesh mcp`` driven by the MCP SDK's own client against the real mesh with auth on (the
secure stack): over stdio (the agent starts the server) it lists the three tools and gets a
cited answer with the tenant's key; over streamable HTTP it refuses requests without a key the
mesh accepts, and serves the same tools to a caller that sends one; over HTTPS, the same under a
certificate the client checks."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from meshkit.rpc import pki
from ragmesh_cli.stack import Stack
from ragmesh_client import TLS, Client, Document

from .conftest import AUTH_TENANT

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RAGMESH = ROOT / ".venv" / "bin" / "ragmesh"
COLLECTION = "docs"
QUESTION = "How many replicas does the snapshot service keep?"
DOCS = {
    "mcp/snapshots.md": "# Snapshot service\n\nThe snapshot service keeps three replicas of every index "
    "snapshot, one per availability zone, and deletes snapshots older than thirty days.",
    "mcp/tokens.md": "# Session tokens\n\nSession tokens expire after twelve hours; a client refreshes "
    "its token with the refresh endpoint before it expires.",
}


def server_env(stack: Stack, tmp_path: Path, api_key: str | None) -> dict[str, str]:
    """What an agent's configuration gives the server: addresses, the CA, maybe a key; and a
    state dir of its own (no local stack's ops identity to fall back on)."""
    ops, addresses = stack.client_tls(), stack.client_env()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "RAGMESH_STATE_DIR": str(tmp_path / "state"),
        "RAGMESH_GATEWAY_ADDRESS": addresses["RAGMESH_GATEWAY_ADDRESS"],
        "RAGMESH_INGESTION_ADDRESS": addresses["RAGMESH_INGESTION_ADDRESS"],
        "RAGMESH_TLS_CA_FILE": str(ops.ca_file),
        "RAGMESH_TLS_SERVER_NAME": ops.server_name,
    }
    if api_key is not None:
        env["RAGMESH_API_KEY"] = api_key
    return env


@pytest.fixture(scope="module")
def indexed(auth_stack: Stack) -> list[str]:
    env, ops = auth_stack.client_env(), auth_stack.client_tls()
    with Client(
        env["RAGMESH_GATEWAY_ADDRESS"],
        ingestion=env["RAGMESH_INGESTION_ADDRESS"],
        api_key=auth_stack.api_key(AUTH_TENANT),
        tls=TLS(ops.ca_file, server_name=ops.server_name),
    ) as client:
        client.ingest(COLLECTION, [Document(d, text, format="markdown") for d, text in DOCS.items()])
        statuses = client.wait_indexed(COLLECTION, list(DOCS), timeout=240)
    assert {s.state for s in statuses} == {"indexed"}
    return list(DOCS)


def payload(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    if isinstance(result.structured_content, dict):
        return result.structured_content
    return json.loads(result.content[0].text)  # type: ignore[no-any-return]


async def check_tools(session: Any) -> None:
    """The three tools, a cited answer, a search and the collection's counts."""
    await session.initialize()
    listed = await session.list_tools()
    assert {t.name for t in listed.tools} == {"search", "ask", "collection_status"}
    answer = payload(await session.call_tool("ask", {"question": QUESTION}))
    assert answer["answered"], answer
    assert answer["citations"] and answer["citations"][0]["doc_id"] == "mcp/snapshots.md"
    assert "[1]" in answer["answer"]
    found = payload(await session.call_tool("search", {"query": "session token expiry", "top_k": 2}))
    assert found["results"][0]["doc_id"] == "mcp/tokens.md"
    status = payload(await session.call_tool("collection_status", {}))
    assert status["collection"] == COLLECTION and status["indexed"] >= 2
    # The tenant's key reaches only its collections: the tool reports the mesh's refusal.
    refused = await session.call_tool("search", {"query": "x", "collection": "someone-elses"})
    assert refused.is_error and "PERMISSION_DENIED" in refused.content[0].text


async def test_mcp_over_stdio_gives_a_cited_answer(
    auth_stack: Stack, indexed: list[str], tmp_path: Path
) -> None:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=str(RAGMESH),
        args=["mcp", "--collection", COLLECTION],
        env=server_env(auth_stack, tmp_path, auth_stack.api_key(AUTH_TENANT)),
        cwd=str(tmp_path),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await check_tools(session)


@pytest.fixture
def http_server(auth_stack: Stack, tmp_path: Path) -> Iterator[str]:
    """``ragmesh mcp --http`` with no key of its own: each caller brings one."""
    with serving_http(auth_stack, tmp_path) as url:
        yield url


@contextmanager
def serving_http(auth_stack: Stack, tmp_path: Path, *extra: str) -> Iterator[str]:
    """``ragmesh mcp --http 127.0.0.1:<free port> *extra``, until the block ends: its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "mcp-http.log").open("w")
    process = subprocess.Popen(
        [str(RAGMESH), "mcp", "--collection", COLLECTION, "--http", f"127.0.0.1:{port}", *extra],
        env=server_env(auth_stack, tmp_path, None),
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / "mcp-http.log").read_text()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the MCP HTTP server did not listen within 60 s"
            time.sleep(0.2)
        yield f"{'https' if '--tls-cert' in extra else 'http'}://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
ACCEPT = {"accept": "application/json, text/event-stream"}


async def test_mcp_over_http_needs_a_key_the_mesh_accepts(
    auth_stack: Stack, indexed: list[str], http_server: str
) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async with httpx.AsyncClient(timeout=30) as http:
        anonymous = await http.post(http_server, json=INITIALIZE, headers=ACCEPT)
        assert anonymous.status_code == 401 and "API key" in anonymous.json()["error"]
        wrong = await http.post(
            http_server, json=INITIALIZE, headers={**ACCEPT, "authorization": "Bearer rmk_nope"}
        )
        assert wrong.status_code == 401
    key = auth_stack.api_key(AUTH_TENANT)
    async with (
        create_mcp_http_client(headers={"authorization": f"Bearer {key}"}) as http2,
        streamable_http_client(http_server, http_client=http2) as (read, write),
        ClientSession(read, write) as session,
    ):
        await check_tools(session)


async def test_mcp_over_https_serves_the_keys_holder_under_its_certificate(
    auth_stack: Stack, indexed: list[str], tmp_path: Path
) -> None:
    ca = pki.new_ca()
    cert, key = pki.issue(ca, "ragmesh-mcp", client=False)
    files = pki.PKIFiles(tmp_path / "pki")
    files.directory.mkdir()
    pki.write_pair(files, "mcp", (cert, key))
    pki.write_pair(files, pki.CA_NAME, ca)
    tls = ("--tls-cert", str(files.cert("mcp")), "--tls-key", str(files.key("mcp")))
    with serving_http(auth_stack, tmp_path, *tls) as url:
        assert url.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(files.ca_cert))
        async with httpx.AsyncClient(timeout=30, verify=trusted) as https:
            anonymous = await https.post(url, json=INITIALIZE, headers=ACCEPT)
            bearer = {"authorization": f"Bearer {auth_stack.api_key(AUTH_TENANT)}"}
            initialized = await https.post(url, json=INITIALIZE, headers={**ACCEPT, **bearer})
        # The certificate is checked: a client without our CA does not connect.
        async with httpx.AsyncClient(timeout=30) as untrusting:
            with pytest.raises(httpx.ConnectError):
                await untrusting.post(url, json=INITIALIZE, headers=ACCEPT)
    assert anonymous.status_code == 401
    assert initialized.status_code == 200, initialized.text
    assert "ragmesh" in initialized.text

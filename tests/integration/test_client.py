"""ragmesh_client against the real mesh with auth on (the secure stack: API keys, TLS, two
workers, two shards, production timings): a tenant ingests, searches, asks (whole and streamed),
reads status, deletes; the errors arrive as the right exceptions; and the package, installed
alone into a fresh venv, runs the README's five-line example against the stack."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragmesh_cli.stack import Stack
from ragmesh_client import (
    TLS,
    Answer,
    AskDelta,
    AskProgress,
    AsyncClient,
    Client,
    Document,
    DocumentsRejectedError,
    InvalidArgumentError,
    PermissionDeniedError,
    UnauthenticatedError,
)

from .conftest import AUTH_TENANT

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = "docs"
QUESTION = "How do I rotate an API key?"
DOCS = {
    "keys/rotation.md": (
        "Rotating API keys",
        "# Rotating API keys\n\nTo rotate an API key, mint a new key with ragmesh keys new, move every "
        "client to the new key, then remove the old entry from the keys file and restart the gateway.",
    ),
    "limits/requests.md": (
        "Request limits",
        "# Request limits\n\nEvery ragmesh server caps the calls it runs at once and refuses messages "
        "larger than its largest legal request with RESOURCE_EXHAUSTED.",
    ),
    "ops/backups.md": (
        "Backups",
        "# Backups\n\nThe object store keeps every document; snapshots of the index shards are taken "
        "hourly and kept for a week.",
    ),
}


def tenant_tls(stack: Stack) -> TLS:
    """A tenant has no certificate: it verifies the servers against the stack's CA."""
    ops = stack.client_tls()
    return TLS(ops.ca_file, server_name=ops.server_name)


def tenant_client(stack: Stack, api_key: str | None = None) -> Client:
    env = stack.client_env()
    return Client(
        env["RAGMESH_GATEWAY_ADDRESS"],
        ingestion=env["RAGMESH_INGESTION_ADDRESS"],
        api_key=stack.api_key(AUTH_TENANT) if api_key is None else api_key,
        tls=tenant_tls(stack),
    )


@pytest.fixture(scope="module")
def client(auth_stack: Stack) -> Iterator[Client]:
    with tenant_client(auth_stack) as c:
        yield c


@pytest.fixture(scope="module")
def indexed(client: Client, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Two documents given as Documents, one as a file; all indexed."""
    documents = [
        Document(doc_id, text, title=title, format="markdown", metadata={"team": doc_id.split("/")[0]})
        for doc_id, (title, text) in list(DOCS.items())[:2]
    ]
    submitted = client.ingest(COLLECTION, documents)
    assert [s.outcome for s in submitted] == ["queued", "queued"]
    folder = tmp_path_factory.mktemp("files")
    page = folder / "backups.md"
    page.write_text(DOCS["ops/backups.md"][1])
    (from_file,) = client.ingest_files(COLLECTION, [page], metadata={"team": "ops"})
    assert from_file.doc_id == "backups.md" and len(from_file.content_sha256) == 64
    ids = [d.doc_id for d in documents] + ["backups.md"]
    statuses = client.wait_indexed(COLLECTION, ids, timeout=240)
    assert [s.state for s in statuses] == ["indexed"] * 3, statuses
    return ids


def test_search_returns_typed_results(client: Client, indexed: list[str]) -> None:
    response = client.search(COLLECTION, QUESTION, top_k=3)
    assert response.degradations == ()
    best = response.results[0]
    assert best.doc_id == "keys/rotation.md"
    assert best.title == "Rotating API keys" and "mint a new key" in best.text
    assert best.metadata == {"team": "keys"} and best.chunk_id
    # The score a caller sees is the one that ordered the results (issue 26), whichever rule did.
    scores = [r.score for r in response.results]
    assert scores == sorted(scores, reverse=True)
    if not response.reranked:
        assert [r.score for r in response.results] == [r.fused_score for r in response.results]
    filtered = client.search(COLLECTION, QUESTION, filter={"team": "ops"})
    assert {r.doc_id for r in filtered.results} == {"backups.md"}
    assert filtered.results[0].source_uri.startswith("file://")


def test_ask_answers_with_citations(client: Client, indexed: list[str]) -> None:
    answer = client.ask(COLLECTION, QUESTION, mode="extractive")
    assert answer.answered and answer.mode == "extractive"
    assert answer.citations and answer.citations[0].doc_id == "keys/rotation.md"
    assert answer.sentences and all(s.sources for s in answer.sentences)
    assert re.search(r"\[\d+\]", answer.text)


def test_ask_stream_ends_with_the_verified_answer(client: Client, indexed: list[str]) -> None:
    events = list(client.ask_stream(COLLECTION, QUESTION, mode="extractive"))
    assert [e.stage for e in events if isinstance(e, AskProgress)][:1] == ["search"]
    final = events[-1]
    assert isinstance(final, Answer) and final.answered
    assert not any(isinstance(e, Answer) for e in events[:-1])
    assert all(isinstance(e, AskProgress | AskDelta) for e in events[:-1])


def test_status_and_delete(client: Client, indexed: list[str]) -> None:
    status = client.collection_status(COLLECTION)
    assert status.indexed >= 3 and status.chunks >= 3
    assert COLLECTION in client.list_collections()
    assert client.delete(COLLECTION, ["limits/requests.md"]) == 1
    deadline = time.monotonic() + 120
    while client.document_status(COLLECTION, ["limits/requests.md"])[0].state != "deleted":
        assert time.monotonic() < deadline, "not deleted in 120 s"
        time.sleep(0.5)
    found = client.search(COLLECTION, "largest legal request RESOURCE_EXHAUSTED", top_k=5)
    assert "limits/requests.md" not in {r.doc_id for r in found.results}
    assert client.dead_letters(COLLECTION).dead_letters == ()


def test_rejected_documents_are_listed_with_their_reason(client: Client, indexed: list[str]) -> None:
    """The API judges each document on its own: the good one is queued and indexed, the bad ones
    come back rejected with a reason, and nothing of them is stored."""
    good = Document("rejects/good.md", "# Good\n\nA page about zeppelin hangars.", format="markdown")
    empty = Document("rejects/empty.md", "", format="markdown")
    undecodable = Document("rejects/latin1.txt", b"caf\xe9 au lait", format="text")
    result = client.ingest(COLLECTION, [good, empty, undecodable])
    assert [s.outcome for s in result] == ["queued", "rejected", "rejected"], result
    assert [s.doc_id for s in result.rejected] == ["rejects/empty.md", "rejects/latin1.txt"]
    assert all(s.reason for s in result.rejected) and result[0].reason == ""
    with pytest.raises(DocumentsRejectedError) as refused:
        client.ingest(COLLECTION, [empty], on_rejected="raise_if_none_accepted")
    assert refused.value.rejected[0].reason == result.rejected[0].reason
    assert refused.value.request_id and "1 of 1 documents rejected" in refused.value.message
    (status,) = client.wait_indexed(COLLECTION, ["rejects/good.md"], timeout=240)
    assert status.state == "indexed"
    listed = {d.doc_id for d in client.list_documents(COLLECTION)}
    assert "rejects/good.md" in listed and not listed & {"rejects/empty.md", "rejects/latin1.txt"}


def test_list_documents_walks_pages_and_filters_by_source(client: Client, indexed: list[str]) -> None:
    one_by_one = [d.doc_id for d in client.list_documents(COLLECTION, page_size=1)]
    assert one_by_one == sorted(one_by_one) and len(one_by_one) == len(set(one_by_one))
    assert {"keys/rotation.md", "backups.md"} <= set(one_by_one)
    assert one_by_one == [d.doc_id for d in client.list_documents(COLLECTION)]
    # Only the file-ingested page has a file:// source.
    from_files = list(client.list_documents(COLLECTION, source_prefix="file://"))
    assert [d.doc_id for d in from_files] == ["backups.md"]
    assert from_files[0].state == "indexed" and len(from_files[0].content_sha256) == 64


def test_errors_arrive_as_exceptions(auth_stack: Stack, client: Client, indexed: list[str]) -> None:
    with pytest.raises(InvalidArgumentError) as bad:
        client.search(COLLECTION, "")
    assert bad.value.request_id and bad.value.message
    # Another collection than the key's; no key; a key the server does not know.
    with pytest.raises(PermissionDeniedError):
        client.search("someone-elses", QUESTION)
    with tenant_client(auth_stack, api_key="") as anonymous, pytest.raises(UnauthenticatedError):
        anonymous.search(COLLECTION, QUESTION)
    with tenant_client(auth_stack, api_key="rmk_not-a-key") as stranger, pytest.raises(UnauthenticatedError):
        stranger.collection_status(COLLECTION)


async def test_async_client(auth_stack: Stack, indexed: list[str]) -> None:
    env = auth_stack.client_env()
    async with AsyncClient(
        env["RAGMESH_GATEWAY_ADDRESS"],
        ingestion=env["RAGMESH_INGESTION_ADDRESS"],
        api_key=auth_stack.api_key(AUTH_TENANT),
        tls=tenant_tls(auth_stack),
    ) as client:
        found = await client.search(COLLECTION, QUESTION, top_k=1)
        assert found.results[0].doc_id == "keys/rotation.md"
        events = [e async for e in client.ask_stream(COLLECTION, QUESTION, mode="extractive")]
        assert isinstance(events[-1], Answer) and events[-1].citations
        assert (await client.collection_status(COLLECTION)).indexed >= 2


def readme_example() -> str:
    """The Python block of the README's "Python client" section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Python client") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("\n```", start)]


def test_readme_example_in_a_fresh_venv(auth_stack: Stack, indexed: list[str], tmp_path: Path) -> None:
    """``pip install ./clients/python`` into a new venv (no project on its path), then the README's
    five lines against the stack, configured by the environment only."""
    example = readme_example()
    assert len([line for line in example.splitlines() if line.strip()]) == 5
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(ROOT / "clients" / "python")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    script = tmp_path / "example.py"
    script.write_text(example)
    ops = auth_stack.client_tls()
    stack_env = auth_stack.client_env()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "RAGMESH_GATEWAY_ADDRESS": stack_env["RAGMESH_GATEWAY_ADDRESS"],
        "RAGMESH_API_KEY": auth_stack.api_key(AUTH_TENANT),
        "RAGMESH_TLS_CA_FILE": str(ops.ca_file),
        "RAGMESH_TLS_SERVER_NAME": ops.server_name,
    }
    # Nothing of the project is importable there: the package stands alone.
    alone = subprocess.run(
        [str(python), "-c", "import ragmesh"], cwd=tmp_path, env=env, capture_output=True, timeout=60
    )
    assert alone.returncode != 0
    run = subprocess.run(
        [str(python), str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    assert "keys/rotation.md" in lines[0]
    assert re.search(r"\[\d+\]", run.stdout)


def test_cli_search_and_ask_run_on_the_client(
    auth_stack: Stack,
    indexed: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ragmesh search`` / ``ask`` as a tenant configured by the environment and --api-key."""
    from ragmesh_cli.main import main

    for name in [n for n in os.environ if n.startswith("RAGMESH_")]:
        monkeypatch.delenv(name)
    ops, env = auth_stack.client_tls(), auth_stack.client_env()
    monkeypatch.setenv("RAGMESH_GATEWAY_ADDRESS", env["RAGMESH_GATEWAY_ADDRESS"])
    monkeypatch.setenv("RAGMESH_TLS_CA_FILE", str(ops.ca_file))
    monkeypatch.setenv("RAGMESH_TLS_SERVER_NAME", ops.server_name)
    key = ["--state-dir", str(tmp_path), "--api-key", auth_stack.api_key(AUTH_TENANT)]
    assert main([*key, "search", QUESTION, "--collection", COLLECTION]) == 0
    assert "keys/rotation.md" in capsys.readouterr().out
    assert main([*key, "ask", QUESTION, "--collection", COLLECTION, "--mode", "extractive"]) == 0
    out = capsys.readouterr().out
    assert "sources:" in out and "keys/rotation.md" in out
    assert main([*key, "search", QUESTION, "--collection", "someone-elses"]) == 1
    assert capsys.readouterr().err.startswith("error: PERMISSION_DENIED: ")

"""Fixtures of the secure-stack tests: one secure stack for the whole folder (both test files),
and the tenants' documents indexed in it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragmesh.ingestion.v1 import ingestion_pb2 as ing
from ragmesh_cli.stack import Stack

from .secure_mesh import ALPHA, ALPHA_DOCS, BETA, BETA_SECRET, BROKEN, start_secure_stack, tenant


@pytest.fixture(scope="package")
def secure_stack() -> Iterator[Stack]:
    # Under a folder every local user may enter (pytest's own tmp folders are 0700), so that
    # only the stack's own permissions keep another user out (test_secure_at_rest.py).
    parent = Path(tempfile.mkdtemp(prefix="ragmesh-secure-"))
    parent.chmod(0o755)
    stack: Stack | None = None
    try:
        stack = start_secure_stack(parent / "state")
        yield stack
    finally:
        if stack is not None:
            stack.down()
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="package")
async def indexed(secure_stack: Stack) -> dict[str, list[str]]:
    """Tenant A's documents in alpha and tenant B's in beta, indexed; and a broken PDF of B's,
    dead-lettered (through the workers' and the API's NATS grants)."""
    written: dict[str, list[str]] = {}
    for name, collection, docs in (
        ("tenant-a", ALPHA, list(ALPHA_DOCS.items())),
        ("tenant-b", BETA, [("secret.md", BETA_SECRET)]),
    ):
        mesh = tenant(secure_stack, name)
        try:
            reply = await mesh.ingest(collection, docs)
            assert [r.outcome for r in reply.results] == [ing.SUBMIT_OUTCOME_QUEUED] * len(docs), reply
            ids = [doc_id for doc_id, _ in docs]
            states = await mesh.wait_settled(collection, ids, timeout=180)
            assert {s.state for s in states.values()} == {ing.DOCUMENT_STATE_INDEXED}, states
            written[collection] = ids
        finally:
            await mesh.close()
    b = tenant(secure_stack, "tenant-b")
    try:
        await b.ingest(BETA, [(BROKEN, b"%PDF-1.4\n not a pdf at all")], fmt=ing.DOCUMENT_FORMAT_PDF)
        assert (await b.wait_settled(BETA, [BROKEN], timeout=180))[BROKEN].state == ing.DOCUMENT_STATE_FAILED
        letters = await b.ingestion.ListDeadLetters(ing.ListDeadLettersRequest(collection=BETA), timeout=10)
        assert [d.doc_id for d in letters.dead_letters] == [BROKEN]
    finally:
        await b.close()
    return written

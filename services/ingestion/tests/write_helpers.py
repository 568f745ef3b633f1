"""What the write-path tests (test_write_path, test_document_source) share: the API's document
states and formats by name, a sample document and its hash, and waiting for a condition or for
a worker to go idle.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from meshkit.domain.ids import sha256_hex
from ragmesh.ingestion.v1 import ingestion_pb2

INDEXED = ingestion_pb2.DOCUMENT_STATE_INDEXED
FAILED = ingestion_pb2.DOCUMENT_STATE_FAILED
QUEUED = ingestion_pb2.DOCUMENT_STATE_QUEUED
PROCESSING = ingestion_pb2.DOCUMENT_STATE_PROCESSING
DELETED = ingestion_pb2.DOCUMENT_STATE_DELETED
PDF = ingestion_pb2.DOCUMENT_FORMAT_PDF
BROKEN_PDF = b"%PDF-1.4\n garbage that is no pdf at all"


def doc(word: str) -> str:
    return f"# Note\n\nA ragmesh note about {word} and nothing else."


def sha(word: str) -> str:
    return sha256_hex(doc(word).encode())


async def until(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        await asyncio.sleep(0.05)


async def idle(worker: Any) -> bool:
    """The worker holds no document and has no cleanup running."""
    return not worker._held and not worker.pipeline._cleanups

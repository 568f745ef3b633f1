"""Pages marked deprecated or legacy rank after current ones.

A documentation corpus often keeps the pages of a predecessor product or an old API version
next to the current ones, and they answer the same questions in nearly the same words: a user
asking how to do something today should read the current page first, and the old one only when
nothing current answers. A page is legacy when its own metadata says so (front matter
``deprecated: true``, ``legacy: true``, or ``status: deprecated`` / ``legacy`` / ``archived``,
or the same keys given with the document) or when a segment of its source path is one the
operator names (``gateway_legacy_path_segments``, e.g. ``legacy,v1-archive``).

The rule is a stable partition of the final list (after fusion and reranking): current results
keep their order, legacy ones follow in theirs. Nothing is dropped: a question only a legacy page
answers still gets it. Each result's score stays the one that ordered it (``ordering_scores``
carries the score above down to a result placed below by rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ragmesh.sparse.v1 import sparse_pb2
from services.gateway.fusion import Fused

FLAG_KEYS = ("deprecated", "legacy")
STATUS_KEY = "status"
LEGACY_STATUSES = frozenset({"deprecated", "legacy", "archived", "obsolete"})


def path_segments(setting: str) -> frozenset[str]:
    """The operator's comma-separated path segments, case-folded; empty: no path rule."""
    return frozenset(part.strip().casefold() for part in setting.split(",") if part.strip())


def _flagged(metadata: Mapping[str, str]) -> bool:
    if any(metadata.get(key, "").strip().casefold() == "true" for key in FLAG_KEYS):
        return True
    return metadata.get(STATUS_KEY, "").strip().casefold() in LEGACY_STATUSES


def _on_legacy_path(source_uri: str, segments: frozenset[str]) -> bool:
    # A split, not a pattern: linear in the URI whatever the operator wrote.
    return bool(segments) and any(part.casefold() in segments for part in source_uri.split("/"))


def is_legacy(chunk: sparse_pb2.ChunkText | None, segments: frozenset[str]) -> bool:
    if chunk is None:
        return False
    return _flagged(chunk.metadata) or _on_legacy_path(chunk.source_uri, segments)


def current_first(
    results: Sequence[Fused], chunks: Mapping[str, sparse_pb2.ChunkText], segments: frozenset[str]
) -> list[Fused]:
    """``results`` with the legacy ones moved after every current one, each group in its order."""
    legacy = [is_legacy(chunks.get(item.chunk_id), segments) for item in results]
    if not any(legacy):
        return list(results)
    current = [item for item, old in zip(results, legacy, strict=True) if not old]
    return current + [item for item, old in zip(results, legacy, strict=True) if old]

"""Every internal service's declarations, checked against its contract and the real call graph:
each RPC has a caller rule (a method without one would be refused to everyone), every call the
mesh makes is admitted, nothing else is; and each service's message limit fits its largest
legal request, built here field by field at its limits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.descriptor import FileDescriptor

from meshkit.domain.ids import MAX_DOC_ID_CHARS, MAX_ITEM_ID_CHARS
from meshkit.rpc.identity import (
    EMBEDDER,
    EXTRACTOR,
    GATEWAY,
    INDEX,
    INGESTION,
    INGESTION_WORKER,
    MESH_IDENTITIES,
    NARRATOR,
    OPS,
    PLANNER,
    RERANKER,
    SPARSE,
    Callers,
    check_declaration,
)
from meshkit.settings import (
    EmbedderSettings,
    ExtractorSettings,
    NarratorSettings,
    PlannerSettings,
    RerankerSettings,
)
from ragmesh.embedder.v1 import embedder_pb2
from ragmesh.extractor.v1 import extractor_pb2
from ragmesh.index.v1 import index_pb2
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2
from ragmesh.reranker.v1 import reranker_pb2
from ragmesh.sparse.v1 import sparse_pb2
from services.embedder import servicer as embedder
from services.extractor import servicer as extractor
from services.index import servicer as index
from services.narrator import servicer as narrator
from services.planner import servicer as planner
from services.reranker import servicer as reranker
from services.sparse import servicer as sparse

# service identity -> (its declaration, its contract, the proto service name)
DECLARATIONS: dict[str, tuple[Callers, FileDescriptor, str]] = {
    EMBEDDER: (embedder.CALLERS, embedder_pb2.DESCRIPTOR, "EmbedderService"),
    INDEX: (index.CALLERS, index_pb2.DESCRIPTOR, "IndexService"),
    SPARSE: (sparse.CALLERS, sparse_pb2.DESCRIPTOR, "SparseService"),
    PLANNER: (planner.CALLERS, planner_pb2.DESCRIPTOR, "PlannerService"),
    RERANKER: (reranker.CALLERS, reranker_pb2.DESCRIPTOR, "RerankerService"),
    EXTRACTOR: (extractor.CALLERS, extractor_pb2.DESCRIPTOR, "ExtractorService"),
    NARRATOR: (narrator.CALLERS, narrator_pb2.DESCRIPTOR, "NarratorService"),
}

# Every call the mesh makes between its services (docs/SECURITY.md): caller -> service.method.
CALL_GRAPH: dict[str, set[str]] = {
    GATEWAY: {
        "planner.Plan",
        "planner.Hyde",
        "embedder.Embed",
        "index.Search",
        # Passage text when the sparse service cannot give it (issue 12: answers survive it).
        "index.GetChunks",
        "sparse.SearchBm25",
        "sparse.SearchExact",
        "sparse.GetChunks",
        "reranker.Rerank",
        "extractor.Extract",
        "narrator.Narrate",
        "narrator.NarrateStream",
    },
    EXTRACTOR: {"embedder.Embed"},
    INGESTION_WORKER: {
        "embedder.Embed",
        "index.ReplaceDocuments",
        "index.Delete",
        "sparse.ReplaceDocuments",
        "sparse.Delete",
    },
}
# Reads that are harmless to the callers that already read the data they describe.
ALSO_ALLOWED: dict[str, set[str]] = {
    GATEWAY: {"index.GetStats", "sparse.GetStats", "embedder.GetModelInfo", "reranker.GetModelInfo"},
    EXTRACTOR: {"embedder.GetModelInfo"},
    INGESTION_WORKER: {"embedder.GetModelInfo", "index.Upsert"},
}


def admitted(identity: str) -> set[str]:
    return {
        f"{service}.{method}"
        for service, (callers, _, _) in DECLARATIONS.items()
        for method, ids in callers.items()
        if identity in ids
    }


@pytest.mark.parametrize("service", sorted(DECLARATIONS))
def test_every_rpc_of_the_contract_has_a_caller_rule(service: str) -> None:
    callers, descriptor, name = DECLARATIONS[service]
    methods = [m.name for m in descriptor.services_by_name[name].methods]
    assert check_declaration(service, callers, methods) == []


def test_the_mesh_admits_exactly_its_call_graph() -> None:
    for identity in MESH_IDENTITIES:
        if identity == OPS:
            continue
        expected = CALL_GRAPH.get(identity, set()) | ALSO_ALLOWED.get(identity, set())
        assert admitted(identity) == expected, identity


def test_operators_may_call_everything_and_only_they_list_or_snapshot() -> None:
    every = {f"{s}.{m}" for s, (callers, _, _) in DECLARATIONS.items() for m in callers}
    assert admitted(OPS) == every
    for method in ("index.ListDocuments", "index.Snapshot", "sparse.ListDocuments"):
        service, name = method.split(".")
        assert DECLARATIONS[service][0][name] == {OPS}
    # The public API and the stages that never call out are nobody's callers here.
    for identity in (INGESTION, INDEX, SPARSE, PLANNER, RERANKER, NARRATOR, EMBEDDER):
        assert admitted(identity) == set(), identity


# ------------------------------------------------------------------ message limits

WIDE = "\U0001f600"  # four bytes in UTF-8: the worst case a character limit allows


def text(chars: int) -> str:
    return WIDE * chars


def largest_embed(s: EmbedderSettings) -> Any:
    return embedder_pb2.EmbedRequest(
        texts=[text(s.embedder_max_text_chars)] * s.embedder_max_request_texts,
        kind=embedder_pb2.TEXT_KIND_PASSAGE,
    )


def largest_rerank(s: RerankerSettings) -> Any:
    passages = [
        reranker_pb2.Passage(id=text(MAX_ITEM_ID_CHARS), text=text(s.reranker_max_passage_chars))
        for _ in range(s.reranker_max_passages)
    ]
    return reranker_pb2.RerankRequest(
        query=text(s.reranker_max_query_chars),
        passages=passages,
        top_n=2**32 - 1,
        min_score=1.0,
        fallback_count=9,
    )


def largest_extract(s: ExtractorSettings) -> Any:
    passages = [
        extractor_pb2.Passage(
            id=text(MAX_ITEM_ID_CHARS),
            doc_id="d" * MAX_DOC_ID_CHARS,
            title=text(extractor.MAX_TITLE_CHARS),
            text=text(s.extractor_max_passage_chars),
            score=1.0,
        )
        for _ in range(s.extractor_max_passages)
    ]
    return extractor_pb2.ExtractRequest(
        query=text(s.extractor_max_query_chars), passages=passages, max_facts=2**32 - 1
    )


def largest_narrate(s: NarratorSettings) -> Any:
    sources = [
        narrator_pb2.Source(
            id=text(MAX_ITEM_ID_CHARS),
            doc_id="d" * MAX_DOC_ID_CHARS,
            title=text(narrator.MAX_TITLE_CHARS),
            snippet=text(s.narrator_max_snippet_chars),
        )
        for _ in range(s.narrator_max_sources)
    ]
    facts = [
        narrator_pb2.Fact(text=text(s.narrator_max_fact_chars), source=2**32 - 1, score=1.0)
        for _ in range(s.narrator_max_facts)
    ]
    turns = s.narrator_max_history_turns
    history = [
        narrator_pb2.ChatTurn(
            role=narrator_pb2.ROLE_USER, content=text(s.narrator_max_history_chars // turns)
        )
        for _ in range(turns)
    ]
    return narrator_pb2.NarrateRequest(
        query=text(s.narrator_max_query_chars),
        sources=sources,
        facts=facts,
        history=history,
        max_tokens=2**32 - 1,
    )


def largest_plan(s: PlannerSettings) -> Any:
    turns = s.planner_max_history_turns
    history = [
        planner_pb2.Turn(
            role=planner_pb2.TURN_ROLE_ASSISTANT, content=text(s.planner_max_history_chars // turns)
        )
        for _ in range(turns)
    ]
    return planner_pb2.PlanRequest(
        query=text(s.planner_max_query_chars), max_variations=2**32 - 1, history=history
    )


LIMITS: list[tuple[str, Any, Callable[[Any], int], Callable[[Any], Any]]] = [
    ("embedder", EmbedderSettings, embedder.max_request_bytes, largest_embed),
    ("reranker", RerankerSettings, reranker.max_request_bytes, largest_rerank),
    ("extractor", ExtractorSettings, extractor.max_request_bytes, largest_extract),
    ("narrator", NarratorSettings, narrator.max_request_bytes, largest_narrate),
]


@pytest.mark.parametrize(
    ("name", "settings_class", "limit_of", "largest"), LIMITS, ids=[x[0] for x in LIMITS]
)
def test_each_limit_fits_the_largest_legal_request_and_not_much_more(
    name: str, settings_class: Any, limit_of: Callable[[Any], int], largest: Callable[[Any], Any]
) -> None:
    settings = settings_class()
    size = largest(settings).ByteSize()
    limit = limit_of(settings)
    assert size <= limit, f"{name}: a legal request of {size} bytes would be refused (limit {limit})"
    # Tight: under the mesh-wide 64 MiB, and no more than half again the largest legal request.
    assert limit <= settings.max_message_bytes and limit < 1.5 * size + 128 * 1024, (name, size, limit)


def test_the_planner_limit_fits_its_largest_request() -> None:
    settings = PlannerSettings()
    spec = planner.build_spec(settings)
    assert largest_plan(settings).ByteSize() <= spec.max_request_bytes < 256 * 1024
    assert spec.callers == planner.CALLERS

"""Follow-up questions on the real mesh: "and for the staging cluster?" after a question about
the production cluster is searched as a standalone query and finds the staging cluster's
configuration, which the bare follow-up does not find (a page that only mentions the staging
cluster a lot wins it); Search and Ask say which query they searched."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh_cli.stack import Stack

from .meshclients import Mesh
from .test_ingest import new_collection

pytestmark = pytest.mark.integration

PRODUCTION_DOC, STAGING_DOC = "production-cluster.md", "staging-cluster.md"
STAGING_BACKUPS_DOC = "staging-backups.md"
DOCS = [
    (
        PRODUCTION_DOC,
        "# Production cluster\n\nThe production cluster is configured with twelve worker nodes of "
        "64 GB memory each, three control-plane nodes, autoscaling up to forty nodes and nightly "
        "etcd snapshots kept for thirty days.",
    ),
    (
        STAGING_DOC,
        "# Staging cluster\n\nThe staging cluster is configured with three worker nodes of 16 GB "
        "memory each, a single control-plane node, no autoscaling and etcd snapshots kept for "
        "two days.",
    ),
    (
        "staging-etiquette.md",
        "# Working with staging\n\nBe kind to the staging cluster: the staging cluster is shared by "
        "every team, so announce long jobs on the staging cluster in the team channel, and clean "
        "up what you leave on the staging cluster. The staging cluster is wiped every Monday.",
    ),
    (
        STAGING_BACKUPS_DOC,
        "# Staging backups\n\nBackups of the staging cluster run once a week and are kept for two "
        "days; restoring one takes about ten minutes.",
    ),
    (
        "production-backups.md",
        "# Production backups\n\nBackups of the production cluster run every night and are kept for "
        "thirty days in another region.",
    ),
    (
        "laptop-backups.md",
        "# Laptop backups\n\nYour laptop's backups run every hour. Backups go to the backup "
        "service; check your backups in the settings, and ask IT to restore backups.",
    ),
    (
        "coffee.md",
        "# Coffee machine\n\nThe office coffee machine needs descaling every month; the cleaning "
        "tablets are in the kitchen drawer.",
    ),
]
QUESTION = "How is the production cluster configured?"
FOLLOW_UP = "and for the staging cluster?"
HISTORY = [
    narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_USER, content=QUESTION),
    narrator_pb2.ChatTurn(
        role=narrator_pb2.ROLE_ASSISTANT,
        content="The production cluster is configured with twelve worker nodes [1].",
    ),
]
SEARCH_SERVICES = {"gateway", "planner", "embedder", "index", "sparse", "ingestion", "worker"}
ASK_SERVICES = SEARCH_SERVICES | {"reranker", "extractor", "narrator"}
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
async def corpus(stack: Stack) -> AsyncIterator[str]:
    missing = SEARCH_SERVICES - set(stack.services)
    if missing:
        pytest.skip(f"the services {sorted(missing)} are not here")
    mesh = Mesh(stack)
    try:
        collection = new_collection()
        await mesh.ingest_indexed(collection, DOCS)
        yield collection
    finally:
        await mesh.close()


async def search(
    gateway: gateway_pb2_grpc.GatewayServiceStub, collection: str, query: str, **fields: object
) -> pb.SearchResponse:
    request = pb.SearchRequest(collection=collection, query=query, top_k=4, collapse_documents=True, **fields)  # type: ignore[arg-type]
    return await gateway.Search(request, timeout=TIMEOUT_S, wait_for_ready=True)


def documents(response: pb.SearchResponse) -> list[str]:
    return [r.doc_id for r in response.results]


async def test_a_follow_up_is_searched_as_a_standalone_query(
    corpus: str, gateway: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    followed = await search(gateway, corpus, FOLLOW_UP, history=HISTORY)
    assert not [d for d in followed.degradations if d.stage == pb.STAGE_PLANNER], followed.degradations
    assert followed.searched_query == followed.plan.searched_query == "staging cluster configured"
    assert documents(followed)[0] == STAGING_DOC, documents(followed)
    bare = await search(gateway, corpus, FOLLOW_UP)
    assert bare.searched_query == FOLLOW_UP


async def test_a_follow_up_finds_what_the_bare_follow_up_misses(
    corpus: str, gateway: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    history = [
        narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_USER, content="How big is the staging cluster?"),
        narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_ASSISTANT, content="Three worker nodes [1]."),
    ]
    bare = await search(gateway, corpus, "what about its backups?")
    assert documents(bare)[0] != STAGING_BACKUPS_DOC, documents(bare)
    followed = await search(gateway, corpus, "what about its backups?", history=history)
    assert followed.searched_query == "big staging cluster backups"
    assert documents(followed)[0] == STAGING_BACKUPS_DOC, documents(followed)


async def test_ask_answers_a_follow_up_from_the_right_document(
    stack: Stack, corpus: str, gateway: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    missing = ASK_SERVICES - set(stack.services)
    if missing:
        pytest.skip(f"the services {sorted(missing)} are not here")
    request = pb.AskRequest(
        collection=corpus, query=FOLLOW_UP, history=HISTORY, mode=pb.ANSWER_MODE_EXTRACTIVE
    )
    answer = await gateway.Ask(request, timeout=TIMEOUT_S * 2, wait_for_ready=True)
    assert answer.searched_query == "staging cluster configured"
    assert answer.answered, answer.answer
    # The answer states the staging cluster's configuration, and nothing of the production
    # cluster it was not asked about. (Which other staging passages it adds, and in what order,
    # is the answer stage's business.)
    doc_of = {c.number: c.doc_id for c in answer.citations}
    cited = [doc_of[n] for s in answer.sentences for n in s.sources]
    assert STAGING_DOC in cited and PRODUCTION_DOC not in cited, answer.answer

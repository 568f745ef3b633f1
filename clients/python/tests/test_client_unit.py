"""The client's failure paths against an in-process fake of the gateway and the ingestion API:
which calls retry (safe reads, on UNAVAILABLE / RESOURCE_EXHAUSTED only) and which never do
(writes), deadlines, the error classes, auth metadata, TLS, and the typed results."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ragmesh_client import (
    TLS,
    Answer,
    AskDelta,
    AskProgress,
    AsyncClient,
    Client,
    DeadlineExceededError,
    Document,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RagmeshError,
    ResourceExhaustedError,
    RetryPolicy,
    UnauthenticatedError,
    UnavailableError,
)
from ragmesh_client.config import ClientConfig, grpc_target

from .fakemesh import FakeMesh

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
FAST_RETRY = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05)


@pytest.fixture
def mesh() -> Iterator[FakeMesh]:
    fake = FakeMesh()
    yield fake
    fake.stop()


@pytest.fixture
def client(mesh: FakeMesh) -> Iterator[Client]:
    with Client(mesh.address, ingestion=mesh.address, api_key="k-123", retry=FAST_RETRY) as c:
        yield c


# ---------------------------------------------------------------------------- retries


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
def test_a_read_is_retried_on_transient_codes(mesh: FakeMesh, client: Client, code: grpc.StatusCode) -> None:
    mesh.script.outcomes = [code, code]
    response = client.search("docs", "rotate keys")
    assert mesh.script.attempts("Search") == 3
    assert response.results[0].doc_id == "doc-1"


def test_status_reads_are_retried(mesh: FakeMesh, client: Client) -> None:
    mesh.script.outcomes = [UNAVAILABLE]
    assert client.collection_status("docs").indexed == 3
    assert mesh.script.attempts("GetCollectionStatus") == 2


def test_retries_stop_after_the_policy_s_attempts(mesh: FakeMesh, client: Client) -> None:
    mesh.script.outcomes = [UNAVAILABLE] * 10
    with pytest.raises(UnavailableError) as caught:
        client.search("docs", "rotate keys")
    assert mesh.script.attempts("Search") == FAST_RETRY.max_attempts
    assert caught.value.message == "scripted unavailable"


@pytest.mark.parametrize(
    "call, method",
    [
        (lambda c: c.ingest("docs", [Document("a.md", "# A\n\ntext", format="markdown")]), "IngestDocuments"),
        (lambda c: c.delete("docs", ["a.md"]), "DeleteDocuments"),
        (lambda c: c.replay_dead_letters("docs"), "ReplayDeadLetters"),
    ],
)
def test_writes_are_never_retried(mesh: FakeMesh, client: Client, call: object, method: str) -> None:
    mesh.script.outcomes = [UNAVAILABLE]
    with pytest.raises(UnavailableError):
        call(client)  # type: ignore[operator]
    assert mesh.script.attempts(method) == 1


def test_a_refused_read_is_not_retried(mesh: FakeMesh, client: Client) -> None:
    mesh.script.outcomes = [grpc.StatusCode.INVALID_ARGUMENT]
    with pytest.raises(InvalidArgumentError):
        client.search("docs", "rotate keys")
    assert mesh.script.attempts("Search") == 1


def test_retries_can_be_turned_off(mesh: FakeMesh) -> None:
    mesh.script.outcomes = [UNAVAILABLE]
    with Client(mesh.address, retry=RetryPolicy(max_attempts=1)) as c, pytest.raises(UnavailableError):
        c.search("docs", "q")
    assert mesh.script.attempts("Search") == 1


# ---------------------------------------------------------------------------- deadlines


def test_every_call_carries_a_deadline_default_and_override(mesh: FakeMesh, client: Client) -> None:
    client.search("docs", "q")
    client.search("docs", "q", timeout=2.0)
    client.ask("docs", "q")
    client.delete("docs", ["a"])
    remaining = [s.time_remaining for s in mesh.script.seen]
    assert all(r is not None for r in remaining)
    search_default, search_override, ask_default, delete_default = remaining
    # gRPC sends a timeout in coarse units (rounded up): up to a second more than asked.
    assert 25 < search_default <= 31  # type: ignore[operator]
    assert 1 < search_override <= 2.1  # type: ignore[operator]
    assert 100 < ask_default <= 121  # type: ignore[operator]
    assert 25 < delete_default <= 31  # type: ignore[operator]


def test_a_late_answer_raises_deadline_exceeded_within_the_deadline(mesh: FakeMesh, client: Client) -> None:
    mesh.script.delay_s = 1.0
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError) as caught:
        client.search("docs", "q", timeout=0.2)
    assert time.monotonic() - started < 0.8
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert caught.value.message == "no answer before the deadline"


def test_a_non_positive_timeout_is_refused(client: Client) -> None:
    with pytest.raises(ValueError, match="timeout"):
        client.search("docs", "q", timeout=0)


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "code, cls",
    [
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgumentError),
        (grpc.StatusCode.NOT_FOUND, NotFoundError),
        (grpc.StatusCode.UNAUTHENTICATED, UnauthenticatedError),
        (grpc.StatusCode.PERMISSION_DENIED, PermissionDeniedError),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhaustedError),
        (grpc.StatusCode.INTERNAL, RagmeshError),
    ],
)
def test_status_codes_become_exceptions(
    mesh: FakeMesh, client: Client, code: grpc.StatusCode, cls: type
) -> None:
    mesh.script.outcomes = [code] * 5
    with pytest.raises(RagmeshError) as caught:
        client.delete("docs", ["a"])
    assert type(caught.value) is cls
    assert caught.value.code == code
    assert caught.value.message == f"scripted {code.name.lower()}"
    # The id the server logged the failure under (echoed in its trailers) is the one sent.
    sent = mesh.script.seen[-1].metadata["x-request-id"]
    assert caught.value.request_id == sent and len(sent) == 16


def test_an_unreachable_server_says_so_without_transport_internals() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with (
        Client(f"127.0.0.1:{port}", retry=RetryPolicy(max_attempts=1)) as c,
        pytest.raises(UnavailableError) as caught,
    ):
        c.search("docs", "q", timeout=5)
    assert caught.value.message == "could not reach the service"
    assert str(port) not in str(caught.value)


def test_a_degraded_answer_raises_when_refused(mesh: FakeMesh, client: Client) -> None:
    mesh.script.degraded = True
    assert client.ask("docs", "q").degradations[0].stage == "narrator"
    with pytest.raises(UnavailableError) as caught:
        client.ask("docs", "q", allow_degraded=False)
    assert [(d.stage, d.reason) for d in caught.value.degradations] == [("narrator", "deadline")]
    with pytest.raises(UnavailableError) as caught_search:
        client.search("docs", "q", allow_degraded=False)
    assert caught_search.value.degradations[0].legs == ("bm25", "exact")


# ---------------------------------------------------------------------------- auth and TLS


def test_the_api_key_and_a_request_id_go_with_every_call(mesh: FakeMesh, client: Client) -> None:
    client.search("docs", "q")
    list(client.ask_stream("docs", "q"))
    client.ingest("docs", [Document("a.txt", "text")])
    for seen in mesh.script.seen:
        assert seen.metadata["authorization"] == "Bearer k-123"
    ids = [s.metadata["x-request-id"] for s in mesh.script.seen]
    assert len(set(ids)) == len(ids)


def test_no_key_no_authorization_header(mesh: FakeMesh) -> None:
    with Client(mesh.address) as c:
        c.search("docs", "q")
    assert "authorization" not in mesh.script.seen[0].metadata
    assert "k-123" not in repr(ClientConfig(api_key="k-123"))


def _pki(tmp_path: Path) -> Path:
    from meshkit.rpc.pki import write_pki

    return write_pki(tmp_path / "pki", identities=["gateway", "ops"], infra=False).directory


def test_mtls_with_a_client_certificate(tmp_path: Path) -> None:
    pki = _pki(tmp_path)
    credentials = grpc.ssl_server_credentials(
        [((pki / "gateway.key").read_bytes(), (pki / "gateway.crt").read_bytes())],
        root_certificates=(pki / "ca.crt").read_bytes(),
        require_client_auth=True,
    )
    mesh = FakeMesh(credentials)
    try:
        tls = TLS(pki / "ca.crt", pki / "ops.crt", pki / "ops.key", server_name="localhost")
        with Client(mesh.address, tls=tls) as c:
            assert c.search("docs", "q").results
        # Without its certificate the handshake fails: nothing reaches the service.
        without = Client(mesh.address, tls=TLS(pki / "ca.crt"), retry=RetryPolicy(max_attempts=1))
        with without as c, pytest.raises(UnavailableError):
            c.search("docs", "q", timeout=5)
        assert mesh.script.attempts("Search") == 1
    finally:
        mesh.stop()


def test_half_a_key_pair_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="together"):
        TLS(tmp_path / "ca.crt", cert_file=tmp_path / "c.crt")


def test_config_from_the_cli_s_environment(tmp_path: Path) -> None:
    config = ClientConfig.from_env(
        {
            "RAGMESH_GATEWAY_ADDRESS": "10.0.0.1:1",
            "RAGMESH_INGESTION_ADDRESS": "10.0.0.2:2",
            "RAGMESH_API_KEY": "secret",
            "RAGMESH_TLS_CA_FILE": str(tmp_path / "ca.crt"),
            "RAGMESH_TLS_SERVER_NAME": "localhost",
        }
    )
    assert (config.gateway, config.ingestion, config.api_key) == ("10.0.0.1:1", "10.0.0.2:2", "secret")
    assert config.tls == TLS(tmp_path / "ca.crt", server_name="localhost")
    assert grpc_target("127.0.0.1:1,127.0.0.1:2") == "ipv4:127.0.0.1:1,127.0.0.1:2"
    assert grpc_target("dns:///gw:50056") == "dns:///gw:50056"


# ---------------------------------------------------------------------------- typed results


def test_search_results_are_typed(client: Client) -> None:
    response = client.search(
        "docs", "rotate keys", top_k=2, filter={"team": "platform"}, weights={"exact": 0}
    )
    first, second = response.results
    assert (first.chunk_id, first.doc_id, first.title, first.source_uri) == (
        "doc-1#0",
        "doc-1",
        "Rotating keys",
        "file:///docs/keys.md",
    )
    assert first.score == 3.25 and first.rerank_score == 3.25 and first.fused_score == 0.5
    assert second.score == 0.25 and second.rerank_score is None
    assert first.metadata == {"team": "platform"}
    assert first.location.heading_path == ("Keys", "Rotation")
    assert first.leg_ranks == {"dense": 1, "bm25": 3}
    assert response.reranked and response.timings == {"total": 12.5}


def test_ask_answers_are_typed(client: Client) -> None:
    answer = client.ask("docs", "how?", mode="extractive", history=[("user", "hi"), ("assistant", "hello")])
    assert answer.answered and answer.mode == "extractive"
    assert answer.citations[0].number == 1 and answer.citations[0].doc_id == "doc-1"
    sentence = answer.sentences[0]
    assert (sentence.sources, sentence.support_check, sentence.support_score) == ((1,), "cross_encoder", 2.5)
    assert answer.sources[0].cited and answer.degradations == ()


def test_bad_options_are_refused_before_any_call(mesh: FakeMesh, client: Client) -> None:
    with pytest.raises(ValueError, match="mode"):
        client.ask("docs", "q", mode="poetry")
    with pytest.raises(ValueError, match="leg"):
        client.search("docs", "q", weights={"vibes": 1.0})
    assert mesh.script.seen == []


def test_ask_stream_yields_progress_text_then_the_answer(client: Client) -> None:
    events = list(client.ask_stream("docs", "how?"))
    assert isinstance(events[0], AskProgress) and events[0].count == 5
    assert events[1] == AskDelta("Mint a new key")
    assert isinstance(events[-1], Answer) and events[-1].answered


def test_a_broken_stream_raises_the_mapped_error(mesh: FakeMesh, client: Client) -> None:
    mesh.script.stream_break = grpc.StatusCode.INTERNAL
    events = []
    with pytest.raises(RagmeshError) as caught:
        for event in client.ask_stream("docs", "how?"):
            events.append(event)
    assert caught.value.code == grpc.StatusCode.INTERNAL
    # Not retried once a message arrived: the progress event came once.
    assert len(events) == 1 and mesh.script.attempts("AskStream") == 1


def test_ingest_files_reads_format_and_id_from_the_file(
    mesh: FakeMesh, client: Client, tmp_path: Path
) -> None:
    page = tmp_path / "guide.md"
    page.write_text("# Guide\n\nBody.")
    assert client.ingest_files("docs", [page])[0].doc_id == "guide.md"
    with pytest.raises(ValueError, match="unsupported"):
        client.ingest_files("docs", [tmp_path / "x.exe"])


# ---------------------------------------------------------------------------- asyncio


async def test_async_client_retries_reads_not_writes(mesh: FakeMesh) -> None:
    async with AsyncClient(mesh.address, ingestion=mesh.address, api_key="k", retry=FAST_RETRY) as c:
        mesh.script.outcomes = [UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert (await c.search("docs", "q")).results
        assert mesh.script.attempts("Search") == 3
        mesh.script.outcomes = [UNAVAILABLE]
        with pytest.raises(UnavailableError):
            await c.ingest("docs", [Document("a.txt", "t")])
        assert mesh.script.attempts("IngestDocuments") == 1


async def test_async_deadline_and_stream(mesh: FakeMesh) -> None:
    async with AsyncClient(mesh.address) as c:
        events = [e async for e in c.ask_stream("docs", "q")]
        assert isinstance(events[-1], Answer)
        mesh.script.delay_s = 1.0
        with pytest.raises(DeadlineExceededError):
            await c.ask("docs", "q", timeout=0.2)


def test_a_contract_message_is_sent_as_is_and_checked(mesh: FakeMesh, client: Client) -> None:
    from ragmesh_client._pb.gateway.v1 import gateway_pb2

    request = gateway_pb2.SearchRequest(collection="docs", query="q", top_k=1, include_leg_results=True)
    assert client.search("", "", request=request).raw.results
    with pytest.raises(TypeError, match="SearchRequest"):
        client.search("", "", request=gateway_pb2.AskRequest(collection="docs", query="q"))
    with pytest.raises(ValueError, match="not both"):
        client.search("", "", request=request, top_k=3)
    assert mesh.script.attempts("Search") == 1


def test_retries_are_throttled_when_most_attempts_fail(mesh: FakeMesh, client: Client) -> None:
    """After half the channel's retry tokens are spent, failures are not retried any more."""
    mesh.script.outcomes = [UNAVAILABLE] * 100
    for _ in range(6):
        with pytest.raises(UnavailableError):
            client.search("docs", "q")
    # 10 tokens: the first call's retries spend down to 6, then one more attempt reaches 5 and
    # from there each call makes one attempt only (instead of 4 each: 24).
    assert mesh.script.attempts("Search") < 12


def test_a_results_score_is_the_gateways_ordering_score_when_it_sends_one() -> None:
    from ragmesh_client import _convert
    from ragmesh_client._pb.gateway.v1 import gateway_pb2

    blended = gateway_pb2.SearchResult(chunk_id="c", fused_score=0.5, rerank_score=1.5, score=0.03125)
    assert _convert.search_result(blended).score == 0.03125
    older = gateway_pb2.SearchResult(chunk_id="c", fused_score=0.5, rerank_score=1.5)
    assert _convert.search_result(older).score == 1.5

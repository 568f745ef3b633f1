"""meshkit.rpc.auth: keys file, constant-time matching, permissions, rate limits, and (through a real
server) the interceptor hook, the log context and what never reaches a log."""

from __future__ import annotations

import hmac
import io
import json
import logging
import re
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from meshkit.core.errors import ServiceError
from meshkit.core.logs import JsonFormatter, api_key_name_var
from meshkit.rpc import auth
from meshkit.rpc.auth import (
    READ,
    WRITE,
    Guard,
    KeysFileError,
    KeyStore,
    Rate,
    Rule,
    TokenBucket,
    credential_from,
    digest_of,
    guard_for,
    key_entry,
    key_id,
    new_api_key,
    parse_keys,
)
from meshkit.rpc.server import ServiceSpec, start_service
from meshkit.settings import GatewaySettings, IngestionSettings, LLMServerSettings, LLMSettings, MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc

READER_KEY = "rmk_reader-secret-value"
WRITER_KEY = "rmk_writer-secret-value"


def keys_json(*entries: dict[str, Any]) -> str:
    return json.dumps({"keys": list(entries)})


def entry(
    name: str, key: str, read: list[str], write: list[str] | None = None, **extra: Any
) -> dict[str, Any]:
    return {"name": name, "sha256": digest_of(key), "read": read, "write": write or [], **extra}


KEYS = parse_keys(
    keys_json(
        entry("reader", READER_KEY, ["docs", "faq"]),
        entry("writer", WRITER_KEY, ["*"], ["docs"], rate={"per_second": 2, "burst": 3}),
    ),
    "test",
)


class Req:
    def __init__(self, collection: str) -> None:
        self.collection = collection


RULES = {
    "Search": Rule(READ, lambda r: r.collection),
    "Ingest": Rule(WRITE, lambda r: r.collection),
    "List": Rule(READ),
    "Replay": Rule(WRITE, lambda r: r.collection, all_when_empty=True),
}


def bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


def code_of(exc: pytest.ExceptionInfo[ServiceError]) -> grpc.StatusCode:
    return exc.value.code


# ----------------------------------------------------------------------------- keys file


def test_keys_file_parses_names_grants_and_rates() -> None:
    reader, writer = KEYS
    assert (reader.name, reader.read, reader.write, reader.rate) == ("reader", {"docs", "faq"}, set(), None)
    assert writer.rate == Rate(2.0, 3)
    assert READER_KEY not in repr(reader) and digest_of(READER_KEY) not in repr(reader)


def test_default_rate_applies_to_entries_without_one() -> None:
    default = Rate(5.0, 5)
    keys = parse_keys(
        keys_json(entry("a", "k1", ["x"]), entry("b", "k2", ["x"], rate={"per_second": 0})), "t", default
    )
    assert keys[0].rate == default
    assert keys[1].rate is None  # an explicit 0: unlimited
    assert Rate.of(2.5, None) == Rate(2.5, 3)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ('{"keys": [{"name": "a", "read": ["x"]}]}', "keys.0.sha256: Field required"),
        (keys_json({**entry("a", "k", ["x"]), "sha256": "abc"}), "keys.0.sha256"),
        (keys_json(entry("a", "k", ["x"]), entry("a", "k2", ["x"])), "appears twice"),
        (keys_json(entry("a", "k", ["x"]), entry("b", "k", ["x"])), "same sha256"),
        (keys_json(entry("a", "k", [])), "grants nothing"),
        (keys_json(entry("a", "k", ["Bad Name"])), "keys.0.read"),
        (keys_json({**entry("a", "k", ["x"]), "admin": True}), "keys.0.admin"),
        (keys_json(entry("a b", "k", ["x"])), "keys.0.name"),
        (keys_json(entry("a", "k", ["x"], rate={"per_second": -1})), "keys.0.rate.per_second"),
        ('{"keys": {}}', "keys"),
    ],
)
def test_bad_keys_files_say_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(KeysFileError) as err:
        parse_keys(text, "keys.json")
    assert str(err.value).startswith("keys.json: ")
    assert problem in str(err.value)


def test_a_plaintext_key_pasted_as_digest_is_not_echoed() -> None:
    secret = new_api_key()
    with pytest.raises(KeysFileError) as err:
        parse_keys(keys_json({**entry("a", "k", ["x"]), "sha256": secret}), "keys.json")
    assert secret not in str(err.value)


def test_unreadable_keys_file(tmp_path: Path) -> None:
    with pytest.raises(KeysFileError, match="cannot read"):
        auth.load_keys(tmp_path / "missing.json")


def test_key_entry_round_trips_through_the_parser() -> None:
    key = new_api_key()
    assert key.startswith("rmk_") and len(key) > 40 and key != new_api_key()
    made = key_entry("app", key, ["docs"], ["docs"], Rate(20, 40))
    assert key not in json.dumps(made)
    (parsed,) = parse_keys(keys_json(made), "t")
    assert KeyStore([parsed]).match(key) == parsed
    with pytest.raises(KeysFileError, match="read"):
        key_entry("app", key, ["NOPE!"], [], None)


# ----------------------------------------------------------------------------- matching


def test_store_matches_only_the_exact_key() -> None:
    store = KeyStore(KEYS)
    assert store.match(READER_KEY) is KEYS[0]
    assert store.match(WRITER_KEY) is KEYS[1]
    for wrong in ("", READER_KEY[:-1], READER_KEY + "x", READER_KEY.upper(), digest_of(READER_KEY)):
        assert store.match(wrong) is None


def test_every_digest_is_compared_even_after_a_match(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    store = KeyStore(KEYS)
    assert store.match(READER_KEY) is KEYS[0]  # the first entry matches...
    assert len(compared) == len(KEYS)  # ...and the others are compared all the same
    compared.clear()
    assert store.match("wrong") is None
    assert len(compared) == len(KEYS)


def test_credentials_from_metadata() -> None:
    assert credential_from(bearer("k1")) == "k1"
    assert credential_from([("authorization", "bearer   k2 ")]) == "k2"
    assert credential_from([("x-api-key", "k3")]) == "k3"
    assert credential_from([("x-request-id", "r")]) is None
    assert credential_from(None) is None
    for bad in ("Basic dXNlcjpwdw==", "Bearer", "k4"):
        with pytest.raises(ServiceError) as err:
            credential_from([("authorization", bad)])
        assert code_of(err) == grpc.StatusCode.UNAUTHENTICATED
        assert "dXNlcjpwdw" not in err.value.message and "k4" not in err.value.message


# ----------------------------------------------------------------------------- permissions


def test_may_honours_lists_and_wildcards() -> None:
    reader, writer = KEYS
    assert reader.may(READ, "docs") and not reader.may(READ, "hr") and not reader.may(WRITE, "docs")
    assert writer.may(READ, "anything") and writer.may(WRITE, "docs") and not writer.may(WRITE, "faq")
    # '*' asks for every collection at once: only a wildcard grant covers it.
    assert writer.may(READ, "*") and not writer.may(WRITE, "*") and not reader.may(READ, "*")


def test_guard_authenticates_then_authorises() -> None:
    guard = Guard("svc", RULES, KEYS)
    assert guard.check("Search", Req("docs"), bearer(READER_KEY)) is KEYS[0]
    assert guard.check("Search", Req("docs"), [("x-api-key", READER_KEY)]) is KEYS[0]

    for metadata in ([], bearer("rmk_wrong"), bearer("x" * 10_000)):
        with pytest.raises(ServiceError) as err:
            guard.check("Search", Req("docs"), metadata)
        assert code_of(err) == grpc.StatusCode.UNAUTHENTICATED
        assert "rmk_wrong" not in err.value.message

    with pytest.raises(ServiceError) as err:
        guard.check("Search", Req("hr"), bearer(READER_KEY))
    assert code_of(err) == grpc.StatusCode.PERMISSION_DENIED
    assert "'reader'" in err.value.message and "'hr'" in err.value.message
    assert READER_KEY not in err.value.message

    with pytest.raises(ServiceError) as err:
        guard.check("Ingest", Req("docs"), bearer(READER_KEY))
    assert code_of(err) == grpc.StatusCode.PERMISSION_DENIED


def test_guard_fails_closed_and_refuses_empty_collections() -> None:
    guard = Guard("svc", RULES, KEYS)
    with pytest.raises(ServiceError) as err:
        guard.check("Unlisted", Req("docs"), bearer(WRITER_KEY))
    assert code_of(err) == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(ServiceError) as err:
        guard.check("Search", Req(""), bearer(READER_KEY))
    assert code_of(err) == grpc.StatusCode.INVALID_ARGUMENT
    # Empty means every collection for these: only a '*' grant will do.
    with pytest.raises(ServiceError) as err:
        guard.check("Replay", Req(""), bearer(WRITER_KEY))
    assert code_of(err) == grpc.StatusCode.PERMISSION_DENIED
    assert "every collection" in err.value.message
    assert guard.check("Replay", Req("docs"), bearer(WRITER_KEY)) is KEYS[1]
    # Not collection-scoped: any key granted the action on something.
    assert guard.check("List", Req(""), bearer(READER_KEY)) is KEYS[0]


def test_readable_filters_by_the_current_caller() -> None:
    assert auth.readable(["docs", "hr"]) == ["docs", "hr"]  # auth off: everything
    token = auth.principal_var.set(KEYS[0])
    try:
        assert auth.readable(["docs", "hr", "faq"]) == ["docs", "faq"]
    finally:
        auth.principal_var.reset(token)


def test_outcomes_are_counted_by_key_id_never_by_name() -> None:
    def count(key: str, outcome: str) -> float:
        labels = {"service": "svc-count", "key": key, "outcome": outcome}
        return REGISTRY.get_sample_value("ragmesh_auth_requests_total", labels) or 0.0

    guard = Guard("svc-count", RULES, KEYS)
    guard.check("Search", Req("docs"), bearer(READER_KEY))
    for metadata, request in ((bearer("nope"), Req("docs")), (bearer(READER_KEY), Req("hr"))):
        with pytest.raises(ServiceError):
            guard.check("Search", request, metadata)
    reader = KEYS[0].id
    assert count(reader, "ok") == 1
    assert count("-", "unauthenticated") == 1
    assert count(reader, "permission_denied") == 1
    assert count("reader", "ok") == 0
    labels = {
        sample.labels["key"]
        for metric in REGISTRY.collect()
        if metric.name == "ragmesh_auth_requests"
        for sample in metric.samples
        if sample.labels.get("service") == "svc-count"
    }
    assert labels == {reader, "-"}


def test_key_ids_come_from_the_digest_and_reveal_neither_it_nor_the_name() -> None:
    reader = KEYS[0]
    digest = digest_of(READER_KEY)
    assert reader.id == key_id(digest) == key_id(digest.upper()) == key_id(digest.encode())
    assert re.fullmatch(r"kid_[0-9a-f]{12}", reader.id)
    # A hash of the digest: not a piece of it, nor of the key, nor the name.
    assert reader.id[4:] not in digest and reader.id[4:] not in READER_KEY and "reader" not in reader.id
    assert reader.id != KEYS[1].id
    assert reader.id in repr(reader) and digest not in repr(reader)


# ----------------------------------------------------------------------------- rate limits


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_allows_a_burst_then_refills() -> None:
    clock = Clock()
    bucket = TokenBucket(Rate(2.0, 3), clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.5)
    clock.now += 0.5
    assert bucket.take() == 0.0
    clock.now += 100  # refills to the burst, not beyond
    assert [bucket.take() == 0.0 for _ in range(4)] == [True, True, True, False]


def test_bucket_is_thread_safe() -> None:
    bucket = TokenBucket(Rate(1.0, 500), Clock())  # a frozen clock: exactly 500 tokens
    granted: list[int] = []

    def hammer() -> None:
        granted.append(sum(1 for _ in range(200) if bucket.take() == 0.0))

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(granted) == 500


def test_guard_rate_limits_per_key_with_a_retry_hint() -> None:
    clock = Clock()
    guard = Guard("svc", RULES, KEYS, clock)
    for _ in range(3):
        guard.check("Search", Req("docs"), bearer(WRITER_KEY))
    with pytest.raises(ServiceError) as err:
        guard.check("Search", Req("docs"), bearer(WRITER_KEY))
    assert code_of(err) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "'writer'" in err.value.message and "retry in 0.500s" in err.value.message
    # Another key has its own budget (here: none, unlimited).
    for _ in range(20):
        guard.check("Search", Req("docs"), bearer(READER_KEY))
    clock.now += 0.5
    guard.check("Search", Req("docs"), bearer(WRITER_KEY))


# ----------------------------------------------------------------------------- configuration


def test_guard_for_is_off_without_a_keys_file(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    assert guard_for("internal", {}, MeshSettings(api_keys_file=tmp_path / "ignored.json")) is None
    with caplog.at_level(logging.WARNING, logger="meshkit.rpc.auth"):
        assert guard_for("gateway", RULES, MeshSettings()) is None
    assert "auth is OFF" in caplog.text


def test_guard_for_loads_the_file_with_the_default_rate(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(keys_json(entry("a", "k1", ["docs"])))
    guard = guard_for("gateway", RULES, MeshSettings(api_keys_file=path, api_key_rate_per_s=4))
    assert guard is not None
    assert guard.store.keys[0].rate == Rate(4.0, 4)
    path.write_text("{oops")
    with pytest.raises(KeysFileError):
        guard_for("gateway", RULES, MeshSettings(api_keys_file=path))


def test_settings_never_show_secrets() -> None:
    secrets_: dict[str, Any] = {
        "api_key": "cli-key-123",
        "s3_secret_key": "s3-secret-456",
        "llm_api_key": "llm-key-789",
        "nats_password": "nats-pw-012",
    }
    settings = LLMSettings(**secrets_)
    shown = repr(settings) + str(settings)
    for value in secrets_.values():
        assert value not in shown
    for cls in (GatewaySettings, IngestionSettings):
        assert "cli-key-123" not in repr(cls(api_key="cli-key-123"))
    server = LLMServerSettings(llm_server_api_key="llm-server-key-345")
    assert "llm-server-key-345" not in repr(server) + str(server)


# ----------------------------------------------------------------------------- through a server


class Echo(embedder_pb2_grpc.EmbedderServiceServicer):
    async def Embed(self, request: Any, context: aio.ServicerContext) -> embedder_pb2.EmbedResponse:
        logging.getLogger("test.echo").info("handled")
        return embedder_pb2.EmbedResponse(model=api_key_name_var.get())


async def test_server_guard_log_context_and_no_secret_in_logs(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(keys_json(entry("reader", READER_KEY, ["docs"])))
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("test"))
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    spec = ServiceSpec(
        name="guarded-echo",
        grpc_services=["ragmesh.embedder.v1.EmbedderService"],
        register=lambda s: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(Echo(), s),
        access={"Embed": Rule(READ)},
    )
    running = await start_service(spec, MeshSettings(host="127.0.0.1", port=0, api_keys_file=path))
    try:
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
            reply = await stub.Embed(embedder_pb2.EmbedRequest(), metadata=bearer(READER_KEY), timeout=5)
            assert reply.model == "reader"  # the handler sees the caller's name
            with pytest.raises(aio.AioRpcError) as err:
                await stub.Embed(embedder_pb2.EmbedRequest(), metadata=bearer(WRITER_KEY), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert WRITER_KEY not in (err.value.details() or "")
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING  # open without a key
    finally:
        await running.stop(0)
        root.removeHandler(handler)
        root.setLevel(old_level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    rpc = [line for line in lines if line["msg"] == "rpc"]
    assert [(line["code"], line.get("api_key_name")) for line in rpc] == [
        ("OK", "reader"),
        ("UNAUTHENTICATED", None),
    ]
    assert any(line["msg"] == "handled" and line.get("api_key_name") == "reader" for line in lines)
    text = stream.getvalue()
    for secret in (READER_KEY, WRITER_KEY, digest_of(READER_KEY), digest_of(WRITER_KEY)):
        assert secret not in text

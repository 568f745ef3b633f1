"""The secure local stack's credentials (see test_secure_mesh.py for the stack): NATS refuses
anonymous clients, a wrong password and plaintext, and admits a service's user only to its
subjects; S3 refuses one service's key on another's bucket; every process holds only its own
credentials."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import nats.errors
import pytest
from minio.error import InvalidResponseError, S3Error

from meshkit.rpc.identity import INDEX, INGESTION, INGESTION_WORKER, OPS, SPARSE
from meshkit.settings import MeshSettings
from meshkit.storage.natsconn import connect_options
from meshkit.storage.objectstore import ObjectStore
from ragmesh_cli.secure import DOCUMENTS, IDENTITY_OF_KIND, LLM_CLIENTS, MODELS, S3_GRANTS, SNAPSHOTS
from ragmesh_cli.stack import Stack

pytestmark = pytest.mark.integration


PROBE = "test-probe"


def nats_settings(stack: Stack, user: str | None, password: str | None = None) -> MeshSettings:
    passwords = stack.secrets.nats_passwords() if stack.secrets else {}
    return MeshSettings(
        nats_url=f"tls://{stack.address('nats')}",
        nats_user=user or "",
        nats_password=password if password is not None else passwords.get(user or "", ""),
        tls_ca_file=stack.client_tls().ca_file,
    )


async def connect(settings: MeshSettings, errors: list[str] | None = None) -> nats.NATS:
    async def on_error(exc: Exception) -> None:
        if errors is not None:
            errors.append(str(exc))

    return await nats.connect(
        **connect_options(settings), name=PROBE, allow_reconnect=False, connect_timeout=3, error_cb=on_error
    )


async def test_nats_admits_only_its_users_and_each_only_to_its_subjects(
    secure_stack: Stack, indexed: dict[str, list[str]]
) -> None:
    for who, settings in {
        "no user": nats_settings(secure_stack, None),
        "wrong password": nats_settings(secure_stack, INGESTION_WORKER, "guess"),
        "plaintext": nats_settings(secure_stack, INGESTION_WORKER).model_copy(
            update={"nats_url": f"nats://{secure_stack.address('nats')}", "tls_ca_file": None}
        ),
    }.items():
        with pytest.raises((nats.errors.Error, OSError, TimeoutError)):
            nc = await connect(settings)
            await nc.close()
            raise AssertionError(f"{who}: connected")

    errors: list[str] = []
    worker = await connect(nats_settings(secure_stack, INGESTION_WORKER), errors)
    try:
        js = worker.jetstream(timeout=2)
        # Its own business works: it reads the ingest stream's state ...
        assert (await js.stream_info("RAGMESH_INGEST")).config.name == "RAGMESH_INGEST"
        # ... but it may not write a store's log or drop a stream. (It may publish ingest events:
        # its reconciler republishes a request whose event was lost.)
        for publish in (
            js.publish("ragmesh.log.index.0", b"{}"),
            js.delete_stream("RAGMESH_INGEST_DLQ"),
        ):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
                await publish
        await asyncio.sleep(0.2)
    finally:
        await worker.close()
    for subject in ("ragmesh.log.index.0", "$js.api.stream.delete.ragmesh_ingest_dlq"):
        assert any("permissions violation" in e.lower() and subject in e.lower() for e in errors), (
            subject,
            errors,
        )

    errors.clear()
    index = await connect(nats_settings(secure_stack, INDEX), errors)
    try:
        # The index's user may neither forge ingest events nor read the ingestion state.
        with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
            await index.jetstream(timeout=2).publish("ragmesh.ingest.beta", b"{}")
        with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
            await index.jetstream(timeout=2).get_msg("KV_ragmesh_doc_records", 1)
        await asyncio.sleep(0.2)
    finally:
        await index.close()
    for subject in ("ragmesh.ingest.beta", "kv_ragmesh_doc_records"):
        assert any("permissions violation" in e.lower() and subject in e.lower() for e in errors), (
            subject,
            errors,
        )
    # The mesh's own traffic (queueing, consuming, state, dead letters, advisories) stayed within
    # its grants: the only violations the server saw are this test's.
    violations = [
        line for line in secure_stack.log_path("nats").read_text().splitlines() if "Violation" in line
    ]
    assert len(violations) == 4 and all(PROBE in line for line in violations), violations


def s3(stack: Stack, identity: str) -> ObjectStore:
    assert stack.secrets is not None
    key = stack.secrets.s3_key(identity)
    return ObjectStore(
        stack.address("s3"),
        key.access_key,
        key.secret_key,
        secure=True,
        ca_file=stack.client_tls().ca_file,
        timeout_s=5,
    )


async def test_s3_keys_reach_only_their_buckets(secure_stack: Stack, indexed: dict[str, list[str]]) -> None:
    # The documents tenants ingested are there, for the services that handle them.
    assert await s3(secure_stack, INGESTION_WORKER).list_keys(DOCUMENTS)
    assert await s3(secure_stack, OPS).list_keys(DOCUMENTS)
    denied = [
        (INDEX, lambda store: store.list_keys(DOCUMENTS)),
        (SPARSE, lambda store: store.get(DOCUMENTS, "anything")),
        (INGESTION, lambda store: store.list_keys(SNAPSHOTS)),
        (INGESTION_WORKER, lambda store: store.put(SNAPSHOTS, "index/planted", b"x")),
        ("reranker", lambda store: store.put(MODELS, "planted/model.onnx", b"x")),
        ("reranker", lambda store: store.list_keys(DOCUMENTS)),
    ]
    for identity, attempt in denied:
        with pytest.raises(S3Error) as err:
            await attempt(s3(secure_stack, identity))
        assert err.value.code == "AccessDenied", identity
    # Plain HTTP gets no answer from the HTTPS port.
    assert secure_stack.secrets is not None
    key = secure_stack.secrets.s3_key(OPS)
    plain = ObjectStore(secure_stack.address("s3"), key.access_key, key.secret_key, secure=False, timeout_s=5)
    with pytest.raises(InvalidResponseError):
        await plain.list_keys(DOCUMENTS)


def environ(pid: int | None) -> dict[str, str]:
    assert pid is not None
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_each_process_holds_only_its_own_credentials(secure_stack: Stack) -> None:
    assert secure_stack.secrets is not None
    passwords = secure_stack.secrets.nats_passwords()
    llm_key = secure_stack.secrets.llm_api_key()
    kinds = set()
    for name in secure_stack.names():
        component = secure_stack.component(name)
        kinds.add(component.kind)
        env = environ(component.pid)
        identity = IDENTITY_OF_KIND.get(component.kind)
        assert "RAGMESH_API_KEY" not in env, name  # the ops key stays with the operator
        # The LLM key: the server's to check, the answer stages' to send, nobody else's.
        assert env.get("RAGMESH_LLM_API_KEY") == (llm_key if identity in LLM_CLIENTS else None), name
        assert env.get("RAGMESH_LLM_SERVER_API_KEY") == (llm_key if component.kind == "llm" else None), name
        if identity is None:  # NATS, S3, the LLM server: no mesh credentials of anyone
            held = {"RAGMESH_S3_SECRET_KEY", "RAGMESH_NATS_PASSWORD", "RAGMESH_TLS_KEY_FILE"} & set(env)
            assert not held and "RAGMESH_TLS_CLIENT_KEY_FILE" not in env, (name, held)
            continue
        assert env["RAGMESH_SERVICE_AUTH"] == "mtls"
        assert env["RAGMESH_TLS_KEY_FILE"].endswith(f"/{identity}.key"), name
        assert env.get("RAGMESH_NATS_PASSWORD") == passwords.get(identity), name
        if identity in S3_GRANTS:
            assert env["RAGMESH_S3_SECRET_KEY"] == secure_stack.secrets.s3_key(identity).secret_key
        else:
            assert "RAGMESH_S3_SECRET_KEY" not in env, name
    assert {"llm", "planner", "extractor", "narrator"} <= kinds

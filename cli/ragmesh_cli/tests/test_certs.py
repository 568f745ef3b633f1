"""``ragmesh certs new`` and the secure stack's material: a CA whose certificates verify for
the names and usages each identity needs, 0600 files, no key material printed, per-identity
environments that carry nothing of another identity, and NATS users limited to their subjects."""

from __future__ import annotations

import datetime
import json
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID

from meshkit.rpc.identity import (
    GATEWAY,
    INGESTION_WORKER,
    MESH_IDENTITIES,
    NARRATOR,
    OPS,
    certificate_identity,
    spiffe_id,
)
from meshkit.rpc.pki import INFRA_PEERS, INFRA_SERVERS, PKIFiles
from ragmesh_cli.main import main
from ragmesh_cli.natsconf import USER_GRANTS, nats_config, permissions
from ragmesh_cli.secure import SecureMaterial


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def usages(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def sans(cert: x509.Certificate) -> x509.SubjectAlternativeName:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKIFiles:
    directory = tmp_path_factory.mktemp("certs") / "mesh"
    assert (
        main(["certs", "new", "--dir", str(directory), "--namespace", "ragmesh", "--dns", "mesh.example"])
        == 0
    )
    return PKIFiles(directory)


def test_every_identity_gets_a_certificate_that_verifies_for_its_names(pki: PKIFiles) -> None:
    store = verification.Store([load(pki.ca_cert)])
    now = datetime.datetime.now(datetime.UTC)
    for identity in MESH_IDENTITIES:
        cert = load(pki.cert(identity))
        assert certificate_identity(pki.cert(identity).read_bytes()) == identity
        assert spiffe_id(identity) in sans(cert).get_values_for_type(x509.UniformResourceIdentifier)
        client = verification.PolicyBuilder().store(store).time(now).build_client_verifier()
        assert client.verify(cert, []).subjects is not None
        if identity == OPS:
            # Operators call, never serve: client usage only, no names to be dialled by.
            assert usages(cert) == {ExtendedKeyUsageOID.CLIENT_AUTH}
            continue
        assert usages(cert) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
        for name in (
            "localhost",
            identity,
            f"{identity}.ragmesh.svc",
            f"{identity}.ragmesh.svc.cluster.local",
        ):
            server = (
                verification.PolicyBuilder().store(store).time(now).build_server_verifier(x509.DNSName(name))
            )
            server.verify(cert, [])
        assert "mesh.example" in sans(cert).get_values_for_type(x509.DNSName)
        assert "*.index.ragmesh.svc" in sans(load(pki.cert("index"))).get_values_for_type(x509.DNSName)
    for server_name, names in INFRA_SERVERS.items():
        cert = load(pki.cert(server_name))
        routes = {ExtendedKeyUsageOID.CLIENT_AUTH} if server_name in INFRA_PEERS else set()
        assert usages(cert) == {ExtendedKeyUsageOID.SERVER_AUTH} | routes
        assert certificate_identity(pki.cert(server_name).read_bytes()) is None
        assert set(names) <= set(sans(cert).get_values_for_type(x509.DNSName))


def test_the_ca_signs_only_leaves(pki: PKIFiles) -> None:
    ca = load(pki.ca_cert)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    leaf = load(pki.cert(GATEWAY)).extensions.get_extension_for_class(x509.BasicConstraints).value
    assert not leaf.ca


def test_files_are_private_and_the_output_holds_no_key(
    pki: PKIFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stat.S_IMODE(pki.directory.stat().st_mode) == 0o700
    files = list(pki.directory.iterdir())
    assert len(files) == 2 * (1 + len(MESH_IDENTITIES) + len(INFRA_SERVERS))
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    # A second run refuses to replace the CA (every certificate would have to follow).
    assert main(["certs", "new", "--dir", str(pki.directory)]) == 1
    assert "exists" in capsys.readouterr().err
    out_dir = pki.directory.parent / "again"
    assert main(["certs", "new", "--dir", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "PRIVATE KEY" not in out and "BEGIN" not in out and "gateway.crt" in out


def test_each_process_environment_carries_only_its_own_credentials(tmp_path: Path) -> None:
    material = SecureMaterial(tmp_path, {"tenant-a": (["a"], ["a"])})
    material.prepare()
    inherited = {"RAGMESH_API_KEY": "leaked", "RAGMESH_TLS_CLIENT_CERT_FILE": "/ops.crt", "OTHER": "kept"}
    worker = dict(inherited)
    material.apply_env(worker, INGESTION_WORKER, "127.0.0.1:4222")
    assert worker["OTHER"] == "kept" and "RAGMESH_API_KEY" not in worker
    assert "RAGMESH_TLS_CLIENT_CERT_FILE" not in worker and "RAGMESH_API_KEYS_FILE" not in worker
    assert worker["RAGMESH_SERVICE_AUTH"] == "mtls"
    assert worker["RAGMESH_TLS_CERT_FILE"].endswith("ingestion-worker.crt")
    assert (
        worker["RAGMESH_NATS_URL"] == "tls://127.0.0.1:4222"
        and worker["RAGMESH_NATS_USER"] == INGESTION_WORKER
    )
    assert worker["RAGMESH_S3_ACCESS_KEY"] == material.s3_key(INGESTION_WORKER).access_key
    gateway: dict[str, str] = {}
    material.apply_env(gateway, GATEWAY, None)
    assert gateway["RAGMESH_API_KEYS_FILE"] == str(material.keys_file)
    # The gateway reads collection records in NATS (its own user, read-only), never S3.
    assert gateway["RAGMESH_NATS_USER"] == GATEWAY and "RAGMESH_S3_ACCESS_KEY" not in gateway
    nats_server = dict(worker)
    material.strip_env(nats_server)
    secrets_ = ("RAGMESH_NATS_PASSWORD", "RAGMESH_S3_SECRET_KEY", "RAGMESH_TLS_KEY_FILE", "RAGMESH_API_KEY")
    assert nats_server["OTHER"] == "kept" and not any(name in nats_server for name in secrets_)
    # The LLM key: the answer stages send it, the LLM server checks it, nobody else holds it.
    narrator: dict[str, str] = {}
    material.apply_env(narrator, NARRATOR, None)
    assert narrator["RAGMESH_LLM_API_KEY"] == material.llm_api_key() != ""
    assert "RAGMESH_LLM_API_KEY" not in worker and "RAGMESH_LLM_API_KEY" not in gateway
    llm_server = {**worker, "RAGMESH_LLM_API_KEY": "leaked"}
    material.apply_server_env(llm_server, "llm")
    assert llm_server["RAGMESH_LLM_SERVER_API_KEY"] == material.llm_api_key()
    assert not any(name in llm_server for name in (*secrets_, "RAGMESH_LLM_API_KEY"))
    material.apply_server_env(llm_server, "nats")
    assert "RAGMESH_LLM_SERVER_API_KEY" not in llm_server
    ops: dict[str, str] = {}
    material.apply_env(ops, OPS, None)
    assert ops["RAGMESH_API_KEY"] == material.api_key() and "RAGMESH_SERVICE_AUTH" not in ops
    # The keys file holds digests: neither key is in it.
    keys_text = material.keys_file.read_text()
    assert material.api_key() not in keys_text and material.api_key("tenant-a") not in keys_text
    assert {k["name"] for k in json.loads(keys_text)["keys"]} == {"ops", "tenant-a"}
    assert stat.S_IMODE(material.keys_file.stat().st_mode) == 0o600
    # Preparing again, without the tenants (ragmesh up on a running stack), keeps every secret
    # and every grant as they were.
    before = (material.api_key(), material.nats_passwords(), material.llm_api_key(), keys_text)
    again = SecureMaterial(tmp_path)
    again.prepare()
    after = (again.api_key(), again.nats_passwords(), again.llm_api_key(), again.keys_file.read_text())
    assert after == before


def test_nats_users_get_only_their_subjects(tmp_path: Path) -> None:
    config = nats_config(4222, 8222, tmp_path, passwords={u: "pw" for u in USER_GRANTS})
    assert config["jetstream"]["sync_interval"] == "always"
    worker = permissions(INGESTION_WORKER, USER_GRANTS[INGESTION_WORKER])
    allowed = worker["publish"]["allow"]
    assert "$KV.ragmesh_doc_status.>" in allowed and "ragmesh.dlq.>" in allowed
    # Its reconciler republishes lost ingest events; a store's log is none of its business.
    assert "ragmesh.ingest.>" in allowed
    assert not any(s.startswith("ragmesh.log") or "STREAM.DELETE" in s for s in allowed)
    assert worker["subscribe"]["allow"][0] == "_INBOX_ingestion-worker.>"
    assert ">" not in allowed and "_INBOX.>" not in worker["subscribe"]["allow"]
    assert permissions(OPS, USER_GRANTS[OPS])["publish"]["allow"] == [">"]
    # The gateway reads the collection records and can write nothing (no $KV publish at all).
    gateway = permissions(GATEWAY, USER_GRANTS[GATEWAY])["publish"]["allow"]
    assert "$JS.API.DIRECT.GET.KV_ragmesh_collections.>" in gateway
    assert not any(s.startswith(("$KV.", "ragmesh.")) or "DELETE" in s or "doc_status" in s for s in gateway)
    # The plain stack's file: no users, no TLS, the same durability.
    plain = nats_config(4222, 8222, tmp_path)
    assert "authorization" not in plain and "tls" not in plain
    assert plain["jetstream"]["sync_interval"] == "always"


def test_the_cli_takes_the_ops_identity_of_a_secure_state_dir_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragmesh_cli import channels, procutil
    from ragmesh_cli.stack import STATE_FILE, STATE_VERSION, Stack

    for name in ("RAGMESH_TLS_CA_FILE", "RAGMESH_API_KEY", "RAGMESH_TLS_CLIENT_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    secure_dir = tmp_path / "secure-stack"
    material = SecureMaterial(secure_dir)
    material.prepare()
    plain_dir = tmp_path / "plain-stack"
    for directory, secure in ((secure_dir, True), (plain_dir, False)):
        state = {"version": STATE_VERSION, "secure": secure, "components": []}
        procutil.write_json_atomic(directory / STATE_FILE, state)
    try:
        channels.use_state_dir(secure_dir)
        tls = channels.client_tls()
        assert tls is not None and tls.cert_file == material.pki.cert(OPS)
        assert channels.api_key() == material.api_key()
        # A plain stack's supervisor probes in plaintext whatever the CLI last loaded.
        assert Stack(plain_dir).client_tls() is None
        monkeypatch.setenv("RAGMESH_API_KEY", "rmk_from-env")  # the environment wins
        channels.use_state_dir(secure_dir)
        assert channels.api_key() == "rmk_from-env"
        channels.use_state_dir(plain_dir)
        assert channels.client_tls() is None
    finally:
        channels.use_state_dir(None)

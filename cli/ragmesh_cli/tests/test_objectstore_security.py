"""SeaweedFS's security.toml in a secure stack: every internal port behind mutual TLS with a CA
of its own, JWTs on the filer and the volume server, a fresh set at every start."""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path

from cryptography import x509

from meshkit.rpc.pki import PKIFiles
from ragmesh_cli.stack import objectstore_security as oss


def load(directory: Path) -> dict[str, object]:
    return tomllib.loads((directory / oss.SECURITY_FILE).read_text())


def test_every_internal_port_wants_a_certificate_of_its_own_ca(tmp_path: Path) -> None:
    config = load(oss.prepare(tmp_path / "weed"))
    pki = PKIFiles(tmp_path / "weed")
    grpc = config["grpc"]
    https = config["https"]
    assert isinstance(grpc, dict) and isinstance(https, dict)
    assert grpc["ca"] == str(pki.ca_cert)
    for part in oss.GRPC_PARTS:
        assert grpc[part]["cert"] == str(pki.cert(oss.CERT_NAME)), part
        assert grpc[part]["allowed_commonNames"] == oss.CERT_NAME
    for part in oss.HTTPS_PARTS:
        # The CA is what makes SeaweedFS require and verify a client certificate.
        assert https[part]["ca"] == str(pki.ca_cert), part
    assert https["client"]["enabled"] is True
    cert = x509.load_pem_x509_certificate(pki.cert(oss.CERT_NAME).read_bytes())
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)


def test_the_filer_and_the_volumes_check_jwts(tmp_path: Path) -> None:
    config = load(oss.prepare(tmp_path / "weed"))
    jwt = config["jwt"]
    assert isinstance(jwt, dict)
    keys = [jwt["signing"]["key"], jwt["signing"]["read"]["key"]]
    keys += [jwt["filer_signing"]["key"], jwt["filer_signing"]["read"]["key"]]
    assert all(len(k) >= 32 for k in keys) and len(set(keys)) == 4
    assert config["access"] == {"ui": False}


def test_each_start_gets_new_keys_and_a_new_ca_all_private(tmp_path: Path) -> None:
    first = load(oss.prepare(tmp_path / "weed"))
    ca_before = (tmp_path / "weed" / "ca.crt").read_bytes()
    second = load(oss.prepare(tmp_path / "weed"))
    assert first["jwt"] != second["jwt"]
    assert (tmp_path / "weed" / "ca.crt").read_bytes() != ca_before
    assert stat.S_IMODE((tmp_path / "weed").stat().st_mode) == 0o700
    for path in (tmp_path / "weed").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path

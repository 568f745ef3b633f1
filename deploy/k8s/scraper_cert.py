"""Issue the certificate Prometheus scrapes the mesh with: the scrape-only identity ``prometheus``.

    .venv/bin/python deploy/k8s/scraper_cert.py --pki PKI_DIR [--days 365]

Under RAGMESH_SERVICE_AUTH=mtls every /metrics port requires a client certificate from the mesh
CA naming a metrics reader (meshkit.rpc.tls.METRICS_READERS: ``prometheus`` or ``ops``). ``ops`` may
also call every gRPC method of the mesh, so Prometheus gets an identity of its own instead: CN
``prometheus``, URI SAN ``spiffe://ragmesh/prometheus``, client usage only, no DNS name (it is
never dialled). No gRPC method admits it (meshkit.rpc.identity), so its key reads metrics and nothing
else.

This signs with PKI_DIR's ``ca.key``, as ``ragmesh certs new`` does, and writes
``prometheus.crt`` and ``prometheus.key`` (0600) beside the others, where make_secrets.py reads
them for the Secret ``ragmesh-tls-prometheus``. Running it again renews the certificate (then
update the Secret and restart Prometheus). It prints paths, never key material.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from meshkit.rpc.identity import spiffe_id
from meshkit.rpc.pki import Issued, PKIFiles, issue, write_pair
from meshkit.rpc.tls import METRICS_SCRAPER


class ScraperCertError(RuntimeError):
    pass


def load_ca(files: PKIFiles) -> Issued:
    try:
        cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
    except OSError as exc:
        raise ScraperCertError(
            f"cannot read the mesh CA in {files.directory}: {exc.strerror or exc}"
        ) from exc
    except ValueError as exc:
        raise ScraperCertError(f"{files.ca_cert} / {files.ca_key} are not a PEM CA and key") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ScraperCertError(f"{files.ca_key} is not an EC key (ragmesh certs new makes P-256)")
    return cert, key


def write_scraper_cert(pki: Path, days: int = 365) -> PKIFiles:
    """prometheus.crt/.key in ``pki``, signed by its CA."""
    files = PKIFiles(pki)
    ca = load_ca(files)
    issued = issue(
        ca, METRICS_SCRAPER, uri=spiffe_id(METRICS_SCRAPER), server=False, days=days, loopback=False
    )
    write_pair(files, METRICS_SCRAPER, issued)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pki", type=Path, required=True, help="the mesh PKI (ca.crt, ca.key): ragmesh certs new"
    )
    parser.add_argument("--days", type=int, default=365, help="validity of the certificate (default 365)")
    args = parser.parse_args(argv)
    if args.days < 1:
        parser.error("--days must be >= 1")
    try:
        files = write_scraper_cert(args.pki, args.days)
    except ScraperCertError as exc:
        print(f"scraper_cert: {exc}", file=sys.stderr)
        return 1
    print(
        f"{METRICS_SCRAPER}: {files.cert(METRICS_SCRAPER)}, {files.key(METRICS_SCRAPER)} "
        f"({spiffe_id(METRICS_SCRAPER)}, client only): make_secrets.py puts them into "
        "Secret ragmesh-tls-prometheus"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

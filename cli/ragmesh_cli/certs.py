"""``ragmesh certs new --dir DIR``: a mesh CA and one key + certificate per service identity
(meshkit.rpc.pki; docs/SECURITY.md). Prints what it wrote (paths and names), never key material."""

from __future__ import annotations

import argparse
from pathlib import Path

from meshkit.rpc.identity import MESH_IDENTITIES
from meshkit.rpc.pki import INFRA_SERVERS, PKIError, write_pki
from ragmesh_cli.documents import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", required=True, type=Path, help="where to write ca.crt/key and <identity>.crt/key"
    )
    parser.add_argument(
        "--namespace",
        default=None,
        help="Kubernetes namespace: adds <service>.<ns>.svc (and its pods, *.<service>.<ns>.svc) to each "
        "certificate",
    )
    parser.add_argument("--cluster-domain", default="cluster.local", help="Kubernetes cluster domain")
    parser.add_argument(
        "--dns", action="append", default=[], metavar="NAME", help="another DNS name for every certificate"
    )
    parser.add_argument("--days", type=int, default=365, help="validity of the certificates (default 365)")
    parser.add_argument("--ca-days", type=int, default=3650, help="validity of the CA (default 3650)")
    parser.add_argument("--force", action="store_true", help="replace an existing CA (and every certificate)")


def run_new(args: argparse.Namespace) -> int:
    if args.days < 1 or args.ca_days < args.days:
        raise InputError("--days must be >= 1 and --ca-days at least --days")
    try:
        files = write_pki(
            args.dir,
            namespace=args.namespace,
            cluster_domain=args.cluster_domain,
            extra_dns=args.dns,
            days=args.days,
            ca_days=args.ca_days,
            force=args.force,
        )
    except PKIError as exc:
        raise InputError(str(exc)) from None
    print(f"mesh CA: {files.ca_cert} (its key {files.ca_key} signs certificates: keep it offline)")
    for name in (*MESH_IDENTITIES, *INFRA_SERVERS):
        print(f"  {name}: {files.cert(name)}, {files.key(name)}")
    print(
        "Each service gets RAGMESH_SERVICE_AUTH=mtls, RAGMESH_TLS_CA_FILE=ca.crt and its own "
        "RAGMESH_TLS_CERT_FILE/RAGMESH_TLS_KEY_FILE (docs/SECURITY.md)."
    )
    return 0

"""ragmesh-bootstrap's object-store step (run in the ragmesh-cpu image, as MinIO's root user):
make the buckets, then one MinIO user per service that uses the object store, each with the
policy of the same name (``<service>.json`` beside this file: only its bucket and prefix).

Idempotent: an existing bucket is kept; an existing user gets its current secret and policy
again, so rotating a service's key is "change its Secret, run the Job". The services never see
the root user; this step is its only user besides MinIO itself.

Environment: MINIO_ROOT_USER / MINIO_ROOT_PASSWORD (Secret ragmesh-s3-root);
S3_ACCESS_KEY_<SERVICE> / S3_SECRET_KEY_<SERVICE> (Secrets ragmesh-s3-<service>, SERVICE upper
case with '_' for '-'); RAGMESH_S3_ENDPOINT and RAGMESH_S3_SECURE (ragmesh-config); SSL_CERT_FILE
(the mesh CA that signed MinIO's certificate).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

SERVICES = ("ingestion", "ingestion-worker", "index", "sparse", "reranker", "llm", "bootstrap")
BUCKETS = ("ragmesh-documents", "ragmesh-snapshots", "ragmesh-models")
POLICY_DIR = Path(__file__).resolve().parent
WAIT_S = 120.0
# MinIO's answer to attaching a policy that is attached already: nothing to do.
ALREADY_APPLIED = "XMinioAdminPolicyChangeAlreadyApplied"


class Admin(Protocol):
    def policy_add(self, policy_name: str, policy_file: Any = None, policy: Any = None) -> str: ...
    def user_add(self, access_key: str, secret_key: str) -> str: ...
    def attach_policy(
        self, policies: list[str], user: str | None = None, group: str | None = None
    ) -> str: ...


class Buckets(Protocol):
    def bucket_exists(self, bucket_name: str) -> bool: ...
    def make_bucket(self, bucket_name: str) -> None: ...


class SetupError(RuntimeError):
    pass


def service_keys(service: str, env: Mapping[str, str]) -> tuple[str, str]:
    var = service.upper().replace("-", "_")
    access, secret = env.get(f"S3_ACCESS_KEY_{var}", ""), env.get(f"S3_SECRET_KEY_{var}", "")
    if not access or not secret:
        raise SetupError(
            f"S3_ACCESS_KEY_{var} and S3_SECRET_KEY_{var} must be set (Secret ragmesh-s3-{service})"
        )
    if len(secret) < 8:
        raise SetupError(f"S3_SECRET_KEY_{var} is shorter than MinIO's minimum of 8 characters")
    return access, secret


def load_policy(service: str, policy_dir: Path = POLICY_DIR) -> dict[str, Any]:
    policy: dict[str, Any] = json.loads((policy_dir / f"{service}.json").read_text())
    return policy


def wait_for(call: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call()
            return
        except Exception as exc:  # MinIO not up yet: retry until the deadline
            if time.monotonic() > deadline:
                raise SetupError(f"{what} did not answer in {timeout_s:.0f} s: {type(exc).__name__}") from exc
            time.sleep(2)


def ensure_buckets(client: Buckets) -> None:
    for bucket in BUCKETS:
        if not client.bucket_exists(bucket):
            client.make_bucket(bucket)


def ensure_user(admin: Admin, service: str, env: Mapping[str, str], policy_dir: Path = POLICY_DIR) -> str:
    access, secret = service_keys(service, env)
    name = f"ragmesh-{service}"
    admin.policy_add(name, policy=load_policy(service, policy_dir))
    admin.user_add(access, secret)
    try:
        admin.attach_policy([name], user=access)
    except Exception as exc:
        if ALREADY_APPLIED not in str(exc):
            raise
    return name


def main() -> int:
    from minio import Minio, MinioAdmin
    from minio.credentials.providers import StaticProvider

    env = os.environ
    endpoint = env.get("RAGMESH_S3_ENDPOINT", "minio:9000")
    secure = env.get("RAGMESH_S3_SECURE", "true").lower() in ("1", "true", "yes")
    root_user, root_password = env.get("MINIO_ROOT_USER", ""), env.get("MINIO_ROOT_PASSWORD", "")
    if not root_user or not root_password:
        print("MINIO_ROOT_USER and MINIO_ROOT_PASSWORD must be set (Secret ragmesh-s3-root)", file=sys.stderr)
        return 1
    try:
        for service in SERVICES:  # every key present before touching anything
            service_keys(service, env)
        client = Minio(endpoint, access_key=root_user, secret_key=root_password, secure=secure)
        admin = MinioAdmin(
            endpoint=endpoint, credentials=StaticProvider(root_user, root_password), secure=secure
        )
        wait_for(lambda: client.bucket_exists(BUCKETS[0]), f"MinIO at {endpoint}")
        ensure_buckets(client)
        print(f"buckets ready: {', '.join(BUCKETS)}")
        for service in SERVICES:
            policy = ensure_user(admin, service, env)
            print(f"s3 user for {service}: policy {policy}")
    except SetupError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

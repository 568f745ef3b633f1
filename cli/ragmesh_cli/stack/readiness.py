"""Whether the stack's processes are ready: health probes for NATS, SeaweedFS S3 (and that it
refuses a wrong key), llama.cpp's HTTP health; the supervisor's S3 client (buckets)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ragmesh_cli import procutil
from ragmesh_cli.procutil import LOOPBACK
from ragmesh_cli.secure import BUCKETS
from ragmesh_cli.stack.spec import NATS, S3, Component
from ragmesh_cli.state import StackError

# Service kinds that answer HTTP health instead of gRPC health (the LLM server is llama.cpp's).
HTTP_HEALTH_PATHS = {"llm": "/health"}
SERVING = "SERVING"
DOWN = "DOWN"
UNREACHABLE = "UNREACHABLE"
# S3 error codes that prove the server checked the key and refused it.
REFUSED_KEY_CODES = frozenset({"SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied"})


async def down_health() -> str:
    """The health of a process that does not run (an awaitable, to gather with real probes)."""
    return DOWN


async def probe_nats(monitor_port: int) -> str:
    return await probe_http(f"http://{LOOPBACK}:{monitor_port}/healthz?js-enabled-only=true")


async def _ignore_nats_error(_exc: Exception) -> None:
    """A probe reports what it saw; the client's own error log would only repeat it."""


async def probe_nats_client(options: dict[str, Any]) -> str:
    """Health of a NATS server without a monitoring port: log in (``options``: nats.connect's
    servers, credentials and TLS) and ask JetStream for the account's limits."""
    import nats

    try:
        nc = await nats.connect(
            **options,
            connect_timeout=1,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            error_cb=_ignore_nats_error,
        )
    except Exception:
        return UNREACHABLE
    try:
        await nc.jetstream(timeout=1.0).account_info()
    except Exception:
        return "NOT_SERVING (JetStream)"
    finally:
        await nc.close()
    return SERVING


async def probe_http(url: str) -> str:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=1.0) as client:
            reply = await client.get(url)
    except httpx.HTTPError:
        return UNREACHABLE
    return SERVING if reply.status_code == 200 else f"NOT_SERVING ({reply.status_code})"


def s3_client(endpoint: str, access_key: str, secret_key: str, ca: Path | None = None) -> Any:
    """A minio client for the stack's S3 (HTTPS verified against ``ca`` when given)."""
    import urllib3
    from minio import Minio

    # No retries and short timeouts: a probe must answer quickly whatever the server's state.
    verify: dict[str, Any] = {"cert_reqs": "CERT_REQUIRED", "ca_certs": str(ca)} if ca is not None else {}
    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=1.0, read=2.0), retries=False, **verify)
    return Minio(
        endpoint, access_key=access_key, secret_key=secret_key, secure=ca is not None, http_client=http
    )


# Written and deleted once per bucket when the stack starts (make_buckets).
WARMUP_OBJECT = ".ragmesh-volume-warmup"


def make_buckets(endpoint: str, access_key: str, secret_key: str, ca: Path | None) -> None:
    """Create the stack's buckets, and make SeaweedFS create each bucket's first volume now: it
    writes a new volume's info file world-readable whatever the umask, so the supervisor takes
    those bits off right after (``Stack``), rather than leaving them to the first document."""
    import io

    from minio.error import S3Error

    client = s3_client(endpoint, access_key, secret_key, ca)
    for bucket in BUCKETS:
        try:
            if not client.bucket_exists(bucket):
                client.make_bucket(bucket)
            # One byte: an empty object has no chunk, so no volume would be written.
            client.put_object(bucket, WARMUP_OBJECT, io.BytesIO(b"."), 1)
            client.remove_object(bucket, WARMUP_OBJECT)
        except S3Error as exc:
            if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise StackError(f"could not create the bucket {bucket}: {exc.code}") from None


def probe_s3(endpoint: str, access_key: str, secret_key: str, ca: Path | None = None) -> str:
    from minio.error import S3Error

    try:
        s3_client(endpoint, access_key, secret_key, ca).list_buckets()
    except S3Error as exc:
        return f"NOT_SERVING ({exc.code})"
    except Exception:
        return UNREACHABLE
    return SERVING


def s3_wrong_key_outcome(endpoint: str, ca: Path | None = None) -> str:
    """What S3 says to a made-up key: an error code, 'ACCEPTED', or the exception's type."""
    from minio.error import S3Error

    try:
        s3_client(endpoint, "rm-wrong-" + secrets.token_hex(4), secrets.token_hex(16), ca).list_buckets()
    except S3Error as exc:
        return str(exc.code)
    except Exception as exc:
        return type(exc).__name__
    return "ACCEPTED"


async def probe_component(
    comp: Component,
    s3_key: Callable[[], tuple[str, str, Path | None]],
    client_tls: Callable[[], Any],
    nats_login: Callable[[], dict[str, Any] | None],
) -> str:
    """Health of one component: SERVING, NOT_SERVING..., UNREACHABLE. ``s3_key`` gives the
    supervisor's (access key, secret key, CA) for S3, ``client_tls`` its gRPC TLS (None: plaintext),
    ``nats_login`` its NATS connection options (None: the open monitoring port answers)."""
    if comp.kind == NATS:
        login = nats_login()
        if login is not None:
            return await probe_nats_client(login)
        return await probe_nats(comp.ports["monitor"])
    if comp.kind == S3:
        access, secret, ca = s3_key()
        return await asyncio.to_thread(probe_s3, comp.address, access, secret, ca)
    if comp.kind in HTTP_HEALTH_PATHS:
        return await probe_http(f"http://{comp.address}{HTTP_HEALTH_PATHS[comp.kind]}")
    from meshkit.rpc.client import check_health

    return await check_health(comp.address, timeout=1.0, tls=client_tls())


async def wait_healthy(
    comp: Component,
    probe: Callable[[Component], Awaitable[str]],
    exit_code: Callable[[Component], int | None],
    log: Path,
    timeout_s: float,
) -> None:
    """Poll ``probe`` until SERVING; StackError with the log's tail when the process exits first
    (``exit_code`` not None; -1: gone, code unknown) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    health = UNREACHABLE
    while True:
        code = exit_code(comp)
        if code is not None:
            exit_desc = "" if code == -1 else f" with code {code}"
            raise StackError(
                f"{comp.name} exited{exit_desc} before becoming healthy; log {log}:\n{procutil.tail(log)}"
            )
        health = await probe(comp)
        if health == SERVING:
            return
        if time.monotonic() >= deadline:
            raise StackError(
                f"{comp.name} not healthy after {timeout_s:.0f}s (last: {health}); "
                f"log {log}:\n{procutil.tail(log)}"
            )
        await asyncio.sleep(0.2)


async def check_s3_refuses_wrong_key(endpoint: str, ca: Path | None) -> None:
    """Without a working credentials config SeaweedFS accepts any key: refuse to run that way."""
    outcome = await asyncio.to_thread(s3_wrong_key_outcome, endpoint, ca)
    if outcome not in REFUSED_KEY_CODES:
        raise StackError(f"S3 did not refuse a wrong key (got {outcome}): its auth config is not in effect")

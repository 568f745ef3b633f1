"""The object store (S3 API: SeaweedFS locally, MinIO in Kubernetes) behind a small async API.

The minio client is synchronous; calls run in a thread so they never block the event loop.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import urllib3
from minio import Minio
from minio.error import MinioException, S3Error

from meshkit.rpc import tracing
from meshkit.settings import MeshSettings


class ObjectNotFound(KeyError):
    pass


def _s3_span(operation: str, bucket: str, key: str = "") -> tracing.Outgoing:
    """The span of one S3 request (no-op with tracing off)."""
    if not tracing.enabled():
        return tracing.NO_SPAN
    attributes: dict[str, str | int] = {"rpc.system": "aws-api", "aws.s3.bucket": bucket}
    if key:
        attributes["aws.s3.key"] = key
    return tracing.outgoing(f"s3.{operation}", tracing.CLIENT, attributes)


# What a call raises when the store is unreachable or failing (as opposed to ObjectNotFound):
# callers treat these as infrastructure trouble, worth retrying later.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (MinioException, urllib3.exceptions.HTTPError)


class ObjectStore:
    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        *,
        secure: bool = False,
        region: str = "us-east-1",
        timeout_s: float = 30.0,
        ca_file: Path | None = None,
    ) -> None:
        # Over HTTPS the server is verified against ca_file (the mesh CA), else the system's CAs.
        verify: dict[str, Any] = {"cert_reqs": "CERT_REQUIRED", "ca_certs": str(ca_file)} if ca_file else {}
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=min(5.0, timeout_s), read=timeout_s),
            maxsize=16,
            retries=urllib3.Retry(total=2, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)),
            **verify,
        )
        self.client = Minio(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            secure=secure,
            region=region,
            http_client=http,
        )

    @classmethod
    def from_settings(cls, settings: MeshSettings) -> ObjectStore:
        return cls(
            settings.s3_endpoint,
            settings.s3_access_key,
            settings.s3_secret_key,
            secure=settings.s3_secure,
            region=settings.s3_region,
            ca_file=settings.tls_ca_file if settings.s3_secure else None,
        )

    async def ensure_bucket(self, bucket: str) -> None:
        def _ensure() -> None:
            if not self.client.bucket_exists(bucket):
                try:
                    self.client.make_bucket(bucket)
                except S3Error as exc:
                    if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise

        with _s3_span("EnsureBucket", bucket):
            await asyncio.to_thread(_ensure)

    async def put(
        self,
        bucket: str,
        key: str,
        data: bytes,
        *,
        content_type: str = "application/octet-stream",
        metadata: dict[str, str] | None = None,
    ) -> None:
        with _s3_span("PutObject", bucket, key):
            await asyncio.to_thread(
                self.client.put_object,
                bucket,
                key,
                io.BytesIO(data),
                len(data),
                content_type=content_type,
                metadata=metadata,  # type: ignore[arg-type]
            )

    async def get(self, bucket: str, key: str) -> bytes:
        def _get() -> bytes:
            try:
                response = self.client.get_object(bucket, key)
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchBucket"):
                    raise ObjectNotFound(f"{bucket}/{key}") from exc
                raise
            try:
                return bytes(response.read())
            finally:
                response.close()
                response.release_conn()

        with _s3_span("GetObject", bucket, key):
            return await asyncio.to_thread(_get)

    async def put_file(self, bucket: str, key: str, path: str) -> None:
        with _s3_span("PutObject", bucket, key):
            await asyncio.to_thread(self.client.fput_object, bucket, key, path)

    async def get_file(self, bucket: str, key: str, path: str) -> None:
        def _get() -> None:
            try:
                self.client.fget_object(bucket, key, path)
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchBucket"):
                    raise ObjectNotFound(f"{bucket}/{key}") from exc
                raise

        with _s3_span("GetObject", bucket, key):
            await asyncio.to_thread(_get)

    async def delete(self, bucket: str, key: str) -> None:
        with _s3_span("DeleteObject", bucket, key):
            await asyncio.to_thread(self.client.remove_object, bucket, key)

    async def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        def _list() -> list[str]:
            return [
                o.object_name
                for o in self.client.list_objects(bucket, prefix=prefix, recursive=True)
                if o.object_name
            ]

        with _s3_span("ListObjects", bucket, prefix):
            return await asyncio.to_thread(_list)

    async def stat(self, bucket: str, key: str) -> dict[str, Any] | None:
        def _stat() -> dict[str, Any] | None:
            try:
                info = self.client.stat_object(bucket, key)
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchBucket"):
                    return None
                raise
            return {"size": info.size, "etag": info.etag, "metadata": dict(info.metadata or {})}

        with _s3_span("HeadObject", bucket, key):
            return await asyncio.to_thread(_stat)

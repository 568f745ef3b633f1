"""Model directories from the object store's models bucket.

``s3://bucket/prefix`` names a directory whose ``manifest.json`` lists the other files with their
sha256. The files are downloaded into a fresh folder under the cache, each checked against the
manifest, and the folder is renamed into place only when complete: a crash mid-download leaves a
temporary folder that the next start ignores, never a half model that looks whole."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from meshkit.domain.ids import sha256_file
from meshkit.storage.objectstore import ObjectNotFound, ObjectStore
from services.reranker.model import MANIFEST, ModelLoadError


def parse_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ModelLoadError(f"model uri {uri!r} must look like s3://bucket/prefix")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket or not prefix.strip("/"):
        raise ModelLoadError(f"model uri {uri!r} must name a bucket and a prefix")
    return bucket, prefix.strip("/")


def _target(cache_dir: Path, manifest: bytes) -> Path:
    digest = hashlib.sha256(manifest).hexdigest()[:16]
    return cache_dir / f"model-{digest}"


def _complete(folder: Path, files: dict[str, str]) -> bool:
    return all((folder / name).is_file() and sha256_file(folder / name) == sha for name, sha in files.items())


def _stage(cache_dir: Path, manifest: bytes) -> Path:
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir))
    (staging / MANIFEST).write_bytes(manifest)
    return staging


def _install(staging: Path, target: Path) -> None:
    if target.exists():  # an incomplete or tampered copy from before
        shutil.rmtree(target)
    staging.rename(target)


def _discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


async def fetch_model_dir(objects: ObjectStore, uri: str, cache_dir: Path) -> Path:
    """The local copy of the model directory at ``uri``, downloaded unless already cached."""
    bucket, prefix = parse_uri(uri)
    try:
        manifest = await objects.get(bucket, f"{prefix}/{MANIFEST}")
    except ObjectNotFound:
        raise ModelLoadError(f"{uri}/{MANIFEST} not found in the object store") from None
    files = _listed_files(uri, manifest)
    target = _target(cache_dir, manifest)
    if await asyncio.to_thread(_complete, target, files):
        return target
    staging = await asyncio.to_thread(_stage, cache_dir, manifest)
    try:
        for name, expected in files.items():
            await _download(objects, bucket, f"{prefix}/{name}", staging / name, expected, f"{uri}/{name}")
        await asyncio.to_thread(_install, staging, target)
    finally:
        await asyncio.to_thread(_discard, staging)
    return target


def _listed_files(uri: str, manifest: bytes) -> dict[str, str]:
    try:
        files = {str(k): str(v).lower() for k, v in json.loads(manifest)["files"].items()}
    except (ValueError, KeyError, AttributeError, TypeError) as exc:
        raise ModelLoadError(f"{uri}/{MANIFEST}: unreadable manifest: {exc}") from exc
    for name in files:
        if "/" in name or "\\" in name or name.startswith("."):
            raise ModelLoadError(f"{uri}/{MANIFEST}: file name {name!r} is not a plain file name")
    return files


async def _download(
    objects: ObjectStore, bucket: str, key: str, path: Path, expected: str, what: str
) -> None:
    try:
        await objects.get_file(bucket, key, str(path))
    except ObjectNotFound:
        raise ModelLoadError(f"{what} (listed in the manifest) not found") from None
    actual = await asyncio.to_thread(sha256_file, path)
    if actual != expected:
        raise ModelLoadError(f"{what} failed its integrity check: expected sha256 {expected}, got {actual}")

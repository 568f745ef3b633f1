"""vLLM's init step: copy a model directory from the object store to the pod's volume, so the LLM
tier needs no internet (its NetworkPolicy admits MinIO only).

    python fetch-model.py <name> <dest>    # s3://ragmesh-models/llm/<name>/... -> <dest>/<name>/...

Runs in the ragmesh-cpu image with the S3 user `llm` (read-only on llm/ of the models bucket,
base/s3/llm.json) from RAGMESH_S3_* and SSL_CERT_FILE (the mesh CA). Files already there with the
same size are kept, so a restarted pod with a kept volume starts fast. Upload a model once with
`mc cp --recursive` (deploy/k8s/README.md, "The LLM's weights").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

BUCKET = "ragmesh-models"


class Objects(Protocol):
    def list_objects(
        self, bucket_name: str, prefix: str | None = None, recursive: bool = False
    ) -> Iterable[Any]: ...
    def fget_object(self, bucket_name: str, object_name: str, file_path: str) -> Any: ...


def fetch(client: Objects, name: str, dest: Path) -> int:
    """Copy s3://ragmesh-models/llm/<name>/ to dest/<name>/; returns how many files were fetched.
    Keys that would land outside dest/<name> are skipped."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"not a model directory name: {name!r}")
    prefix = f"llm/{name}/"
    root = dest / name
    count = 0
    for obj in client.list_objects(BUCKET, prefix=prefix, recursive=True):
        key = obj.object_name or ""
        relative = key[len(prefix) :]
        if not relative or relative.startswith("/") or ".." in Path(relative).parts:
            continue
        target = root / relative
        if target.exists() and target.stat().st_size == obj.size:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        client.fget_object(BUCKET, key, str(target))
        count += 1
    if not root.is_dir():
        raise FileNotFoundError(f"no model under s3://{BUCKET}/{prefix}: upload it first")
    return count


def main() -> int:
    from minio import Minio

    name, dest = sys.argv[1], Path(sys.argv[2])
    client = Minio(
        os.environ.get("RAGMESH_S3_ENDPOINT", "minio:9000"),
        access_key=os.environ["RAGMESH_S3_ACCESS_KEY"],
        secret_key=os.environ["RAGMESH_S3_SECRET_KEY"],
        secure=os.environ.get("RAGMESH_S3_SECURE", "true").lower() in ("1", "true", "yes"),
    )
    try:
        count = fetch(client, name, dest)
    except (ValueError, FileNotFoundError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(f"model {name}: {count} files fetched into {dest / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

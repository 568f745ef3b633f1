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
from pathlib import Path

BUCKET = "ragmesh-models"


def main() -> int:
    from minio import Minio

    name, dest = sys.argv[1], Path(sys.argv[2])
    if not name or "/" in name or name.startswith("."):
        print(f"not a model directory name: {name!r}", file=sys.stderr)
        return 1
    client = Minio(
        os.environ.get("RAGMESH_S3_ENDPOINT", "minio:9000"),
        access_key=os.environ["RAGMESH_S3_ACCESS_KEY"],
        secret_key=os.environ["RAGMESH_S3_SECRET_KEY"],
        secure=os.environ.get("RAGMESH_S3_SECURE", "true").lower() in ("1", "true", "yes"),
    )
    prefix = f"llm/{name}/"
    count = 0
    for obj in client.list_objects(BUCKET, prefix=prefix, recursive=True):
        relative = (obj.object_name or "")[len(prefix) :]
        if not relative or relative.startswith("/") or ".." in Path(relative).parts:
            continue
        target = dest / name / relative
        if target.exists() and target.stat().st_size == obj.size:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        client.fget_object(BUCKET, obj.object_name or "", str(target))
        count += 1
    if not (dest / name).is_dir():
        print(f"no model under s3://{BUCKET}/{prefix}: upload it first", file=sys.stderr)
        return 1
    print(f"model {name}: {count} files fetched into {dest / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""overlays/gpu/fetch-model.py, vLLM's init step: copies llm/<name>/ of the models bucket to the
pod's volume, keeps files already there, and never writes outside the model's directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .loader import load_deploy_module

fetch_model = load_deploy_module("overlays/gpu/fetch-model")


@dataclass
class Obj:
    object_name: str
    size: int


class FakeBucket:
    """The models bucket as the minio client lists and downloads it."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.downloads: list[str] = []

    def list_objects(self, bucket_name: str, prefix: str | None = None, recursive: bool = False) -> list[Any]:
        assert bucket_name == "ragmesh-models" and recursive
        return [Obj(k, len(v)) for k, v in sorted(self.objects.items()) if k.startswith(prefix or "")]

    def fget_object(self, bucket_name: str, object_name: str, file_path: str) -> None:
        self.downloads.append(object_name)
        Path(file_path).write_bytes(self.objects[object_name])


def test_copies_the_model_and_keeps_what_is_there(tmp_path: Path) -> None:
    bucket = FakeBucket(
        {
            "llm/qwen/config.json": b"{}",
            "llm/qwen/weights/part-1.safetensors": b"x" * 10,
            "llm/qwen/../../../etc/passwd": b"owned",
            "llm/other/config.json": b"{}",
            "reranker/model.onnx": b"no",
        }
    )
    assert fetch_model.fetch(bucket, "qwen", tmp_path) == 2
    assert (tmp_path / "qwen/config.json").read_bytes() == b"{}"
    assert (tmp_path / "qwen/weights/part-1.safetensors").stat().st_size == 10
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["config.json", "part-1.safetensors"]
    # A restarted pod with its volume kept downloads nothing again.
    bucket.downloads.clear()
    assert fetch_model.fetch(bucket, "qwen", tmp_path) == 0 and bucket.downloads == []


def test_refuses_odd_names_and_missing_models(tmp_path: Path) -> None:
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError):
            fetch_model.fetch(FakeBucket({}), bad, tmp_path)
    with pytest.raises(FileNotFoundError, match="upload it first"):
        fetch_model.fetch(FakeBucket({}), "qwen", tmp_path)

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from meshkit.storage.objectstore import ObjectNotFound, ObjectStore
from services.reranker.fetch import fetch_model_dir
from services.reranker.model import MANIFEST, MODEL_FILE, TOKENIZER_FILE, CrossEncoderModel, ModelLoadError

BUCKET = "models"
PREFIX = "reranker/tiny"
URI = f"s3://{BUCKET}/{PREFIX}"


class FakeStore(ObjectStore):
    """The two calls fetch uses, over a dict; counts downloads."""

    def __init__(self) -> None:  # no client: nothing leaves the process
        self.objects: dict[tuple[str, str], bytes] = {}
        self.downloads: list[str] = []

    def upload(self, model_dir: Path, prefix: str = PREFIX) -> None:
        for path in model_dir.iterdir():
            self.objects[BUCKET, f"{prefix}/{path.name}"] = path.read_bytes()

    async def get(self, bucket: str, key: str) -> bytes:
        try:
            return self.objects[bucket, key]
        except KeyError:
            raise ObjectNotFound(f"{bucket}/{key}") from None

    async def get_file(self, bucket: str, key: str, path: str) -> None:
        data = await self.get(bucket, key)
        self.downloads.append(key)
        await asyncio.to_thread(Path(path).write_bytes, data)


@pytest.fixture
def store(cell_model_dir: Path) -> FakeStore:
    fake = FakeStore()
    fake.upload(cell_model_dir)
    return fake


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


async def test_fetch_downloads_verifies_and_loads(store: FakeStore, cache: Path) -> None:
    model_dir = await fetch_model_dir(store, URI, cache)
    assert model_dir.parent == cache
    assert sorted(store.downloads) == [f"{PREFIX}/{MODEL_FILE}", f"{PREFIX}/{TOKENIZER_FILE}"]
    assert sorted(p.name for p in model_dir.iterdir()) == [MANIFEST, MODEL_FILE, TOKENIZER_FILE]
    assert leftovers(cache) == [model_dir.name]  # no staging folder left behind
    model = CrossEncoderModel.load(model_dir, provider="cpu")
    assert model.score_pairs(["cell"], ["a cell"]).tolist() == [2.0]


async def test_second_fetch_reuses_the_cache(store: FakeStore, cache: Path) -> None:
    first = await fetch_model_dir(store, URI, cache)
    downloads = len(store.downloads)
    second = await fetch_model_dir(store, URI, cache)
    assert second == first
    assert len(store.downloads) == downloads


async def test_a_damaged_cached_copy_is_fetched_again(store: FakeStore, cache: Path) -> None:
    first = await fetch_model_dir(store, URI, cache)
    (first / MODEL_FILE).write_bytes(b"half a model")
    downloads = len(store.downloads)
    second = await fetch_model_dir(store, URI, cache)
    assert second == first
    assert len(store.downloads) == downloads + 2
    assert leftovers(cache) == [second.name]
    CrossEncoderModel.load(second, provider="cpu")


async def test_a_tampered_object_leaves_nothing_in_the_cache(store: FakeStore, cache: Path) -> None:
    store.objects[BUCKET, f"{PREFIX}/{TOKENIZER_FILE}"] += b" "
    with pytest.raises(ModelLoadError, match="failed its integrity check"):
        await fetch_model_dir(store, URI, cache)
    assert leftovers(cache) == []


async def test_a_listed_object_missing_leaves_nothing_in_the_cache(store: FakeStore, cache: Path) -> None:
    del store.objects[BUCKET, f"{PREFIX}/{MODEL_FILE}"]
    with pytest.raises(ModelLoadError, match="listed in the manifest"):
        await fetch_model_dir(store, URI, cache)
    assert leftovers(cache) == []


async def test_missing_manifest(store: FakeStore, cache: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"manifest\.json not found"):
        await fetch_model_dir(store, f"s3://{BUCKET}/elsewhere", cache)
    assert store.downloads == []


@pytest.mark.parametrize(
    "uri", ["", "models/reranker", "http://models/reranker", "s3://models", "s3://models/", "s3:///reranker"]
)
async def test_bad_uri(store: FakeStore, cache: Path, uri: str) -> None:
    with pytest.raises(ModelLoadError, match="must"):
        await fetch_model_dir(store, uri, cache)


@pytest.mark.parametrize("name", ["../x", "sub/x", "..\\x", ".hidden"])
async def test_a_manifest_naming_a_path_is_refused(store: FakeStore, cache: Path, name: str) -> None:
    store.objects[BUCKET, f"{PREFIX}/{MANIFEST}"] = json.dumps({"files": {name: "0" * 64}}).encode()
    with pytest.raises(ModelLoadError, match="not a plain file name"):
        await fetch_model_dir(store, URI, cache)
    assert store.downloads == []
    assert leftovers(cache) == []


@pytest.mark.parametrize("manifest", [b"{not json", b'{"name": 1}', b'{"files": [1]}', b"[]", b'"x"'])
async def test_an_unreadable_manifest_is_refused(store: FakeStore, cache: Path, manifest: bytes) -> None:
    store.objects[BUCKET, f"{PREFIX}/{MANIFEST}"] = manifest
    with pytest.raises(ModelLoadError, match="unreadable manifest"):
        await fetch_model_dir(store, URI, cache)
    assert leftovers(cache) == []

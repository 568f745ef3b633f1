"""Both clients from one declaration (``_operations.py``): every method exists on both faces with
the same signature and docstring, the sync face returning what the async face awaits; a method
added once (here in the test) works on both, with its loops, pauses, emitted items and a failed
step raised into it; and a type checker sees each face's precise types."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ragmesh_client import AsyncClient, Client, RagmeshError, RetryPolicy
from ragmesh_client._calls import INGESTION, Call
from ragmesh_client._operations import Operations
from ragmesh_client._pb.ingestion.v1 import ingestion_pb2
from ragmesh_client._steps import Emit, Items, Sleep, Steps, iterator, operation, run

from .fakemesh import FakeMesh

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def mesh() -> Iterator[FakeMesh]:
    fake = FakeMesh()
    yield fake
    fake.stop()


def public_methods(cls: type) -> dict[str, Any]:
    return {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}


def test_both_faces_have_the_same_methods_signatures_and_docstrings() -> None:
    sync, aio = public_methods(Client), public_methods(AsyncClient)
    assert set(sync) == set(aio)
    for name in sorted(set(sync) - {"close", "from_env"}):
        blocking, awaited = inspect.signature(sync[name]), inspect.signature(aio[name])
        assert blocking.parameters == awaited.parameters, name
        assert sync[name].__doc__ == aio[name].__doc__, name
        if inspect.isasyncgenfunction(aio[name]):
            assert inspect.isgeneratorfunction(sync[name]), name
            assert awaited.return_annotation == f"Async{blocking.return_annotation}", name
        else:
            assert inspect.iscoroutinefunction(aio[name]), name
            assert awaited.return_annotation == blocking.return_annotation, name
    assert str(inspect.signature(Client.list_documents)) == (
        "(self, collection: 'str', *, source_prefix: 'str' = '', page_size: 'int' = 1000, "
        "timeout: 'float | None' = None) -> 'Iterator[DocumentSummary]'"
    )
    assert Client.search.__qualname__ == "Client.search"
    assert AsyncClient.ask_stream.__module__ == "ragmesh_client.aio"


class Probe(Operations):
    """A method added once, as a new RPC would be."""

    @operation
    def counted(self, collection: str, *, pause_s: float = 0.01) -> Steps[tuple[int, bool]]:
        """Two status reads with a pause between; a failing third is caught here."""
        first = yield from run(self._status(collection))
        yield Sleep(pause_s)
        second = yield from run(self._status(collection))
        try:
            yield from run(
                Call(INGESTION, "ListCollections", ingestion_pb2.ListCollectionsRequest(), 5, _keep)
            )
        except RagmeshError as exc:
            return first + second, exc.code == grpc.StatusCode.UNIMPLEMENTED
        return first + second, False

    @iterator
    def pages(self, collection: str, *, count: int = 3) -> Items[str]:
        for i in range(count):
            indexed = yield from run(self._status(collection))
            yield Emit(f"{i}:{indexed}")

    def _status(self, collection: str) -> Call[int]:
        request = ingestion_pb2.GetCollectionStatusRequest(collection=collection)
        return Call(INGESTION, "GetCollectionStatus", request, 5, lambda reply, _rid: int(reply.indexed))


def _keep(reply: Any, request_id: str) -> Any:
    return reply


class ProbeClient(Probe, Client):
    pass


class AsyncProbeClient(Probe, AsyncClient):
    pass


def test_a_method_written_once_runs_on_the_sync_face(mesh: FakeMesh) -> None:
    with ProbeClient(mesh.address, ingestion=mesh.address, retry=RetryPolicy(max_attempts=1)) as c:
        assert c.counted("docs") == (6, True)
        assert list(c.pages("docs")) == ["0:3", "1:3", "2:3"]
        assert c.counted.__doc__ == Probe.__dict__["counted"].steps.__doc__
    assert mesh.script.attempts("GetCollectionStatus") == 5


async def test_a_method_written_once_runs_on_the_async_face(mesh: FakeMesh) -> None:
    async with AsyncProbeClient(mesh.address, ingestion=mesh.address) as c:
        assert await c.counted("docs") == (6, True)
        assert [p async for p in c.pages("docs", count=2)] == ["0:3", "1:3"]
    assert mesh.script.attempts("GetCollectionStatus") == 4


def test_an_iterator_runs_nothing_before_its_first_item(mesh: FakeMesh) -> None:
    with Client(mesh.address, ingestion=mesh.address) as c:
        listing = c.list_documents("docs", page_size=0)
        assert mesh.script.seen == []
        with pytest.raises(ValueError, match="page_size"):
            next(listing)


def test_a_method_must_say_what_it_returns() -> None:
    with pytest.raises(TypeError, match="Steps"):

        class Wrong(Operations):
            @operation  # type: ignore[arg-type]
            def plain(self) -> int:
                return 1


def test_a_type_checker_sees_precise_types_on_both_faces(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    snippet = tmp_path / "faces.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from collections.abc import AsyncIterator, Iterator
            from typing import assert_type

            from ragmesh_client import AskEvent, AsyncClient, Client, DocumentSummary, SearchResponse
            from ragmesh_client import DocumentStatus, IngestResult, Document


            async def check(c: Client, a: AsyncClient) -> None:
                assert_type(c.search("docs", "q", top_k=3), SearchResponse)
                assert_type(await a.search("docs", "q", top_k=3), SearchResponse)
                assert_type(c.ingest("docs", [Document("a", "b")]), IngestResult)
                assert_type(await a.wait_indexed("docs", ["a"]), tuple[DocumentStatus, ...])
                assert_type(c.list_documents("docs"), Iterator[DocumentSummary])
                assert_type(a.list_documents("docs"), AsyncIterator[DocumentSummary])
                assert_type(c.ask_stream("docs", "q"), Iterator[AskEvent])
                assert_type(a.ask_stream("docs", "q"), AsyncIterator[AskEvent])
                c.delete("docs", ["a"], timeout="soon")  # E: the wrong type is seen
            """
        )
    )
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nmypy_path = {SRC}\nignore_missing_imports = True\n")
    out, _, status = api.run(
        [
            str(snippet),
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-error-summary",
        ]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1 and len(errors) == 1, out
    assert '"timeout"' in errors[0], out

"""The MCP tools of ``ragmesh mcp`` (ragmesh_cli.mcp_server): search, ask, collection_status,
each one call of ragmesh_client. Kept apart so that only ``ragmesh mcp`` imports the MCP SDK
(seconds of imports every other command would pay)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from ragmesh_cli.search import snippet
from ragmesh_client import Answer, AsyncClient, RagmeshError, SearchResponse

if TYPE_CHECKING:
    from ragmesh_cli.mcp_clients import Clients

MAX_TOP_K = 50
PREVIEW_CHARS = 600
INSTRUCTIONS = (
    "Search and question-answering over the documents indexed in ragmesh. Use `ask` for a "
    "verified answer whose sentences cite numbered sources; `search` for ranked passages; "
    "`collection_status` to see how many documents a collection holds."
)


def search_payload(response: SearchResponse) -> dict[str, Any]:
    return {
        "results": [
            {
                "rank": rank,
                "doc_id": r.doc_id,
                "chunk_id": r.chunk_id,
                "title": r.title,
                "score": round(r.score, 4),
                "text": snippet(r.text, PREVIEW_CHARS),
                "source_uri": r.source_uri,
                "metadata": r.metadata,
            }
            for rank, r in enumerate(response.results, start=1)
        ],
        "degradations": [f"{d.stage}: {d.reason}" for d in response.degradations],
    }


def answer_payload(answer: Answer) -> dict[str, Any]:
    return {
        "answer": answer.text,
        "answered": answer.answered,
        "citations": [
            {
                "number": c.number,
                "doc_id": c.doc_id,
                "title": c.title,
                "snippet": c.snippet,
                "source_uri": c.source_uri,
            }
            for c in answer.citations
        ],
        "mode": answer.mode,
        "degradations": [f"{d.stage}: {d.reason}" for d in answer.degradations],
    }


def build_server(clients: Clients, default_collection: str) -> MCPServer:
    server = MCPServer(name="ragmesh", instructions=INSTRUCTIONS, log_level="WARNING")

    async def run(ctx: Context, call: Callable[[AsyncClient], Awaitable[Any]]) -> Any:
        client = clients.for_headers(ctx.headers)
        try:
            return await call(client)
        except RagmeshError as exc:
            # The mesh's message is written for callers; the request id finds its log lines.
            raise ToolError(f"{exc.code.name}: {exc.message} (request id {exc.request_id})") from None

    @server.tool(description="Search a collection: the best passages, ranked, with their source.")
    async def search(query: str, ctx: Context, collection: str = "", top_k: int = 5) -> dict[str, Any]:
        if not 1 <= top_k <= MAX_TOP_K:
            raise ToolError(f"top_k must be 1..{MAX_TOP_K}")
        name = collection or default_collection
        found = await run(ctx, lambda c: c.search(name, query, top_k=top_k))
        return search_payload(found)

    @server.tool(
        description="Answer a question from a collection's documents: a verified answer whose "
        "sentences cite numbered sources ([n]), the citations, and whether the documents answer it."
    )
    async def ask(question: str, ctx: Context, collection: str = "") -> dict[str, Any]:
        name = collection or default_collection
        answer = await run(ctx, lambda c: c.ask(name, question))
        return answer_payload(answer)

    @server.tool(description="Documents of a collection per lifecycle state, and its chunk count.")
    async def collection_status(ctx: Context, collection: str = "") -> dict[str, Any]:
        name = collection or default_collection
        status = await run(ctx, lambda c: c.collection_status(name))
        return {
            "collection": status.collection or name,
            "indexed": status.indexed,
            "queued": status.queued,
            "processing": status.processing,
            "failed": status.failed,
            "deleting": status.deleting,
            "chunks": status.chunks,
        }

    return server

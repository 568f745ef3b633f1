"""Document preparation (normalise, then chunk) in child processes under a hard CPU budget.

A document is untrusted input to parsers (pdfminer, BeautifulSoup, markdownify) and to our own
text handling. Whatever one costs, it must not freeze the worker: Python's ``re`` and most
parsers hold the GIL, so in a thread a pathological document would stop the event loop, the
heartbeat that keeps the worker's events and claims alive, and every other document. Here each
document runs in one of a small pool of child processes (``ingest_prepare_processes``, started
once with the chunker and its tokenizer loaded), and:

- RLIMIT_CPU is set before each document to the CPU the child has used plus
  ``ingest_document_cpu_budget_s``: the kernel kills a child that goes over (SIGXCPU), even in
  the middle of a C-level regex match;
- the parent also waits at most ``WALL_FACTOR`` times the budget (plus ``WALL_GRACE_S``) of wall
  clock, for a child starved of CPU or blocked, and kills it then;
- RLIMIT_AS caps the child's memory (``ingest_prepare_memory_bytes``), so a decompression bomb
  fails with MemoryError instead of taking the host down.

A document over its budget, over the memory cap, or that crashes its child (a segfault in a
parser) fails permanently with a clear reason; the child is replaced and the other children
keep working. Children are fresh interpreters (running ``child_main``), never
forks of the worker, whose gRPC and NATS threads would not survive a fork; they talk to it over
a socket pair (multiprocessing's pickled messages) and exit when it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from meshkit.settings import IngestionSettings
from services.ingestion.chunking import ChunkDraft, Chunker
from services.ingestion.normalize import DocumentError, normalize

log = logging.getLogger(__name__)

# The parent's wall-clock limit per document: this many times the CPU budget, plus the grace.
WALL_FACTOR = 2.0
WALL_GRACE_S = 5.0
_MAX_DETAIL_CHARS = 300
_STOP_TIMEOUT_S = 5.0
# How long a new child may take to import the parsers and load the tokenizer.
_START_TIMEOUT_S = 120.0
# The child imports this module by its name (not as __main__): the messages' classes must
# unpickle the same on both sides.
_CHILD_COMMAND = f"import sys; from {__name__} import child_main; child_main(int(sys.argv[1]))"


@dataclass(frozen=True)
class PreparedDocument:
    title: str
    drafts: list[ChunkDraft]
    # What the document's own text says about it (front matter, tags): filterable metadata.
    metadata: dict[str, str] = field(default_factory=dict)


class PreparationFailed(Exception):
    """The document could not be prepared. ``permanent``: the same bytes will fail again.
    ``reason`` is in our words (it becomes the document's status and dead-letter reason);
    ``detail`` is what a parser or the process said, for the worker's log only."""

    def __init__(self, reason: str, *, permanent: bool, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent
        self.detail = detail


@dataclass(frozen=True)
class _Request:
    content: bytes
    fmt: int
    title: str
    max_pdf_pages: int
    cpu_budget_s: float


# What a child sends back: ("ok", PreparedDocument) or ("failed", reason, permanent, detail).
_Reply = tuple[Any, ...]
# A parser raised something not known to be the document's fault (a bug, ours or its).
UNEXPECTED_FAILURE = "document preparation failed unexpectedly (a document parser raised an error)"
NO_PROCESS = "no document preparation process could be started"


def _failed(reason: str, permanent: bool, detail: str = "") -> _Reply:
    return ("failed", reason, permanent, detail)


def prepare_document(request: _Request, chunker: Chunker) -> PreparedDocument:
    """Normalise and chunk one document (what a child runs)."""
    normalized = normalize(request.content, request.fmt, request.title, max_pdf_pages=request.max_pdf_pages)
    return PreparedDocument(
        normalized.title, chunker.chunk(normalized.markdown, normalized.title), normalized.metadata
    )


class DocumentSandbox:
    """A pool of child processes that prepare documents; ``prepare`` is safe to call from many
    tasks at once (each waits for a free child) and never blocks the event loop."""

    def __init__(self, settings: IngestionSettings, chunker: Chunker) -> None:
        self.processes = max(1, settings.ingest_prepare_processes)
        self.cpu_budget_s = settings.ingest_document_cpu_budget_s
        self.wall_limit_s = self.cpu_budget_s * WALL_FACTOR + WALL_GRACE_S
        self.memory_bytes = settings.ingest_prepare_memory_bytes
        self.max_pdf_pages = settings.ingest_max_pdf_pages
        # One thread per child waits on it: the event loop only awaits futures.
        self._executor = ThreadPoolExecutor(max_workers=self.processes, thread_name_prefix="sandbox")
        self._children = [_Child(chunker, self.memory_bytes) for _ in range(self.processes)]
        self._idle: asyncio.Queue[_Child] | None = None
        self._closed = False
        # Started now, in the background: the first document should not wait for the imports.
        self._started = [self._executor.submit(child.start_quietly) for child in self._children]

    @property
    def child_pids(self) -> list[int | None]:
        """The children's process ids (None: not running), for operators and tests."""
        return [child.pid for child in self._children]

    async def start(self) -> None:
        """Wait until every child is ready (``prepare`` otherwise waits for its own)."""
        await asyncio.gather(*(asyncio.wrap_future(started) for started in self._started))

    async def prepare(self, content: bytes, fmt: int, title: str) -> PreparedDocument:
        """The document's title and chunks; PreparationFailed when it cannot be prepared."""
        if self._closed:
            raise PreparationFailed("the document sandbox is closed", permanent=False)
        idle = self._idle_queue()
        child = await idle.get()
        loop = asyncio.get_running_loop()
        request = _Request(content, fmt, title, self.max_pdf_pages, self.cpu_budget_s)
        future: Future[_Reply] = self._executor.submit(child.exchange, request, self.wall_limit_s)
        # The child goes back to the pool only once its thread is done with it, even when this
        # task is cancelled first (a batch watchdog): it may still be working on the document.
        future.add_done_callback(lambda _: _call_in_loop(loop, idle.put_nowait, child))
        reply = await asyncio.wrap_future(future)
        if reply[0] == "ok":
            prepared: PreparedDocument = reply[1]
            return prepared
        _status, reason, permanent, detail = reply
        raise PreparationFailed(reason, permanent=permanent, detail=detail)

    async def close(self) -> None:
        self._closed = True
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, child.stop) for child in self._children))
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _idle_queue(self) -> asyncio.Queue[_Child]:
        if self._idle is None:
            self._idle = asyncio.Queue()
            for child in self._children:
                self._idle.put_nowait(child)
        return self._idle


def _call_in_loop(loop: asyncio.AbstractEventLoop, callback: Callable[[_Child], None], child: _Child) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed first: nobody waits for the child
        loop.call_soon_threadsafe(callback, child)


class _Child:
    """One child process and the socket to it. A document's exchange holds the lock for its
    whole round trip; ``stop`` kills the process without it, so a round trip in flight ends at
    once (it sees the socket close) and then gives the lock up."""

    def __init__(self, chunker: Chunker, memory_bytes: int) -> None:
        self._chunker = chunker
        self._memory_bytes = memory_bytes
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._lock = threading.RLock()
        self._stopped = False

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def start_quietly(self) -> None:
        try:
            self.ensure_running()
        except Exception:
            # Retried by the first document that needs this child, which reports the failure;
            # a start cut short by stop() is no failure at all.
            if not self._stopped:
                log.exception("could not start a document preparation process")

    def ensure_running(self) -> None:
        """Start the child if it is not running, and wait until it is ready for documents."""
        with self._lock:
            if self._stopped:
                raise RuntimeError("the document sandbox is closed")
            if self._process is not None and self._process.poll() is None and self._conn is not None:
                return
            self._discard()
            ours, theirs = socket.socketpair()
            with ours, theirs:
                process = subprocess.Popen(
                    [sys.executable, "-c", _CHILD_COMMAND, str(theirs.fileno())],
                    pass_fds=[theirs.fileno()],
                    stdin=subprocess.DEVNULL,
                )
                conn = Connection(ours.detach())
            self._process, self._conn = process, conn
            conn.send((self._chunker, self._memory_bytes))
            if not conn.poll(_START_TIMEOUT_S) or conn.recv() != "ready":
                self._kill()
                raise RuntimeError("the document preparation process did not start")

    def exchange(self, request: _Request, wall_limit_s: float) -> _Reply:
        """Send one document and wait for its reply, at most ``wall_limit_s``; a child that
        died or ran out of time is replaced before this returns."""
        with self._lock:
            try:
                self.ensure_running()
            except Exception as exc:
                return _failed(NO_PROCESS, False, f"{type(exc).__name__}: {exc}"[:_MAX_DETAIL_CHARS])
            assert self._conn is not None
            try:
                self._conn.send(request)
                if self._conn.poll(wall_limit_s):
                    reply: _Reply = self._conn.recv()
                    return reply
            except (EOFError, OSError):
                return self._failed_child(request)
            self._kill()
            self._restart()
            return _failed(
                f"processing took more than {wall_limit_s:.0f} s of wall-clock time "
                f"(the budget is {request.cpu_budget_s:g} s of CPU); the document was abandoned",
                True,
            )

    def _failed_child(self, request: _Request) -> _Reply:
        """The reply for a child that died mid-document (and a fresh child in its place)."""
        if self._stopped:
            # Killed by stop(): the worker is shutting down, the document is not at fault.
            return _failed("document preparation was stopped (the worker is shutting down)", False)
        assert self._process is not None
        try:
            code = self._process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        self._kill()
        self._restart()
        if code == -signal.SIGXCPU:
            return _failed(
                f"processing took more than {request.cpu_budget_s:g} s of CPU "
                "(ingest_document_cpu_budget_s); the document was abandoned",
                True,
            )
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        log.error("document preparation process died", extra={"exit": how})
        return _failed(f"document processing crashed ({how}); the document was abandoned", True)

    def _restart(self) -> None:
        # The next document should not pay for the start; a failure here is retried then.
        if not self._stopped:
            self.start_quietly()

    def stop(self) -> None:
        self._stopped = True
        process = self._process
        if process is not None and process.poll() is None:
            # Preparing is a pure function of the document: nothing is lost by a kill.
            process.kill()
        if self._lock.acquire(timeout=_STOP_TIMEOUT_S):
            try:
                self._kill()
            finally:
                self._lock.release()

    def _kill(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        self._discard()

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None


# --- in the child ----------------------------------------------------------------------------


def child_main(fd: int) -> None:
    """A child's life: receive the chunker, then prepare documents until the socket closes."""
    # The parent decides when children stop: a terminal's Ctrl-C reaches the whole process
    # group, and must not kill a child mid-document before the parent shuts down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    conn = Connection(fd)
    try:
        chunker, memory_bytes = conn.recv()
    except (EOFError, OSError):
        return
    if memory_bytes > 0:
        _set_soft_limit(resource.RLIMIT_AS, memory_bytes)
    conn.send("ready")
    while True:
        try:
            request: _Request = conn.recv()
        except (EOFError, OSError):
            return  # the parent closed the socket or died
        _limit_cpu(request.cpu_budget_s)
        conn.send(_run(request, chunker, memory_bytes))


def _run(request: _Request, chunker: Chunker, memory_bytes: int) -> _Reply:
    try:
        return ("ok", prepare_document(request, chunker))
    except DocumentError as exc:
        return _failed(exc.reason, True, exc.detail)
    except MemoryError:
        return _failed(f"processing needs more than {memory_bytes // 2**20} MiB of memory", True)
    except RecursionError:
        return _failed("document is nested too deeply to process", True)
    except Exception as exc:
        # A bug on our side or in a parser, not known to be the document's fault: retried. Its
        # text goes back for the worker's log (this process has no log of its own).
        return _failed(UNEXPECTED_FAILURE, False, f"{type(exc).__name__}: {exc}"[:_MAX_DETAIL_CHARS])


def _limit_cpu(budget_s: float) -> None:
    """Let this process use ``budget_s`` more seconds of CPU, then be killed (SIGXCPU). Only
    the soft limit moves: an unprivileged process cannot raise a hard limit it lowered."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _set_soft_limit(resource.RLIMIT_CPU, math.ceil(usage.ru_utime + usage.ru_stime + budget_s))


def _set_soft_limit(kind: int, soft: int) -> None:
    _current, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))

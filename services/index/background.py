"""One collection's background work on its segments (the jobs are maintenance.py's): sealing
frozen segments, compacting sealed ones, merging checkpoint files. Each job picks its work under
the state read lock, builds without any lock (searches and writes go on), and swaps the result
in under the write lock, briefly; the next checkpoint names the new files."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from services.index import maintenance as jobs
from services.index.backends import release_memory
from services.index.compaction import merge_plan
from services.index.metrics import COMPACTIONS, INDEX_BUILD_SECONDS, REBUILDS, SEALS
from services.index.records import IndexPolicy
from services.index.rwlock import RWLock
from services.index.state import IndexState

log = logging.getLogger(__name__)


class SegmentWork:
    def __init__(
        self,
        name: str,
        directory: Path,
        policy: IndexPolicy,
        state: Callable[[], IndexState],
        rw: RWLock,
        write_lock: threading.Lock,
        changed: Callable[[], None],
    ) -> None:
        self.name = name
        self.directory = directory
        self.policy = policy
        self._state = state
        self._rw = rw
        self._write_lock = write_lock
        # Called (write lock held) when a job changed the layout: the next checkpoint has work.
        self._changed = changed
        self._running = threading.Lock()

    def rebuild_target(self) -> str | None:
        with self._rw.read():
            s = self._state()
            job = jobs.prepare_seal(s) or jobs.prepare_compaction(s)
            return job.kind if job is not None else None

    def due(self) -> bool:
        with self._rw.read():
            s = self._state()
            merges = merge_plan([p.end - p.start for p in s.growing.parts]) or merge_plan(
                [max(1, r.size) for r in s.doc_runs]
            )
        return merges is not None or self.rebuild_target() is not None

    def run(self, build: jobs.BuildFn) -> bool:
        """Every job due now, one after the other (one caller at a time); whether any ran."""
        if not self._running.acquire(blocking=False):
            return False
        try:
            done = False
            while self._seal_or_compact(build) or self._merge_files():
                done = True
            return done
        finally:
            self._running.release()

    def _seal_or_compact(self, build: jobs.BuildFn) -> bool:
        with self._rw.read():
            s = self._state()
            job = jobs.prepare_seal(s)
            sealing = job is not None
            job = job or jobs.prepare_compaction(s)
        if job is None:
            return False
        config = self.policy.backend_config()
        jobs.build_segment(self.directory, job, config, self.policy.recall_target, build)
        with self._write_lock, self._rw.write():
            installed = jobs.install_segment(self._state(), job, config)
            self._changed()
        rows = len(job.data) if job.data is not None else 0
        inputs = [s.sid for s in job.replaces]
        job.sources, job.replaces, job.data = [], [], None  # the rows in RAM a seal leaves behind
        release_memory()
        INDEX_BUILD_SECONDS.labels("seal" if sealing else "compaction").observe(job.seconds)
        REBUILDS.labels(job.kind).inc()
        if sealing:
            SEALS.labels(job.kind).inc()
        else:
            COMPACTIONS.labels("ok" if installed is not None or not rows else "superseded").inc()
        log.info(
            "segment sealed" if sealing else "segments compacted",
            extra={
                "collection": self.name,
                "index_type": job.kind,
                "rows": rows,
                "inputs": inputs,
                "recall": round(job.recall, 4),
                "seconds": round(job.seconds, 3),
            },
        )
        return True

    def _merge_files(self) -> bool:
        with self._rw.read():
            s = self._state()
            parts = jobs.prepare_parts_merge(s)
            runs = None if parts else jobs.prepare_runs_merge(s)
        if parts is not None:
            jobs.build_parts_merge(self.directory, parts, self.policy.dimension)
            with self._write_lock, self._rw.write():
                jobs.install_parts_merge(self._state(), parts, self.directory)
                self._changed()
            return True
        if runs is not None:
            jobs.build_runs_merge(self.directory, runs)
            with self._write_lock:
                jobs.install_runs_merge(self._state(), runs)
                self._changed()
            return True
        return False

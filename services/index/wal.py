"""Write-ahead log of one collection: framed, checksummed, fsynced records in segment files.

Frame: ``length u32 | crc32 u32 | sequence u64 | payload``; the crc covers sequence + payload
and ``length`` counts them. A record is acknowledged only after its fsync returns, so a record
cut short by a crash was never acknowledged: recovery truncates such a torn tail of the last
segment. Anything wrong *before* the tail of the last segment is real corruption of
acknowledged data and stops recovery loudly.

Segments are named by the first sequence they may hold. A snapshot rotates the log (the
records it covers stay in older segments) and then drops those segments; replaying a segment
that survived a crash in between is a no-op because records at or below the snapshot's
sequence are skipped.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from meshkit.core.fsutil import fsync_dir

log = logging.getLogger(__name__)

_FRAME = struct.Struct("<II")  # length, crc32
_SEQ = struct.Struct("<Q")
_SUFFIX = ".wal"
# A length beyond this can only be garbage (a request is capped far below it by gRPC).
MAX_RECORD_BYTES = 1 << 31


class WalCorruption(RuntimeError):
    """Acknowledged WAL data is unreadable: recovery must not guess."""


class _TornRecord(Exception):
    pass


def _segment_name(start: int) -> str:
    return f"{start:020d}{_SUFFIX}"


def _frame(seq: int, payload: bytes) -> bytes:
    body = _SEQ.pack(seq) + payload
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def _read_record(f: BinaryIO) -> tuple[int, bytes] | None:
    """The next record, None at a clean end of file; raises _TornRecord on a bad frame."""
    head = f.read(_FRAME.size)
    if not head:
        return None
    if len(head) < _FRAME.size:
        raise _TornRecord("short frame header")
    length, crc = _FRAME.unpack(head)
    if length < _SEQ.size or length > MAX_RECORD_BYTES:
        raise _TornRecord(f"implausible record length {length}")
    body = f.read(length)
    if len(body) < length:
        raise _TornRecord("short record body")
    if zlib.crc32(body) != crc:
        raise _TornRecord("checksum mismatch")
    (seq,) = _SEQ.unpack_from(body)
    return seq, body[_SEQ.size :]


class WriteAheadLog:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._file: BinaryIO | None = None
        self._segment_start = 0
        self.last_seq = 0
        self.torn_bytes_dropped = 0

    def segments(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.directory.glob(f"*{_SUFFIX}"):
            stem = path.name[: -len(_SUFFIX)]
            if stem.isdigit():
                found.append((int(stem), path))
        return sorted(found)

    def recover(self, after_seq: int, apply: Callable[[int, bytes], None]) -> int:
        """Replay every record with sequence > ``after_seq`` through ``apply`` in order, cut a
        torn tail, and open the log for appends. Returns the number of records applied."""
        self.directory.mkdir(parents=True, exist_ok=True)
        segments = self.segments()
        expected = after_seq + 1
        applied = 0
        last = after_seq
        for i, (_start, path) in enumerate(segments):
            is_last = i == len(segments) - 1
            for seq, payload in self._records(path, tolerate_torn_tail=is_last):
                if seq <= after_seq:
                    continue  # already inside the snapshot
                if seq != expected:
                    raise WalCorruption(f"{path}: sequence {seq} follows {last} (expected {expected})")
                apply(seq, payload)
                applied += 1
                last = seq
                expected = seq + 1
        self.last_seq = last
        self._open_for_append(segments, last)
        return applied

    def _records(self, path: Path, *, tolerate_torn_tail: bool) -> Iterator[tuple[int, bytes]]:
        with path.open("rb") as f:
            while True:
                offset = f.tell()
                try:
                    record = _read_record(f)
                except _TornRecord as exc:
                    if not tolerate_torn_tail:
                        raise WalCorruption(f"{path} at byte {offset}: {exc}") from exc
                    self._truncate_torn_tail(path, offset, str(exc))
                    return
                if record is None:
                    return
                yield record

    def _truncate_torn_tail(self, path: Path, offset: int, reason: str) -> None:
        size = path.stat().st_size
        self.torn_bytes_dropped += size - offset
        log.warning(
            "truncating torn WAL tail (never acknowledged)",
            extra={"wal": str(path), "offset": offset, "dropped_bytes": size - offset, "reason": reason},
        )
        with path.open("r+b") as f:
            f.truncate(offset)
            f.flush()
            os.fsync(f.fileno())

    def _open_for_append(self, segments: list[tuple[int, Path]], last: int) -> None:
        if segments:
            self._segment_start, path = segments[-1]
            self._file = path.open("ab")
        else:
            self._start_segment(last + 1)

    def _start_segment(self, start: int) -> None:
        path = self.directory / _segment_name(start)
        self._file = path.open("ab")
        os.fsync(self._file.fileno())
        fsync_dir(self.directory)
        self._segment_start = start

    def append(self, payload: bytes) -> int:
        """Write one record and fsync it; returns its sequence. On any failure the segment is
        cut back to where it was, so a failed append leaves no partial frame behind."""
        if self._file is None:
            raise RuntimeError("WAL is not open")
        seq = self.last_seq + 1
        f = self._file
        offset = f.tell()
        try:
            f.write(_frame(seq, payload))
            f.flush()
            os.fsync(f.fileno())
        except BaseException:
            self._cut_back(offset)
            raise
        self.last_seq = seq
        return seq

    def _cut_back(self, offset: int) -> None:
        assert self._file is not None
        try:
            self._file.truncate(offset)
            self._file.seek(offset)
            os.fsync(self._file.fileno())
        except OSError:
            # The file may now end in a partial frame; recovery treats it as a torn tail, but
            # appending after it would bury it mid-log, so refuse further appends.
            log.exception("could not cut a failed WAL append back; closing the log")
            self._file.close()
            self._file = None

    def rotate(self) -> int:
        """Start a new segment for records after ``last_seq``; returns its first sequence."""
        if self._file is None:
            raise RuntimeError("WAL is not open")
        start = self.last_seq + 1
        if start == self._segment_start:
            return start  # the current segment is still empty
        self._file.close()
        self._start_segment(start)
        return start

    def drop_segments_before(self, start: int) -> int:
        """Delete segments whose records all precede ``start`` (covered by a snapshot)."""
        dropped = 0
        for seg_start, path in self.segments():
            if seg_start < start and seg_start != self._segment_start:
                path.unlink(missing_ok=True)
                dropped += 1
        if dropped:
            fsync_dir(self.directory)
        return dropped

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

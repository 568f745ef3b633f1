"""One gRPC call over a bare HTTP/2 connection, with headers grpc's own clients never send.

grpc's clients cap ``grpc-timeout`` at 27000H (C-core) or fail a longer deadline locally
(Python: DEADLINE_EXCEEDED before anything is sent), but other clients may send up to the
header's 99999999H. This client writes the request's headers as plain HPACK literals and reads
the answer's, which grpc's servers send as literals without Huffman coding (a Huffman-coded
header fails loudly rather than being misread).
"""

from __future__ import annotations

import asyncio
import struct
import urllib.parse
from dataclasses import dataclass, field

import grpc

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY, _CONTINUATION = 0, 1, 3, 4, 6, 7, 9
_END_STREAM = _ACK = 0x1
_END_HEADERS = 0x4
_STREAM = 1
_MAX_FRAME = 16384
# The HPACK static-table entries grpc's servers refer to (RFC 7541, appendix A); the others
# come back under a placeholder name.
_STATIC = {8: (":status", "200"), 31: ("content-type", ""), 16: ("accept-encoding", "gzip, deflate")}
_STATIC_SIZE = 61


@dataclass
class RawReply:
    """The answer's headers and trailers (one mapping), and its gRPC messages."""

    headers: dict[str, str] = field(default_factory=dict)
    messages: list[bytes] = field(default_factory=list)
    reset: bool = False

    @property
    def code(self) -> grpc.StatusCode | None:
        status = self.headers.get("grpc-status")
        if status is None:
            return None
        return next(code for code in grpc.StatusCode if code.value[0] == int(status))

    @property
    def details(self) -> str:
        return urllib.parse.unquote(self.headers.get("grpc-message", ""))

    @property
    def request_id(self) -> str | None:
        return self.headers.get("x-request-id")


async def call(
    port: int, path: str, request: bytes, headers: dict[str, str] | None = None, timeout_s: float = 20.0
) -> RawReply:
    """Send ``request`` (a serialized message) to ``path`` on 127.0.0.1:``port``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_PREFACE + _frame(_SETTINGS, 0, 0))
        writer.write(_frame(_HEADERS, _END_HEADERS, _STREAM, _request_headers(port, path, headers or {})))
        writer.write(b"".join(_data_frames(b"\x00" + struct.pack(">I", len(request)) + request)))
        await writer.drain()
        return await asyncio.wait_for(_read_reply(reader, writer), timeout_s)
    finally:
        writer.close()


def _request_headers(port: int, path: str, extra: dict[str, str]) -> bytes:
    fields = {
        ":method": "POST",
        ":scheme": "http",
        ":path": path,
        ":authority": f"127.0.0.1:{port}",
        "content-type": "application/grpc",
        "te": "trailers",
        **extra,
    }
    # Literal header fields without indexing, new names (RFC 7541, 6.2.2).
    return b"".join(b"\x00" + _string(name) + _string(value) for name, value in fields.items())


def _string(text: str) -> bytes:
    data = text.encode()
    return _integer(len(data), 7, 0) + data


def _integer(value: int, prefix_bits: int, flags: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([flags | value])
    out = bytearray([flags | limit])
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _data_frames(body: bytes) -> list[bytes]:
    pieces = [body[i : i + _MAX_FRAME] for i in range(0, len(body), _MAX_FRAME)] or [b""]
    last = len(pieces) - 1
    return [_frame(_DATA, _END_STREAM if i == last else 0, _STREAM, p) for i, p in enumerate(pieces)]


async def _read_reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> RawReply:
    reply = RawReply()
    table: list[tuple[str, str]] = []
    data = b""
    while True:
        head = await reader.readexactly(9)
        length = int.from_bytes(head[:3], "big")
        kind, flags = head[3], head[4]
        payload = await reader.readexactly(length)
        if kind == _SETTINGS and not flags & _ACK:
            writer.write(_frame(_SETTINGS, _ACK, 0))
        elif kind == _PING and not flags & _ACK:
            writer.write(_frame(_PING, _ACK, 0, payload))
        elif kind == _HEADERS:
            if not flags & _END_HEADERS:
                raise AssertionError("a header block split over CONTINUATION frames is not supported")
            reply.headers.update(_decode_headers(payload, table))
        elif kind == _DATA:
            data += payload
        elif kind in (_RST_STREAM, _GOAWAY):
            reply.reset = True
            break
        if kind in (_HEADERS, _DATA) and flags & _END_STREAM:
            break
    reply.messages = _messages(data)
    return reply


def _messages(data: bytes) -> list[bytes]:
    messages = []
    while data:
        length = int.from_bytes(data[1:5], "big")
        messages.append(data[5 : 5 + length])
        data = data[5 + length :]
    return messages


def _decode_headers(block: bytes, table: list[tuple[str, str]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    pos = 0
    while pos < len(block):
        first = block[pos]
        if first & 0x80:  # indexed field
            index, pos = _read_integer(block, pos, 7)
            name, value = _entry(index, table)
        elif first & 0x40:  # literal, added to the dynamic table
            name, value, pos = _literal(block, pos, 6, table)
            table.insert(0, (name, value))
        elif first & 0x20:  # dynamic table size update
            _size, pos = _read_integer(block, pos, 5)
            continue
        else:  # literal, not indexed (or never indexed)
            name, value, pos = _literal(block, pos, 4, table)
        headers[name] = value
    return headers


def _literal(block: bytes, pos: int, prefix_bits: int, table: list[tuple[str, str]]) -> tuple[str, str, int]:
    index, pos = _read_integer(block, pos, prefix_bits)
    if index:
        name = _entry(index, table)[0]
    else:
        name, pos = _read_string(block, pos)
    value, pos = _read_string(block, pos)
    return name, value, pos


def _entry(index: int, table: list[tuple[str, str]]) -> tuple[str, str]:
    if index > _STATIC_SIZE:
        return table[index - _STATIC_SIZE - 1]
    return _STATIC.get(index, (f":static-{index}", ""))


def _read_integer(block: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    limit = (1 << prefix_bits) - 1
    value = block[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    while True:
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _read_string(block: bytes, pos: int) -> tuple[str, int]:
    if block[pos] & 0x80:
        raise AssertionError("a Huffman-coded header: this client reads literal ones only")
    length, pos = _read_integer(block, pos, 7)
    return block[pos : pos + length].decode(), pos + length

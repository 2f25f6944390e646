"""Length-prefixed frames over a byte stream, with hard size limits and read deadlines.

Frame: u32 big-endian length | body. Invariants: a frame longer than the reader's limit is refused before
any of it is buffered (FrameError, the sender's fault), so a peer cannot make us allocate more than
`max_size`; a stream that ends mid-frame raises StreamEnded (not a fault: an honest peer whose connection
drops looks the same); a read or write that does not finish within its deadline raises trio.TooSlowError;
`read_exactly` never returns short data.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Protocol

import trio

HEADER = struct.Struct(">I")
DEFAULT_TIMEOUT = 30.0


class FrameError(ValueError):
    """The peer sent a malformed or oversized frame: its fault."""


class StreamEnded(EOFError):
    """The stream closed or was reset mid-frame: a dropped connection looks the same, so nobody's fault."""


class ByteStream(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...


async def read_exactly(stream: ByteStream, n: int) -> bytes:
    buffer = bytearray()
    while len(buffer) < n:
        try:
            piece = await stream.read(n - len(buffer))
        except EOFError:  # libp2p's StreamEOF
            piece = b""
        if not piece:
            raise StreamEnded(f"stream closed after {len(buffer)} of {n} bytes")
        buffer += piece
    return bytes(buffer)


async def read_frame(stream: ByteStream, max_size: int, timeout: float = DEFAULT_TIMEOUT) -> bytes:
    with trio.fail_after(timeout):
        (length,) = HEADER.unpack(await read_exactly(stream, HEADER.size))
        if length > max_size:
            raise FrameError(f"frame of {length} bytes exceeds the limit of {max_size}")
        return await read_exactly(stream, length)


async def write_frame(stream: ByteStream, body: bytes, timeout: float = DEFAULT_TIMEOUT) -> None:
    with trio.fail_after(timeout):  # a peer that died mid-stream must not hold the writer forever
        await stream.write(HEADER.pack(len(body)) + body)


async def read_json(stream: ByteStream, max_size: int = 64 * 1024, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    body = await read_frame(stream, max_size, timeout)
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FrameError(f"malformed JSON frame ({exc})") from None
    if not isinstance(value, dict):
        raise FrameError("JSON frame is not an object")
    return value


async def write_json(stream: ByteStream, value: dict[str, Any]) -> None:
    await write_frame(stream, json.dumps(value, separators=(",", ":")).encode())

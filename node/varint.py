"""Unsigned LEB128 varints: 7 bits per byte, high bit set on every byte but the last.

Invariant: `read_varint(write_varint(n)) == n` for every n >= 0, and a truncated or over-long input
raises ValueError instead of returning a wrong number.
"""

from __future__ import annotations

MAX_BYTES = 10  # enough for 64-bit values


def write_varint(value: int) -> bytes:
    if value < 0:
        raise ValueError("varints are unsigned")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(data: bytes | bytearray | memoryview, offset: int) -> tuple[int, int]:
    """(value, offset after it)."""
    value, shift = 0, 0
    for index in range(MAX_BYTES):
        if offset + index >= len(data):
            raise ValueError("truncated varint")
        byte = data[offset + index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset + index + 1
        shift += 7
    raise ValueError("varint too long")

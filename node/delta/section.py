"""One tensor's part of a delta (a section): how its target differs from its base, exactly.

Section bytes: varint header_len | header | payload (varints are unsigned LEB128, see rollnet.node.varint).
  header: u8 kind | varint name_len | name (utf-8) | u8 dtype code | varint ndim | ndim x varint dim
          | 32-byte target tensor hash (see checkpoint.tensor_hash) | varint changed | varint block_elements
  kind SPARSE: payload is an entropy payload (see entropy.encode_blocks) with one block per
      `block_elements` elements of the flat tensor and two streams per block: positions (the first
      changed offset from the block start, then gap-1 between consecutive changes) and values
      (zigzag of the modular difference of order-preserving bit patterns, see bitcast).
  kind FULL: payload is zstd of the raw little-endian bytes (a new tensor, or its dtype/shape changed).
  kind REMOVED: no payload; the tensor is not in the target.

Invariants: applying writes new bit patterns (never adds floats), only at the listed positions; a section
never applies to a tensor whose name, dtype or shape differs from its header; `apply_section` returns an
undo record so a caller can restore the base exactly if a later check fails.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch
import zstandard
from rollnet.node.delta import entropy
from rollnet.node.delta.bitcast import (
    DTYPE_CODES,
    DTYPES_BY_CODE,
    FLOAT_DTYPES,
    apply_difference,
    bits_of,
    difference,
    from_ordered,
    to_ordered,
)
from rollnet.node.delta.checkpoint import tensor_hash
from rollnet.node.varint import read_varint, write_varint

BLOCK_ELEMENTS = 1 << 20
ZSTD_LEVEL = 3


class Kind(IntEnum):
    SPARSE = 1
    FULL = 2
    REMOVED = 3


class SectionError(ValueError):
    """A section is malformed or does not fit the tensor it is applied to."""


@dataclass(frozen=True)
class SectionHeader:
    kind: Kind
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    target_hash: bytes
    changed: int
    block_elements: int

    def pack(self) -> bytes:
        name = self.name.encode()
        return b"".join([
            bytes([self.kind]), write_varint(len(name)), name, bytes([DTYPE_CODES[self.dtype]]),
            write_varint(len(self.shape)), *(write_varint(d) for d in self.shape), self.target_hash,
            write_varint(self.changed), write_varint(self.block_elements),
        ])

    @classmethod
    def unpack(cls, data: bytes) -> SectionHeader:
        try:
            kind = Kind(data[0])
            name_len, offset = read_varint(data, 1)
            name = data[offset:offset + name_len].decode()
            offset += name_len
            dtype = DTYPES_BY_CODE[data[offset]]
            ndim, offset = read_varint(data, offset + 1)
            shape = []
            for _ in range(ndim):
                dim, offset = read_varint(data, offset)
                shape.append(dim)
            target_hash = data[offset:offset + 32]
            changed, offset = read_varint(data, offset + 32)
            block, offset = read_varint(data, offset)
            if offset != len(data) or len(target_hash) != 32:
                raise SectionError("section header has the wrong length")
            return cls(kind, name, dtype, tuple(shape), target_hash, changed, block)
        except (IndexError, KeyError, ValueError, UnicodeDecodeError) as exc:
            if isinstance(exc, SectionError):
                raise
            raise SectionError(f"malformed section header ({exc})") from None


def _pack(header: SectionHeader, payload: bytes) -> bytes:
    packed = header.pack()
    return write_varint(len(packed)) + packed + payload


def split_section(section: bytes) -> tuple[SectionHeader, bytes]:
    try:
        header_len, offset = read_varint(section, 0)
    except ValueError:
        raise SectionError("truncated section") from None
    if offset + header_len > len(section):
        raise SectionError("truncated section header")
    return SectionHeader.unpack(section[offset:offset + header_len]), section[offset + header_len:]


def changed_positions(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Sorted positions where two equally long bit-pattern arrays differ (call on blocks: it allocates)."""
    return np.flatnonzero(old != new)


def encode_section(name: str, base: torch.Tensor | None, target: torch.Tensor | None,
                   block_elements: int = BLOCK_ELEMENTS) -> bytes:
    """The section turning `base` into `target` (either may be None: a new or removed tensor)."""
    if target is None:
        header = SectionHeader(Kind.REMOVED, name, base.dtype, tuple(base.shape), b"\0" * 32, 0, 0)
        return _pack(header, b"")
    target = target.detach().contiguous()
    target_hash = tensor_hash(name, target)
    shape = tuple(target.shape)
    if base is None or base.dtype != target.dtype or tuple(base.shape) != shape:
        raw = bits_of(target).view("u1").tobytes()
        payload = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(raw)
        return _pack(SectionHeader(Kind.FULL, name, target.dtype, shape, target_hash, target.numel(), 0), payload)
    old_bits, new_bits = bits_of(base.detach().contiguous()), bits_of(target)
    is_float = target.dtype in FLOAT_DTYPES

    def prepare(start: int) -> entropy.PreparedBlock:
        old_block, new_block = old_bits[start:start + block_elements], new_bits[start:start + block_elements]
        positions = changed_positions(old_block, new_block)
        gaps = np.diff(positions, prepend=-1) - 1
        values = difference(to_ordered(old_block[positions], is_float), to_ordered(new_block[positions], is_float))
        return entropy.prepare_block([gaps.astype(np.uint64), values.astype(np.uint64)])

    starts = range(0, len(new_bits), block_elements)
    blocks = list(_pool().map(prepare, starts)) if len(starts) > 1 else [prepare(s) for s in starts]
    changed = sum(block.length for block in blocks)
    payload = entropy.encode_prepared(blocks, 2) if changed else b""
    header = SectionHeader(Kind.SPARSE, name, target.dtype, shape, target_hash, changed, block_elements)
    return _pack(header, payload)


@functools.cache
def _pool() -> ThreadPoolExecutor:
    """Threads for block work: numpy, blake3 and the comparisons release the GIL."""
    return ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="delta")


@dataclass
class Undo:
    """What `apply_section` overwrote (per block: positions and old patterns), to restore the base exactly."""

    positions: list[np.ndarray]
    old_values: list[np.ndarray]

    @property
    def count(self) -> int:
        return sum(len(p) for p in self.positions)


def apply_section(header: SectionHeader, payload: bytes, base: torch.Tensor) -> Undo:
    """Overwrite `base` in place (SPARSE only); returns the undo record."""
    if header.kind is not Kind.SPARSE:
        raise SectionError(f"section {header.name!r} is not sparse")
    if base.dtype != header.dtype or tuple(base.shape) != header.shape:
        raise SectionError(
            f"tensor {header.name!r} is {base.dtype} {tuple(base.shape)}, "
            f"the delta expects {header.dtype} {header.shape}"
        )
    bits = bits_of(base)
    undo = Undo([], [])
    if header.changed == 0:
        if payload:
            raise SectionError(f"section {header.name!r} has a payload but no changes")
        return undo
    if header.block_elements == 0:
        raise SectionError(f"section {header.name!r} has no block size")
    is_float = header.dtype in FLOAT_DTYPES
    try:
        for index, (gaps, values) in enumerate(entropy.decode_blocks(payload)):
            start = index * header.block_elements
            positions = np.cumsum(gaps.astype(np.int64) + 1) - 1
            if len(positions) and (positions[-1] >= header.block_elements or start + positions[-1] >= len(bits)):
                raise SectionError(f"section {header.name!r} points outside the tensor")
            block = bits[start:start + header.block_elements]
            old = block[positions]
            block[positions] = from_ordered(apply_difference(to_ordered(old, is_float), values.astype(old.dtype)),
                                            is_float)
            undo.positions.append(positions + start)
            undo.old_values.append(old)
        if undo.count != header.changed:
            raise SectionError(f"section {header.name!r} lists {undo.count} changes, its header {header.changed}")
    except (entropy.EntropyError, SectionError) as exc:
        restore(base, undo)
        raise SectionError(str(exc)) from None
    return undo


def restore(base: torch.Tensor, undo: Undo) -> None:
    bits = bits_of(base)
    for positions, old in zip(reversed(undo.positions), reversed(undo.old_values), strict=True):
        bits[positions] = old


def full_tensor(header: SectionHeader, payload: bytes) -> torch.Tensor:
    """The target tensor of a FULL section."""
    if header.kind is not Kind.FULL:
        raise SectionError(f"section {header.name!r} is not a full tensor")
    try:
        raw = zstandard.ZstdDecompressor().decompress(payload)
    except zstandard.ZstdError as exc:
        raise SectionError(f"section {header.name!r}: corrupt compressed tensor ({exc})") from None
    tensor = torch.empty(header.shape, dtype=header.dtype)
    bits = bits_of(tensor).view("u1")
    if len(raw) != len(bits):
        raise SectionError(f"section {header.name!r}: {len(raw)} bytes for a tensor of {len(bits)}")
    bits[:] = np.frombuffer(raw, dtype="u1")
    return tensor

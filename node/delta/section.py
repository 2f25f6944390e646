"""One tensor's part of a delta (a section): how its target differs from its base, exactly.

Section bytes: u32 header_len | header | payload, little-endian.
  header: u8 kind | tensor header (u16 name_len, name, u8 dtype code, u8 ndim, ndim x u64 shape)
          | 32-byte target tensor hash | u64 changed | u32 block_elements
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
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch
import zstandard
from rollnet.node.delta import entropy
from rollnet.node.delta.bitcast import (
    DTYPES_BY_CODE,
    FLOAT_DTYPES,
    apply_difference,
    bits_of,
    difference,
    from_ordered,
    to_ordered,
)
from rollnet.node.delta.checkpoint import tensor_hash, tensor_header

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
        return (
            struct.pack("<B", self.kind) + tensor_header(self.name, self.dtype, self.shape) + self.target_hash
            + struct.pack("<QI", self.changed, self.block_elements)
        )

    @classmethod
    def unpack(cls, data: bytes) -> SectionHeader:
        try:
            kind = Kind(data[0])
            (name_len,) = struct.unpack_from("<H", data, 1)
            offset = 3 + name_len
            name = data[3:offset].decode()
            dtype_code, ndim = struct.unpack_from("<BB", data, offset)
            offset += 2
            shape = struct.unpack_from(f"<{ndim}Q", data, offset)
            offset += 8 * ndim
            target_hash = data[offset:offset + 32]
            changed, block = struct.unpack_from("<QI", data, offset + 32)
            if offset + 44 != len(data) or len(target_hash) != 32:
                raise SectionError("section header has the wrong length")
            return cls(kind, name, DTYPES_BY_CODE[dtype_code], tuple(shape), target_hash, changed, block)
        except (IndexError, KeyError, ValueError, struct.error, UnicodeDecodeError) as exc:
            if isinstance(exc, SectionError):
                raise
            raise SectionError(f"malformed section header ({exc})") from None


def _pack(header: SectionHeader, payload: bytes) -> bytes:
    packed = header.pack()
    return struct.pack("<I", len(packed)) + packed + payload


def split_section(section: bytes) -> tuple[SectionHeader, bytes]:
    if len(section) < 4:
        raise SectionError("truncated section")
    (header_len,) = struct.unpack_from("<I", section, 0)
    if 4 + header_len > len(section):
        raise SectionError("truncated section header")
    return SectionHeader.unpack(section[4:4 + header_len]), section[4 + header_len:]


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
    """What `apply_section` overwrote, to restore the base exactly."""

    positions: np.ndarray
    old_values: np.ndarray


def apply_section(header: SectionHeader, payload: bytes, base: torch.Tensor) -> Undo:
    """Overwrite `base` in place (SPARSE only); returns the undo record."""
    if header.kind is not Kind.SPARSE:
        raise SectionError(f"section {header.name!r} is not sparse")
    if base.dtype != header.dtype or tuple(base.shape) != header.shape:
        raise SectionError(
            f"tensor {header.name!r} is {base.dtype} {tuple(base.shape)}, the delta expects {header.dtype} {header.shape}"
        )
    bits = bits_of(base)
    if header.changed == 0:
        if payload:
            raise SectionError(f"section {header.name!r} has a payload but no changes")
        return Undo(np.zeros(0, np.int64), bits[:0].copy())
    if header.block_elements == 0:
        raise SectionError(f"section {header.name!r} has no block size")
    is_float = header.dtype in FLOAT_DTYPES
    all_positions, all_old = [], []
    try:
        blocks = entropy.decode_blocks(payload)
        for index, (gaps, values) in enumerate(blocks):
            start = index * header.block_elements
            positions = np.cumsum(gaps.astype(np.int64) + 1) - 1
            if len(positions) and (positions[-1] >= header.block_elements or start + positions[-1] >= len(bits)):
                raise SectionError(f"section {header.name!r} points outside the tensor")
            block = bits[start:start + header.block_elements]
            old = block[positions]
            ordered = to_ordered(old, is_float)
            block[positions] = from_ordered(apply_difference(ordered, values.astype(old.dtype)), is_float)
            all_positions.append(positions + start)
            all_old.append(old)
    except (entropy.EntropyError, SectionError) as exc:
        undo = _undo_of(all_positions, all_old, bits)
        restore(base, undo)
        raise SectionError(str(exc)) from None
    undo = _undo_of(all_positions, all_old, bits)
    if len(undo.positions) != header.changed:
        restore(base, undo)
        raise SectionError(f"section {header.name!r} lists {len(undo.positions)} changes, its header {header.changed}")
    return undo


def _undo_of(positions: list[np.ndarray], olds: list[np.ndarray], bits: np.ndarray) -> Undo:
    if not positions:
        return Undo(np.zeros(0, np.int64), bits[:0].copy())
    return Undo(np.concatenate(positions), np.concatenate(olds))


def restore(base: torch.Tensor, undo: Undo) -> None:
    bits_of(base)[undo.positions] = undo.old_values


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

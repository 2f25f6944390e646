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

Invariants: applying writes new bit patterns (never adds floats), only at the listed positions, each inside
its own block of the tensor; a section never applies to a tensor whose name, dtype or shape differs from its
header; `apply_section` returns an undo record so a caller can restore the base exactly if a later check
fails. Nothing a section claims sizes memory by itself: a sparse payload's layout is checked against the
tensor before decoding (`check_sparse`), and a full tensor is allocated at the size its header declares,
within the caller's bound, and decompressed no further than that (`full_tensor`). A dtype code outside the
format is refused with UnsupportedDelta; any other malformation raises SectionError.
"""

from __future__ import annotations

import functools
import math
import os
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
    SUPPORTED,
    apply_difference,
    bits_of,
    difference,
    dtype_code,
    from_ordered,
    to_ordered,
)
from rollnet.node.delta.checkpoint import MAX_NAME_BYTES, MAX_NDIM, tensor_hash
from rollnet.node.errors import UnsupportedDelta
from rollnet.node.varint import read_varint, write_varint

BLOCK_ELEMENTS = 1 << 20
ZSTD_LEVEL = 3
MAX_DIM = (1 << 63) - 1  # torch sizes are int64
STREAMS = 2  # per sparse block: positions, values


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
            bytes([self.kind]), write_varint(len(name)), name, bytes([dtype_code(self.dtype, self.name)]),
            write_varint(len(self.shape)), *(write_varint(d) for d in self.shape), self.target_hash,
            write_varint(self.changed), write_varint(self.block_elements),
        ])

    @classmethod
    def unpack(cls, data: bytes) -> SectionHeader:
        try:
            kind = Kind(data[0])
            name_len, offset = read_varint(data, 1)
            if name_len > MAX_NAME_BYTES:
                raise SectionError(f"section header names a tensor of {name_len} bytes")
            name = data[offset:offset + name_len].decode()
            offset += name_len
            dtype = _dtype_of(data[offset], name)
            shape, offset = _read_shape(data, offset + 1, name)
            target_hash = data[offset:offset + 32]
            changed, offset = read_varint(data, offset + 32)
            block, offset = read_varint(data, offset)
            if offset != len(data) or len(target_hash) != 32:
                raise SectionError(f"section {name!r}: header has the wrong length")
            return cls(kind, name, dtype, shape, target_hash, changed, block)
        except (IndexError, ValueError, UnicodeDecodeError) as exc:
            if isinstance(exc, SectionError):
                raise
            raise SectionError(f"malformed section header ({exc})") from None

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def declared_bytes(self) -> int:
        """An upper bound of the bytes a tensor of this header's shape takes (every zero dimension read as one,
        so no dimension, however large, hides behind another's zero)."""
        return math.prod(max(1, d) for d in self.shape) * _ITEM_SIZES[self.dtype]


_ITEM_SIZES = {dtype: torch.empty(0, dtype=dtype).element_size() for dtype in DTYPES_BY_CODE.values()}


def _dtype_of(code: int, name: str) -> torch.dtype:
    dtype = DTYPES_BY_CODE.get(code)
    if dtype is None:
        raise UnsupportedDelta(f"section {name!r} names dtype code {code}, which this node does not know "
                               f"(it knows {SUPPORTED}): the delta needs a newer rollnet")
    return dtype


def _read_shape(data: bytes, offset: int, name: str) -> tuple[tuple[int, ...], int]:
    ndim, offset = read_varint(data, offset)
    if ndim > MAX_NDIM:
        raise SectionError(f"section {name!r}: {ndim} dimensions, at most {MAX_NDIM}")
    shape = []
    for _ in range(ndim):
        dim, offset = read_varint(data, offset)
        if dim > MAX_DIM:
            raise SectionError(f"section {name!r}: a dimension of {dim}")
        shape.append(dim)
    return tuple(shape), offset


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


def check_sparse(header: SectionHeader, payload: bytes) -> entropy.Framing | None:
    """Check a SPARSE section's header and payload framing against its own shape, decoding nothing; returns
    the framing (None: no changes) for `apply_section`. Raises SectionError."""
    layout = _layout(header, payload)
    if layout is None:
        return None
    try:
        return entropy.read_framing(payload, layout)
    except entropy.EntropyError as exc:
        raise SectionError(f"section {header.name!r}: {exc}") from None


def _layout(header: SectionHeader, payload: bytes) -> entropy.Layout | None:
    """The layout a SPARSE section's payload must have; None for a section without changes (and payload)."""
    if header.kind is not Kind.SPARSE:
        raise SectionError(f"section {header.name!r} is not sparse")
    elements = header.elements
    if header.changed > elements:
        raise SectionError(f"section {header.name!r} lists {header.changed} changes for {elements} elements")
    if header.changed == 0:
        if payload:
            raise SectionError(f"section {header.name!r} has a payload but no changes")
        return None
    if header.block_elements == 0:
        raise SectionError(f"section {header.name!r} has no block size")
    return entropy.Layout(STREAMS, elements, header.block_elements, header.changed)


def apply_section(header: SectionHeader, payload: bytes, base: torch.Tensor,
                  framing: entropy.Framing | None = None) -> Undo:
    """Overwrite `base` (contiguous) in place (SPARSE only); returns the undo record. If it raises (anything),
    the base is already restored. `framing`: what `check_sparse` returned for this section, if it was called."""
    layout = _layout(header, payload)
    if base.dtype != header.dtype or tuple(base.shape) != header.shape:
        raise SectionError(
            f"tensor {header.name!r} is {base.dtype} {tuple(base.shape)}, "
            f"the delta expects {header.dtype} {header.shape}"
        )
    undo = Undo([], [])
    if layout is None:
        return undo
    bits = bits_of(base)
    is_float = header.dtype in FLOAT_DTYPES
    try:
        for index, (gaps, values) in enumerate(entropy.decode_blocks(payload, layout, framing)):
            start = index * layout.block
            positions = _positions(gaps, layout.capacity(index), header.name)
            block = bits[start:start + layout.block]
            old = block[positions]
            undo.positions.append(positions + start)  # recorded before the write: an interrupt loses nothing
            undo.old_values.append(old)
            block[positions] = from_ordered(apply_difference(to_ordered(old, is_float), values.astype(old.dtype)),
                                            is_float)
        if undo.count != header.changed:
            raise SectionError(f"section {header.name!r} lists {undo.count} changes, its header {header.changed}")
    except BaseException as exc:
        restore(base, undo)
        if isinstance(exc, entropy.EntropyError):
            raise SectionError(f"section {header.name!r}: {exc}") from None
        raise
    return undo


def _positions(gaps: np.ndarray, capacity: int, name: str) -> np.ndarray:
    """Offsets in a block of `capacity` elements from the gaps between them: strictly increasing, all inside."""
    if not len(gaps):
        return np.zeros(0, dtype=np.int64)
    if int(gaps.max()) >= capacity:  # unsigned: also stops a gap that would read as a negative offset
        raise SectionError(f"section {name!r} points outside the tensor")
    positions = np.cumsum(gaps.astype(np.int64) + 1) - 1
    wrapped = len(gaps) * capacity >= 1 << 63 and bool((np.diff(positions) <= 0).any())  # int64 overflow
    if positions[-1] >= capacity or wrapped:
        raise SectionError(f"section {name!r} points outside the tensor")
    return positions


def restore(base: torch.Tensor, undo: Undo) -> None:
    bits = bits_of(base)
    for positions, old in zip(reversed(undo.positions), reversed(undo.old_values), strict=True):
        bits[positions] = old


def full_tensor(header: SectionHeader, payload: bytes, max_bytes: int) -> torch.Tensor:
    """The target tensor of a FULL section, allocated only when its declared size is at most `max_bytes`
    (else UnsupportedDelta), and decompressed no further than that size (else SectionError)."""
    if header.kind is not Kind.FULL:
        raise SectionError(f"section {header.name!r} is not a full tensor")
    if header.declared_bytes > max_bytes:
        raise UnsupportedDelta(
            f"section {header.name!r} declares a {header.dtype} tensor of shape {list(header.shape)} "
            f"({header.declared_bytes} bytes), more than the {max_bytes} bytes this delta may add"
        )
    size = header.elements * _ITEM_SIZES[header.dtype]
    try:
        declared = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as exc:
        raise SectionError(f"section {header.name!r}: corrupt compressed tensor ({exc})") from None
    if declared not in (-1, size):
        raise SectionError(f"section {header.name!r}: the compressed tensor holds {declared} bytes, its header {size}")
    tensor = torch.empty(header.shape, dtype=header.dtype)
    _decompress_into(payload, bits_of(tensor).view("u1"), header.name)
    return tensor


def _decompress_into(payload: bytes, out: np.ndarray, name: str) -> None:
    """Fill `out` from one zstd frame: exactly len(out) bytes, never a byte more held."""
    view = memoryview(out).cast("B")
    filled = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(payload, read_across_frames=False) as reader:
            while filled < len(view):
                read = reader.readinto(view[filled:])
                if not read:
                    break
                filled += read
            more = reader.read(1)
    except zstandard.ZstdError as exc:
        raise SectionError(f"section {name!r}: corrupt compressed tensor ({exc})") from None
    if filled < len(view):
        raise SectionError(f"section {name!r}: the compressed tensor holds {filled} bytes, its header {len(view)}")
    if more:
        raise SectionError(f"section {name!r}: the compressed tensor holds more than the {len(view)} bytes "
                           "its header declares")

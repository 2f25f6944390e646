"""Entropy coding of log-bin symbol streams with rANS (constriction), near the order-0 entropy.

Invariants: `decode(encode(streams)) == streams` exactly. Each stream's symbol model is its own histogram,
stored in the payload (only nonzero bins), so the decoder rebuilds the identical quantized model; raw
extra bits go through the same coder as uniform symbols of at most 16 bits. The byte layout is pinned to
constriction 0.5.0's model quantisation (`perfect=False`). A decoder given the `Layout` it expects checks the
payload's stream count, block count and block lengths against it before it allocates or decodes anything, so
what a payload claims never sizes memory or work beyond the tensor it is for; any malformed payload raises
EntropyError.

Payload layout: see `encode_blocks`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import constriction
import numpy as np
from rollnet.node.delta.logbins import ALPHABET, extra_counts_of, join, split
from rollnet.node.varint import read_varint, write_varint

CHUNK_BITS = 16
MAX_STREAMS = 16  # per block, for a decoder told no layout
MAX_SYMBOLS = 1 << 48  # per stream, likewise
_uniform_family = constriction.stream.model.Uniform()


class EntropyError(ValueError):
    """The payload is malformed."""


@dataclass(frozen=True)
class Layout:
    """What a payload must hold to fit its tensor: `streams` streams per block, blocks of `block` elements
    (the last may be shorter) covering `elements` elements in order, `total` symbols per stream in all."""

    streams: int
    elements: int
    block: int
    total: int

    def capacity(self, index: int) -> int:
        """How many elements block `index` covers."""
        return max(0, min(self.block, self.elements - index * self.block))


def _model_from_counts(counts: np.ndarray) -> constriction.stream.model.Categorical | None:
    nonzero = np.flatnonzero(counts)
    if len(nonzero) <= 1:
        return None  # a single symbol needs no bits
    top = int(nonzero[-1]) + 1
    probabilities = counts[:top].astype(np.float64) / float(counts.sum())
    return constriction.stream.model.Categorical(probabilities, perfect=False)


def _extra_chunks(extra: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cut each value's raw bits into <=16-bit chunks: (chunk values int32, chunk sizes int32 = 2^bits).

    Round r carries, for every value with bits left, its next (highest remaining) <=16 bits.
    """
    live = counts > 0
    remaining = counts[live]
    bits = extra[live].astype(np.uint64, copy=False)
    values, sizes = [], []
    while len(remaining):
        take = np.minimum(remaining, CHUNK_BITS)
        shift = (remaining - take).astype(np.uint64)
        chunk = (bits >> shift) & ((np.uint64(1) << take.astype(np.uint64)) - np.uint64(1))
        values.append(chunk.astype(np.int32))
        sizes.append(np.left_shift(1, take).astype(np.int32))
        remaining = remaining - take
        more = remaining > 0
        if not more.all():
            remaining, bits = remaining[more], bits[more]
    if not values:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate(values), np.concatenate(sizes)


def _rebuild_extra(chunks: np.ndarray, counts: np.ndarray) -> np.ndarray:
    extra = np.zeros(len(counts), dtype=np.uint64)
    index = np.flatnonzero(counts > 0)
    remaining = counts[index]
    offset = 0
    while len(index):
        take = np.minimum(remaining, CHUNK_BITS)
        piece = chunks[offset:offset + len(index)].astype(np.uint64)
        offset += len(index)
        extra[index] = (extra[index] << take.astype(np.uint64)) | piece
        remaining = remaining - take
        more = remaining > 0
        index, remaining = index[more], remaining[more]
    return extra


def _encode_streams(coder: constriction.stream.stack.AnsCoder, prepared: list, models: list) -> None:
    """Push one block's streams so that decoding pops its symbols first, then its extras, in stream order."""
    for _, chunks, sizes in reversed(prepared):
        if len(chunks):
            coder.encode_reverse(chunks, _uniform_family, sizes)
    for (symbols, _, _), model in zip(reversed(prepared), reversed(models), strict=True):
        if model is not None and len(symbols):
            coder.encode_reverse(symbols.astype(np.int32), model)


@dataclass
class PreparedBlock:
    """One block's streams split into symbols and raw-bit chunks, with its symbol histograms."""

    length: int
    streams: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    histograms: list[np.ndarray]


def prepare_block(streams: list[np.ndarray]) -> PreparedBlock:
    """The per-block half of encoding; independent per block, so blocks may be prepared in parallel."""
    prepared, histograms = [], []
    for values in streams:
        symbols, extra, counts = split(values)
        histograms.append(np.bincount(symbols, minlength=ALPHABET))
        chunks, sizes = _extra_chunks(extra, counts)
        prepared.append((symbols, chunks, sizes))
    return PreparedBlock(len(streams[0]) if streams else 0, prepared, histograms)


def encode_prepared(blocks: list[PreparedBlock], n_streams: int) -> bytes:
    """Encode prepared blocks of `n_streams` equally long unsigned streams into one rANS payload.

    Layout (varints are unsigned LEB128): varint n_streams; per stream its histogram over all blocks
    (varint nonzero bins, then per bin varint symbol gap and varint count); varint n_blocks, n_blocks x
    varint block length; then the rANS words as little-endian u32 to the end of the payload.
    Blocks decode in order, one at a time (see `decode_blocks`).
    """
    histograms = [np.zeros(ALPHABET, dtype=np.int64) for _ in range(n_streams)]
    for block in blocks:
        for index, hist in enumerate(block.histograms):
            histograms[index] += hist
    models = [_model_from_counts(h) for h in histograms]
    coder = constriction.stream.stack.AnsCoder()
    for block in reversed(blocks):
        _encode_streams(coder, block.streams, models)
    words = coder.get_compressed()
    header = [write_varint(n_streams)]
    for hist in histograms:
        header.append(_pack_histogram(hist))
    header.append(write_varint(len(blocks)))
    header.extend(write_varint(block.length) for block in blocks)
    return b"".join(header) + words.astype("<u4").tobytes()


def _pack_histogram(hist: np.ndarray) -> bytes:
    """varint count of nonzero bins, then per bin: varint gap to the previous bin's symbol, varint count."""
    nonzero = np.flatnonzero(hist)
    out = [write_varint(len(nonzero))]
    previous = -1
    for symbol in nonzero.tolist():
        out.append(write_varint(symbol - previous - 1) + write_varint(int(hist[symbol])))
        previous = symbol
    return b"".join(out)


def _read_histogram(payload: bytes, offset: int, most: int) -> tuple[np.ndarray, int]:
    """One stream's histogram; a bin counting more than `most` symbols is refused."""
    hist = np.zeros(ALPHABET, dtype=np.int64)
    count, offset = read_varint(payload, offset)
    symbol = -1
    for _ in range(count):
        gap, offset = read_varint(payload, offset)
        symbol += gap + 1
        if symbol >= ALPHABET:
            raise EntropyError("histogram symbol out of range")
        value, offset = read_varint(payload, offset)
        if value > most:
            raise EntropyError(f"a histogram bin counts {value} symbols, more than the {most} expected")
        hist[symbol] = value
    return hist, offset


def _read_lengths(payload: bytes, offset: int, expect: Layout | None) -> tuple[np.ndarray, int]:
    """The block lengths, each checked against the block it covers before the next is read."""
    n_blocks, offset = read_varint(payload, offset)
    most_blocks = -(-expect.elements // expect.block) if expect else len(payload) - offset
    if n_blocks > most_blocks:
        raise EntropyError(f"the payload has {n_blocks} blocks, more than the {most_blocks} its tensor holds")
    lengths = []
    for index in range(n_blocks):
        length, offset = read_varint(payload, offset)
        most = expect.capacity(index) if expect else MAX_SYMBOLS
        if length > most:
            raise EntropyError(f"block {index} lists {length} changes, more than the {most} elements it covers")
        lengths.append(length)
    return np.array(lengths, dtype=np.int64), offset


@dataclass(frozen=True)
class Framing:
    """A payload's framing, read and checked against `expect`: its histograms, its block lengths and where its
    rANS words start. Reading it decodes no symbol."""

    histograms: list[np.ndarray]
    lengths: np.ndarray
    offset: int
    expect: Layout | None


def read_framing(payload: bytes, expect: Layout | None = None) -> Framing:
    """The payload's framing; EntropyError if it is malformed or does not fit `expect`."""
    try:
        n_streams, offset = read_varint(payload, 0)
        wanted = expect.streams if expect else None
        if (wanted is not None and n_streams != wanted) or n_streams > MAX_STREAMS:
            raise EntropyError(f"the payload has {n_streams} streams per block, expected {wanted or MAX_STREAMS}")
        most = expect.total if expect else MAX_SYMBOLS
        histograms = []
        for _ in range(n_streams):
            hist, offset = _read_histogram(payload, offset, most)
            histograms.append(hist)
        lengths, offset = _read_lengths(payload, offset, expect)
    except ValueError as exc:
        if isinstance(exc, EntropyError):
            raise
        raise EntropyError(f"truncated entropy payload ({exc})") from None
    total = sum(lengths.tolist())
    if expect is not None and total != expect.total:
        raise EntropyError(f"the payload lists {total} changes, its header {expect.total}")
    if any(int(h.sum()) != total for h in histograms):
        raise EntropyError("histograms do not match the block lengths")
    if (len(payload) - offset) % 4:
        raise EntropyError("the rANS words are not whole 32-bit words")
    return Framing(histograms, lengths, offset, expect)


def encode_blocks(blocks: list[list[np.ndarray]], n_streams: int) -> bytes:
    """Encode blocks of equally long unsigned streams (see `encode_prepared` for the layout)."""
    return encode_prepared([prepare_block(streams) for streams in blocks], n_streams)


def decode_blocks(payload: bytes, expect: Layout | None = None, framing: Framing | None = None,
                  ) -> Iterator[list[np.ndarray]]:
    """Yield each block's streams in order; raises EntropyError on a malformed payload, or, before decoding
    anything, on one that does not fit `expect` (`framing`: this payload's, already read for `expect`)."""
    if framing is None or framing.expect != expect:
        framing = read_framing(payload, expect)
    histograms, lengths = framing.histograms, framing.lengths
    total = sum(lengths.tolist())
    try:
        words = np.frombuffer(payload, dtype="<u4", offset=framing.offset).astype(np.uint32)
        models = [_model_from_counts(h) for h in histograms]
        singles = [int(np.flatnonzero(h)[0]) if total else 0 for h in histograms]
        coder = constriction.stream.stack.AnsCoder(words)
    except (ValueError, RuntimeError, AssertionError) as exc:
        raise EntropyError(f"corrupt entropy payload ({exc})") from None
    for length in lengths.tolist():
        yield _decode_block(coder, models, singles, length)
    if not coder.is_empty():
        raise EntropyError("trailing data in the entropy payload")


def _decode_block(coder: constriction.stream.stack.AnsCoder, models: list, singles: list[int],
                  length: int) -> list[np.ndarray]:
    try:
        symbol_streams = []
        for model, single in zip(models, singles, strict=True):
            if model is None:
                symbol_streams.append(np.full(length, single, dtype=np.uint8))
            elif length:
                symbol_streams.append(coder.decode(model, length).astype(np.uint8))
            else:
                symbol_streams.append(np.zeros(0, dtype=np.uint8))
        streams = []
        for symbols in symbol_streams:
            counts = extra_counts_of(symbols)
            sizes = _chunk_sizes(counts)
            chunks = coder.decode(_uniform_family, sizes) if len(sizes) else np.zeros(0, np.int32)
            if len(chunks) != len(sizes):
                raise EntropyError("the rANS words ran out")
            streams.append(join(symbols, _rebuild_extra(chunks, counts), counts))
        return streams
    except (ValueError, RuntimeError, AssertionError) as exc:
        if isinstance(exc, EntropyError):
            raise
        raise EntropyError(f"corrupt entropy payload ({exc})") from None


def encode(streams: list[np.ndarray]) -> bytes:
    """Encode equally long streams as one block."""
    return encode_blocks([streams], len(streams))


def decode(payload: bytes) -> list[np.ndarray]:
    """Inverse of `encode`."""
    blocks = list(decode_blocks(payload))
    if len(blocks) != 1:
        raise EntropyError(f"expected one block, found {len(blocks)}")
    return blocks[0]


def _chunk_sizes(counts: np.ndarray) -> np.ndarray:
    remaining = counts[counts > 0]
    sizes = []
    while len(remaining):
        take = np.minimum(remaining, CHUNK_BITS)
        sizes.append(np.left_shift(1, take).astype(np.int32))
        remaining = remaining - take
        remaining = remaining[remaining > 0]
    return np.concatenate(sizes) if sizes else np.zeros(0, np.int32)

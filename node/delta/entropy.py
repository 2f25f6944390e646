"""Entropy coding of log-bin symbol streams with rANS (constriction), near the order-0 entropy.

Invariants: `decode(encode(streams)) == streams` exactly. Each stream's symbol model is its own histogram,
stored in the payload (only nonzero bins), so the decoder rebuilds the identical quantized model; raw
extra bits go through the same coder as uniform symbols of at most 16 bits. The byte layout is pinned to
constriction 0.5.0's model quantisation (`perfect=False`).

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
_uniform_family = constriction.stream.model.Uniform()


class EntropyError(ValueError):
    """The payload is malformed."""


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


def _read_histogram(payload: bytes, offset: int) -> tuple[np.ndarray, int]:
    hist = np.zeros(ALPHABET, dtype=np.int64)
    count, offset = read_varint(payload, offset)
    symbol = -1
    for _ in range(count):
        gap, offset = read_varint(payload, offset)
        symbol += gap + 1
        if symbol >= ALPHABET:
            raise EntropyError("histogram symbol out of range")
        hist[symbol], offset = read_varint(payload, offset)
    return hist, offset


def encode_blocks(blocks: list[list[np.ndarray]], n_streams: int) -> bytes:
    """Encode blocks of equally long unsigned streams (see `encode_prepared` for the layout)."""
    return encode_prepared([prepare_block(streams) for streams in blocks], n_streams)


def decode_blocks(payload: bytes) -> Iterator[list[np.ndarray]]:
    """Yield each block's streams in order; raises EntropyError on a malformed payload."""
    try:
        n_streams, offset = read_varint(payload, 0)
        histograms = []
        for _ in range(n_streams):
            hist, offset = _read_histogram(payload, offset)
            histograms.append(hist)
        n_blocks, offset = read_varint(payload, offset)
        lengths_list = []
        for _ in range(n_blocks):
            length, offset = read_varint(payload, offset)
            lengths_list.append(length)
        lengths = np.array(lengths_list, dtype=np.int64)
        if (len(payload) - offset) % 4:
            raise EntropyError("the rANS words are not whole 32-bit words")
        words = np.frombuffer(payload, dtype="<u4", offset=offset).astype(np.uint32)
    except ValueError as exc:
        if isinstance(exc, EntropyError):
            raise
        raise EntropyError(f"truncated entropy payload ({exc})") from None
    total = int(lengths.sum())
    if any(int(h.sum()) != total for h in histograms):
        raise EntropyError("histograms do not match the block lengths")
    models = [_model_from_counts(h) for h in histograms]
    singles = [int(np.flatnonzero(h)[0]) if total else 0 for h in histograms]
    coder = constriction.stream.stack.AnsCoder(words)
    try:
        for length in lengths:
            symbol_streams = []
            for model, single in zip(models, singles, strict=True):
                if model is None:
                    symbol_streams.append(np.full(length, single, dtype=np.uint8))
                elif length:
                    symbol_streams.append(coder.decode(model, int(length)).astype(np.uint8))
                else:
                    symbol_streams.append(np.zeros(0, dtype=np.uint8))
            streams = []
            for symbols in symbol_streams:
                counts = extra_counts_of(symbols)
                sizes = _chunk_sizes(counts)
                chunks = coder.decode(_uniform_family, sizes) if len(sizes) else np.zeros(0, np.int32)
                streams.append(join(symbols, _rebuild_extra(chunks, counts), counts))
            yield streams
    except (ValueError, RuntimeError, AssertionError) as exc:
        raise EntropyError(f"corrupt entropy payload ({exc})") from None
    if not coder.is_empty():
        raise EntropyError("trailing data in the entropy payload")


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

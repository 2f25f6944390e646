"""Split unsigned integers into an entropy-coded symbol and raw low bits (a log-bin alphabet).

Invariant: `join(split(v)) == v` for every v < 2^64. Values below 16 are their own symbol (no extra bits);
a value of bit length L >= 5 becomes symbol 16 + 4(L-5) + (the two bits after its leading one), followed by
its L-3 lowest bits raw. 256 symbols cover 64-bit values, so a symbol fits one byte.
"""

from __future__ import annotations

import numpy as np

DIRECT = 16
SUB_BITS = 2
ALPHABET = DIRECT + (64 - 4) * (1 << SUB_BITS)  # 256


FLOAT_EXACT = 1 << 53


def bit_length(values: np.ndarray) -> np.ndarray:
    """Exact bit length of each unsigned value (0 for 0), as int64."""
    v = values.astype(np.uint64, copy=False)
    if v.size == 0 or int(v.max()) < FLOAT_EXACT:
        return np.frexp(v.astype(np.float64))[1].astype(np.int64)  # v = m * 2^e with m in [0.5, 1)
    v = v.copy()
    length = np.zeros(v.shape, dtype=np.int64)
    for step in (32, 16, 8, 4, 2, 1):
        big = v >= np.uint64(1 << step)
        v[big] >>= np.uint64(step)
        length[big] += step
    return length + (v > 0)


def split(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(symbols uint8, extra bits uint64, extra bit counts int64) for unsigned `values`."""
    v = values.astype(np.uint64, copy=False)
    length = bit_length(v)
    extra_count = np.maximum(length - (1 + SUB_BITS), 0)
    shift = extra_count.astype(np.uint64)
    top = ((v >> shift) & np.uint64((1 << SUB_BITS) - 1)).astype(np.int64)
    direct = v < DIRECT
    symbols = np.where(direct, v.astype(np.int64), DIRECT - 5 * (1 << SUB_BITS) + (length << SUB_BITS) + top)
    extra = v & ((np.uint64(1) << shift) - np.uint64(1))
    extra_count[direct] = 0
    extra[direct] = 0
    return symbols.astype(np.uint8), extra, extra_count


def extra_counts_of(symbols: np.ndarray) -> np.ndarray:
    s = symbols.astype(np.int64)
    return np.where(s < DIRECT, 0, (s - DIRECT) // (1 << SUB_BITS) + 5 - 1 - SUB_BITS)


def join(symbols: np.ndarray, extra: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
    """Inverse of `split` (`counts` = extra_counts_of(symbols), when the caller already has it)."""
    s = symbols.astype(np.int64)
    if counts is None:
        counts = extra_counts_of(symbols)
    head = ((1 << SUB_BITS) | ((s - DIRECT) & ((1 << SUB_BITS) - 1))).astype(np.uint64)
    joined = (head << counts.astype(np.uint64)) | extra.astype(np.uint64, copy=False)
    direct = s < DIRECT
    joined[direct] = s[direct].astype(np.uint64)
    return joined

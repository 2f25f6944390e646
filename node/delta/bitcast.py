"""Bit-pattern views of tensors and the exact integer arithmetic the delta codec works in.

Invariants: no float arithmetic touches a weight. A tensor of element size W bytes is viewed as W-byte
unsigned integers (zero-copy, writable). Floats are first mapped to an order-preserving integer
(`to_ordered`: +x keeps its pattern, a negative pattern 1|m maps to -m-1), so one ULP is one integer step
across zero too; the map is a bijection on all 2^(8W) patterns (NaN payloads, +-0, +-inf, subnormals).
Differences are taken modulo 2^(8W) and zigzagged, so `apply_difference(old, difference(old, new)) == new`
for every pair of patterns. A dtype outside DTYPE_CODES is refused by name (`dtype_code`), never looked up blindly.
"""

from __future__ import annotations

import numpy as np
import torch
from rollnet.node.errors import UnsupportedDelta

UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
TORCH_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# dtype codes in the byte format; never renumber.
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.bfloat16: 1, torch.float16: 2, torch.float32: 3, torch.float64: 4,
    torch.int8: 5, torch.uint8: 6, torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.bool: 10,
}
DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}
FLOAT_DTYPES = {torch.bfloat16, torch.float16, torch.float32, torch.float64}
SUPPORTED = ", ".join(str(dtype).removeprefix("torch.") for dtype in DTYPE_CODES)


def dtype_code(dtype: torch.dtype, name: str) -> int:
    """The byte-format code of `dtype`; UnsupportedDelta naming tensor `name` for a dtype the format lacks."""
    code = DTYPE_CODES.get(dtype)
    if code is None:
        raise UnsupportedDelta(f"tensor {name!r} has dtype {dtype}, which policy deltas cannot carry "
                               f"(supported: {SUPPORTED})")
    return code


def bits_of(tensor: torch.Tensor) -> np.ndarray:
    """A flat, writable, zero-copy unsigned-integer view of a contiguous tensor's bit patterns (writes through
    to the tensor, also to one that requires grad)."""
    if not tensor.is_contiguous():
        raise ValueError("delta codec needs contiguous tensors")
    if tensor.dtype not in DTYPE_CODES:
        raise ValueError(f"unsupported dtype {tensor.dtype}")
    width = tensor.element_size()
    flat = tensor.detach().reshape(-1)
    if tensor.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return flat.view(TORCH_SIGNED[width]).numpy().view(UNSIGNED[width])


def to_ordered(patterns: np.ndarray, is_float: bool) -> np.ndarray:
    """Map bit patterns to order-preserving unsigned integers of the same width (mod 2^W arithmetic)."""
    if not is_float:
        return patterns
    width = patterns.dtype.itemsize * 8
    sign = patterns >> np.array(width - 1, dtype=patterns.dtype)
    # negative 1|m -> -m-1 == ~m (mod 2^W), i.e. flip every bit except the sign: patterns ^ (2^(W-1) - 1)
    # and then the result is read as a signed integer; positives stay as they are.
    magnitude_mask = np.array((1 << (width - 1)) - 1, dtype=patterns.dtype)
    return np.where(sign.astype(bool), patterns ^ magnitude_mask, patterns)


def from_ordered(ordered: np.ndarray, is_float: bool) -> np.ndarray:
    """Inverse of `to_ordered` (the map is an involution on patterns)."""
    return to_ordered(ordered, is_float)


def difference(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """zigzag((new - old) mod 2^W as a signed W-bit integer), as unsigned W-bit integers."""
    width = old.dtype.itemsize
    diff = (new - old).view(SIGNED[width])  # wraps modulo 2^W
    shift = np.array(width * 8 - 1, dtype=SIGNED[width])
    return ((diff << np.array(1, dtype=SIGNED[width])) ^ (diff >> shift)).view(UNSIGNED[width])


def apply_difference(old: np.ndarray, zigzag: np.ndarray) -> np.ndarray:
    """`new` such that difference(old, new) == zigzag."""
    one = np.array(1, dtype=zigzag.dtype)
    signed = (zigzag >> one).view(SIGNED[zigzag.dtype.itemsize]) ^ -(zigzag & one).view(SIGNED[zigzag.dtype.itemsize])
    return old + signed.view(old.dtype)

"""Versioned checkpoints: a policy version is a set of named tensors, identified by its content root.

Invariants: a tensor's hash is blake3 over ("rollnet-tensor-v1", name, dtype code, shape, raw bytes), so it
pins name, type, shape and every bit; a version's content root is the Merkle root over the tensor hashes
sorted by name. A tensor the hash cannot pin (a dtype outside the format, a name over 65535 bytes, more than
255 dimensions) is refused with UnsupportedDelta. On disk a version is one safetensors file; `LazyCheckpoint`
reads one tensor at a time.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

import blake3
import torch
from rollnet.node.delta.bitcast import bits_of, dtype_code
from rollnet.node.errors import UnsupportedDelta
from rollnet.node.merkle import merkle_root
from safetensors import safe_open
from safetensors.torch import save_file

TENSOR_DOMAIN = b"rollnet-tensor-v1"
MAX_NAME_BYTES = 0xFFFF
MAX_NDIM = 0xFF


def tensor_header(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> bytes:
    encoded = name.encode()
    if len(encoded) > MAX_NAME_BYTES or len(shape) > MAX_NDIM:
        shown = name if len(name) <= 40 else name[:40] + "..."
        raise UnsupportedDelta(f"tensor {shown!r} has a name of {len(encoded)} bytes and {len(shape)} dimensions; "
                               f"at most {MAX_NAME_BYTES} and {MAX_NDIM} can be hashed")
    return (
        struct.pack("<H", len(encoded)) + encoded
        + struct.pack("<BB", dtype_code(dtype, name), len(shape))
        + b"".join(struct.pack("<Q", d) for d in shape)
    )


def tensor_hash(name: str, tensor: torch.Tensor) -> bytes:
    hasher = blake3.blake3(TENSOR_DOMAIN + tensor_header(name, tensor.dtype, tuple(tensor.shape)),
                           max_threads=blake3.blake3.AUTO)
    hasher.update(bits_of(tensor.contiguous()).view("u1"))
    return hasher.digest()


def root_of_hashes(hashes: Mapping[str, bytes]) -> bytes:
    return merkle_root([hashes[name] for name in sorted(hashes)])


def content_root(tensors: Mapping[str, torch.Tensor]) -> bytes:
    return root_of_hashes({name: tensor_hash(name, tensor) for name, tensor in tensors.items()})


def save_checkpoint(path: Path, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write atomically. Tied tensors (one storage, several names) are written once per name, as copies:
    safetensors refuses shared storage, and loading gives every name its own tensor."""
    seen: set[int] = set()
    plain: dict[str, torch.Tensor] = {}
    for name, tensor in sorted(tensors.items()):
        pointer = tensor.untyped_storage().data_ptr()
        plain[name] = tensor.detach().contiguous().clone() if pointer in seen else tensor.detach().contiguous()
        seen.add(pointer)
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file(plain, str(tmp), metadata=metadata)
    tmp.replace(path)


def load_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    return dict(LazyCheckpoint(path).items())


class LazyCheckpoint(Mapping[str, torch.Tensor]):
    """A safetensors file as a mapping that loads each tensor only when asked (peak: one tensor)."""

    def __init__(self, path: Path):
        self.path = path
        with safe_open(str(path), framework="pt") as handle:
            self._names = sorted(handle.keys())

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        with safe_open(str(self.path), framework="pt") as handle:
            return handle.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

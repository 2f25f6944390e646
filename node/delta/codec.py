"""Encode a policy version as a delta from its predecessor, and apply a delta in place, exactly.

Invariants:
- `apply` returns only verified weights: it checks the trainer's signature, every section hash, that the
  delta's base root is the holder's root and its base version the holder's version, and, after writing,
  every tensor's hash against the signed target root. On any failure it restores the base bit for bit
  (undo records) and raises a DeltaError; it never leaves wrong weights behind.
- Both directions stream tensor by tensor: `encode_stream` yields each section's record as soon as it is
  encoded (the trailer, which needs every section hash, comes last), and `apply` holds the base plus
  one tensor's changes, so peak memory stays near one model copy.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Iterator, Mapping, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from rollnet.node.delta.checkpoint import content_root, root_of_hashes, tensor_hash
from rollnet.node.delta.container import (
    MAGIC,
    TAG_SECTION,
    TAG_TRAILER,
    ContainerError,
    Delta,
    Trailer,
    record,
    section_hash,
)
from rollnet.node.delta.section import (
    BLOCK_ELEMENTS,
    Kind,
    SectionError,
    Undo,
    apply_section,
    encode_section,
    full_tensor,
    restore,
    split_section,
)
from rollnet.node.errors import BadSignature, CorruptDelta, WrongBase


def _encode_sections(
    base: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    *,
    base_version: int,
    version: int,
    signer: LocalAccount,
    base_root: bytes | None = None,
    block_elements: int = BLOCK_ELEMENTS,
) -> Generator[bytes, None, Trailer]:
    """Yield each tensor's section in name order; return the signed trailer."""
    if version <= base_version:
        raise ValueError(f"version {version} must be newer than base version {base_version}")
    if base_root is None:
        base_root = content_root(base)
    hashes: list[bytes] = []
    target_hashes: dict[str, bytes] = {}
    for name in sorted(set(base) | set(target)):
        section = encode_section(name, base.get(name), target.get(name), block_elements)
        header, _ = split_section(section)
        if header.kind is not Kind.REMOVED:
            target_hashes[name] = header.target_hash
        hashes.append(section_hash(section))
        yield section
    trailer = Trailer(base_version, version, base_root, root_of_hashes(target_hashes), hashes)
    trailer.sign(signer)
    return trailer


def _drain(sections: Generator[bytes, None, Trailer]) -> Iterator[tuple[bytes | None, Trailer | None]]:
    while True:
        try:
            yield next(sections), None
        except StopIteration as done:
            yield None, done.value
            return


def encode_stream(base: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor],
                  **kwargs: Any) -> Generator[bytes, None, Trailer]:
    """Yield the delta's bytes record by record: magic, each section as soon as it is encoded (tensors in
    name order), then the signed trailer. Arguments as `encode`; the return value is the trailer."""
    yield MAGIC
    for section, trailer in _drain(_encode_sections(base, target, **kwargs)):
        if trailer is None:
            yield record(TAG_SECTION, section)
    yield record(TAG_TRAILER, trailer.pack())
    return trailer


def encode(base: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor], *, base_version: int,
           version: int, signer: LocalAccount, base_root: bytes | None = None,
           block_elements: int = BLOCK_ELEMENTS) -> Delta:
    """The delta turning `base` (version `base_version`, root `base_root`, computed if None) into `target`
    (version `version`), signed by the trainer's key."""
    sections: list[bytes] = []
    for section, trailer in _drain(_encode_sections(base, target, base_version=base_version, version=version,
                                                    signer=signer, base_root=base_root,
                                                    block_elements=block_elements)):
        if trailer is None:
            sections.append(section)
    return Delta(sections, trailer)


@dataclass(frozen=True)
class Applied:
    version: int
    root: bytes
    changed_elements: int


@functools.cache
def _hash_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="delta-hash")


def parse(data: bytes | Delta) -> Delta:
    if isinstance(data, Delta):
        return data
    try:
        return Delta.from_bytes(data)
    except ContainerError as exc:
        raise CorruptDelta(f"corrupt delta: {exc}") from None


def verify_header(delta: Delta, *, trainer: str, base_version: int, base_root: bytes) -> None:
    """Checks that need no weights: signer, base version and base root."""
    try:
        signer = delta.trailer.signer()
    except ContainerError as exc:
        raise BadSignature(f"delta {delta.base_version}->{delta.version}: {exc}") from None
    if signer != to_checksum_address(trainer):
        raise BadSignature(
            f"delta {delta.base_version}->{delta.version} is signed by {signer}, not the trainer {trainer}"
        )
    if delta.base_version != base_version or delta.trailer.base_root != base_root:
        raise WrongBase(
            f"delta applies to version {delta.base_version} (root {delta.trailer.base_root.hex()[:16]}...), "
            f"but the weights held are version {base_version} (root {base_root.hex()[:16]}...)"
        )


def apply(
    base: MutableMapping[str, torch.Tensor],
    data: bytes | Delta,
    *,
    trainer: str,
    base_version: int,
    base_root: bytes,
) -> Applied:
    """Turn `base` (version `base_version`, content root `base_root`) into the delta's target, in place."""
    delta = parse(data)
    verify_header(delta, trainer=trainer, base_version=base_version, base_root=base_root)
    try:
        parsed = [split_section(section) for section in delta.sections]
    except SectionError as exc:
        raise CorruptDelta(f"corrupt delta: {exc}") from None
    target_hashes = {h.name: h.target_hash for h, _ in parsed if h.kind is not Kind.REMOVED}
    if root_of_hashes(target_hashes) != delta.trailer.target_root:
        raise CorruptDelta("the sections' tensor hashes do not add up to the signed target root")
    expected_base = {h.name for h, _ in parsed if h.kind in (Kind.SPARSE, Kind.REMOVED)}
    if expected_base - set(base):
        missing = sorted(expected_base - set(base))[:3]
        raise WrongBase(f"the weights held lack tensors the delta changes: {missing}")
    extra = set(base) - expected_base - {h.name for h, _ in parsed}
    if extra:
        raise WrongBase(f"the weights held have tensors the delta does not know: {sorted(extra)[:3]}")

    undos: list[tuple[torch.Tensor, Undo]] = []
    replaced: dict[str, torch.Tensor | None] = {}
    applied_storage: set[tuple] = set()
    # Hashing tensor i (blake3, GIL released) overlaps with decoding tensor i+1.
    pending_hashes: list[tuple[str, bytes, Future[bytes]]] = []
    changed = 0
    try:
        for header, payload in parsed:
            if header.kind is Kind.SPARSE:
                tensor = base[header.name]
                key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)
                if key not in applied_storage:  # a tied tensor changes once, with its first name
                    undos.append((tensor, apply_section(header, payload, tensor)))
                    changed += header.changed
                    applied_storage.add(key)
                pending_hashes.append((header.name, header.target_hash,
                                       _hash_pool().submit(tensor_hash, header.name, tensor)))
            elif header.kind is Kind.FULL:
                replaced[header.name] = base.get(header.name)
                tensor = full_tensor(header, payload)
                if tensor_hash(header.name, tensor) != header.target_hash:
                    raise CorruptDelta(f"tensor {header.name!r} does not match its hash")
                base[header.name] = tensor
            else:
                replaced[header.name] = base.pop(header.name)
        for name, expected, future in pending_hashes:
            if future.result() != expected:
                raise WrongBase(
                    f"tensor {name!r} does not match the signed target after applying: "
                    "the weights held are not the delta's base"
                )
    except (SectionError, WrongBase, CorruptDelta) as exc:
        for _, _, future in pending_hashes:
            future.cancel()
        wait([future for _, _, future in pending_hashes])
        for tensor, undo in reversed(undos):
            restore(tensor, undo)
        for name, old in replaced.items():
            if old is None:
                base.pop(name, None)
            else:
                base[name] = old
        if isinstance(exc, SectionError):
            raise CorruptDelta(f"corrupt delta: {exc}") from None
        raise
    return Applied(delta.version, delta.trailer.target_root, changed)

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

from collections.abc import Generator, Mapping, MutableMapping
from dataclasses import dataclass

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
    read_records,
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


def encode_stream(
    base: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    *,
    base_version: int,
    version: int,
    signer: LocalAccount,
    base_root: bytes | None = None,
    block_elements: int = BLOCK_ELEMENTS,
) -> Generator[bytes, None, Trailer]:
    """Yield the delta's bytes record by record (magic, sections in name order, signed trailer).

    The generator's return value is the trailer (its target root is the target's content root).
    """
    if version <= base_version:
        raise ValueError(f"version {version} must be newer than base version {base_version}")
    if base_root is None:
        base_root = content_root(base)
    hashes: list[bytes] = []
    target_hashes: dict[str, bytes] = {}
    yield MAGIC
    for name in sorted(set(base) | set(target)):
        section = encode_section(name, base.get(name), target.get(name), block_elements)
        header, _ = split_section(section)
        if header.kind is not Kind.REMOVED:
            target_hashes[name] = header.target_hash
        hashes.append(section_hash(section))
        yield record(TAG_SECTION, section)
    trailer = Trailer(base_version, version, base_root, root_of_hashes(target_hashes), hashes)
    trailer.sign(signer)
    yield record(TAG_TRAILER, trailer.pack())
    return trailer


def encode(base: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor], **kwargs: object) -> Delta:
    """The whole delta in memory (see `encode_stream` for the arguments)."""
    return read_records(encode_stream(base, target, **kwargs))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Applied:
    version: int
    root: bytes
    changed_elements: int


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
        raise BadSignature(f"delta {delta.base_version}->{delta.version} is signed by {signer}, not the trainer {trainer}")
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
    applied_storage: dict[tuple, str] = {}
    changed = 0
    try:
        for header, payload in parsed:
            if header.kind is Kind.SPARSE:
                tensor = base[header.name]
                key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)
                if key not in applied_storage:  # a tied tensor changes once, with its first name
                    undos.append((tensor, apply_section(header, payload, tensor)))
                    changed += header.changed
                    applied_storage[key] = header.name
                if tensor_hash(header.name, tensor) != header.target_hash:
                    raise WrongBase(
                        f"tensor {header.name!r} does not match the signed target after applying: "
                        "the weights held are not the delta's base"
                    )
            elif header.kind is Kind.FULL:
                replaced[header.name] = base.get(header.name)
                tensor = full_tensor(header, payload)
                if tensor_hash(header.name, tensor) != header.target_hash:
                    raise CorruptDelta(f"tensor {header.name!r} does not match its hash")
                base[header.name] = tensor
            else:
                replaced[header.name] = base.pop(header.name)
    except (SectionError, WrongBase, CorruptDelta) as exc:
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

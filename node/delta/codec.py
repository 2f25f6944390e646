"""Encode a policy version as a delta from its predecessor, and apply a delta in place, exactly.

Invariants:
- `apply` returns only verified weights: it checks the trainer's signature, every section hash, that the
  delta's base root is the holder's root and its base version the holder's version, and, after writing,
  every tensor's hash against the signed target root. A refused delta leaves the weights exactly as they
  were, whatever refuses it: everything that needs no decoding (section order, names, dtypes, shapes and
  layouts of the tensors held, payload layouts, the size of new tensors, which are decoded and hashed here
  too) is checked before the first write; what only decoding or hashing reveals is undone bit for bit
  (undo records) before the DeltaError is raised, as is any other exception (a mapping that refuses to
  drop a tensor). The mapping itself (new, replaced and removed names) changes only after every check.
- No claim in a delta sizes memory by itself: new tensors may add at most max(ADDED_BYTES_FLOOR, the bytes
  held) in all, each allocated at its declared size before decompressing into it, and sparse payloads
  must fit their tensor before they are decoded (see section.py).
- Contiguous tensors are written in place; a strided one (a transposed or sliced view) is written through a
  contiguous copy that is copied back only when the whole delta checks out; one whose elements overlap in
  memory is refused (UnsupportedDelta).
- Both directions stream tensor by tensor: `encode_stream` yields each section's record as soon as it is
  encoded (the trailer, which needs every section hash, comes last), and `apply` holds the base plus
  one tensor's changes, so peak memory stays near one model copy.
"""

from __future__ import annotations

import functools
import itertools
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
from rollnet.node.delta.entropy import Framing
from rollnet.node.delta.section import (
    BLOCK_ELEMENTS,
    Kind,
    SectionError,
    SectionHeader,
    Undo,
    apply_section,
    check_sparse,
    encode_section,
    full_tensor,
    restore,
    split_section,
)
from rollnet.node.errors import BadSignature, CorruptDelta, UnsupportedDelta, WrongBase

ADDED_BYTES_FLOOR = 64 << 20  # new tensors a delta may bring in all, for weights smaller than this


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
    if delta.version <= delta.base_version:
        raise CorruptDelta(f"corrupt delta: version {delta.version} is not newer than its base {delta.base_version}")
    if delta.base_version != base_version or delta.trailer.base_root != base_root:
        raise WrongBase(
            f"delta applies to version {delta.base_version} (root {delta.trailer.base_root.hex()[:16]}...), "
            f"but the weights held are version {base_version} (root {base_root.hex()[:16]}...)"
        )


@dataclass
class _Write:
    """One sparse section's write: into `tensor` itself when it is contiguous, else into `work`, a contiguous
    copy that is copied back into `tensor` only after every check (`copied_back`)."""

    header: SectionHeader
    payload: bytes
    tensor: torch.Tensor
    work: torch.Tensor
    first: bool  # False: a tied name; the write under its storage's first name changes it
    framing: Framing | None = None
    undo: Undo | None = None
    copied_back: bool = False


@dataclass
class _Plan:
    """What applying a delta does, known before the first write: sparse writes, new tensors, removed names."""

    writes: list[_Write]
    full: dict[str, torch.Tensor]
    removed: list[str]


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
    plan = _plan(base, delta)
    replaced: list[tuple[str, torch.Tensor | None]] = []
    # Hashing tensor i (blake3, GIL released) overlaps with decoding tensor i+1.
    pending: list[tuple[str, bytes, Future[bytes]]] = []
    try:
        changed = _write(plan, pending)
        _check_hashes(pending)
        _commit(base, plan, replaced)
    except BaseException as exc:
        _cancel(pending)
        _roll_back(base, plan, replaced)
        if isinstance(exc, SectionError):
            raise CorruptDelta(f"corrupt delta: {exc}") from None
        raise
    return Applied(delta.version, delta.trailer.target_root, changed)


def _plan(base: Mapping[str, torch.Tensor], delta: Delta) -> _Plan:
    """Every check that needs no write; new tensors are decoded and hashed here, into memory of their own."""
    parsed = _sections(delta)
    _check_names(base, parsed)
    held = sum(tensor.numel() * tensor.element_size() for tensor in base.values())
    limit, added = max(ADDED_BYTES_FLOOR, held), 0
    plan = _Plan([], {}, [])
    by_storage: dict[tuple, _Write] = {}
    for header, payload in parsed:
        if header.kind is Kind.SPARSE:
            plan.writes.append(_plan_write(header, payload, base[header.name], by_storage))
        elif header.kind is Kind.FULL:
            if added + header.declared_bytes > limit:
                raise UnsupportedDelta(
                    f"section {header.name!r} declares a {header.dtype} tensor of shape {list(header.shape)} "
                    f"({header.declared_bytes} bytes): with the {added} bytes of new tensors before it, more than "
                    f"the {limit} bytes a delta may add to {held} bytes of weights"
                )
            plan.full[header.name] = _full_tensor(header, payload, limit - added)
            added += header.declared_bytes
        elif payload:
            raise CorruptDelta(f"corrupt delta: section {header.name!r} removes its tensor but carries a payload")
        else:
            plan.removed.append(header.name)
    return plan


def _sections(delta: Delta) -> list[tuple[SectionHeader, bytes]]:
    """Headers and payloads, one section per name in name order, adding up to the signed target root."""
    parsed = []
    for index, section in enumerate(delta.sections):
        try:
            parsed.append(split_section(section))
        except SectionError as exc:
            raise CorruptDelta(f"corrupt delta: {exc}, in section {index} of {len(delta.sections)}") from None
    names = [header.name for header, _ in parsed]
    for before, after in itertools.pairwise(names):
        if before == after:
            raise CorruptDelta(f"corrupt delta: two sections for tensor {after!r}")
        if before > after:
            raise CorruptDelta(f"corrupt delta: sections are not in name order ({before!r} before {after!r})")
    target_hashes = {h.name: h.target_hash for h, _ in parsed if h.kind is not Kind.REMOVED}
    if root_of_hashes(target_hashes) != delta.trailer.target_root:
        raise CorruptDelta("the sections' tensor hashes do not add up to the signed target root")
    return parsed


def _check_names(base: Mapping[str, torch.Tensor], parsed: list[tuple[SectionHeader, bytes]]) -> None:
    expected_base = {h.name for h, _ in parsed if h.kind in (Kind.SPARSE, Kind.REMOVED)}
    if expected_base - set(base):
        missing = sorted(expected_base - set(base))[:3]
        raise WrongBase(f"the weights held lack tensors the delta changes: {missing}")
    extra = set(base) - expected_base - {h.name for h, _ in parsed}
    if extra:
        raise WrongBase(f"the weights held have tensors the delta does not know: {sorted(extra)[:3]}")


def _plan_write(header: SectionHeader, payload: bytes, tensor: torch.Tensor, by_storage: dict[tuple, _Write],
                ) -> _Write:
    _check_writable(header.name, tensor)
    if tensor.dtype != header.dtype or tuple(tensor.shape) != header.shape:
        raise WrongBase(
            f"tensor {header.name!r} held is {tensor.dtype} {list(tensor.shape)}, the delta expects "
            f"{header.dtype} {list(header.shape)}: the weights held are not the delta's base"
        )
    try:
        framing = check_sparse(header, payload)
    except SectionError as exc:
        raise CorruptDelta(f"corrupt delta: {exc}") from None
    key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
           tensor.dtype)
    tied = by_storage.get(key)
    if tied is not None:  # a tied tensor changes once, with its first name
        return _Write(header, payload, tensor, tied.work, first=False)
    in_place = tensor.is_contiguous() or header.changed == 0
    write = _Write(header, payload, tensor, tensor if in_place else tensor.detach().contiguous(), True, framing)
    by_storage[key] = write
    return write


def _check_writable(name: str, tensor: torch.Tensor) -> None:
    """Refuse, before any write, a tensor the codec cannot change element by element."""
    if tensor.layout is not torch.strided or tensor.device.type != "cpu":
        raise UnsupportedDelta(f"tensor {name!r} is a {tensor.layout} tensor on {tensor.device}; deltas apply to "
                               "dense CPU tensors")
    if not tensor.is_contiguous() and not _distinct_elements(tensor):
        raise UnsupportedDelta(
            f"tensor {name!r} has elements that overlap in memory (shape {list(tensor.shape)}, strides "
            f"{list(tensor.stride())}), so it cannot take a delta: give it storage of its own (tensor.clone())"
        )


def _distinct_elements(tensor: torch.Tensor) -> bool:
    """True when no two elements share memory (sufficient: the dimensions, by stride, nest inside each other,
    as in any transpose, permutation or slice of a contiguous tensor)."""
    extent = 1
    for stride, size in sorted((st, si) for si, st in zip(tensor.shape, tensor.stride(), strict=True) if si > 1):
        if stride < extent:
            return False
        extent = stride * size
    return True


def _full_tensor(header: SectionHeader, payload: bytes, max_bytes: int) -> torch.Tensor:
    try:
        tensor = full_tensor(header, payload, max_bytes)
    except SectionError as exc:
        raise CorruptDelta(f"corrupt delta: {exc}") from None
    if tensor_hash(header.name, tensor) != header.target_hash:
        raise CorruptDelta(f"tensor {header.name!r} does not match its hash")
    return tensor


def _write(plan: _Plan, pending: list[tuple[str, bytes, Future[bytes]]]) -> int:
    """Apply the sparse sections (each to its contiguous tensor or work copy); returns the changed elements."""
    changed = 0
    for write in plan.writes:
        if write.first:
            write.undo = apply_section(write.header, write.payload, write.work, write.framing)
            changed += write.header.changed
        pending.append((write.header.name, write.header.target_hash,
                        _hash_pool().submit(tensor_hash, write.header.name, write.work)))
    return changed


def _check_hashes(pending: list[tuple[str, bytes, Future[bytes]]]) -> None:
    for name, expected, future in pending:
        if future.result() != expected:
            raise WrongBase(
                f"tensor {name!r} does not match the signed target after applying: "
                "the weights held are not the delta's base"
            )


def _commit(base: MutableMapping[str, torch.Tensor], plan: _Plan,
            replaced: list[tuple[str, torch.Tensor | None]]) -> None:
    """The changes only a checked delta makes: names removed and added, strided tensors copied back."""
    for name in plan.removed:
        old = base[name]
        del base[name]
        replaced.append((name, old))
    for name, tensor in plan.full.items():
        old = base.get(name)
        base[name] = tensor
        replaced.append((name, old))
    copied = False
    for write in plan.writes:
        if write.first and write.work is not write.tensor:
            write.tensor.detach().copy_(write.work)
            write.copied_back = copied = True
    if copied:
        _check_copied_back(plan)


def _check_copied_back(plan: _Plan) -> None:
    """A strided view may share storage with other names: every tensor on a storage a copy reached is hashed
    again, so two sections that disagree about shared memory cannot leave unverified weights."""
    reached = {write.tensor.untyped_storage().data_ptr() for write in plan.writes if write.copied_back}
    for write in plan.writes:
        if write.tensor.untyped_storage().data_ptr() in reached:
            if tensor_hash(write.header.name, write.tensor) != write.header.target_hash:
                raise WrongBase(f"tensor {write.header.name!r} shares memory with another tensor the delta "
                                "changes differently")


def _cancel(pending: list[tuple[str, bytes, Future[bytes]]]) -> None:
    for _, _, future in pending:
        future.cancel()
    wait([future for _, _, future in pending])


def _roll_back(base: MutableMapping[str, torch.Tensor], plan: _Plan,
               replaced: list[tuple[str, torch.Tensor | None]]) -> None:
    """Undo, newest first, everything `_write` and `_commit` did."""
    for name, old in reversed(replaced):
        if old is not None:
            base[name] = old
        elif name in base:
            del base[name]
    for write in reversed(plan.writes):
        if write.undo is not None:
            restore(write.work, write.undo)
        if write.copied_back:
            write.tensor.detach().copy_(write.work)

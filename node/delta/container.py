"""The delta file: a magic, one record per tensor section, then a signed trailer.

Byte format (little-endian):
  b"RNDELTA1"
  record*:  u8 tag | varint length | bytes     tag 1 = section (see section.py), tag 2 = trailer (last)
  trailer:  u64 base_version | u64 version | 32 base_root | 32 target_root | u32 n_sections
            | n_sections x 32-byte blake3 hash of each section's bytes, in record order
            | 65-byte Ethereum signature (r, s, v) of the digest
  digest = blake3(b"rollnet-delta-v1" | trailer without its signature), signed as an EIP-191 message.

Invariants: a Delta that parses has a trailer whose section count and hashes match its records; the
signer is recovered from the signature, never taken from the file; records stream: a writer can emit
each section as soon as it is encoded and the trailer last, and a reader can hash sections as they arrive.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import blake3
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from rollnet.node.varint import read_varint, write_varint

MAGIC = b"RNDELTA1"
TAG_SECTION, TAG_TRAILER = 1, 2
DIGEST_DOMAIN = b"rollnet-delta-v1"
SIGNATURE_BYTES = 65
MAX_RECORD = 1 << 40


class ContainerError(ValueError):
    """The bytes are not a well-formed delta."""


def section_hash(section: bytes) -> bytes:
    return blake3.blake3(section, max_threads=blake3.blake3.AUTO).digest()


def record(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + write_varint(len(body)) + body


@dataclass
class Trailer:
    base_version: int
    version: int
    base_root: bytes
    target_root: bytes
    section_hashes: list[bytes]
    signature: bytes = b""

    def unsigned_bytes(self) -> bytes:
        return (
            struct.pack("<QQ", self.base_version, self.version) + self.base_root + self.target_root
            + struct.pack("<I", len(self.section_hashes)) + b"".join(self.section_hashes)
        )

    def digest(self) -> bytes:
        return blake3.blake3(DIGEST_DOMAIN + self.unsigned_bytes()).digest()

    def sign(self, signer: LocalAccount) -> None:
        self.signature = bytes(signer.sign_message(encode_defunct(primitive=self.digest())).signature)

    def signer(self) -> str:
        """The address that signed this trailer (raises ContainerError if the signature is malformed)."""
        try:
            return Account.recover_message(encode_defunct(primitive=self.digest()), signature=self.signature)
        except Exception as exc:  # noqa: BLE001 - eth_keys raises several types for junk signatures
            raise ContainerError(f"malformed signature ({type(exc).__name__})") from None

    def pack(self) -> bytes:
        return self.unsigned_bytes() + self.signature

    @classmethod
    def unpack(cls, body: bytes) -> Trailer:
        try:
            base_version, version = struct.unpack_from("<QQ", body, 0)
            base_root, target_root = body[16:48], body[48:80]
            (count,) = struct.unpack_from("<I", body, 80)
        except struct.error:
            raise ContainerError("truncated trailer") from None
        end = 84 + 32 * count
        if len(body) != end + SIGNATURE_BYTES:
            raise ContainerError("trailer length does not match its section count")
        hashes = [body[84 + 32 * i:116 + 32 * i] for i in range(count)]
        return cls(base_version, version, base_root, target_root, hashes, body[end:])


@dataclass
class Delta:
    """A parsed delta: its sections (bytes, in order) and its trailer."""

    sections: list[bytes]
    trailer: Trailer
    size: int = field(default=0)

    @property
    def base_version(self) -> int:
        return self.trailer.base_version

    @property
    def version(self) -> int:
        return self.trailer.version

    def to_bytes(self) -> bytes:
        return b"".join(iter_records(self.sections, self.trailer))

    @classmethod
    def from_bytes(cls, data: bytes) -> Delta:
        return read_records([data])


def iter_records(sections: Iterable[bytes], trailer: Trailer) -> Iterator[bytes]:
    yield MAGIC
    for section in sections:
        yield record(TAG_SECTION, section)
    yield record(TAG_TRAILER, trailer.pack())


def read_records(chunks: Iterable[bytes]) -> Delta:
    """Parse a delta from a stream of byte chunks (e.g. network reads); checks every section hash."""
    buffer = bytearray()
    sections: list[bytes] = []
    trailer: Trailer | None = None
    size = 0
    started = False
    for chunk in chunks:
        buffer += chunk
        size += len(chunk)
        if not started:
            if len(buffer) < len(MAGIC):
                continue
            if bytes(buffer[:len(MAGIC)]) != MAGIC:
                raise ContainerError("not a rollnet delta (bad magic)")
            del buffer[:len(MAGIC)]
            started = True
        while buffer:
            if trailer is not None:
                raise ContainerError("data after the trailer")
            tag = buffer[0]
            if tag not in (TAG_SECTION, TAG_TRAILER):
                raise ContainerError(f"bad record tag {tag}")
            try:
                length, offset = read_varint(buffer, 1)
            except ValueError as exc:
                if "truncated" in str(exc):
                    break
                raise ContainerError(f"bad record length ({exc})") from None
            if length > MAX_RECORD:
                raise ContainerError(f"record of {length} bytes is too large")
            if len(buffer) < offset + length:
                break
            body = bytes(buffer[offset:offset + length])
            del buffer[:offset + length]
            if tag == TAG_SECTION:
                sections.append(body)
            else:
                trailer = Trailer.unpack(body)
    if not started:
        raise ContainerError("not a rollnet delta (too short)")
    if trailer is None or buffer:
        raise ContainerError("truncated delta (no trailer)" if trailer is None else "data after the trailer")
    if len(trailer.section_hashes) != len(sections):
        raise ContainerError(f"trailer lists {len(trailer.section_hashes)} sections, the file has {len(sections)}")
    for index, (section, expected) in enumerate(zip(sections, trailer.section_hashes, strict=True)):
        if section_hash(section) != expected:
            raise ContainerError(f"section {index} does not match its hash (corrupt or tampered)")
    return Delta(sections, trailer, size)

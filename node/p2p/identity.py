"""A node's libp2p identity: an ed25519 key persisted in the data directory, and its peer ID.

Invariants: the key file holds the libp2p protobuf-marshalled private key (KeyType Ed25519, 64 bytes of
seed then public key) with mode 0600, so a libp2p host loads the same identity; the peer ID is the
identity multihash of the marshalled public key (what libp2p prints as "12D3KooW...").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from rollnet.node.errors import KeystoreError

IDENTITY_FILE = "p2p-identity.key"
KEY_TYPE_ED25519 = 1
MULTIHASH_IDENTITY = 0x00
BASE58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def b58encode(data: bytes) -> str:
    number = int.from_bytes(data, "big")
    out = ""
    while number:
        number, rem = divmod(number, 58)
        out = BASE58_ALPHABET[rem] + out
    leading = len(data) - len(data.lstrip(b"\0"))
    return "1" * leading + out


def b58decode(text: str) -> bytes:
    number = 0
    for char in text:
        index = BASE58_ALPHABET.find(char)
        if index < 0:
            raise ValueError(f"invalid base58 character {char!r}")
        number = number * 58 + index
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    leading = len(text) - len(text.lstrip("1"))
    return b"\0" * leading + body


def _marshal(key_type: int, data: bytes) -> bytes:
    """libp2p's protobuf {1: KeyType (varint), 2: Data (bytes)}, for data shorter than 128 bytes."""
    return bytes([0x08, key_type, 0x12, len(data)]) + data


@dataclass(frozen=True)
class PeerIdentity:
    private_key: Ed25519PrivateKey

    @property
    def public_bytes(self) -> bytes:
        return self.private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def peer_id_bytes(self) -> bytes:
        public = _marshal(KEY_TYPE_ED25519, self.public_bytes)
        return bytes([MULTIHASH_IDENTITY, len(public)]) + public

    @property
    def peer_id(self) -> str:
        return b58encode(self.peer_id_bytes)

    def marshal_private(self) -> bytes:
        seed = self.private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return _marshal(KEY_TYPE_ED25519, seed + self.public_bytes)


def load_or_create_identity(data_dir: Path) -> PeerIdentity:
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = data_dir / IDENTITY_FILE
    if path.exists():
        raw = path.read_bytes()
        if len(raw) != 68 or raw[:4] != bytes([0x08, KEY_TYPE_ED25519, 0x12, 64]):
            raise KeystoreError(f"{path} is not an ed25519 libp2p key; move it away to make a new identity")
        return PeerIdentity(Ed25519PrivateKey.from_private_bytes(raw[4:36]))
    identity = PeerIdentity(Ed25519PrivateKey.generate())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(identity.marshal_private())
    return identity

"""A node's libp2p identity: a secp256k1 key persisted in the data directory, its peer ID, and its proof
that it binds itself to an Ethereum address.

Invariants: the key file holds the libp2p protobuf-marshalled private key (KeyType Secp256k1, the 32-byte
secret) with mode 0600, so a libp2p host loads the same identity; the peer ID is the identity multihash of
the marshalled compressed public key (what libp2p prints as "16Uiu2..."). The key is secp256k1, not
ed25519, so that `NodeRegistry.join` can verify on chain (with ecrecover) that the holder of this key
signed the binding of its peer ID to the registering address: `sign_binding` is that signature, an
EIP-191 personal-message signature of the registry's `peerBindingHash(address)`, made with this key.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_keys import keys as eth_keys
from rollnet.node.errors import KeystoreError

IDENTITY_FILE = "p2p-identity.key"
KEY_TYPE_SECP256K1 = 2
KEY_TYPE_ED25519 = 1
MULTIHASH_IDENTITY = 0x00
BASE58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


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
    secret: bytes  # the 32-byte secp256k1 private key

    def __post_init__(self) -> None:
        if len(self.secret) != 32 or not 0 < int.from_bytes(self.secret, "big") < SECP256K1_ORDER:
            raise KeystoreError("a libp2p identity needs a 32-byte secp256k1 secret in the curve's range")

    @classmethod
    def generate(cls) -> PeerIdentity:
        while True:
            secret = secrets.token_bytes(32)
            if 0 < int.from_bytes(secret, "big") < SECP256K1_ORDER:
                return cls(secret)

    @property
    def public_bytes(self) -> bytes:
        """The 33-byte compressed public key."""
        return eth_keys.PrivateKey(self.secret).public_key.to_compressed_bytes()

    @property
    def peer_id_bytes(self) -> bytes:
        public = _marshal(KEY_TYPE_SECP256K1, self.public_bytes)
        return bytes([MULTIHASH_IDENTITY, len(public)]) + public

    @property
    def peer_id(self) -> str:
        return b58encode(self.peer_id_bytes)

    def marshal_private(self) -> bytes:
        return _marshal(KEY_TYPE_SECP256K1, self.secret)

    def sign_binding(self, binding_hash: bytes) -> bytes:
        """This key's 65-byte signature (r, s, v) of the registry's binding hash, as `join` checks it."""
        signed = Account.sign_message(encode_defunct(primitive=binding_hash), private_key=self.secret)
        return bytes(signed.signature)


def load_or_create_identity(data_dir: Path) -> PeerIdentity:
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = data_dir / IDENTITY_FILE
    if path.exists():
        raw = path.read_bytes()
        if len(raw) == 68 and raw[:4] == bytes([0x08, KEY_TYPE_ED25519, 0x12, 64]):
            raise KeystoreError(f"{path} is an ed25519 libp2p key from an earlier rollnet; peer identities are now "
                                "secp256k1 so the registry can verify them: move the file away to make a new one "
                                "(and `rollnet node join` again, or rotate with the new peer ID)")
        if len(raw) != 36 or raw[:4] != bytes([0x08, KEY_TYPE_SECP256K1, 0x12, 32]):
            raise KeystoreError(f"{path} is not a secp256k1 libp2p key; move it away to make a new identity")
        return PeerIdentity(raw[4:])
    identity = PeerIdentity.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(identity.marshal_private())
    return identity

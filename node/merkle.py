"""Binary Merkle roots with domain-separated blake3 hashing.

Invariant: leaf hashes are H(0x00 | leaf) and inner nodes H(0x01 | left | right); an odd node is promoted
unchanged to the next level; the root of no leaves is H(0x02). So no leaf can pose as an inner node and
the same leaves in the same order always give the same 32-byte root.
"""

from __future__ import annotations

from collections.abc import Sequence

import blake3

LEAF, NODE, EMPTY = b"\x00", b"\x01", b"\x02"


def hash_leaf(data: bytes) -> bytes:
    return blake3.blake3(LEAF + data).digest()


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """The root over already-serialised leaves, in the given order."""
    if not leaves:
        return blake3.blake3(EMPTY).digest()
    level = [hash_leaf(leaf) for leaf in leaves]
    while len(level) > 1:
        paired = [blake3.blake3(NODE + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]

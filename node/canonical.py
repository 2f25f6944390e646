"""Canonical JSON: the one text form rollnet hashes when it pins a structure on chain.

Invariant: equal JSON values give the same text (sorted keys, no spaces, ASCII escapes), so their keccak256
is the same on every machine; non-JSON values are a TypeError, never a silent str().
"""

from __future__ import annotations

import json

from eth_utils import keccak


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def canonical_keccak(value: object) -> bytes:
    return keccak(text=canonical_json(value))

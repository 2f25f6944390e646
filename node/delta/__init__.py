"""Lossless sparse policy deltas: encode a version against its predecessor, apply it exactly, store chains.

Invariant: a delta only ever turns the exact base it names into the exact target it signs; everything
else is refused with a DeltaError and the held weights stay untouched (see codec.py). The byte format is
documented in container.py (file), section.py (per tensor) and entropy.py (the rANS payload).
"""

from rollnet.node.delta.checkpoint import content_root, load_checkpoint, save_checkpoint, tensor_hash
from rollnet.node.delta.codec import Applied, apply, encode, encode_stream
from rollnet.node.delta.container import Delta
from rollnet.node.delta.store import PolicyStore, Published

__all__ = [
    "Applied", "Delta", "PolicyStore", "Published", "apply", "content_root", "encode", "encode_stream",
    "load_checkpoint", "save_checkpoint", "tensor_hash",
]

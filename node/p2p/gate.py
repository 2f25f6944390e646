"""Who may use a node's protected protocols: peers whose authenticated peer ID is registered on chain to an
address with active stake as a worker or validator, or to a trusted address (the job's trainer, whose
registration proves its peer ID but carries no stake), with answers cached.

Invariants: the decision uses only the peer ID that the Noise handshake authenticated, never anything the
peer says about itself, and the registry binds a peer ID only to the address its key signed for, so nobody
passes as another's peer; a registration without stake (the trainer role) admits only a trusted address;
a chain error denies (fail closed) and is not cached; answers are cached for `ttl` seconds (denials for
less), so a flood of requests costs one chain lookup per peer per window.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from rollnet.node.chain.registry import RegistryClient
from rollnet.node.errors import RollnetError
from rollnet.node.p2p.identity import b58decode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admission:
    allowed: bool
    address: str | None
    reason: str


class PeerGate:
    def __init__(self, registry: RegistryClient | None, *, trusted: set[str] | None = None,
                 trusted_owners: set[str] | None = None, ttl: float = 30.0, deny_ttl: float = 5.0):
        self.registry = registry
        self.trusted = set(trusted or ())  # peer IDs
        self.trusted_owners = {owner.lower() for owner in trusted_owners or ()}  # addresses
        self.ttl = ttl
        self.deny_ttl = deny_ttl
        self._cache: dict[str, tuple[float, Admission]] = {}
        self._lock = threading.Lock()
        self.lookups = 0

    def check(self, peer_id: str) -> Admission:
        """Blocking (may call the chain): run it off the trio thread."""
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(peer_id)
            if cached and cached[0] > now:
                return cached[1]
        admission = self._decide(peer_id)
        if admission.reason != "chain unavailable":
            with self._lock:
                self._cache[peer_id] = (now + (self.ttl if admission.allowed else self.deny_ttl), admission)
        return admission

    def _decide(self, peer_id: str) -> Admission:
        if peer_id in self.trusted:
            return Admission(True, None, "trusted")
        if self.registry is None:
            return Admission(False, None, "no registry configured")
        try:
            raw = b58decode(peer_id)
        except ValueError:
            return Admission(False, None, "malformed peer id")
        self.lookups += 1
        try:
            owner = self.registry.owner_of_peer(raw)
            if owner is None:
                return Admission(False, None, "peer id not registered")
            if owner.lower() in self.trusted_owners:
                return Admission(True, owner, "trusted address")
            active = self.registry.is_staked(owner)
        except RollnetError as exc:
            log.warning("gate: chain lookup for %s failed: %s", peer_id, exc)
            return Admission(False, None, "chain unavailable")
        return Admission(active, owner, "active stake" if active else "stake not active")

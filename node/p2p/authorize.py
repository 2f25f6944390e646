"""Who may say what on a job's gossip topics, beyond a valid signature.

Invariants: a policy announcement or a demand counts only when signed by the job's trainer address; a `have`
announcement only when its signer is the address registered (on chain) for the announced peer ID, so no
one can advertise another peer as a provider; a verdict only when its signer is an active validator.
Lookups go through a TTL cache, so a flood of messages costs one chain read per signer per window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from eth_utils import to_checksum_address
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.errors import RollnetError
from rollnet.node.p2p.envelopes import Body, Demand, Envelope, Have, PolicyAnnouncement, Verdict
from rollnet.node.p2p.identity import b58decode

Authorizer = Callable[[Envelope, Body], bool]


class _Cache:
    def __init__(self, ttl: float):
        self.ttl = ttl
        self._values: dict[object, tuple[float, object]] = {}
        self._lock = threading.Lock()

    def get(self, key: object, compute: Callable[[], object]) -> object:
        now = time.monotonic()
        with self._lock:
            hit = self._values.get(key)
            if hit and hit[0] > now:
                return hit[1]
        value = compute()
        with self._lock:
            self._values[key] = (now + self.ttl, value)
        return value


class JobAuthorizer:
    def __init__(self, job: str, trainer: str, registry: RegistryClient | None, ttl: float = 30.0):
        self.job = to_checksum_address(job)
        self.trainer = to_checksum_address(trainer)
        self.registry = registry
        self._cache = _Cache(ttl)

    def __call__(self, envelope: Envelope, body: Body) -> bool:
        if body.job != self.job:
            return False
        if isinstance(body, PolicyAnnouncement | Demand):
            return envelope.signer == self.trainer
        if self.registry is None:
            return False
        try:
            if isinstance(body, Have):
                owner = self._cache.get(("peer", body.peer_id), lambda: self._owner(body.peer_id))
                return owner == envelope.signer
            if isinstance(body, Verdict):
                return bool(self._cache.get(("validator", envelope.signer),
                                            lambda: self.registry.is_active(envelope.signer, Role.VALIDATOR)))
        except (RollnetError, ValueError):
            return False  # fail closed; not cached
        return False

    def _owner(self, peer_id: str) -> str | None:
        return self.registry.owner_of_peer(b58decode(peer_id))

"""Per-peer fault accounting: a peer that keeps sending malformed data is disconnected and banned for a while.

Invariants: a fault is counted against the peer ID the Noise handshake authenticated, never against an
address; a peer with `threshold` faults inside a sliding window of `window_s` seconds is banned for `ban_s`
seconds (and every later fault while banned extends nothing: the ban is a fixed term); the table is bounded
(`max_peers` entries, oldest clean records evicted first), so a stranger minting fresh peer IDs costs the
node a fixed amount of memory. Time is injected (`clock`), so the rules are testable without sleeping.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class PeerRecord:
    faults: deque[float] = field(default_factory=deque)
    banned_until: float = 0.0
    last_seen: float = 0.0


class PeerDiscipline:
    """Counts malformed input per peer and decides bans."""

    def __init__(self, *, threshold: int = 10, window_s: float = 60.0, ban_s: float = 300.0,
                 max_peers: int = 4096, clock: Callable[[], float] = time.monotonic):
        if threshold < 1 or window_s <= 0 or ban_s < 0:
            raise ValueError("discipline needs threshold >= 1, a positive window and a non-negative ban")
        self.threshold = threshold
        self.window_s = window_s
        self.ban_s = ban_s
        self.max_peers = max_peers
        self.clock = clock
        self._peers: dict[str, PeerRecord] = {}
        self.faults_by_kind: Counter = Counter()
        self.bans = 0

    def fault(self, peer: str, kind: str) -> bool:
        """Count one malformed message from `peer`; True when this fault bans it (the caller disconnects)."""
        now = self.clock()
        self.faults_by_kind[kind] += 1
        record = self._record(peer, now)
        if record.banned_until > now:
            return False
        record.faults.append(now)
        while record.faults and record.faults[0] <= now - self.window_s:
            record.faults.popleft()
        if len(record.faults) < self.threshold:
            return False
        record.faults.clear()
        record.banned_until = now + self.ban_s
        self.bans += 1
        return True

    def banned(self, peer: str) -> bool:
        record = self._peers.get(peer)
        return record is not None and record.banned_until > self.clock()

    def fault_count(self, peer: str) -> int:
        record = self._peers.get(peer)
        return len(record.faults) if record else 0

    def _record(self, peer: str, now: float) -> PeerRecord:
        record = self._peers.get(peer)
        if record is None:
            if len(self._peers) >= self.max_peers:
                self._evict(now)
            record = self._peers[peer] = PeerRecord()
        record.last_seen = now
        return record

    def _evict(self, now: float) -> None:
        """Drop the least recently seen records, unbanned ones first, until there is room for one more."""
        order = sorted(self._peers, key=lambda p: (self._peers[p].banned_until > now, self._peers[p].last_seen))
        for peer in order[: max(1, len(order) - self.max_peers + 1)]:
            del self._peers[peer]

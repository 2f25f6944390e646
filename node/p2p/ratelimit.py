"""Token buckets that cap a node's upload rate across all its streams, and each peer's share of it (trio).

Invariants: over any window of t seconds at most `rate * t + burst` bytes pass `take`; waiters are served
in arrival order, so one large transfer cannot starve the others for long. PeerBuckets gives every peer its
own bucket of the same rate and keeps at most `max_peers` of them (the idlest are dropped; a dropped peer
starts again with one burst, which bounds what forgetting can give away).
"""

from __future__ import annotations

import trio


class TokenBucket:
    def __init__(self, rate_bytes_per_s: float | None, burst: int = 256 * 1024):
        self.rate = rate_bytes_per_s
        self.burst = burst
        self._tokens = float(burst)
        self._stamp: float | None = None  # set on first use, inside trio
        self._lock = trio.Lock()

    async def take(self, n: int) -> None:
        """Wait until `n` bytes may be sent (immediately when unlimited)."""
        if not self.rate:
            return
        async with self._lock:
            if self._stamp is None:
                self._stamp = trio.current_time()
            while True:
                now = trio.current_time()
                self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
                self._stamp = now
                if self._tokens >= n or (self._tokens >= self.burst and n > self.burst):
                    self._tokens -= n  # a request larger than the burst goes into debt once the bucket is full
                    return
                # at least a millisecond: a float shortfall of 1e-12 tokens must not spin on a zero sleep
                await trio.sleep(max(1e-3, (min(n, self.burst) - self._tokens) / self.rate))


class PeerBuckets:
    """One TokenBucket per remote peer, bounded in number."""

    def __init__(self, rate_bytes_per_s: float | None, burst: int = 256 * 1024, max_peers: int = 1024):
        self.rate = rate_bytes_per_s
        self.burst = burst
        self.max_peers = max_peers
        self._buckets: dict[str, TokenBucket] = {}

    async def take(self, peer: str, n: int) -> None:
        if not self.rate:
            return
        bucket = self._buckets.pop(peer, None)
        if bucket is None:
            if len(self._buckets) >= self.max_peers:
                del self._buckets[next(iter(self._buckets))]  # insertion order: the least recently used
            bucket = TokenBucket(self.rate, self.burst)
        self._buckets[peer] = bucket  # re-inserted: most recently used last
        await bucket.take(n)

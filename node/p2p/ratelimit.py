"""A token bucket that caps a node's upload rate across all its streams (trio).

Invariant: over any window of t seconds at most `rate * t + burst` bytes pass `take`; waiters are served
in arrival order, so one large transfer cannot starve the others for long.
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
                await trio.sleep((min(n, self.burst) - self._tokens) / self.rate)

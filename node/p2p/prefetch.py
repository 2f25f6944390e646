"""Submitted batches fetched in the background from the moment their submission is seen, so that a validator
judging a batch, or the trainer admitting one, reads bytes already stored instead of waiting for the transfer.

Invariants: the bytes come only from the wrapped `Fetcher` (content-addressed: what arrives is what the root
names; a fetched object stays in the node's object store, so nothing is held in memory here); at most one fetch
per root is in flight; a fetch that gave up is started again when asked for after it was taken; `close` cancels
what has not started. A fetch in flight ends at the fetcher's deadline (`p2p_fetcher`: no chunk for its timeout,
or a transfer slower on average than its minimum rate), so a worker that trickles chunks holds a thread for at
most the timeout plus the batch's size over that rate.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from rollnet.node.p2p.fetch import Fetcher

PREFETCH_THREADS = 4  # batches fetched at once
KEEP_FINISHED = 1024  # finished fetches remembered (a bool each) before the oldest are forgotten


class Prefetcher:
    """A `Fetcher` that can also start fetches ahead (`start`) and say whether one has finished (`ready`)."""

    def __init__(self, fetch: Fetcher, threads: int = PREFETCH_THREADS):
        self._fetch = fetch
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="prefetch")
        self._fetching: dict[bytes, Future[bool]] = {}
        self._lock = threading.Lock()

    def start(self, root: bytes, worker: str) -> Future[bool]:
        """Fetch `root` from `worker` in the background, unless that is already under way or finished (a fetch that
        gave up is started again once it has been taken)."""
        with self._lock:
            future = self._fetching.get(root)
            if future is None:
                future = self._pool.submit(lambda: self._fetch(root, worker) is not None)
                self._fetching[root] = future
                self._forget_finished()
            return future

    def ready(self, root: bytes, worker: str) -> bool:
        """Whether `root`'s bytes have arrived, or its fetch gave up (then reading it answers None, and the next
        ask starts it again); starts the fetch if nothing has."""
        return self.start(root, worker).done()

    def take(self, root: bytes, worker: str) -> bytes | None:
        """The bytes of a fetch that has finished (`ready`), or None if it gave up (asked again, it starts anew);
        never waits for a transfer."""
        with self._lock:
            future = self._fetching.get(root)
            if future is None or not future.done():
                return None
            del self._fetching[root]
        return self._fetch(root, worker) if not future.cancelled() and future.result() else None

    def __call__(self, root: bytes, worker: str) -> bytes | None:
        """The bytes (waiting for a fetch in flight; one still queued behind others is cancelled and done now),
        or None if the worker could not serve them."""
        with self._lock:
            future = self._fetching.pop(root, None)
        if future is not None and not future.cancel():
            if future.result():
                return self._fetch(root, worker)  # from the store
            return None  # it gave up just now: the caller's patience decides whether to ask again
        return self._fetch(root, worker)

    def _forget_finished(self) -> None:
        if len(self._fetching) <= KEEP_FINISHED:
            return
        for root in [r for r, f in self._fetching.items() if f.done()][:len(self._fetching) - KEEP_FINISHED]:
            del self._fetching[root]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

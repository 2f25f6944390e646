"""A worker's lease transactions off its generating thread: leases claimed (with their seeds drawn) ahead of
generation, and submissions mined while the next batch generates.

On a chain with real block times each of a lease's three transactions (claim, seed draw, submission) waits
about a block, and the seed draw must also wait for the claim's block to pass. Sent one after the other from
the thread that generates, a lease costs three blocks of idle hardware. Here they run on background threads
(the client's nonce manager hands each thread its own nonce), so several leases' transactions share blocks
and generation never waits for a receipt.

Invariants:
- nothing is claimed unasked: the caller says how many claims to keep in flight (`claim_ahead`);
- every claim started here reaches the caller at most once, through `ready` (oldest started first: its
  seeded lease, or its failure raised) or, seeded but not taken, through `close`; only claims still in
  flight at `close` go unreported;
- every submission started here reaches the caller exactly once through `finished`: its lease and either
  the receipt's result or the failure;
- the background threads only send transactions and read the chain; they never touch the model.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

from rollnet.node.chain.job import Lease

Result = TypeVar("Result")


@dataclass(frozen=True)
class Finished(Generic[Result]):
    """A submission that finished: `result` if it was mined, else `error` (never both)."""

    lease_id: int
    result: Result | None
    error: BaseException | None


@dataclass(frozen=True)
class Claimed:
    """A lease claimed and seeded in the background, with the seconds its transactions took."""

    lease: Lease
    timings: dict[str, float]


class LeaseLanes(Generic[Result]):
    """Claims and submissions of one worker, in flight on `width` threads each."""

    def __init__(self, claim: Callable[[], Claimed], width: int):
        if width < 1:
            raise ValueError(f"width must be at least 1, not {width}")
        self._claim = claim
        self._pool = ThreadPoolExecutor(max_workers=2 * width, thread_name_prefix="lease-lane")
        self._claims: deque[Future[Claimed]] = deque()
        self._submissions: dict[int, Future[Result]] = {}

    @property
    def claiming(self) -> int:
        """Claims in flight or seeded and not yet taken by `ready`."""
        return len(self._claims)

    @property
    def unfinished_claims(self) -> int:
        """Claims still in flight (their claim or seed draw not yet mined)."""
        return sum(not future.done() for future in self._claims)

    @property
    def submitting(self) -> int:
        """Submissions started and not yet reported by `finished`."""
        return len(self._submissions)

    def claim_ahead(self, wanted: int) -> None:
        """Start claims until `wanted` are in flight or waiting to be taken."""
        while len(self._claims) < wanted:
            self._claims.append(self._pool.submit(self._claim))

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the oldest claim to finish; whether `ready` now has something."""
        if not self._claims:
            return False
        wait([self._claims[0]], timeout=timeout)
        return self._claims[0].done()

    def ready(self, timeout: float = 0.0) -> Claimed | None:
        """The oldest claim, once seeded (waiting up to `timeout` seconds for it); None while it is in flight.
        A failed claim raises its error here, once."""
        if not self._claims:
            return None
        oldest = self._claims[0]
        wait([oldest], timeout=timeout)
        if not oldest.done():
            return None
        self._claims.popleft()
        return oldest.result()

    def submit(self, lease_id: int, send: Callable[[], Result]) -> None:
        """Send a lease's submission in the background; `finished` reports it."""
        if lease_id in self._submissions:
            raise ValueError(f"lease {lease_id} is already being submitted")
        self._submissions[lease_id] = self._pool.submit(send)

    def finished(self, wait_all: bool = False) -> list[Finished[Result]]:
        """The submissions that finished since the last call (with `wait_all`, after waiting for every one)."""
        if wait_all:
            wait(list(self._submissions.values()))
        done = []
        for lease_id, future in list(self._submissions.items()):
            if future.done():
                del self._submissions[lease_id]
                error = future.exception()
                done.append(Finished(lease_id, None if error else future.result(), error))
        return done

    def close(self) -> list[Claimed]:
        """Stop starting work. Returns the leases claimed and seeded but never taken, so the caller can say they
        are abandoned (they expire on chain); claims still in flight are left to finish or fail unreported."""
        abandoned = [f.result() for f in self._claims if f.done() and not f.cancelled() and f.exception() is None]
        for future in self._claims:
            future.cancel()
        self._claims.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        return abandoned

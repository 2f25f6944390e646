"""How many leases a worker keeps in flight (claimed, generating, being submitted, or waiting for its committee):
enough that generation never waits for the protocol, and no more than its batches can arrive fresh with.

- **Little's law.** A lease holds its slot from its claim until the chain decides it: its occupancy. A worker
  that finishes a batch every `batch_s` seconds generates without a pause only with ceil(occupancy / batch_s)
  slots. Both are running means over its own leases. Holding more only queues batches that age while they wait.
- **Staleness.** Each submission's g (the chain's version when it was mined, less the batch's version) is the
  signal that the market is fed faster than the staleness budget lets it train: the trainer's own version leads
  the chain's while it writes, and more versions pass while the committee judges, so a batch submitted at g =
  budget arrives too stale to train on. The window then halves; while g stays at least two under the budget it
  grows by one per window's worth of submissions (additive increase, multiplicative decrease, as congestion
  control does).

Invariant: `size()` is at least 1 and at most `cap`, and once a lease has been measured, at most the Little's
law need. A fixed window (`fixed`) never moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _mean(old: float | None, new: float) -> float:
    return new if old is None else 0.5 * (old + new)


@dataclass
class InFlightWindow:
    budget: int  # the job's staleness budget
    cap: int  # never more than this many (the worker's lanes are this wide)
    fixed: bool = False  # a window the operator set: never adapted
    start: int | None = None  # the first size (default: the budget, at least 1)
    batch_s: float | None = None  # seconds one batch takes to generate, sign and store (a running mean)
    occupancy_s: float | None = None  # seconds a lease holds its slot, claim to decision (a running mean)

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise ValueError(f"cap must be at least 1, not {self.cap}")
        self._size = float(min(self.cap, max(1, self.start if self.start is not None else self.budget)))

    def size(self) -> int:
        size = int(self._size)
        if not self.fixed and self.batch_s and self.occupancy_s:
            size = min(size, math.ceil(self.occupancy_s / self.batch_s))
        return max(1, min(self.cap, size))

    def note_batch(self, seconds: float) -> None:
        self.batch_s = _mean(self.batch_s, seconds)

    def note_decided(self, occupancy_s: float) -> None:
        """A lease of this worker left the chain's undecided states `occupancy_s` after it was claimed."""
        self.occupancy_s = _mean(self.occupancy_s, occupancy_s)

    def note_submitted(self, g: int) -> None:
        """A submission was mined `g` versions behind the chain."""
        if self.fixed:
            return
        if g >= self.budget:
            self._size = max(1.0, self._size / 2)
        elif g <= self.budget - 2:
            self._size = min(float(self.cap), self._size + 1 / self._size)

"""Group-relative advantages.

Invariant: a group's advantages are (r - mean) / (std + ε) over that group's rewards only (population
std); a group whose rewards are all equal carries no signal and yields None, never zeros that would
dilute the batch.
"""

from __future__ import annotations

import math


def group_advantages(rewards: list[float], epsilon: float = 1e-6) -> list[float] | None:
    if len(rewards) < 2:
        return None
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    if std < 1e-12:
        return None
    return [(r - mean) / (std + epsilon) for r in rewards]

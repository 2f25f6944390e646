"""The asynchrony budget: how stale a worker's policy is when it lands, from model size, link and step time.

Model: a policy version is P bf16 parameters. Full broadcast ships 2P bytes. A sparse delta ships about
P · (H(c) + b·c) / 8 bytes, where c is the fraction of elements that change per step, H the binary
entropy (bits per element to say which positions changed) and b the bits per changed value; b = 2.35 is
what rollnet's codec measured (BENCHMARKS.md: 154× at c = 1%, 1156× at 0.1%, 40× at 5%). Through a
pipelined broadcast tree every peer forwards what it receives, so the broadcast takes about one payload
over one link: B = overhead · 8 · payload / link rate (overhead ≥ 1 for a tree that is not ideal; the
swarm measured 2.2× its pipelined bound on this machine). Staleness g = B / S for step time S; it fits
when g ≤ the budget (4 steps for the two-sided-clip recipe). Invariant: every function is pure, and
parsing a size, rate or duration either yields a positive number or raises ConfigError naming the text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from rollnet.node.errors import ConfigError

VALUE_BITS = 2.35
MODELS = ("1B", "3B", "8B", "14B", "32B", "70B")
LINKS = ("100mbps", "1gbps", "10gbps", "100gbps")

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmbt]?)\s*$", re.IGNORECASE)
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(bps|bit/s|b/s)\s*$", re.IGNORECASE)
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min|h)?\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12}
_SECONDS = {"ms": 1e-3, "s": 1, "": 1, "m": 60, "min": 60, "h": 3600}


def parse_params(text: str) -> float:
    """'8B' -> 8e9 parameters; also '135M', '1.5b', '70000000'."""
    match = _SIZE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(f"cannot read a parameter count from {text!r} (examples: 8B, 135M)")
    return float(match.group(1)) * _SCALE[match.group(2).lower()]


def parse_rate(text: str) -> float:
    """'1gbps' -> 1e9 bits per second; also '100Mbps', '10 Gbit/s'."""
    match = _RATE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(f"cannot read a link rate from {text!r} (examples: 100mbps, 1gbps, 10gbps)")
    return float(match.group(1)) * _SCALE[match.group(2).lower()]


def parse_duration(text: str) -> float:
    """'30s' -> 30.0 seconds; also '2m', '0.5h', '800ms', '45'."""
    match = _TIME.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(f"cannot read a duration from {text!r} (examples: 30s, 2m, 800ms)")
    return float(match.group(1)) * _SECONDS[(match.group(2) or "").lower()]


def binary_entropy(c: float) -> float:
    if c <= 0 or c >= 1:
        return 0.0
    return -c * math.log2(c) - (1 - c) * math.log2(1 - c)


def payload_bytes(params: float, sparse: bool, change: float = 0.01, value_bits: float = VALUE_BITS) -> float:
    if not 0 < change <= 1:
        raise ConfigError(f"the change fraction must be in (0, 1], got {change}")
    if not sparse:
        return 2 * params
    return min(2 * params, params * (binary_entropy(change) + value_bits * change) / 8)


@dataclass(frozen=True)
class Prediction:
    params: float
    link_bps: float
    sparse: bool
    change: float
    step_s: float
    budget: float
    payload_bytes: float
    broadcast_s: float
    staleness: float

    @property
    def fits(self) -> bool:
        return self.staleness <= self.budget


def predict(params: float, link_bps: float, *, sparse: bool = True, change: float = 0.01, step_s: float = 30.0,
            budget: float = 4.0, overhead: float = 1.0) -> Prediction:
    if overhead < 1:
        raise ConfigError("the tree overhead is at least 1 (1 = an ideal pipelined tree)")
    payload = payload_bytes(params, sparse, change)
    broadcast = overhead * 8 * payload / link_bps
    return Prediction(params, link_bps, sparse, change, step_s, budget, payload, broadcast, broadcast / step_s)


def format_bytes(count: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count:.0f} B"

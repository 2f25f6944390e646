"""Validator weights as the registry's checkpoints hold them, rebuilt locally from its ValidatorWeightChanged
events (node, weight, total), which the registry emits for every change of a validator's weight.

Invariants: `weight_at(node, block)` and `total_at(block)` are what NodeRegistry.weightsAt answers for the end
of `block` (the last change in a block wins, as in the contract's checkpoints), and are answered only once
every block up to `block` is folded; folding reads the new blocks in bounded ranges (`ChainClient.log_ranges`),
one eth_getLogs per range, so a participant's weight reads grow with the blocks it covers, never with the
leases, rounds or start blocks it asks about. The history starts at the registry's deployment block or before
it: `check_start` refuses a start after which validators already held weight (their weight would be missing).
"""

from __future__ import annotations

import threading
from bisect import bisect_right

from rollnet.node.chain.registry import RegistryClient
from rollnet.node.errors import ChainUnavailable, ConfigError


class _Series:
    """A value over blocks: (block, value) in block order, the last value of a block kept."""

    def __init__(self) -> None:
        self.blocks: list[int] = []
        self.values: list[int] = []

    def record(self, block: int, value: int) -> None:
        if self.blocks and self.blocks[-1] == block:
            self.values[-1] = value
        else:
            self.blocks.append(block)
            self.values.append(value)

    def at(self, block: int) -> int:
        index = bisect_right(self.blocks, block) - 1
        return self.values[index] if index >= 0 else 0


class WeightHistory:
    def __init__(self, registry: RegistryClient, from_block: int):
        self.registry = registry
        self.from_block = from_block
        self.cursor = from_block - 1  # the last block folded
        self._nodes: dict[str, _Series] = {}  # lower-case address -> its weight
        self._names: dict[str, str] = {}  # lower-case address -> as the events spell it
        self._total = _Series()
        self._lock = threading.Lock()
        self._checked = False

    def check_start(self) -> None:
        """Refuse a history that starts after validators held weight (one registry read, once)."""
        if self._checked or self.from_block <= 0:
            return
        before = self.registry.total_weight_at(self.from_block - 1)
        if before:
            raise ConfigError(f"validators held weight before block {self.from_block}: follow the registry from "
                              "its deployment block")
        self._checked = True

    def follow(self, block: int) -> None:
        """Fold the registry's weight changes up to at least `block` (to the chain's head, if that is further)."""
        with self._lock:
            if block <= self.cursor:
                return
            self.check_start()
            client = self.registry.client
            head = client.block_number()
            for end, logs in client.log_ranges(self.registry.contract, ["ValidatorWeightChanged"], self.cursor + 1,
                                               head):
                for log in logs:
                    node, number = log["args"]["node"], log["blockNumber"]
                    key = node.lower()
                    self._names.setdefault(key, node)
                    self._nodes.setdefault(key, _Series()).record(number, log["args"]["weight"])
                    self._total.record(number, log["args"]["total"])
                self.cursor = end
            if self.cursor < block:  # an endpoint whose head is behind a block another has shown us
                raise ChainUnavailable(f"the endpoint's head is block {self.cursor}, behind block {block}")

    def weight_at(self, node: str, block: int) -> int:
        """`node`'s validator weight at the end of `block`."""
        self.follow(block)
        series = self._nodes.get(node.lower())
        return series.at(block) if series is not None else 0

    def total_at(self, block: int) -> int:
        """All validators' weight at the end of `block`."""
        self.follow(block)
        return self._total.at(block)

    def weighted_at(self, block: int) -> list[str]:
        """Every validator with weight at the end of `block`."""
        self.follow(block)
        with self._lock:
            return [self._names[key] for key, series in self._nodes.items() if series.at(block) > 0]

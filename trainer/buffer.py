"""The rollout buffer: it owns staleness.

Invariants: a rollout is admitted only if its policy version v satisfies current - max_staleness <= v <=
current; a group (the `group_size` samples of one task seed, all of one version) becomes trainable only
when complete, and is trained on whole or not at all; staleness is checked again when a group is taken,
because versions advance while groups wait; the realised staleness g = current - v of every sample
handed to training is recorded; every rollout offered is counted exactly once as admitted, too stale or
invalid (with the reason).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from rollnet.node.rollout.generate import Rollout


@dataclass
class Group:
    task_seed: int
    version: int
    rollouts: list[Rollout]


@dataclass
class BufferCounts:
    admitted: int = 0
    too_stale: int = 0
    invalid: int = 0
    invalid_reasons: Counter = field(default_factory=Counter)
    staleness: Counter = field(default_factory=Counter)  # g -> samples trained on with that staleness


class RolloutBuffer:
    def __init__(self, group_size: int, max_staleness: int, vocab_size: int):
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.vocab_size = vocab_size
        self.current_version = 0
        self.counts = BufferCounts()
        self._pending: OrderedDict[tuple[int, int], dict[int, Rollout]] = OrderedDict()
        self._ready: list[Group] = []

    def advance(self, version: int) -> None:
        """The trainer published `version`: drop what can no longer be trained on."""
        self.current_version = version
        for key in [k for k in self._pending if self._stale(k[1])]:
            self.counts.too_stale += len(self._pending.pop(key))
        fresh = [g for g in self._ready if not self._stale(g.version)]
        self.counts.too_stale += sum(len(g.rollouts) for g in self._ready if self._stale(g.version))
        self._ready = fresh

    def _stale(self, version: int) -> bool:
        return version < self.current_version - self.max_staleness

    def _invalid(self, reason: str) -> str:
        self.counts.invalid += 1
        self.counts.invalid_reasons[reason] += 1
        return f"invalid: {reason}"

    def admit(self, rollout: Rollout) -> str:
        """Offer one rollout; returns "admitted", "too stale" or "invalid: <reason>"."""
        if rollout.policy_version > self.current_version:
            return self._invalid("policy version from the future")
        if not rollout.tokens or not rollout.prompt_tokens:
            return self._invalid("empty prompt or completion")
        if len(rollout.logprobs) != len(rollout.tokens):
            return self._invalid("log-probs and tokens differ in length")
        if any(not 0 <= t < self.vocab_size for t in rollout.prompt_tokens + rollout.tokens):
            return self._invalid("token outside the vocabulary")
        if not 0 <= rollout.sample < self.group_size:
            return self._invalid("sample index outside the group")
        if self._stale(rollout.policy_version):
            self.counts.too_stale += 1
            return "too stale"
        key = (rollout.task_seed, rollout.policy_version)
        group = self._pending.setdefault(key, {})
        if rollout.sample in group:
            return self._invalid("duplicate sample")
        group[rollout.sample] = rollout
        self.counts.admitted += 1
        if len(group) == self.group_size:
            del self._pending[key]
            self._ready.append(Group(key[0], key[1], [group[i] for i in range(self.group_size)]))
        return "admitted"

    def admit_all(self, rollouts: list[Rollout]) -> Counter:
        return Counter(self.admit(r).split(":")[0] for r in rollouts)

    @property
    def ready_groups(self) -> int:
        return len(self._ready)

    def take(self, groups: int) -> list[Group]:
        """Up to `groups` complete, still-fresh groups, oldest first; records their staleness."""
        self.advance(self.current_version)
        taken, self._ready = self._ready[:groups], self._ready[groups:]
        for group in taken:
            self.counts.staleness[self.current_version - group.version] += len(group.rollouts)
        return taken

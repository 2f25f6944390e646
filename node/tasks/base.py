"""The Task interface and the lookup of tasks by name.

Invariant: every task name resolves to exactly one generator; an unknown name is a ConfigError naming
the choices, never a traceback.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from rollnet.node.errors import ConfigError

SEED_BYTES = 8


@dataclass(frozen=True)
class TaskInstance:
    seed: int
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False)


class Task(ABC):
    name: str

    @abstractmethod
    def instance(self, seed: int) -> TaskInstance:
        """The task for `seed` (deterministic)."""

    @abstractmethod
    def reward(self, instance: TaskInstance, completion: str) -> float:
        """Reward in [0, 1] for a completion of `instance`."""

    def examples(self, seeds: range) -> list[TaskInstance]:
        return [self.instance(seed) for seed in seeds]


def seed_from_bytes(seed: bytes) -> int:
    """An integer task seed from an on-chain 32-byte task seed."""
    return int.from_bytes(seed[:SEED_BYTES], "big")


def load_task(name: str) -> Task:
    """`addition-2digit`, `gym:<reasoning-gym dataset>`, or a path to a JSONL file of prompt/answer pairs."""
    from rollnet.node.tasks.addition import AdditionTask
    from rollnet.node.tasks.gym import ReasoningGymTask
    from rollnet.node.tasks.jsonl import JsonlTask

    if name == AdditionTask.name:
        return AdditionTask()
    if name.startswith("gym:"):
        return ReasoningGymTask(name.removeprefix("gym:"))
    if name.endswith(".jsonl"):
        return JsonlTask(Path(name))
    raise ConfigError(f"unknown task {name!r}: use {AdditionTask.name}, gym:<dataset> or a .jsonl file")

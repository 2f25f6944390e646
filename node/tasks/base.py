"""The Task interface and the lookup of tasks by name.

Invariant: every task name resolves to exactly one generator; an unknown name is a ConfigError naming
the choices, never a traceback. A task's configuration hash is keccak256 over its `configuration()` and its
prompts and answers for seeds 0-7, as canonical JSON (sorted keys, no spaces): two tasks with the same hash
are meant to give the same prompt and reward for every seed, so the chain can pin a task set by name and
hash (the fingerprint catches generator code that drifts under an unchanged configuration).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from rollnet.node.canonical import canonical_keccak
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

    def plain(self) -> Task:
        """The task without any prompt formatting a recipe wraps around it (itself, for a plain task)."""
        return self

    @abstractmethod
    def configuration(self) -> dict:
        """Everything that decides this task's prompts and rewards (JSON values), for `task_config_hash`."""


FINGERPRINT_SEEDS = range(8)


def task_config_hash(task: Task) -> bytes:
    """keccak256 of the task's configuration and of its prompts and answers for a few fixed seeds, as
    canonical JSON: a declared configuration can stay the same while a generator's code drifts (another
    library build), and the fingerprint catches that drift."""
    fingerprint = [[item.prompt, item.answer] for item in task.plain().examples(FINGERPRINT_SEEDS)]
    return canonical_keccak({"configuration": task.configuration(), "fingerprint": fingerprint})


def seed_from_bytes(seed: bytes) -> int:
    """An integer task seed from an on-chain 32-byte task seed."""
    return int.from_bytes(seed[:SEED_BYTES], "big")


def load_task(name: str) -> Task:
    """`addition-2digit`, `gym:<reasoning-gym dataset>[:<answer rule>]` (see tasks.gym), or a path to a JSONL
    file of prompt/answer pairs."""
    from rollnet.node.tasks.addition import AdditionTask
    from rollnet.node.tasks.gym import ReasoningGymTask
    from rollnet.node.tasks.jsonl import JsonlTask

    if name == AdditionTask.name:
        return AdditionTask()
    if name.startswith("gym:"):
        return ReasoningGymTask.from_name(name.removeprefix("gym:"))
    if name.endswith(".jsonl"):
        return JsonlTask(Path(name))
    raise ConfigError(f"unknown task {name!r}: use {AdditionTask.name}, gym:<dataset>[:<answer rule>] or a .jsonl file")

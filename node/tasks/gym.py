"""Tasks from reasoning-gym's procedural generators (offline; nothing is downloaded).

Invariant: the instance for a seed is the generator's single item for that seed; rewards come from the
generator's own scorer.
"""

from __future__ import annotations

from functools import cached_property

from rollnet.node.errors import ConfigError
from rollnet.node.tasks.base import Task, TaskInstance


class ReasoningGymTask(Task):
    def __init__(self, dataset: str):
        self.dataset = dataset
        self.name = f"gym:{dataset}"
        import reasoning_gym

        if dataset not in reasoning_gym.factory.DATASETS:
            raise ConfigError(f"reasoning-gym has no dataset {dataset!r}")

    @cached_property
    def _module(self):  # noqa: ANN202 - the reasoning_gym module
        import reasoning_gym

        return reasoning_gym

    def _dataset(self, seed: int):  # noqa: ANN202 - a reasoning_gym dataset
        return self._module.create_dataset(self.dataset, size=1, seed=seed)

    def instance(self, seed: int) -> TaskInstance:
        entry = self._dataset(seed)[0]
        return TaskInstance(seed, entry["question"], str(entry["answer"]), {"entry": entry})

    def reward(self, instance: TaskInstance, completion: str) -> float:
        dataset = self._dataset(instance.seed)
        return float(dataset.score_answer(answer=completion.strip(), entry=dataset[0]))

    def configuration(self) -> dict:
        """The dataset with reasoning-gym's version: its generators are code, so the version pins them."""
        return {"task": self.name, "reasoning_gym": self._module.__version__, "size": 1}

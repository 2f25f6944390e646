"""The embedded default task: fixed-width two-digit addition ("07+45=" -> "52").

Invariant: prompts are exactly 6 characters over the alphabet "0123456789+="; the answer is the decimal
sum without leading zeros; the reward is 1 for an exact answer (surrounding whitespace ignored), else 0.
"""

from __future__ import annotations

import random

from rollnet.node.tasks.base import Task, TaskInstance

ALPHABET = "0123456789+="


class AdditionTask(Task):
    name = "addition-2digit"

    def instance(self, seed: int) -> TaskInstance:
        rng = random.Random(seed)
        a, b = rng.randrange(100), rng.randrange(100)
        return TaskInstance(seed, f"{a:02d}+{b:02d}=", str(a + b))

    def reward(self, instance: TaskInstance, completion: str) -> float:
        return 1.0 if completion.strip() == instance.answer else 0.0

    def configuration(self) -> dict:
        return {"task": self.name, "generator": "fixed-width two-digit addition", "version": 1}

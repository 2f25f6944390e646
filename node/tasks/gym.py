"""Tasks from reasoning-gym's procedural generators (offline; nothing is downloaded).

A task is named `gym:<dataset>` or `gym:<dataset>:<answer rule>`. The answer rule decides which part of a
completion the dataset's scorer sees:
- the whole completion, stripped of surrounding space, when no rule is named (`gym:<dataset>`);
- `last-number`: the last number in the completion (an optional minus sign, digits, an optional decimal
  part; thousands separators `,` are dropped first), or nothing when it holds no number;
- `answer-tag`: the text inside the last `<answer>...</answer>` pair (reasoning-gym's own `extract_answer`),
  or nothing without one. The prompt then ends with an instruction to answer in that format.
Nothing scores 0 whatever the dataset, and so does an extract the dataset's scorer raises on (some scorers
parse their input and fail on odd text) or scores outside [0, 1]: every role computes the same reward, and no
completion can crash the role computing it. ANSWER_RULE_VERSION is in `configuration()`: a change to how a
rule extracts changes the task hash, so roles on different rollnet versions cannot silently disagree.

Invariant: the instance for a seed is the generator's single item for that seed (with the rule's
instruction appended, for `answer-tag`); rewards come from the generator's own scorer applied to the rule's
extract; the rule is part of the name and of `configuration()`, so it is pinned by the task hash.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cached_property

from rollnet.node.errors import ConfigError
from rollnet.node.tasks.base import Task, TaskInstance

NUMBER = re.compile(r"-?\d+(?:\.\d+)?", re.ASCII)
ANSWER_RULE_VERSION = 1
ANSWER_TAG_INSTRUCTION = "\n\nGive your final answer between <answer> and </answer>, like <answer>42</answer>."


def last_number(completion: str) -> str | None:
    """The last number in `completion`, thousands separators removed; None when it holds none."""
    numbers = NUMBER.findall(completion.replace(",", ""))
    return numbers[-1] if numbers else None


def answer_tag(completion: str) -> str | None:
    """The text of the last `<answer>` pair (reasoning-gym's rule); None without one."""
    from reasoning_gym.utils import extract_answer

    return extract_answer(completion)


WHOLE = "whole"  # the rule of a bare `gym:<dataset>`; it is never written out in a name
ANSWER_RULES: dict[str, Callable[[str], str | None]] = {
    WHOLE: str.strip,
    "last-number": last_number,
    "answer-tag": answer_tag,
}


class ReasoningGymTask(Task):
    def __init__(self, dataset: str, answer_rule: str | None = None):
        import reasoning_gym

        if dataset not in reasoning_gym.factory.DATASETS:
            raise ConfigError(f"reasoning-gym has no dataset {dataset!r}")
        if answer_rule is not None and (answer_rule == WHOLE or answer_rule not in ANSWER_RULES):
            rules = ", ".join(rule for rule in ANSWER_RULES if rule != WHOLE)
            raise ConfigError(f"unknown answer rule {answer_rule!r} in gym:{dataset}:{answer_rule}: use one of "
                              f"{rules}, or gym:{dataset} to score the whole completion")
        self.dataset = dataset
        self.answer_rule = answer_rule or WHOLE
        self.name = f"gym:{dataset}" if answer_rule is None else f"gym:{dataset}:{answer_rule}"  # as named

    @classmethod
    def from_name(cls, name: str) -> ReasoningGymTask:
        """`<dataset>` or `<dataset>:<answer rule>` (the part after `gym:`)."""
        dataset, colon, rule = name.partition(":")
        return cls(dataset, rule if colon else None)

    @cached_property
    def _module(self):  # noqa: ANN202 - the reasoning_gym module
        import reasoning_gym

        return reasoning_gym

    def _dataset(self, seed: int):  # noqa: ANN202 - a reasoning_gym dataset
        return self._module.create_dataset(self.dataset, size=1, seed=seed)

    def instance(self, seed: int) -> TaskInstance:
        entry = self._dataset(seed)[0]
        prompt = entry["question"] + (ANSWER_TAG_INSTRUCTION if self.answer_rule == "answer-tag" else "")
        return TaskInstance(seed, prompt, str(entry["answer"]), {"entry": entry})

    def reward(self, instance: TaskInstance, completion: str) -> float:
        answer = ANSWER_RULES[self.answer_rule](completion)
        if answer is None:
            return 0.0
        dataset = self._dataset(instance.seed)
        try:
            score = float(dataset.score_answer(answer=answer, entry=dataset[0]))
        except Exception:  # noqa: BLE001 - a scorer failing on a completion's text scores it 0, for every role
            return 0.0
        return score if 0.0 <= score <= 1.0 else 0.0

    def configuration(self) -> dict:
        """The dataset with reasoning-gym's version (its generators are code, so the version pins them), and
        the answer rule when it is not the whole completion."""
        config = {"task": self.name, "reasoning_gym": self._module.__version__, "size": 1}
        if self.name != f"gym:{self.dataset}":
            config["answer_rule"] = self.answer_rule
            config["answer_rule_version"] = ANSWER_RULE_VERSION
        return config

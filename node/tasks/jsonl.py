"""Tasks from a JSONL file of {"prompt": ..., "answer": ...} lines.

Invariant: seed s selects line s mod n; a malformed file is a ConfigError naming the line.
"""

from __future__ import annotations

import json
from pathlib import Path

from rollnet.node.errors import ConfigError
from rollnet.node.tasks.base import Task, TaskInstance


class JsonlTask(Task):
    def __init__(self, path: Path):
        self.name = str(path)
        if not path.exists():
            raise ConfigError(f"task file {path} does not exist")
        self.items: list[tuple[str, str]] = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                self.items.append((str(item["prompt"]), str(item["answer"])))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ConfigError(f"{path}:{number}: expected a JSON object with prompt and answer") from None
        if not self.items:
            raise ConfigError(f"task file {path} has no tasks")

    def instance(self, seed: int) -> TaskInstance:
        prompt, answer = self.items[seed % len(self.items)]
        return TaskInstance(seed, prompt, answer)

    def reward(self, instance: TaskInstance, completion: str) -> float:
        return 1.0 if completion.strip() == instance.answer.strip() else 0.0

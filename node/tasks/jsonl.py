"""Tasks from a JSONL file of {"prompt": ..., "answer": ...} lines.

Invariant: seed s selects line s mod n; a malformed file is a ConfigError naming the line, a missing or
unreadable one (a directory, not UTF-8, a NUL in its name) a ConfigError naming the file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rollnet.node.errors import ConfigError
from rollnet.node.tasks.base import Task, TaskInstance


class JsonlTask(Task):
    def __init__(self, path: Path):
        self.name = str(path)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise ConfigError(f"task file {path} does not exist") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # a directory, unreadable, not text, a NUL
            raise ConfigError(f"cannot read task file {str(path)!r}: {type(exc).__name__}") from None
        self.sha256 = hashlib.sha256(text.encode()).hexdigest()
        self.items: list[tuple[str, str]] = []
        for number, line in enumerate(text.splitlines(), start=1):
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

    def configuration(self) -> dict:
        """The file's contents (by hash), not its path: the same tasks hash the same wherever they live."""
        return {"task": "jsonl", "sha256": self.sha256}

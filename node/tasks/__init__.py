"""Verifiable tasks: a prompt derived from a seed, and a reward computed from a completion.

Invariant: `prompt(seed)` is a pure function of the seed (the chain supplies seeds, so no worker picks its
prompts), and `reward` depends only on the task instance and the completion text, never on anything a
worker reports about itself.
"""

from rollnet.node.tasks.base import Task, TaskInstance, load_task, seed_from_bytes, task_config_hash

__all__ = ["Task", "TaskInstance", "load_task", "seed_from_bytes", "task_config_hash"]

"""A task whose prompts are wrapped in the model tokenizer's chat template (a recipe setting).

Invariant: the wrapped prompt is the tokenizer's own template applied to one user turn holding the task's
prompt, with the generation prompt appended, as text; answers, rewards and configuration are the inner
task's, so the prompt format is the only thing this changes, and every role that wraps the same task
with the same tokenizer sees the same prompt for every seed.
"""

from __future__ import annotations

from rollnet.node.errors import ConfigError
from rollnet.node.tasks.base import Task, TaskInstance
from transformers import PreTrainedTokenizerBase


class ChatTemplatedTask(Task):
    def __init__(self, inner: Task, tokenizer: PreTrainedTokenizerBase):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("prompts are to be wrapped in a chat template (the job's recipe, or --chat-template), "
                              "but this model's tokenizer has none")
        self.inner = inner
        self.tokenizer = tokenizer
        self.name = inner.name

    def instance(self, seed: int) -> TaskInstance:
        plain = self.inner.instance(seed)
        prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": plain.prompt}], tokenize=False,
                                                    add_generation_prompt=True)
        return TaskInstance(plain.seed, str(prompt), plain.answer, plain.meta)

    def reward(self, instance: TaskInstance, completion: str) -> float:
        return self.inner.reward(instance, completion)

    def plain(self) -> Task:
        return self.inner.plain()

    def configuration(self) -> dict:
        return self.inner.configuration()

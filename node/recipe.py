"""A job's recipe: everything a participant needs to do the work the same way, as the chain states it.

Invariants: a `Recipe` is built only from the job's on-chain spec (`JobClient.spec().recipe`), never from a
participant's own flags; a flag that names a recipe value is either absent (the chain's value is used) or
equal to it, and anything else is refused with one `ConfigError` line naming the flag, its value and the
chain's (`agree`); the task a role works on is the chain's task set, loaded from the task registry and
refused unless its configuration hash equals the chain's (`recipe_task`), so a worker never uses a task,
length, temperature or prompt format the validators would not check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ConfigDict
from rollnet.node.errors import ConfigError

if TYPE_CHECKING:
    from rollnet.node.tasks import Task
    from transformers import PreTrainedTokenizerBase

Value = TypeVar("Value")


class Recipe(BaseModel):
    """The recipe part of a job's on-chain spec, typed (hashes as 0x hex)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_name: str
    model_root: str  # content root of version 0
    model_files_hash: str  # node.model.identity: config, tokenizer, chat template, EOS set
    task_name: str
    task_config_hash: str
    max_new_tokens: int
    temperature: float
    chat_template: bool
    stop_on_eos: bool
    group_size: int
    max_staleness: int
    clip_epsilon: float
    clip_delta: float

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs for a table, in the order a reader needs them."""
        return [
            ("model", f"{_shown(self.model_name)} (root {self.model_root[:18]}…, config and tokenizer "
                      f"{self.model_files_hash[:18]}…)"),
            ("task", f"{_shown(self.task_name)} (configuration {self.task_config_hash[:18]}…)"),
            ("generation", f"up to {self.max_new_tokens} new tokens at temperature {self.temperature:g}, "
                           f"{'stop at EOS' if self.stop_on_eos else 'always full length'}, "
                           f"{'chat template' if self.chat_template else 'raw prompts'}"),
            ("GRPO", f"group {self.group_size}, ε {self.clip_epsilon:g}, δ {self.clip_delta:g}, "
                     f"max staleness {self.max_staleness}"),
        ]


def _shown(name: str) -> str:
    """A name the requester chose, safe to print: control characters escaped."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in name)


def agree(flag: str, given: Value | None, chain: Value) -> Value:
    """The chain's value, after checking that a flag given on the command line does not contradict it."""
    if given is None or given == chain:
        return chain
    raise ConfigError(f"{flag} {_shown(str(given))} contradicts the job's recipe on chain ({_shown(str(chain))}): "
                      "leave the flag out, every participant uses the chain's value")


def recipe_task(recipe: Recipe, tokenizer: PreTrainedTokenizerBase | None = None, *,
                task_flag: str | None = None) -> Task:
    """The job's task as every role must run it: the chain's task set (a `--task` flag may only repeat it),
    with the chain's configuration hash, its prompts wrapped in the tokenizer's chat template when the
    recipe says so."""
    from rollnet.node.tasks import load_task, task_config_hash
    from rollnet.node.tasks.templated import ChatTemplatedTask

    name = agree("--task", task_flag, recipe.task_name)
    task = load_task(name)
    local = "0x" + task_config_hash(task).hex()
    if local != recipe.task_config_hash:
        raise ConfigError(f"task {name!r} here has configuration {local[:18]}…, but the job pins "
                          f"{recipe.task_config_hash[:18]}…: this node's task registry or task file differs "
                          "from the requester's (same rollnet and reasoning-gym versions, same file)")
    if not recipe.chat_template:
        return task
    if tokenizer is None:
        raise ConfigError("the job's recipe applies a chat template, so its task needs the model's tokenizer")
    return ChatTemplatedTask(task, tokenizer)

"""The local asynchronous GRPO pipeline: generation and training in two processes, no chain and no p2p.

A generator process samples rollouts of a `LocalRecipe` (model folder, task, prompt format, batch, completion
limit; by default the embedded model's devnet batch) with the seeded sampler and TOPLOC proofs, as a worker
does, and a trainer process trains on them and sends each new bf16 policy back as safetensors bytes (as it would
cross a network); one torch thread each. The generator may run up to `max_ahead` versions ahead of the newest
policy it has received (0: synchronous, it waits for each). It is the market's baseline: what the same
GRPO loop trains per second when nothing but the process boundary separates the roles (`bench/efficiency.py`,
and the devnet's own efficiency).

Invariants: both processes are bounded by counts (batches, steps), never by time; the trainer's clock starts
at the first batch's arrival, so start-up is not counted; the result counts only samples trained on; both
processes build their task and settings from the same recipe.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field
from rollnet.node.model.pinned import EMBEDDED_TASK

if TYPE_CHECKING:
    from rollnet.node.tasks import Task
    from rollnet.trainer.config import GRPOConfig
    from transformers import PreTrainedTokenizerBase

PROMPTS, GROUP = 32, 8


class LocalRecipe(BaseModel):
    """What the local arms run: a model folder, its task and prompt format, the batch and the trainer's
    learning rate (default: the embedded model's devnet batch)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    folder: str
    task: str = EMBEDDED_TASK
    chat_template: bool = False
    prompts: int = Field(PROMPTS, ge=1)
    group: int = Field(GROUP, ge=2)
    max_new_tokens: int = Field(6, ge=1)
    lr: float = Field(1e-5, gt=0)

    def task_for(self, tokenizer: PreTrainedTokenizerBase) -> Task:
        from rollnet.node.tasks import load_task
        from rollnet.node.tasks.templated import ChatTemplatedTask

        task = load_task(self.task)
        return ChatTemplatedTask(task, tokenizer) if self.chat_template else task

    def config(self, max_staleness: int) -> GRPOConfig:
        from rollnet.trainer.config import GRPOConfig

        return GRPOConfig.make(max_staleness=max_staleness, prompts_per_step=self.prompts, group_size=self.group,
                               max_new_tokens=self.max_new_tokens, lr=self.lr,
                               optimizer_steps=min(4, self.prompts))


def generator(recipe: LocalRecipe, max_ahead: int, batches: int, rollouts_out: multiprocessing.Queue,
              weights_in: multiprocessing.Queue) -> None:
    import safetensors.torch
    import torch
    from rollnet.node.model.loading import load_policy
    from rollnet.node.rollout.generate import generate

    torch.set_num_threads(1)
    model, tokenizer = load_policy(Path(recipe.folder))
    task = recipe.task_for(tokenizer)
    version, seed = 0, 0

    def load(message: tuple) -> int:
        new_version, payload = message
        weights = safetensors.torch.load(payload)
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                tensor.copy_(weights[name])
        return new_version

    for sent in range(batches):
        while True:  # take every policy that has arrived; block only when too far ahead
            try:
                version = load(weights_in.get(block=sent - version > max_ahead))
            except queue.Empty:
                break
        rollouts = generate(model, tokenizer, task.examples(range(seed, seed + recipe.prompts)), recipe.group,
                            max_new_tokens=recipe.max_new_tokens, policy_version=version)
        seed += recipe.prompts
        rollouts_out.put(rollouts)


def trainer(recipe: LocalRecipe, max_staleness: int, steps: int, rollouts_in: multiprocessing.Queue,
            weights_out: multiprocessing.Queue, results: multiprocessing.Queue) -> None:
    import safetensors.torch
    import torch
    from rollnet.node.model.loading import load_policy
    from rollnet.trainer.buffer import RolloutBuffer
    from rollnet.trainer.trainer import Trainer, bf16_policy

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer = load_policy(Path(recipe.folder))
    grpo = Trainer(model, tokenizer, recipe.task_for(tokenizer), recipe.config(max_staleness))
    buffer = RolloutBuffer(recipe.group, max_staleness, model.config.vocab_size)
    trained, started, busy = 0, None, 0.0
    while grpo.version < steps:
        buffer.admit_all(rollouts_in.get())
        if started is None:
            started = time.perf_counter()  # both arms: clock from the first batch's arrival
        if buffer.ready_groups < recipe.prompts:
            continue
        began = time.perf_counter()
        report = grpo.train_on(buffer.take(recipe.prompts))
        busy += time.perf_counter() - began
        trained += report.samples
        buffer.advance(grpo.version)
        # The policy crosses the process boundary as bytes (bf16 safetensors), as it would a network.
        weights_out.put((grpo.version, safetensors.torch.save(bf16_policy(grpo.model))))
    counts = buffer.counts
    results.put({"seconds": time.perf_counter() - started, "trained_samples": trained,
                 "samples_trained_on": sum(counts.staleness.values()), "train_busy_s": busy,
                 "staleness": dict(sorted(counts.staleness.items())), "too_stale": counts.too_stale})


def run_arm(recipe: LocalRecipe | str, max_ahead: int, steps: int) -> dict:
    """Train `steps` steps of `recipe` (or the default batch on a model folder) with the generator up to
    `max_ahead` versions ahead; the trainer's result. A process that dies is an error at once, never a wait."""
    recipe = recipe if isinstance(recipe, LocalRecipe) else LocalRecipe(folder=recipe)
    context = multiprocessing.get_context("spawn")
    rollouts, weights, results = context.Queue(), context.Queue(), context.Queue()
    batches = steps + max_ahead + 1
    processes = [
        context.Process(target=generator, args=(recipe, max_ahead, batches, rollouts, weights)),
        context.Process(target=trainer, args=(recipe, max(max_ahead, 0), steps, rollouts, weights, results)),
    ]
    for process in processes:
        process.start()
    try:
        while True:
            try:
                result = results.get(timeout=1.0)
                break
            except queue.Empty:
                if processes[0].exitcode not in (None, 0):
                    raise RuntimeError("the local pipeline's generator process died") from None
                if not processes[1].is_alive():  # its result may still be on its way through the pipe
                    try:
                        result = results.get(timeout=10.0)
                        break
                    except queue.Empty:
                        raise RuntimeError("the local pipeline's trainer process died") from None
        processes[1].join(timeout=60)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()  # the generator may be waiting for a version that will never come
            process.join(timeout=10)
    return result

"""The in-process rollout source: the synchronous baseline, and a faithful simulation of staleness.

Invariants: at trainer version v the sampling policy is exactly the bf16 policy of version max(0, v - lag)
(the weights a worker `lag` broadcasts behind would hold), so every sample trained on has realised
staleness min(v, lag), recorded by the buffer; rollouts are sampled by the same seeded generator workers
use; task seeds come from one run-seeded stream, so two runs with the same seed see the same tasks.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from dataclasses import dataclass

import torch
from rollnet.node.model.builder import greedy_accuracy
from rollnet.node.rollout.generate import generate
from rollnet.trainer.buffer import RolloutBuffer
from rollnet.trainer.trainer import StepReport, Trainer, bf16_policy

HELD_OUT_PROMPTS = 200  # the held-out set's default size: tasks 10**9, 10**9 + 1, … (never training seeds)


def held_out_accuracy(trainer: Trainer, prompts: int = HELD_OUT_PROMPTS) -> float:
    """Greedy accuracy of the trainer's current policy on the first `prompts` held-out tasks, each completion
    as long as the recipe allows (the policy is left in training mode)."""
    accuracy = greedy_accuracy(trainer.model, trainer.tokenizer, trainer.task, range(10**9, 10**9 + prompts),
                               max_new_tokens=trainer.config.max_new_tokens)
    trainer.model.train()
    return accuracy


@dataclass
class LocalStep:
    report: StepReport
    sampled_reward: float
    rollouts: int
    mean_tokens: float  # completion tokens per rollout


class LocalRun:
    def __init__(self, trainer: Trainer, *, lag: int = 0, seed: int = 0):
        self.trainer = trainer
        self.lag = lag
        self.rng = random.Random(seed)
        config = trainer.config
        self.buffer = RolloutBuffer(config.group_size, config.max_staleness, trainer.model.config.vocab_size)
        self.buffer.advance(trainer.version)
        self.sampler = copy.deepcopy(trainer.model).eval()
        self._snapshots: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=lag + 1)
        self._snapshots.append((trainer.version, bf16_policy(trainer.model)))

    def sampling_version(self) -> int:
        return self._snapshots[0][0]

    def step(self) -> LocalStep:
        config = self.trainer.config
        version, weights = self._snapshots[0]
        with torch.no_grad():
            for name, tensor in self.sampler.state_dict().items():
                tensor.copy_(weights[name])
        seeds = [self.rng.randrange(0, 10**9) for _ in range(config.prompts_per_step)]
        rollouts = generate(self.sampler, self.trainer.tokenizer, [self.trainer.task.instance(s) for s in seeds],
                            config.group_size, max_new_tokens=config.max_new_tokens,
                            temperature=config.temperature, policy_version=version, prove=False)
        task = self.trainer.task
        sampled_reward = sum(task.reward(task.instance(r.task_seed), r.text) for r in rollouts) / len(rollouts)
        self.buffer.admit_all(rollouts)
        report = self.trainer.train_on(self.buffer.take(config.prompts_per_step))
        self.buffer.advance(self.trainer.version)
        if self._snapshots[-1][0] != self.trainer.version:
            self._snapshots.append((self.trainer.version, bf16_policy(self.trainer.model)))
        return LocalStep(report, sampled_reward, len(rollouts), sum(len(r.tokens) for r in rollouts) / len(rollouts))

    def held_out_accuracy(self) -> float:
        return held_out_accuracy(self.trainer)

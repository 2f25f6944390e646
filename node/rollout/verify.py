"""Check a rollout the way a validator does: one prefill over prompt + completion at the claimed policy.

Invariants: the prompt must be the task's prompt for its seed; each completion token must be the seeded
sampler's choice from the recomputed logits (within `sampling_tolerance`, for float near-ties); the TOPLOC
proofs must match the recomputed final-norm hidden states. The first failure is reported with its reason
and position or chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rollnet.node import toploc
from rollnet.node.rollout import sampler
from rollnet.node.rollout.generate import NormCapture, Rollout
from rollnet.node.tasks import Task
from transformers import PreTrainedModel, PreTrainedTokenizerFast


@dataclass(frozen=True)
class RolloutVerdict:
    ok: bool
    reason: str
    position: int | None = None


@torch.no_grad()
def verify_rollout(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, rollout: Rollout, *,
                   temperature: float = 1.0, sampling_tolerance: float = 1e-3,
                   thresholds: toploc.Thresholds = toploc.PUBLIC_THRESHOLDS) -> RolloutVerdict:
    expected_prompt = tokenizer.encode(task.instance(rollout.task_seed).prompt)
    if rollout.prompt_tokens != expected_prompt:
        return RolloutVerdict(False, "the prompt is not the task's prompt for its on-chain seed", 0)
    if not rollout.tokens:
        return RolloutVerdict(False, "empty completion", 0)
    ids = torch.tensor([rollout.prompt_tokens + rollout.tokens])
    capture = NormCapture(model)
    try:
        logits = model(input_ids=ids).logits[0]
        hidden = capture.take()[0]
    finally:
        capture.close()
    start = len(rollout.prompt_tokens) - 1
    producing = slice(start, start + len(rollout.tokens))
    claimed = torch.tensor(rollout.tokens)
    noise = sampler.noise_batch([rollout.task_seed] * len(claimed), [rollout.sample] * len(claimed),
                                list(range(len(claimed))), logits.shape[-1])
    margins = sampler.choice_margin(logits[producing], noise, temperature, claimed)
    bad = torch.nonzero(margins > sampling_tolerance).flatten()
    if len(bad):
        position = int(bad[0])
        return RolloutVerdict(False, f"token {position} is not the seeded sampler's choice "
                                     f"(margin {float(margins[position]):.4f})", position)
    verdict = toploc.verify(rollout.proofs, hidden[producing], thresholds)
    if not verdict.ok:
        return RolloutVerdict(False, f"TOPLOC: {verdict.reason}", verdict.first_failing_chunk)
    return RolloutVerdict(True, "ok")

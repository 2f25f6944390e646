"""Check rollouts the way a validator does: one prefill over prompt + completion at the claimed policy.

Invariants: the prompt must be the task's prompt for its seed; each completion token must be the seeded
sampler's choice from the recomputed logits (within `sampling_tolerance`, for float near-ties); the TOPLOC
proofs must match the recomputed final-norm hidden states. The first failure is reported with its reason
and position or chunk. Rollouts of equal length are prefilled together in one batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rollnet.node import toploc
from rollnet.node.rollout import sampler
from rollnet.node.rollout.generate import NormCapture, Rollout
from rollnet.node.tasks import Task
from transformers import PreTrainedModel, PreTrainedTokenizerFast

# Calibrated on this 2-core CPU with the default model (bench/toploc.py, BENCHMARKS.md): honest
# recomputation differs by at most 0.008 in mean mantissa and never in exponent; 1e-3 relative weight
# noise gives at least 0.087, bf16 at least 0.55, dynamic int8 at least 3.2.
CPU_THRESHOLDS = toploc.Thresholds(max_exponent_mismatches=2, max_mean_mantissa_diff=0.03,
                                   max_median_mantissa_diff=1.0)


@dataclass(frozen=True)
class RolloutVerdict:
    ok: bool
    reason: str
    position: int | None = None


@torch.no_grad()
def verify_rollouts(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, rollouts: list[Rollout],
                    *, temperature: float = 1.0, sampling_tolerance: float = 1e-3,
                    thresholds: toploc.Thresholds = CPU_THRESHOLDS) -> list[RolloutVerdict]:
    verdicts: list[RolloutVerdict | None] = [None] * len(rollouts)
    by_length: dict[int, list[int]] = {}
    for index, rollout in enumerate(rollouts):
        if rollout.prompt_tokens != tokenizer.encode(task.instance(rollout.task_seed).prompt):
            verdicts[index] = RolloutVerdict(False, "the prompt is not the task's prompt for its on-chain seed", 0)
        elif not rollout.tokens:
            verdicts[index] = RolloutVerdict(False, "empty completion", 0)
        else:
            by_length.setdefault(len(rollout.prompt_tokens) + len(rollout.tokens), []).append(index)
    capture = NormCapture(model)
    try:
        for indices in by_length.values():
            ids = torch.tensor([rollouts[i].prompt_tokens + rollouts[i].tokens for i in indices])
            # The LM head runs only where some row's completion tokens are produced (the last `keep`
            # positions); the hidden states come whole from the final norm.
            keep = 1 + max(len(rollouts[i].tokens) for i in indices)
            logits = model(input_ids=ids, logits_to_keep=keep).logits
            hidden = capture.take()
            for row, index in enumerate(indices):
                rollout = rollouts[index]
                start = len(rollout.prompt_tokens) - 1
                producing = slice(start, start + len(rollout.tokens))
                first_logit = ids.shape[1] - keep
                verdicts[index] = _check(rollout, logits[row, start - first_logit:start - first_logit
                                                         + len(rollout.tokens)], hidden[row, producing],
                                         temperature, sampling_tolerance, thresholds)
    finally:
        capture.close()
    return verdicts  # type: ignore[return-value]


def verify_rollout(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, rollout: Rollout,
                   **options: object) -> RolloutVerdict:
    return verify_rollouts(model, tokenizer, task, [rollout], **options)[0]  # type: ignore[arg-type]


def _check(rollout: Rollout, logits: torch.Tensor, hidden: torch.Tensor, temperature: float,
           sampling_tolerance: float, thresholds: toploc.Thresholds) -> RolloutVerdict:
    """`logits` and `hidden` are the recomputed ones at the positions that produced the completion."""
    claimed = torch.tensor(rollout.tokens)
    noise = sampler.noise_for_positions(rollout.task_seed, rollout.sample, len(claimed), logits.shape[-1])
    margins = sampler.choice_margin(logits, noise, temperature, claimed)
    bad = torch.nonzero(margins > sampling_tolerance).flatten()
    if len(bad):
        position = int(bad[0])
        return RolloutVerdict(False, f"token {position} is not the seeded sampler's choice "
                                     f"(margin {float(margins[position]):.4f})", position)
    verdict = toploc.verify(rollout.proofs, hidden, thresholds)
    if not verdict.ok:
        return RolloutVerdict(False, f"TOPLOC: {verdict.reason}", verdict.first_failing_chunk)
    return RolloutVerdict(True, "ok")

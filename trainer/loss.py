"""The GRPO loss with two-sided clipping, per token.

Objective per completion token (A the sequence's group-normalised advantage, r = exp(logp_θ - logp_old),
π_old the policy at the start of the optimisation step):
    A ≥ 0:  min(r, 1 + ε) · A
    A < 0:  max(min(r, δ), 1 - ε) · A        (δ = None: no cap, i.e. max(r, 1 - ε) · A)
The loss is minus the objective, averaged per token over the batch ("token") or per sequence then over
sequences ("sequence"), plus kl_coef · k3 KL to a reference (exp(ref - θ) - (ref - θ) - 1) and minus
entropy_coef · entropy. Invariant: padding (mask 0) contributes nothing to the loss or its gradient.

Accumulation hook: `normaliser` replaces the count a batch's averages divide by (its tokens for "token", its
sequences for "sequence") with a whole batch's, `batch_normaliser`; the losses, and so the gradients, of the
parts of a batch computed with it then add up exactly to the whole batch's (gradient accumulation over
micro-batches), and so do the stats `loss`, `kl` and `entropy`. The other stats stay the part's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossStats:
    loss: float
    clipped_fraction: float  # share of tokens whose gradient the clip removed
    mean_ratio: float
    max_ratio: float
    kl: float
    entropy: float


def clipped_objective(ratio: torch.Tensor, advantages: torch.Tensor, epsilon: float,
                      delta: float | None) -> torch.Tensor:
    """Per-token objective; `advantages` broadcasts against `ratio` ([B, 1] against [B, T])."""
    positive = torch.minimum(ratio, torch.full_like(ratio, 1 + epsilon)) * advantages
    capped = ratio if delta is None else torch.minimum(ratio, torch.full_like(ratio, delta))
    negative = torch.maximum(capped, torch.full_like(ratio, 1 - epsilon)) * advantages
    return torch.where(advantages >= 0, positive, negative)


def batch_normaliser(completion_lengths: list[int], normalisation: str) -> float:
    """What `_reduce` divides by for a whole batch with these completion lengths: its token count (at least 1)
    for "token", its sequence count for "sequence". Pass it as `normaliser` for each part of the batch."""
    if normalisation == "token":
        return float(max(1, sum(completion_lengths)))
    return float(len(completion_lengths))


def _reduce(values: torch.Tensor, mask: torch.Tensor, normalisation: str,
            normaliser: float | None = None) -> torch.Tensor:
    if normalisation == "token":
        count = mask.sum().clamp(min=1) if normaliser is None else normaliser
        return (values * mask).sum() / count
    per_sequence = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_sequence.mean() if normaliser is None else per_sequence.sum() / normaliser


def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              *, epsilon: float, delta: float | None, normalisation: str = "token",
              ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
              entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
              normaliser: float | None = None) -> tuple[torch.Tensor, LossStats]:
    """Loss over completion tokens: logprobs, old_logprobs, mask [B, T]; advantages [B]. `normaliser`: the
    whole batch's `batch_normaliser` when this is one part of it (see the accumulation hook above)."""
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages[:, None].to(logprobs.dtype)
    objective = clipped_objective(ratio, adv, epsilon, delta)
    loss = -_reduce(objective, mask, normalisation, normaliser)
    kl_value = torch.zeros(())
    if ref_logprobs is not None and kl_coef > 0:
        log_ref_over = ref_logprobs - logprobs
        kl_value = _reduce(torch.exp(log_ref_over) - log_ref_over - 1, mask, normalisation, normaliser)
        loss = loss + kl_coef * kl_value
    entropy_value = torch.zeros(())
    if entropy is not None:
        entropy_value = _reduce(entropy, mask, normalisation, normaliser)
        if entropy_coef > 0:
            loss = loss - entropy_coef * entropy_value
    with torch.no_grad():
        upper = torch.where(adv >= 0, ratio > 1 + epsilon, ratio < 1 - epsilon)
        if delta is not None:
            upper |= (adv < 0) & (ratio > delta)
        tokens = mask.sum().clamp(min=1)
        live = ratio[mask.bool()]
        stats = LossStats(
            loss=float(loss.detach()), clipped_fraction=float((upper & mask.bool()).sum() / tokens),
            mean_ratio=float(live.mean()) if live.numel() else 1.0,
            max_ratio=float(live.max()) if live.numel() else 1.0,
            kl=float(kl_value), entropy=float(entropy_value.detach()),
        )
    return loss, stats

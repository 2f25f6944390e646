"""Per-token log-probabilities of completions under a policy, for the loss.

Invariant: entry [b, j] is log π(completion_b[j] | prompt_b + completion_b[:j]) at temperature T, taken
from the logits at the position just before that token (exactly the positions the sampler drew from);
sequences are right-padded, and padded entries have mask 0 and log-prob 0.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def completion_logprobs(model: PreTrainedModel, prompts: list[list[int]], completions: list[list[int]],
                        *, pad_id: int, temperature: float = 1.0,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(log-probs [B, Tc], mask [B, Tc], entropy [B, Tc] or None); Tc is the longest completion."""
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    longest = max(len(c) for c in completions)
    offsets = torch.arange(longest)
    starts = torch.tensor([len(p) - 1 for p in prompts])
    mask = offsets[None, :] < torch.tensor([len(c) for c in completions])[:, None]
    positions = (starts[:, None] + offsets[None, :]).clamp(max=width - 1)
    targets = torch.tensor([c + [pad_id] * (longest - len(c)) for c in completions])
    logits = model(input_ids=ids, attention_mask=attention).logits
    picked = logits.gather(1, positions[:, :, None].expand(-1, -1, logits.shape[-1])).float() / temperature
    log_probs = torch.log_softmax(picked, dim=-1)
    token_logprobs = log_probs.gather(-1, targets[:, :, None]).squeeze(-1) * mask
    entropy = None
    if with_entropy:
        entropy = -(log_probs.exp() * log_probs).sum(-1) * mask
    return token_logprobs, mask, entropy

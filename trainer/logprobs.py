"""Per-token log-probabilities of completions under a policy, for the loss.

Invariant: entry [b, j] is log π(completion_b[j] | prompt_b + completion_b[:j]) at temperature T, taken
from the logits at the position just before that token (exactly the positions the sampler drew from);
sequences are right-padded, and padded entries have mask 0 and log-prob 0.

Memory: rows are computed in consecutive micro-batches from `microbatch.split_rows`, each right-padded only to
its own longest row, and the LM head runs only on the positions from the micro-batch's shortest prompt's last
token onwards (`logits_to_keep`, which keeps the last n positions), so no forward pass materialises more than
`microbatch.LOGIT_BUDGET` logits (a row that alone exceeds it goes alone). Without autograd that bounds the
whole call. With autograd each micro-batch's graph lives until backward, so a caller that needs the bound while
training calls this once per part from `completion_microbatches` and backpropagates each part before the next
(the trainer's gradient accumulation).
"""

from __future__ import annotations

import torch
from rollnet.node.rollout.microbatch import split_rows
from transformers import PreTrainedModel


def logit_spans(prompts: list[list[int]], completions: list[list[int]]) -> list[tuple[int, int]]:
    """Each row's [first, end) run of logit positions: from its last prompt token (which produces its first
    completion token) to the end of its sequence (a right-padded batch keeps logits up to its longest row)."""
    return [(len(p) - 1, len(p) + len(c)) for p, c in zip(prompts, completions, strict=True)]


def completion_microbatches(prompts: list[list[int]], completions: list[list[int]], vocab_size: int,
                            budget: int | None = None) -> list[list[int]]:
    """Row indices in the consecutive micro-batches `completion_logprobs` computes (default budget:
    `microbatch.LOGIT_BUDGET`)."""
    return split_rows(range(len(prompts)), logit_spans(prompts, completions), vocab_size, budget)


def completion_logprobs(model: PreTrainedModel, prompts: list[list[int]], completions: list[list[int]],
                        *, pad_id: int, temperature: float = 1.0,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(log-probs [B, Tc], mask [B, Tc], entropy [B, Tc] or None); Tc is the longest completion."""
    longest = max(len(c) for c in completions)
    mask = torch.arange(longest)[None, :] < torch.tensor([len(c) for c in completions])[:, None]
    logprob_parts, entropy_parts = [], []
    for rows in completion_microbatches(prompts, completions, model.config.vocab_size):
        token_logprobs, entropy = _microbatch_logprobs(model, [prompts[i] for i in rows],
                                                       [completions[i] for i in rows], pad_id=pad_id,
                                                       temperature=temperature, with_entropy=with_entropy)
        logprob_parts.append(_pad_columns(token_logprobs, longest))
        if entropy is not None:
            entropy_parts.append(_pad_columns(entropy, longest))
    entropy = torch.cat(entropy_parts) if with_entropy else None
    return torch.cat(logprob_parts), mask, entropy


def _microbatch_logprobs(model: PreTrainedModel, prompts: list[list[int]], completions: list[list[int]], *,
                         pad_id: int, temperature: float,
                         with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs, entropy or None), [b, this micro-batch's longest completion], from one forward pass."""
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    longest = max(len(c) for c in completions)
    offsets = torch.arange(longest)
    starts = torch.tensor([len(p) - 1 for p in prompts])
    mask = offsets[None, :] < torch.tensor([len(c) for c in completions])[:, None]
    first_kept = int(starts.min())
    positions = (starts[:, None] + offsets[None, :]).clamp(max=width - 1) - first_kept
    targets = torch.tensor([c + [pad_id] * (longest - len(c)) for c in completions])
    logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=width - first_kept).logits
    picked = logits.gather(1, positions[:, :, None].expand(-1, -1, logits.shape[-1])).float() / temperature
    del logits  # without autograd the kept logits go now; the float copy at the produced positions stays
    log_probs = torch.log_softmax(picked, dim=-1)
    token_logprobs = torch.where(mask, log_probs.gather(-1, targets[:, :, None]).squeeze(-1), 0.0)
    entropy = None
    if with_entropy:
        entropy = torch.where(mask, -(log_probs.exp() * log_probs).sum(-1), 0.0)
    return token_logprobs, entropy


def _pad_columns(values: torch.Tensor, width: int) -> torch.Tensor:
    """`values` [b, t] right-padded with zeros to [b, width]."""
    return torch.cat([values, values.new_zeros(values.shape[0], width - values.shape[1])], dim=1)

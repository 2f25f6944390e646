"""The transformers generation backend: a group of seeded completions per task, with log-probs and the
final-norm hidden states TOPLOC commits to.

Invariants: the sampled token at each step is `sampler.pick` of that step's logits; a sequence stops at
EOS or `max_new_tokens`; the hidden states committed for a completion are the final norm's outputs at the
positions that produced its tokens (the last prompt position through the second-to-last completion
position), exactly what a validator's single prefill over prompt + completion recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from rollnet.node import toploc
from rollnet.node.rollout import sampler
from rollnet.node.tasks import TaskInstance
from transformers import PreTrainedModel, PreTrainedTokenizerFast


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
    """`group_size` seeded completions for each instance, batched (prompts of one length per call)."""
    prompts = [tokenizer.encode(instance.prompt) for instance in instances]
    if len({len(p) for p in prompts}) != 1:
        return [r for group in _by_length(instances, prompts) for r in generate(
            model, tokenizer, group, group_size, max_new_tokens=max_new_tokens, temperature=temperature,
            policy_version=policy_version, policy_root=policy_root, prove=prove, ignore_eos=ignore_eos)]
    seeds = [instance.seed for instance in instances for _ in range(group_size)]
    samples = [index for _ in instances for index in range(group_size)]
    ids = torch.tensor([p for p in prompts for _ in range(group_size)])
    batch, prompt_len = ids.shape
    eos = tokenizer.eos_token_id
    capture = NormCapture(model)
    try:
        output = model(input_ids=ids, use_cache=True)
        hidden_steps = [capture.take()[:, -1]]
        logits, cache = output.logits[:, -1], output.cache
        tokens = torch.zeros(batch, 0, dtype=torch.long)
        logprobs = torch.zeros(batch, 0)
        done = torch.zeros(batch, dtype=torch.bool)
        streams = [sampler.NoiseStream(seed, sample, logits.shape[-1]) for seed, sample in zip(seeds, samples,
                                                                                               strict=True)]
        for step in range(max_new_tokens):
            noise = sampler.next_noise(streams)
            chosen = sampler.pick(logits, noise, temperature)
            chosen = torch.where(done, torch.full_like(chosen, eos), chosen)
            step_logprobs = torch.log_softmax(logits.float() / temperature, -1).gather(-1, chosen[:, None])[:, 0]
            tokens = torch.cat([tokens, chosen[:, None]], dim=1)
            logprobs = torch.cat([logprobs, step_logprobs[:, None]], dim=1)
            if not ignore_eos:
                done |= chosen == eos
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            output = model(input_ids=chosen[:, None], cache=cache, use_cache=True)
            hidden_steps.append(capture.take()[:, -1])
            logits, cache = output.logits[:, -1], output.cache
    finally:
        capture.close()
    hidden = torch.stack(hidden_steps, dim=1)  # [batch, produced steps, hidden]
    rollouts = []
    for row in range(batch):
        length = tokens.shape[1] if ignore_eos else _completion_length(tokens[row].tolist(), eos)
        rollouts.append(Rollout(
            seeds[row], samples[row], ids[row].tolist(), tokens[row, :length].tolist(),
            logprobs[row, :length].tolist(), tokenizer.decode(tokens[row, :length], skip_special_tokens=True),
            policy_version, policy_root,
        ))
    if prove:
        proofs = toploc.prove_many([hidden[row, : len(r.tokens)] for row, r in enumerate(rollouts)])
        for rollout, proof in zip(rollouts, proofs, strict=True):
            rollout.proofs = proof
    return rollouts


def _completion_length(tokens: list[int], eos: int) -> int:
    return tokens.index(eos) + 1 if eos in tokens else len(tokens)


def _by_length(instances: list[TaskInstance], prompts: list[list[int]]) -> list[list[TaskInstance]]:
    groups: dict[int, list[TaskInstance]] = {}
    for instance, prompt in zip(instances, prompts, strict=True):
        groups.setdefault(len(prompt), []).append(instance)
    return list(groups.values())

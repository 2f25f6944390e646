"""Seeded generation with the default model, and the validator-side check of each rollout."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from rollnet.node.errors import ConfigError
from rollnet.node.rollout.generate import generate
from rollnet.node.rollout.sampler import BatchNoise, SequenceNoise, noise_for_positions
from rollnet.node.rollout.verify import verify_rollout, verify_rollouts
from rollnet.node.rollout.wire import RolloutBatch
from rollnet.node.tasks import load_task
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

TASK = load_task("addition-2digit")


@pytest.fixture(scope="module")
def policy(model_home: Path) -> tuple:
    (folder,) = (model_home / "models").glob("addition-2digit-*")
    return AutoModelForCausalLM.from_pretrained(folder).eval(), PreTrainedTokenizerFast.from_pretrained(folder)


@pytest.fixture(scope="module")
def rollouts(policy: tuple) -> list:
    model, tokenizer = policy
    return generate(model, tokenizer, TASK.examples(range(300, 308)), group_size=8, max_new_tokens=6,
                    policy_version=3, policy_root="ab" * 32)


def test_groups_are_seeded_batched_and_complete(policy: tuple, rollouts: list) -> None:
    model, tokenizer = policy
    assert len(rollouts) == 64
    assert [(r.task_seed, r.sample) for r in rollouts[:9]] == [(300, i) for i in range(8)] + [(301, 0)]
    for rollout in rollouts:
        assert 1 <= len(rollout.tokens) <= 6 and len(rollout.logprobs) == len(rollout.tokens)
        assert all(lp <= 0 for lp in rollout.logprobs)
        assert rollout.tokens[-1] == tokenizer.eos_token_id or len(rollout.tokens) == 6
        assert len(rollout.proofs) == math.ceil(len(rollout.tokens) / 32)
        assert rollout.policy_version == 3 and rollout.prompt_tokens == tokenizer.encode(TASK.instance(
            rollout.task_seed).prompt)
    again = generate(model, tokenizer, TASK.examples(range(300, 302)), group_size=8, max_new_tokens=6)
    assert [r.tokens for r in again] == [r.tokens for r in rollouts[:16]]  # same seeds, same tokens
    assert len({tuple(r.tokens) for r in rollouts[:8]}) > 1  # samples of one group differ
    rewards = [TASK.reward(TASK.instance(r.task_seed), r.text) for r in rollouts]
    assert 0 < sum(rewards) < len(rewards)  # some right, some wrong: GRPO has signal


def test_honest_rollouts_verify(policy: tuple, rollouts: list) -> None:
    model, tokenizer = policy
    verdicts = [verify_rollout(model, tokenizer, TASK, r) for r in rollouts]
    assert all(v.ok for v in verdicts), [v.reason for v in verdicts if not v.ok]


def test_cheats_are_caught_with_a_reason(policy: tuple, rollouts: list) -> None:
    model, tokenizer = policy
    changed = copy.deepcopy(rollouts[0])
    changed.tokens[0] = (changed.tokens[0] + 1) % len(tokenizer)
    verdict = verify_rollout(model, tokenizer, TASK, changed)
    assert not verdict.ok and verdict.position == 0 and "seeded sampler" in verdict.reason

    other_prompt = copy.deepcopy(rollouts[0])
    other_prompt.prompt_tokens = tokenizer.encode("99+99=")
    assert "prompt" in verify_rollout(model, tokenizer, TASK, other_prompt).reason

    wrong = [r for r in rollouts if TASK.reward(TASK.instance(r.task_seed), r.text) == 0][0]
    forced = copy.deepcopy(wrong)  # the cheater writes the right answer instead of what the sampler drew
    forced.tokens = tokenizer.encode(TASK.instance(wrong.task_seed).answer) + [tokenizer.eos_token_id]
    assert not verify_rollout(model, tokenizer, TASK, forced).ok

    noisy = copy.deepcopy(model)  # a stand-in whose weights differ by 1e-3 relative noise
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in noisy.parameters():
            parameter.mul_(1 + 1e-3 * torch.randn(parameter.shape, generator=generator))
    cheap = generate(noisy, tokenizer, TASK.examples(range(300, 304)), group_size=8, max_new_tokens=6)
    verdicts = verify_rollouts(model, tokenizer, TASK, cheap)
    assert not any(v.ok for v in verdicts) and all("TOPLOC" in v.reason or "sampler" in v.reason for v in verdicts)

    stranger = AutoModelForCausalLM.from_config(model.config).eval()  # another model, same shape
    torch.manual_seed(5)
    fooled = sum(verify_rollout(stranger, tokenizer, TASK, r).ok for r in rollouts)
    assert fooled == 0


def test_mixed_prompt_lengths_batch_with_padding_and_change_nothing(policy: tuple, tmp_path: Path) -> None:
    """Left-padded prompts of four lengths in one batch give the tokens each prompt gets alone, and verify."""
    model, tokenizer = policy
    prompts = ["3+4=", "12+5=", "07+45=", "123+45=", "9+9=", "40+2="]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": p, "answer": "0"}) for p in prompts))
    task = load_task(str(path))
    together = generate(model, tokenizer, task.examples(range(6)), group_size=4, max_new_tokens=6)
    alone = [r for seed in range(6) for r in generate(model, tokenizer, [task.instance(seed)], 4, max_new_tokens=6)]
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert [r.prompt_tokens for r in together] == [r.prompt_tokens for r in alone]  # no padding leaks out
    verdicts = verify_rollouts(model, tokenizer, task, together)
    assert all(v.ok for v in verdicts), [v.reason for v in verdicts if not v.ok]


def test_batch_noise_is_the_per_sequence_noise() -> None:
    noise = BatchNoise([7, 7, 9], [0, 1, 0], vocab=5)
    drawn = torch.stack([noise.next() for _ in range(40)], dim=1)  # crosses block refills
    for row, (seed, sample) in enumerate([(7, 0), (7, 1), (9, 0)]):
        assert torch.equal(drawn[row], noise_for_positions(seed, sample, 40, 5))
    assert not torch.equal(drawn[0], drawn[1]) and torch.isfinite(drawn).all()


def test_sequence_noise_is_the_per_sequence_noise_in_any_order() -> None:
    expected = noise_for_positions(7, 1, 40, 5)
    noise = SequenceNoise(7, 1, vocab=5)
    for position in [0, 1, 1, 2, 17, 39, 3, 16, 38]:  # repeats, a skipped block, and a step back
        assert torch.equal(noise.at(position), expected[position])


def test_rollout_batches_round_trip_and_reject_malformed_files(rollouts: list) -> None:
    batch = RolloutBatch.of("addition-2digit", rollouts)
    again = RolloutBatch.from_json(batch.to_json()).to_rollouts()
    assert again == rollouts
    record = json.loads(batch.to_json())
    for mutate, complaint in [
        (lambda r: r["rollouts"][0].update(proofs=["00" * 10]), "258 bytes"),
        (lambda r: r["rollouts"][0].update(logprobs=[]), "differ in length"),
        (lambda r: r.pop("task"), "task"),
        (lambda r: r.update(schema="other"), "unknown rollout schema"),
    ]:
        broken = copy.deepcopy(record)
        mutate(broken)
        with pytest.raises(ConfigError, match=complaint):
            RolloutBatch.from_json(json.dumps(broken))
    with pytest.raises(ConfigError, match="malformed"):
        RolloutBatch.from_json("{not json")

"""Completions end exactly where generation stops, and claimed log-probs are the prefill's: attacks that rebuild
honest TOPLOC proofs for a changed completion, judged by the validator's own `check_submission`.

The attacker here holds the real model, so every proof and log-prob it submits is recomputed honestly for the
text it submits (one prefill over prompt + completion, as a validator would); only where the completion ends, or
the claimed log-probs, are wrong. Each attack is shown to pass when the recipe's bounds are not given (the hole
as it was) and to be rejected, naming the sample, when they are.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from eth_account import Account
from rollnet.node import toploc
from rollnet.node.chain.job import Lease, LeaseStatus, Outcome
from rollnet.node.p2p.objects import object_root
from rollnet.node.rollout.generate import NormCapture, Rollout, generate
from rollnet.node.rollout.submission import max_submission_bytes
from rollnet.node.rollout.verify import LOGPROB_TOLERANCE, completion_bounds_problem, verify_rollouts
from rollnet.node.tasks import load_task
from rollnet.node.worker import leased_instances, submission_bytes
from rollnet.validator.checks import Check, SubmissionContext, check_submission
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

TASK = load_task("addition-2digit")
WORKER = Account.from_key("0x" + "b" * 64)
JOB = Account.from_key("0x" + "d" * 64).address
VERSION, ROOT = 2, "ab" * 32
GROUP, TASKS, MAX_NEW = 8, 4, 6
LEASE = Lease(3, WORKER.address, LeaseStatus.VOTING, Outcome.PENDING, 0, 0, 0, VERSION, 0, b"\x07" * 32, b"")
RECIPE = {"max_new_tokens": MAX_NEW, "stop_on_eos": True, "temperature": 1.0}


@pytest.fixture(scope="module")
def policy(model_home: Path) -> tuple:
    (folder,) = (model_home / "models").glob("addition-2digit-*")
    return AutoModelForCausalLM.from_pretrained(folder).eval(), PreTrainedTokenizerFast.from_pretrained(folder)


def honest(policy: tuple, **options: object) -> list[Rollout]:
    model, tokenizer = policy
    options = {"max_new_tokens": MAX_NEW, **options}
    return generate(model, tokenizer, leased_instances(TASK, LEASE, TASKS), GROUP, policy_version=VERSION,
                    policy_root=ROOT, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def rollouts(policy: tuple) -> list[Rollout]:
    return honest(policy)


def judge(policy: tuple, rollouts: list[Rollout], **recipe: object) -> Check:
    """The validator's verdict on the signed submission of `rollouts` for the lease."""
    model, tokenizer = policy
    data = submission_bytes(JOB, LEASE, WORKER, TASK, rollouts, VERSION)
    lease = dataclasses.replace(LEASE, root=object_root(data))
    context = SubmissionContext(JOB, lease, GROUP, TASKS, bytes.fromhex(ROOT), True)
    return check_submission(data, context, TASK, model, tokenizer, **recipe)  # type: ignore[arg-type]


@torch.no_grad()
def rebuilt(policy: tuple, rollout: Rollout, tokens: list[int], temperature: float = 1.0) -> Rollout:
    """`rollout` with completion `tokens`, its TOPLOC proofs and log-probs recomputed honestly for them."""
    model, tokenizer = policy
    ids = torch.tensor([rollout.prompt_tokens + tokens])
    capture = NormCapture(model)
    try:
        logits = model(input_ids=ids).logits[0].float() / temperature
        hidden = capture.take()[0]
    finally:
        capture.close()
    start = len(rollout.prompt_tokens) - 1
    producing = slice(start, start + len(tokens))
    scaled = logits[producing]
    logprobs = (scaled.gather(-1, torch.tensor(tokens)[:, None])[:, 0] - torch.logsumexp(scaled, -1)).tolist()
    (proofs,) = toploc.prove_many([hidden[producing]])
    return dataclasses.replace(rollout, tokens=list(tokens), logprobs=logprobs, proofs=proofs,
                               text=tokenizer.decode(tokens, skip_special_tokens=True))


def replaced(rollouts: list[Rollout], index: int, rollout: Rollout) -> list[Rollout]:
    return [rollout if i == index else r for i, r in enumerate(rollouts)]


def sample_name(rollout: Rollout) -> str:
    return f"task {rollout.task_seed} sample {rollout.sample}:"


def test_the_bounds_rule_for_every_ending() -> None:
    eos, rule = 1, completion_bounds_problem
    stop = {"max_new_tokens": 4, "eos_token_ids": [eos], "stop_on_eos": True}
    for ok in ([eos], [5, eos], [5, 6, 7, eos], [5, 6, 7, 8]):
        assert rule(ok, **stop) is None, ok
    for bad, word, position in [([], "empty", 0), ([5, 6], "truncated", 1), ([5, 6, 7], "truncated", 2),
                                ([5, eos, 6], "past the EOS at token 1", 2), ([eos, eos], "past the EOS", 1),
                                ([5, eos, 6, 7], "past the EOS", 2), ([5, 6, 7, 8, eos], "more than", 4),
                                ([5, 6, 7, 8, 9], "more than", 4)]:
        reason, at = rule(bad, **stop)  # type: ignore[misc]
        assert word in reason and at == position, (bad, reason, at)
    ignore = {**stop, "stop_on_eos": False}
    for ok in ([5, 6, 7, 8], [5, eos, 6, eos], [eos] * 4):
        assert rule(ok, **ignore) is None, ok
    for bad, word in [([], "empty"), ([5, eos], "exactly max_new_tokens"), ([eos], "exactly"), ([5] * 5, "more")]:
        assert word in rule(bad, **ignore)[0], bad  # type: ignore[index]


def test_honest_rollouts_pass_with_the_recipe_and_their_log_probs_are_the_prefill_s(policy: tuple,
                                                                                   rollouts: list[Rollout]) -> None:
    model, tokenizer = policy
    assert judge(policy, rollouts, **RECIPE) == Check(True, "ok")
    verdicts = verify_rollouts(model, tokenizer, TASK, rollouts, max_new_tokens=MAX_NEW)
    assert all(v.ok for v in verdicts)
    assert max(v.max_logprob_error for v in verdicts) < LOGPROB_TOLERANCE / 10  # a wide margin
    assert any(len(r.tokens) < MAX_NEW for r in rollouts)  # some stop at EOS, which they keep as the last token
    # Without stop-on-EOS (generation's ignore_eos) honest completions are exactly max_new_tokens long, and pass.
    full = honest(policy, ignore_eos=True)
    assert all(len(r.tokens) == MAX_NEW for r in full)
    assert judge(policy, full, **{**RECIPE, "stop_on_eos": False}) == Check(True, "ok")
    # Fetchers refuse a batch declaring more bytes than the spec allows: an honest one is well inside the bound.
    assert len(submission_bytes(JOB, LEASE, WORKER, TASK, full, VERSION)) < max_submission_bytes(len(full), MAX_NEW)
    # A recipe at another temperature: the sampling and log-prob checks follow it.
    cool = honest(policy, temperature=0.5)
    assert judge(policy, cool, **{**RECIPE, "temperature": 0.5}) == Check(True, "ok")
    assert not judge(policy, cool, **RECIPE).accept


def test_a_completion_truncated_before_eos_with_rebuilt_proofs_is_rejected(policy: tuple,
                                                                           rollouts: list[Rollout]) -> None:
    index, victim = next((i, r) for i, r in enumerate(rollouts) if len(r.tokens) >= 3)
    cut = rebuilt(policy, victim, victim.tokens[:-2])  # the answer cut short, EOS dropped, proofs redone
    attack = replaced(rollouts, index, cut)
    assert judge(policy, attack) == Check(True, "ok")  # the hole: nothing knew where completions must end
    check = judge(policy, attack, **RECIPE)
    assert not check.accept and check.reason.startswith(sample_name(victim)) and "truncated" in check.reason
    # Cut short and then "ended" with an EOS: the sampling check pins that EOS was not the seeded choice there.
    ended = rebuilt(policy, victim, victim.tokens[:-2] + [policy[1].eos_token_id])
    check = judge(policy, replaced(rollouts, index, ended), **RECIPE)
    assert not check.accept and sample_name(victim) in check.reason and "seeded sampler" in check.reason


def test_sampling_past_eos_is_rejected_even_with_every_token_seeded_and_proven(policy: tuple,
                                                                               rollouts: list[Rollout]) -> None:
    model, tokenizer = policy
    eos = tokenizer.eos_token_id
    onward = honest(policy, ignore_eos=True)  # the seeded sampler's own tokens after EOS, honest proofs
    stopped = [i for i, r in enumerate(rollouts) if len(r.tokens) < MAX_NEW]
    assert stopped and all(onward[i].tokens[:len(rollouts[i].tokens)] == rollouts[i].tokens for i in stopped)
    # The attacker keeps, for each sample that stopped at EOS, whatever prefix of the continuation scores best
    # (its text skips the EOS), or at least continues one of them by one token.
    attack = list(rollouts)
    for i in stopped:
        instance = TASK.instance(rollouts[i].task_seed)
        best, best_reward = None, TASK.reward(instance, rollouts[i].text)
        for end in range(len(rollouts[i].tokens) + 1, MAX_NEW + 1):
            candidate = rebuilt(policy, rollouts[i], onward[i].tokens[:end])
            if TASK.reward(instance, candidate.text) > best_reward:
                best, best_reward = candidate, TASK.reward(instance, candidate.text)
        if best is not None:
            attack[i] = best
    if attack == rollouts:
        attack[stopped[0]] = rebuilt(policy, rollouts[stopped[0]], onward[stopped[0]].tokens[
            :len(rollouts[stopped[0]].tokens) + 1])
    changed = [r for r, h in zip(attack, rollouts, strict=True) if r is not h]
    assert all(eos in r.tokens[:-1] for r in changed)
    assert judge(policy, attack) == Check(True, "ok")  # the hole: past-EOS tokens were seeded and proven
    check = judge(policy, attack, **RECIPE)
    assert not check.accept and "continues past the EOS" in check.reason
    assert any(check.reason.startswith(sample_name(r)) for r in changed)
    # Whatever reward it gained (on the embedded model one wrong "8" continues past EOS to the right "81"),
    # the batch is rejected: the attacker is not paid for it.


def test_a_completion_longer_than_max_new_tokens_is_rejected_under_either_eos_rule(policy: tuple,
                                                                                  rollouts: list[Rollout]) -> None:
    longer = honest(policy, max_new_tokens=MAX_NEW + 2, ignore_eos=True)  # seeded, proven, too long
    index = 5
    victim = longer[index]
    attack = replaced(rollouts, index, victim)
    assert judge(policy, attack) == Check(True, "ok")  # the hole
    for stop_on_eos in (True, False):
        check = judge(policy, attack if stop_on_eos else replaced(honest(policy, ignore_eos=True), index, victim),
                      **{**RECIPE, "stop_on_eos": stop_on_eos})
        assert not check.accept and check.reason.startswith(sample_name(victim)), check.reason
        assert f"more than the recipe's max_new_tokens {MAX_NEW}" in check.reason
    # Without stop-on-EOS, a completion that stopped at EOS early is as wrong as a truncated one.
    check = judge(policy, rollouts, **{**RECIPE, "stop_on_eos": False})
    assert not check.accept and "exactly max_new_tokens" in check.reason


@pytest.mark.parametrize("shift", [5.0, -5.0, 1.5 * LOGPROB_TOLERANCE, math.nan, -math.inf])
def test_claimed_log_probs_off_the_prefill_are_rejected(policy: tuple, rollouts: list[Rollout], shift: float) -> None:
    index = 3
    victim = copy.deepcopy(rollouts[index])
    position = len(victim.tokens) - 1
    victim.logprobs[position] = (victim.logprobs[position] + shift) if math.isfinite(shift) else shift
    attack = replaced(rollouts, index, victim)
    if not math.isfinite(shift):  # the submission's JSON parser refuses NaN and infinities before any check
        check = judge(policy, attack, **RECIPE)
        assert not check.accept and "malformed rollout batch" in check.reason, check.reason
        model, tokenizer = policy  # and the log-prob check itself fails them too, whatever delivers them
        (verdict,) = verify_rollouts(model, tokenizer, TASK, [victim], max_new_tokens=MAX_NEW)
        assert not verdict.ok and "claimed log-prob" in verdict.reason and verdict.position == position
        return
    assert judge(policy, attack, **RECIPE, logprob_tolerance=None) == Check(True, "ok")  # the hole, unchecked
    check = judge(policy, attack, **RECIPE)
    assert not check.accept and check.reason.startswith(sample_name(victim)), check.reason
    assert "claimed log-prob" in check.reason and f"token {position}" in check.reason


def test_every_log_prob_shifted_by_five_is_rejected_and_honest_jitter_passes(policy: tuple,
                                                                            rollouts: list[Rollout]) -> None:
    inflated = [dataclasses.replace(r, logprobs=[lp + 5 for lp in r.logprobs]) for r in rollouts]
    check = judge(policy, inflated, **RECIPE)
    assert not check.accept and "claimed log-prob" in check.reason and check.reason.startswith(
        sample_name(rollouts[0]))
    # Within the tolerance (as another honest backend's float noise would be), the batch is accepted.
    jittered = [dataclasses.replace(r, logprobs=[lp + 0.5 * LOGPROB_TOLERANCE * (-1) ** k
                                                 for k, lp in enumerate(r.logprobs)]) for r in rollouts]
    assert judge(policy, jittered, **RECIPE) == Check(True, "ok")


def test_mismatched_log_prob_count_is_a_verdict_not_an_exception(policy: tuple, rollouts: list[Rollout]) -> None:
    model, tokenizer = policy
    short = dataclasses.replace(rollouts[0], logprobs=rollouts[0].logprobs[:-1])
    (verdict,) = verify_rollouts(model, tokenizer, TASK, [short], max_new_tokens=MAX_NEW)
    assert not verdict.ok and "log-probs for" in verdict.reason


@pytest.mark.parametrize("token", [-1, 2**40])
def test_a_token_id_no_tokenizer_can_decode_is_a_rejection_never_a_crash(policy: tuple, rollouts: list[Rollout],
                                                                         token: int) -> None:
    """A worker that put an impossible token id in a signed batch used to crash every validator drawn for it
    (the decode ran before any check), and again after each restart: its lease went void, unslashed. Now the
    batch is refused at the schema, before anything decodes it, so the attacker's lease is simply rejected."""
    model, tokenizer = policy
    data = json.loads(submission_bytes(JOB, LEASE, WORKER, TASK, rollouts, VERSION))
    data["batch"]["rollouts"][0]["tokens"][0] = token
    signed = make_signed(data)
    lease = dataclasses.replace(LEASE, root=object_root(signed))
    context = SubmissionContext(JOB, lease, GROUP, TASKS, bytes.fromhex(ROOT), True)
    check = check_submission(signed, context, TASK, model, tokenizer, **RECIPE)  # type: ignore[arg-type]
    assert not check.accept and "malformed" in check.reason and "tokens" in check.reason, check.reason


def make_signed(content: dict) -> bytes:
    """`content` re-signed by the worker, as an attacker with its own key can."""
    from eth_account.messages import encode_defunct
    from rollnet.node.rollout.submission import SubmissionHeader, _digest

    header = SubmissionHeader(**content["header"])
    signature = WORKER.sign_message(encode_defunct(primitive=_digest(header, content["batch"]))).signature.hex()
    return json.dumps({"header": content["header"], "batch": content["batch"], "signature": signature},
                      sort_keys=True, separators=(",", ":")).encode()

"""Sampled verification: each first-round member's sample, the validator's checks on it with the real default model,
and the sizing rule as the real factory on anvil applies it."""

from __future__ import annotations

import dataclasses
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
from conftest import ETH, REPO, client_for
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_utils import keccak
from rollnet.node.chain.anvil import AnvilProcess
from rollnet.node.chain.job import FactoryClient, JobClient, Lease, LeaseStatus, Outcome
from rollnet.node.config import Deployment
from rollnet.node.errors import ContractRevert
from rollnet.node.p2p.objects import object_root
from rollnet.node.rollout.generate import Rollout, generate
from rollnet.node.sampling import (
    catch_probability,
    indices_from_signature,
    sample_message,
    sampled_indices,
    samples_checked,
)
from rollnet.node.spec import explain_spec_refusal, load_job_spec
from rollnet.node.tasks import load_task
from rollnet.node.worker import leased_instances, submission_bytes
from rollnet.validator.checks import SubmissionContext, check_submission
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

TASK = load_task("addition-2digit")
WORKER = Account.from_key("0x" + "b" * 64)
JOB = Account.from_key("0x" + "d" * 64).address
VERSION, ROOT = 2, "ab" * 32
GROUP, TASKS = 4, 4
LEASE = Lease(5, WORKER.address, LeaseStatus.VOTING, Outcome.PENDING, 0, 0, 0, VERSION, 0, b"\x09" * 32, b"")
SEED = bytes.fromhex("5a" * 20)
MEMBERS = [Account.from_key("0x" + f"{i:064x}") for i in range(1, 9)]


def test_a_sample_is_m_distinct_sorted_indices_fixed_by_seed_job_lease_and_the_members_key() -> None:
    sample = sampled_indices(SEED, JOB, 7, MEMBERS[0], 64, 8)
    assert sample == sorted(set(sample)) and len(sample) == 8 and all(0 <= i < 64 for i in sample)
    assert sampled_indices(SEED, JOB, 7, MEMBERS[0], 64, 8) == sample  # the member recomputes it after a restart
    assert sampled_indices(SEED, JOB.lower(), 7, MEMBERS[0], 64, 8) == sample  # an address in any case
    others = [sampled_indices(SEED, JOB, 7, member, 64, 8) for member in MEMBERS[1:]]
    assert all(other != sample for other in others)  # each member draws its own
    assert sampled_indices(bytes.fromhex("5b" * 20), JOB, 7, MEMBERS[0], 64, 8) != sample
    assert sampled_indices(SEED, JOB, 8, MEMBERS[0], 64, 8) != sample
    assert sampled_indices(SEED, WORKER.address, 7, MEMBERS[0], 64, 8) != sample  # another job
    assert sampled_indices(SEED, JOB, 7, MEMBERS[0], 5, 9) == [0, 1, 2, 3, 4]  # more than the batch: all of it


def test_only_the_members_key_draws_its_sample_and_anyone_can_check_a_revealed_one() -> None:
    """The worker knows the seed once it is public, yet not which rollouts a member will check, so it cannot
    serve its batch only to the members whose samples miss its fakes; a revealed signature proves the sample."""
    member = MEMBERS[0]
    message = encode_defunct(primitive=sample_message(SEED, JOB, 7))
    signature = member.sign_message(message).signature
    assert Account.recover_message(message, signature=signature) == member.address
    assert indices_from_signature(bytes(signature), 64, 8) == sampled_indices(SEED, JOB, 7, member, 64, 8)
    # What a worker can compute from public data alone (the seed, the job, the lease, the member's address) is
    # no better than chance: over many leases its best guess overlaps a member's sample as often as random.
    overlaps = []
    for lease_id in range(300):
        guess = set(indices_from_signature(keccak(SEED + lease_id.to_bytes(32, "big")
                                                  + bytes.fromhex(member.address[2:])), 64, 8))
        overlaps.append(len(guess & set(sampled_indices(SEED, JOB, lease_id, member, 64, 8))))
    assert abs(sum(overlaps) / len(overlaps) - 8 * 8 / 64) < 0.25  # 1 expected by chance


def test_samples_cover_every_rollout_evenly() -> None:
    """A worker cannot find a rollout that members rarely check: over 2,000 draws of 8 of 64, every index is
    picked close to 1/8 of the time."""
    counts: Counter = Counter()
    for lease_id in range(2000):
        counts.update(sampled_indices(SEED, JOB, lease_id, MEMBERS[lease_id % len(MEMBERS)], 64, 8))
    assert set(counts) == set(range(64))
    assert all(abs(count / 2000 - 1 / 8) < 0.035 for count in counts.values()), sorted(counts.values())


def test_no_sample_without_the_round_seed() -> None:
    with pytest.raises(ValueError, match="committee seed"):
        sampled_indices(bytes(20), JOB, 1, MEMBERS[0], 64, 8)


def test_samples_checked_rounds_up_within_the_batch() -> None:
    assert samples_checked(Decimal("0.125"), 64) == 8
    assert samples_checked(Decimal("0.125"), 9) == 2
    assert samples_checked(Decimal("0.001"), 16) == 1
    assert samples_checked(Decimal(1), 16) == 16
    with pytest.raises(ValueError):
        samples_checked(Decimal(0), 16)
    assert catch_probability(1 / 64, 8, 3) == pytest.approx(1 - (63 / 64) ** 24)


# ------------------------------------------------------------------ the checks on a member's sample, real model

@pytest.fixture(scope="module")
def policy(model_home: Path) -> tuple:
    (folder,) = (model_home / "models").glob("addition-2digit-*")
    return AutoModelForCausalLM.from_pretrained(folder).eval(), PreTrainedTokenizerFast.from_pretrained(folder)


def _judge(policy: tuple, rollouts: list[Rollout], audit: list[int] | None):
    model, tokenizer = policy
    data = submission_bytes(JOB, LEASE, WORKER, TASK, rollouts, VERSION)
    lease = dataclasses.replace(LEASE, root=object_root(data))
    context = SubmissionContext(JOB, lease, GROUP, TASKS, bytes.fromhex(ROOT), True)
    return check_submission(data, context, TASK, model, tokenizer, max_new_tokens=6, audit=audit)


def test_a_member_catches_a_fake_only_if_its_sample_holds_it(policy: tuple) -> None:
    """One rollout of 16 faked (another rollout's completion, claimed as sampled for this prompt, with the
    original's proofs): a sample holding its index rejects it by name, one without it accepts, and a full
    audit (an appeal round) rejects it."""
    model, tokenizer = policy
    rollouts = generate(model, tokenizer, leased_instances(TASK, LEASE, TASKS), GROUP, max_new_tokens=6,
                        policy_version=VERSION, policy_root=ROOT)
    assert _judge(policy, rollouts, None).accept
    order = {(instance.seed, s): t * GROUP + s
             for t, instance in enumerate(leased_instances(TASK, LEASE, TASKS)) for s in range(GROUP)}
    victim = next(i for i, r in enumerate(rollouts)
                  if any(o.tokens != r.tokens and len(o.tokens) == len(r.tokens) for o in rollouts))
    donor = next(o for o in rollouts if o.tokens != rollouts[victim].tokens
                 and len(o.tokens) == len(rollouts[victim].tokens))
    faked = list(rollouts)
    faked[victim] = dataclasses.replace(rollouts[victim], tokens=list(donor.tokens), text=donor.text)
    index = order[(faked[victim].task_seed, faked[victim].sample)]
    others = [i for i in range(GROUP * TASKS) if i != index]

    caught = _judge(policy, faked, [index, others[0]])
    assert not caught.accept
    assert caught.reason.startswith(f"task {faked[victim].task_seed} sample {faked[victim].sample}:"), caught.reason
    assert _judge(policy, faked, others[:4]).accept  # this member's sample missed it
    assert not _judge(policy, faked, None).accept  # an appeal round verifies everything
    # What needs no model is checked on every rollout, sampled or not: a rollout for another task's prompt.
    other = next(r for r in rollouts if r.prompt_tokens != rollouts[victim].prompt_tokens)
    wrong_prompt = list(rollouts)
    wrong_prompt[victim] = dataclasses.replace(rollouts[victim], prompt_tokens=list(other.prompt_tokens))
    refused = _judge(policy, wrong_prompt, others[:4])
    assert not refused.accept and "not the task's prompt" in refused.reason, refused.reason


# ------------------------------------------------------------------ the sizing rule on the real factory

def _spec_tuple(requester: str, **changes: object) -> tuple:
    return load_job_spec(REPO / "examples" / "job.toml").model_copy(update=changes).to_abi(requester)


def test_the_factory_stores_the_sample_size_and_refuses_a_slash_a_cheat_would_outweigh(
        market: Deployment, anvil: AnvilProcess) -> None:
    requester = client_for(anvil, 0)
    factory = FactoryClient(requester, market.factory)
    job = JobClient(requester, factory.create_job(_spec_tuple(requester.address, sampled_fraction=Decimal("0.1"),
                                                               detectable_cheat_fraction=Decimal("0.015625")), ETH))
    spec = job.spec()
    assert (spec.samples_checked, spec.min_cheat_ppm, spec.rollouts_per_lease) == (7, 15_625, 64)  # ceil(6.4)
    # A lease pays 64 x 0.02 = 1.28 ETH; the slash is 1 ETH: faking the whole batch would pay 0.28 ETH.
    with pytest.raises(ContractRevert) as refused:
        factory.validate(_spec_tuple(requester.address, reward_per_sample_eth=Decimal("0.02")))
    assert refused.value.error_name == "CheatNotDeterred"
    assert refused.value.error_args["cheatPpm"] == 1_000_000
    assert refused.value.error_args["gain"] - refused.value.error_args["expectedSlash"] == 28 * 10**16
    message = str(explain_spec_refusal(refused.value.error_name, refused.value.error_args, "job.toml"))
    assert "a cheat on 100% of a batch would pay" in message and "\n" not in message
    # Any sample at all deters every fraction once the slash exceeds a lease's pay (P(c) >= c).
    factory.validate(_spec_tuple(requester.address, sampled_fraction=Decimal("0.001"),
                                 detectable_cheat_fraction=Decimal("0.000001")))

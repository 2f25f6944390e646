"""Everything a validator checks about one submitted batch, in order, stopping at the first failure.

Invariant: a batch is accepted only if every check holds: the bytes are available and hash to the root
on chain; the submission parses; its header names this job, this lease, the lease holder and the version
on chain; it is signed by the lease holder, who is an active staked worker; its policy root is the one
the trainer published for that version; its rollouts are exactly group_size samples of each leased task
(seeds from the chain), no more and no others; every claimed reward equals the one recomputed from the
completion tokens; every completion is within the recipe's bounds (ends exactly at EOS or at its max new
tokens), asks for the task's prompt of its seed and claims one log-prob per token; and each audited rollout
passes the seeded-sampling, TOPLOC and claimed log-prob checks at the claimed version and the recipe's
generation settings (see `rollnet.node.rollout.verify`). The audited
rollouts are all of them, or the member's sample (`rollnet.node.sampling`, indices in lease order): the
checks above it cost no model and always cover the whole batch, only the model's checks are sampled. A
rejection says which check failed and why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

from eth_account.signers.local import LocalAccount
from rollnet.node.chain.job import ChainSpec, Lease
from rollnet.node.model.identity import model_eos_token_ids
from rollnet.node.p2p.objects import object_root
from rollnet.node.recipe import Recipe
from rollnet.node.rollout.submission import SubmissionError, parse_submission
from rollnet.node.rollout.verify import (
    LOGPROB_TOLERANCE,
    completion_bounds_problem,
    structural_problem,
    verify_rollouts,
)
from rollnet.node.sampling import sampled_indices
from rollnet.node.tasks import Task
from rollnet.node.worker import leased_instances
from transformers import PreTrainedModel, PreTrainedTokenizerFast

log = logging.getLogger(__name__)

DATA_UNAVAILABLE = "rollout data unavailable within the deadline"
POLICY_UNAVAILABLE = "the claimed policy version was unavailable within the deadline"


def is_unavailability(reason: str | None) -> bool:
    """Whether a rejection says only that this validator could not obtain the data or the policy."""
    return bool(reason) and reason.startswith((DATA_UNAVAILABLE, POLICY_UNAVAILABLE))


@dataclass(frozen=True)
class Check:
    accept: bool
    reason: str


def reject(reason: str) -> Check:
    return Check(False, reason)


@dataclass(frozen=True)
class SubmissionContext:
    """What the chain says about the submission being checked."""

    job: str
    lease: Lease
    group_size: int
    tasks_per_lease: int
    policy_root: bytes  # the trainer's published root for lease.policy_version
    worker_active: bool


def check_submission(data: bytes | None, context: SubmissionContext, task: Task, model: PreTrainedModel,
                     tokenizer: PreTrainedTokenizerFast, *, temperature: float = 1.0, max_new_tokens: int | None = None,
                     eos_token_ids: Collection[int] | None = None, stop_on_eos: bool = True,
                     logprob_tolerance: float | None = LOGPROB_TOLERANCE,
                     audit: Collection[int] | None = None) -> Check:
    """The recipe's generation settings (temperature, max new tokens, the EOS set, stop on EOS) are what the
    rollouts are checked against; without `max_new_tokens` completion lengths go unchecked. `audit` (indices
    in lease order: rollout t x group_size + s is sample s of the lease's task t) limits the model's checks to
    those rollouts; None audits every one."""
    lease = context.lease
    if data is None:
        return reject(DATA_UNAVAILABLE)
    if object_root(data) != lease.root:
        return reject("the fetched bytes do not hash to the root submitted on chain")
    try:
        submission = parse_submission(data)
        batch = submission.rollout_batch()
        signer = submission.signer()
    except SubmissionError as exc:
        return reject(str(exc))
    header = submission.header
    if header.job.lower() != context.job.lower() or header.lease_id != lease.lease_id:
        return reject(f"the submission is for job {header.job} lease {header.lease_id}, not this lease")
    if header.worker.lower() != lease.worker.lower() or signer.lower() != lease.worker.lower():
        return reject(f"signed by {signer}, not by the lease holder {lease.worker}")
    if not context.worker_active:
        return reject("the worker has no active worker stake")
    if header.policy_version != lease.policy_version or batch.policy_version != lease.policy_version:
        return reject(f"claims policy version {batch.policy_version}, the chain says {lease.policy_version}")
    if batch.policy_root.lower().removeprefix("0x") != context.policy_root.hex():
        return reject("the policy root is not the one published for that version")
    if batch.task != task.name:
        return reject(f"rollouts for task {batch.task!r}, the job's task is {task.name!r}")
    position = {(instance.seed, s): t * context.group_size + s
                for t, instance in enumerate(leased_instances(task, lease, context.tasks_per_lease))
                for s in range(context.group_size)}
    expected = set(position)
    got = [(r.task_seed, r.sample) for r in batch.rollouts]
    if len(got) != len(set(got)) or set(got) != expected:
        return reject("the rollouts are not exactly group_size samples of each leased task")
    vocab = model.config.vocab_size
    if any(not 0 <= t < vocab for r in batch.rollouts for t in r.prompt_tokens + r.tokens):
        return reject("token ids outside the model's vocabulary")
    if max_new_tokens is not None:  # before any decoding: an over-long completion costs the validator nothing
        eos_token_ids = model_eos_token_ids(model, tokenizer) if eos_token_ids is None else eos_token_ids
        for record in batch.rollouts:
            problem = completion_bounds_problem(record.tokens, max_new_tokens=max_new_tokens,
                                                eos_token_ids=eos_token_ids, stop_on_eos=stop_on_eos)
            if problem is not None:
                reason, position = problem
                return reject(f"task {record.task_seed} sample {record.sample}: {reason} (at {position})")
    for record in batch.rollouts:
        recomputed = task.reward(task.instance(record.task_seed), tokenizer.decode(record.tokens,
                                                                                  skip_special_tokens=True))
        if record.reward is not None and abs(record.reward - recomputed) > 1e-9:
            return reject(f"task {record.task_seed} sample {record.sample}: claimed reward {record.reward}, "
                          f"recomputed {recomputed}")
    rollouts = batch.to_rollouts()
    if audit is not None:  # the model's checks on the sample; the checks that need no model on every rollout
        for rollout in rollouts:
            problem = structural_problem(rollout, tokenizer, task, max_new_tokens=max_new_tokens,
                                         eos_token_ids=eos_token_ids, stop_on_eos=stop_on_eos)
            if problem is not None:
                return reject(f"task {rollout.task_seed} sample {rollout.sample}: {problem.reason}"
                              + (f" (at {problem.position})" if problem.position is not None else ""))
        audited = set(audit)
        rollouts = [r for r in rollouts if position[(r.task_seed, r.sample)] in audited]
    verdicts = verify_rollouts(model, tokenizer, task, rollouts, temperature=temperature,
                               max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids, stop_on_eos=stop_on_eos,
                               logprob_tolerance=logprob_tolerance)
    for rollout, verdict in zip(rollouts, verdicts, strict=True):
        if not verdict.ok:
            return reject(f"task {rollout.task_seed} sample {rollout.sample}: {verdict.reason}"
                          + (f" (at {verdict.position})" if verdict.position is not None else ""))
    return Check(True, "ok")


def judge_batch(data: bytes | None, context: SubmissionContext, task: Task, model: PreTrainedModel,
                tokenizer: PreTrainedTokenizerFast, recipe: Recipe, audit: Collection[int] | None) -> Check:
    """`check_submission` at the job's recipe (temperature, completion limit, EOS rule), with anything that still
    breaks a check turned into a rejection naming the exception: the checks refuse malformed input by name, so
    what remains is the batch's doing, and must cost a vote, never the validator."""
    try:
        return check_submission(data, context, task, model, tokenizer, temperature=recipe.temperature,
                                max_new_tokens=recipe.max_new_tokens, stop_on_eos=recipe.stop_on_eos, audit=audit)
    except (ValueError, OverflowError, IndexError, TypeError, KeyError) as exc:
        log.warning("lease %d: the batch broke a check (%s: %s)", context.lease.lease_id, type(exc).__name__, exc)
        return Check(False, f"the batch breaks the validator's checks ({type(exc).__name__})")


def member_audit(spec: ChainSpec, job: str, lease_id: int, round_: int, member: LocalAccount,
                 round_seed: Callable[[], bytes]) -> list[int] | None:
    """The rollouts (lease order) `member` verifies with the model: its own sample in round 0 of a sampled job,
    else all (None). `round_seed` reads the round-0 committee seed; a seed lost unstored (nobody can vote that
    round) means every rollout."""
    rollouts, samples = spec.rollouts_per_lease, spec.samples_checked
    if round_ > 0 or samples >= rollouts:
        return None
    seed = round_seed()
    if not any(seed):
        return None
    return sampled_indices(seed, job, lease_id, member, rollouts, samples)

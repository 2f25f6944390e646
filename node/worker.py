"""The rollout worker's job for one lease: the leased tasks from their on-chain seeds, seeded and proven
rollouts at the current policy, a signed submission stored for peers to fetch, and its root on chain.

Invariant: the tasks are exactly the lease's (task i's seed is keccak(leaseSeed, i), read from the
chain, never chosen by the worker); the root submitted on chain is the object root of the stored bytes,
so anyone fetching that root gets exactly what was signed.
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_account.signers.local import LocalAccount
from rollnet.node.chain.job import JobClient, Lease
from rollnet.node.p2p.objects import ObjectStore
from rollnet.node.rollout.generate import Rollout, generate
from rollnet.node.rollout.submission import SubmissionHeader, make_submission
from rollnet.node.rollout.wire import RolloutBatch
from rollnet.node.tasks import Task, TaskInstance, seed_from_bytes
from transformers import PreTrainedModel, PreTrainedTokenizerFast


def leased_instances(task: Task, lease: Lease, tasks_per_lease: int) -> list[TaskInstance]:
    return [task.instance(seed_from_bytes(lease.task_seed(i))) for i in range(tasks_per_lease)]


@dataclass(frozen=True)
class SubmittedLease:
    lease_id: int
    root: bytes
    data: bytes
    rollouts: list[Rollout]


def submission_bytes(job: str, lease: Lease, worker: LocalAccount, task: Task, rollouts: list[Rollout],
                     policy_version: int, rewards: list[float] | None = None) -> bytes:
    """The signed submission of `rollouts` for `lease` (rewards claimed as given, else recomputed)."""
    if rewards is None:
        rewards = [task.reward(task.instance(r.task_seed), r.text) for r in rollouts]
    header = SubmissionHeader(job=job, lease_id=lease.lease_id, worker=worker.address, policy_version=policy_version)
    return make_submission(header, RolloutBatch.of(task.name, rollouts, rewards), worker).to_bytes()


def work_lease(job: JobClient, lease: Lease, worker: LocalAccount, task: Task, model: PreTrainedModel,
               tokenizer: PreTrainedTokenizerFast, store: ObjectStore, *, policy_version: int, policy_root: str,
               max_new_tokens: int = 6) -> SubmittedLease:
    spec = job.spec()
    rollouts = generate(model, tokenizer, leased_instances(task, lease, spec["tasks_per_lease"]), spec["group_size"],
                        max_new_tokens=max_new_tokens, policy_version=policy_version, policy_root=policy_root)
    data = submission_bytes(job.address, lease, worker, task, rollouts, policy_version)
    root = store.put(data)
    job.submit(lease.lease_id, root, policy_version)
    return SubmittedLease(lease.lease_id, root, data, rollouts)

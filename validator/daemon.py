"""The validator daemon's loop for one job: follow submissions on chain, fetch, judge, sign, gossip, vote.

Invariants (with the store's): every BatchSubmitted event is recorded exactly once and judged exactly
once; a verdict is signed and handed to `publish` (the signed verdict envelope, for gossip) as soon as it
is written, before any block; votes go out in `attestBatch` transactions, and before each one the chain is
asked whether this validator already voted, so a crash at any point neither loses nor duplicates a vote;
chain errors back off and retry rather than skip. A decision that contradicts this validator's verdict,
on a lease it did not vote on, is challenged with the bond inside the window; once a challenge of its own
is resolved as overturned, it slashes every validator who voted the losing way (the Schelling incentive).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from eth_account.signers.local import LocalAccount
from rollnet.node.chain.job import JobClient, LeaseStatus
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.errors import ChainUnavailable
from rollnet.node.tasks import Task
from rollnet.node.verdicts import seal_verdict
from rollnet.validator.checks import SubmissionContext, check_submission
from rollnet.validator.store import ValidatorStore
from transformers import PreTrainedModel, PreTrainedTokenizerFast

log = logging.getLogger(__name__)

PolicySource = Callable[[int], tuple[PreTrainedModel, PreTrainedTokenizerFast]]
Fetcher = Callable[[bytes, str], bytes | None]  # (root, worker address) -> the bytes, or None if unavailable


@dataclass
class RoundReport:
    new_submissions: int = 0
    judged: int = 0
    attested: int = 0
    challenged: int = 0
    slashed_voters: int = 0


class ValidatorDaemon:
    def __init__(self, job: JobClient, registry: RegistryClient, account: LocalAccount, task: Task,
                 policies: PolicySource, fetch: Fetcher, store: ValidatorStore,
                 publish: Callable[[bytes], None] | None = None, retries: int = 5, backoff_s: float = 0.5):
        self.job = job
        self.registry = registry
        self.account = account
        self.task = task
        self.policies = policies
        self.fetch = fetch
        self.store = store
        self.publish = publish
        self.retries = retries
        self.backoff_s = backoff_s
        self.spec = self._retrying(job.spec)

    def _retrying(self, call: Callable, *args: object) -> object:
        """Run a chain call, backing off while the chain is unavailable."""
        delay = self.backoff_s
        for attempt in range(self.retries):
            try:
                return call(*args)
            except ChainUnavailable as exc:
                if attempt == self.retries - 1:
                    raise
                log.warning("chain unavailable (%s); retrying in %.1f s", exc, delay)
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def follow_events(self) -> int:
        """Record BatchSubmitted events since the cursor; returns how many were new."""
        client = self.job.client
        head = self._retrying(client.block_number)
        start = self.store.cursor(self.job.address) + 1
        if head < start:
            return 0
        logs = self._retrying(client.events, self.job.contract, "BatchSubmitted", start, head)
        rows = [(log_["args"]["leaseId"], bytes(log_["args"]["root"]), log_["args"]["worker"],
                 log_["args"]["policyVersion"]) for log_ in logs]
        before = len(self.store.all(self.job.address))
        self.store.record_events(self.job.address, rows, head)
        return len(self.store.all(self.job.address)) - before

    def judge_pending(self) -> int:
        judged = 0
        for pending in self.store.unjudged(self.job.address):
            lease = self._retrying(self.job.lease, pending.lease_id)
            context = SubmissionContext(
                job=self.job.address, lease=lease, group_size=self.spec["group_size"],
                tasks_per_lease=self.spec["tasks_per_lease"],
                policy_root=self._retrying(self.job.policy_root, lease.policy_version),
                worker_active=self._retrying(self.registry.is_active, lease.worker, Role.WORKER),
            )
            model, tokenizer = self.policies(lease.policy_version)
            data = self.fetch(lease.root, lease.worker)
            check = check_submission(data, context, self.task, model, tokenizer)
            self.store.record_verdict(self.job.address, pending.lease_id, check.accept, check.reason)
            log.info("lease %d: %s (%s)", pending.lease_id, "accept" if check.accept else "reject", check.reason)
            if self.publish is not None:
                self.publish(seal_verdict(self.job.address, pending.lease_id, lease.root, check.accept,
                                          check.reason, self.account))
            judged += 1
        return judged

    def attest_pending(self) -> int:
        """Vote on every judged, unattested lease this validator has not voted on yet (one transaction)."""
        pending = self.store.unattested(self.job.address)
        already, votes = [], {}
        for row in pending:
            voted = self._retrying(self.job.has_voted, row.lease_id, self.account.address)
            lease = self._retrying(self.job.lease, row.lease_id)
            if voted or lease.status is not LeaseStatus.SUBMITTED:
                already.append(row.lease_id)  # voted before a crash, or decided/lapsed without us
            else:
                votes[row.lease_id] = bool(row.accept)
        if votes:
            self._retrying(self.job.attest_batch, votes)
        self.store.mark_attested(self.job.address, already + list(votes))
        return len(votes)

    def challenge_wrong_decisions(self) -> int:
        """Challenge (with the bond) every decision that contradicts this validator's verdict, where it did
        not vote (a voter may not challenge) and the challenge window is still open."""
        challenged = 0
        now = self._retrying(self._chain_time)
        for row in self.store.all(self.job.address):
            if row.accept is None:
                continue
            lease = self._retrying(self.job.lease, row.lease_id)
            if lease.status not in (LeaseStatus.ACCEPTED, LeaseStatus.REJECTED) or now > lease.deadline:
                continue
            if (lease.status is LeaseStatus.ACCEPTED) == row.accept:
                continue
            if self._retrying(self.job.has_voted, row.lease_id, self.account.address):
                continue
            log.warning("lease %d was decided %s against our verdict (%s): challenging", row.lease_id,
                        lease.status.name.lower(), row.reason)
            self._retrying(self.job.challenge, row.lease_id, self.spec["challenge_bond"])
            challenged += 1
        return challenged

    def slash_losing_voters(self) -> int:
        """After a challenge of ours overturned a decision, slash each validator who voted the losing way
        (their stake goes to the challenger)."""
        slashed = 0
        for row in self.store.all(self.job.address):
            state = self._retrying(self.job.challenge_state, row.lease_id)
            if state.challenger.lower() != self.account.address.lower() or not (state.resolved and state.overturned):
                continue
            losing_vote = 1 if state.original_accepted else 2
            for validator in self._retrying(self.job.voters, row.lease_id):
                if self._retrying(self.job.vote_of, row.lease_id, validator) == losing_vote:
                    self._retrying(self.job.slash_voter, row.lease_id, validator)
                    slashed += 1
        return slashed

    def _chain_time(self) -> int:
        return self.job.client.w3.eth.get_block("latest")["timestamp"]

    def run_once(self) -> RoundReport:
        report = RoundReport(new_submissions=self.follow_events())
        report.judged = self.judge_pending()
        report.attested = self.attest_pending()
        report.challenged = self.challenge_wrong_decisions()
        report.slashed_voters = self.slash_losing_voters()
        return report

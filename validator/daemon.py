"""The validator daemon's loop for one job: follow submissions on chain, fetch, judge, sign, gossip, vote.

Invariants (with the store's): every BatchSubmitted event is recorded exactly once and judged exactly
once; a verdict is signed and handed to `publish` (the signed verdict envelope, for gossip) as soon as it
is written, before any block; data that cannot be fetched is retried for the first half of the vote
window before it counts as withheld; votes go out in `attestBatch` transactions, and before each one the chain is
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
from rollnet.node.errors import ChainUnavailable, PolicyUnavailable
from rollnet.node.events import EventLog
from rollnet.node.ledger import CHALLENGED, CLOSED, OPEN, SubmissionLedger
from rollnet.node.p2p.fetch import Fetcher
from rollnet.node.tasks import Task
from rollnet.node.verdicts import seal_verdict
from rollnet.validator.checks import SubmissionContext, check_submission
from transformers import PreTrainedModel, PreTrainedTokenizerFast

log = logging.getLogger(__name__)

PolicySource = Callable[[int], tuple[PreTrainedModel, PreTrainedTokenizerFast]]


@dataclass
class RoundReport:
    new_submissions: int = 0
    judged: int = 0
    attested: int = 0
    challenged: int = 0
    slashed_voters: int = 0


class ValidatorDaemon:
    def __init__(self, job: JobClient, registry: RegistryClient, account: LocalAccount, task: Task,
                 policies: PolicySource, fetch: Fetcher, store: SubmissionLedger,
                 publish: Callable[[bytes], None] | None = None, retries: int = 5, backoff_s: float = 0.5,
                 events: EventLog | None = None):
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
        self.events = events or EventLog(None)
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
            try:
                model, tokenizer = self.policies(lease.policy_version)
            except PolicyUnavailable as exc:
                log.info("lease %d waits for policy version %d: %s", pending.lease_id, lease.policy_version, exc)
                continue  # judged once the delta arrives (or the lease lapses): never rejected for our lag
            data = self.fetch(lease.root, lease.worker)
            if data is None and self._retrying(self._chain_time) < lease.deadline - self.spec["vote_window"] // 2:
                log.info("lease %d: data not available yet; retrying next round", pending.lease_id)
                continue  # a busy or restarting worker gets half the vote window before "unavailable" counts
            check = check_submission(data, context, self.task, model, tokenizer)
            self.store.record_verdict(self.job.address, pending.lease_id, check.accept, check.reason)
            log.info("lease %d: %s (%s)", pending.lease_id, "accept" if check.accept else "reject", check.reason)
            self.events.emit("verdict", lease=pending.lease_id, worker=lease.worker, version=lease.policy_version,
                             accept=check.accept, reason=check.reason)
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
            receipt = self._retrying(self.job.attest_batch, votes)
            self.events.emit("attest", leases=list(votes), gas=receipt["gasUsed"])
        self.store.mark_attested(self.job.address, already + list(votes))
        return len(votes)

    def challenge_wrong_decisions(self) -> int:
        """Challenge (with the bond) every decision that contradicts this validator's verdict, where it did
        not vote (a voter may not challenge) and the challenge window is still open. Rows with nothing left
        to do are closed, so each round reads only undecided leases."""
        challenged = 0
        now = self._retrying(self._chain_time)
        for row in self.store.in_stage(self.job.address, OPEN):
            lease = self._retrying(self.job.lease, row.lease_id)
            if lease.status in (LeaseStatus.LEASED, LeaseStatus.SUBMITTED):
                continue  # not decided yet
            decided = lease.status in (LeaseStatus.ACCEPTED, LeaseStatus.REJECTED) and now <= lease.deadline
            against_us = (lease.status is LeaseStatus.ACCEPTED) != row.accept
            if not (decided and against_us) or self._retrying(self.job.has_voted, row.lease_id,
                                                               self.account.address):
                self.store.set_stage(self.job.address, row.lease_id, CLOSED)
                continue
            log.warning("lease %d was decided %s against our verdict (%s): challenging", row.lease_id,
                        lease.status.name.lower(), row.reason)
            self._retrying(self.job.challenge, row.lease_id, self.spec["challenge_bond"])
            self.store.set_stage(self.job.address, row.lease_id, CHALLENGED)
            self.events.emit("challenge", lease=row.lease_id, worker=lease.worker)
            challenged += 1
        return challenged

    def slash_losing_voters(self) -> int:
        """After a challenge of ours overturned a decision, slash each validator who voted the losing way
        (their stake goes to the challenger)."""
        slashed = 0
        for row in self.store.in_stage(self.job.address, CHALLENGED):
            state = self._retrying(self.job.challenge_state, row.lease_id)
            if state.challenger.lower() != self.account.address.lower() or not state.resolved:
                continue
            if state.overturned:
                losing_vote = 1 if state.original_accepted else 2
                for validator in self._retrying(self.job.voters, row.lease_id):
                    if self._retrying(self.job.vote_of, row.lease_id, validator) == losing_vote:
                        self._retrying(self.job.slash_voter, row.lease_id, validator)
                        self.events.emit("slash_voter", lease=row.lease_id, validator=validator)
                        slashed += 1
            self.store.set_stage(self.job.address, row.lease_id, CLOSED)
        return slashed

    def _chain_time(self) -> int:
        return self.job.client.latest_timestamp()

    def run_once(self) -> RoundReport:
        report = RoundReport(new_submissions=self.follow_events())
        report.judged = self.judge_pending()
        report.attested = self.attest_pending()
        report.challenged = self.challenge_wrong_decisions()
        report.slashed_voters = self.slash_losing_voters()
        return report

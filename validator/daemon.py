"""The validator daemon's loop for one job: follow submissions and appeals on chain, find the rounds this
validator was drawn for, and there fetch, judge, sign, gossip and vote; appeal a round it lost; after the
final outcome slash the losing voters, penalize absent members and collect its rewards.

Invariants (with the ledger's and the lease book's):
- Every BatchSubmitted and Appealed event is recorded exactly once. The chain is followed through the lease
  book (`rollnet.node.lease_book`), so a pass makes a fixed number of requests to learn what changed, and
  reads a lease only where this validator has work on it: its committee draw, its judgement, its vote.
- A lease is fetched and judged only if this validator sits on one of its rounds' committees (the contract
  says so: `memberWeight`), so verification work grows with committee size, not with the number of
  validators.
- A verdict is judged once, signed and handed to `publish` (for gossip) as soon as it is written, before
  any block. A drawn member judges its round even if the round was decided before it could vote (a lucky
  minority may decide a sampled round at once), so that it can appeal it.
- Data or a policy that cannot be obtained is waited for during the first half of the round's vote (or
  appeal) window before it counts against the worker.
- In round 0 a member verifies with the model only its own sample of the batch (`rollnet.node.sampling`:
  its signature over the round's committee seed, which the worker can neither know in advance nor compute
  afterwards); in appeal rounds, every rollout. A sampled accept is judged again in full when an appeal
  round draws this validator, and is never voted in such a round nor grounds for an appeal (a sample proves
  no batch good; the wronged worker appeals its own rejection).
- Votes go out in `voteBatch` transactions, and before each one the chain is asked whether this validator
  already voted in that round, so a crash at any point neither loses nor duplicates a vote.
- A decision that contradicts this validator's verdict (unless that verdict was a rejection for lack of
  data, or a sampled accept) is appealed while appeals remain. Keeper chores are done in this validator's
  turn (`keeper_turn`). Chain errors back off and retry rather than skip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eth_account.signers.local import LocalAccount
from rollnet.node.chain.job import JobClient, Lease, LeaseStatus, Outcome
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.committee import CommitteeView
from rollnet.node.errors import ChainUnavailable, ContractRevert, PolicyUnavailable
from rollnet.node.events import EventLog
from rollnet.node.keeper import KEEPER_GRACE_S, Keeper, appeal_deadline, appealable, current_outcome
from rollnet.node.lease_book import LeaseBook, LeaseEntry
from rollnet.node.ledger import Pending, SubmissionLedger
from rollnet.node.p2p.fetch import Fetcher
from rollnet.node.tasks import Task
from rollnet.node.verdicts import seal_verdict
from rollnet.validator.checks import (
    POLICY_UNAVAILABLE,
    SubmissionContext,
    is_unavailability,
    judge_batch,
    member_audit,
)
from transformers import PreTrainedModel, PreTrainedTokenizerFast

log = logging.getLogger(__name__)

PolicySource = Callable[[int], tuple[PreTrainedModel, PreTrainedTokenizerFast]]


@dataclass
class RoundReport:
    new_submissions: int = 0
    drawn: int = 0
    judged: int = 0
    attested: int = 0
    appealed: int = 0
    slashed_voters: int = 0
    penalized: int = 0


class ValidatorDaemon:
    def __init__(self, job: JobClient, registry: RegistryClient, account: LocalAccount, task: Task,
                 policies: PolicySource, fetch: Fetcher, store: SubmissionLedger,
                 publish: Callable[[bytes], None] | None = None, retries: int = 5, backoff_s: float = 0.5,
                 events: EventLog | None = None, appeals: bool = True, from_block: int = 0,
                 book_path: Path | None = None, keeper_grace_s: int = KEEPER_GRACE_S,
                 prefetch: Callable[[bytes, str], object] | None = None):
        self.job = job
        self.registry = registry
        self.account = account
        self.task = task
        self.policies = policies
        self.fetch = fetch
        self.prefetch = prefetch  # starts fetching a batch in the background once this validator is drawn for it
        self.store = store
        self.publish = publish
        self.retries = retries
        self.backoff_s = backoff_s
        self.events = events or EventLog(None)
        self.appeals = appeals
        self.spec = self._retrying(job.spec)
        self.keeper = Keeper(job, self.events, self.spec)
        self.keeper_grace_s = keeper_grace_s
        self.book = LeaseBook(job, from_block, book_path)
        self.committees = CommitteeView(job, registry, from_block)
        self.book.align(store.cursor(job.address))
        self._finished: dict[int, LeaseEntry] = {}  # leases the book saw end, until the next settling pass
        self._enlisted = False
        self._leases: dict[int, Lease] = {}  # this round's reads of the chain: each lease read once per round
        self._now: int | None = None

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

    @property
    def me(self) -> str:
        return self.account.address

    def _chain_time(self) -> int:
        if self._now is None:
            self._now = self.job.client.now()
        return self._now

    def _lease(self, lease_id: int) -> Lease:
        """The lease as read once this round (our own transactions on it forget the read)."""
        if lease_id not in self._leases:
            self._leases[lease_id] = self._retrying(self.job.lease, lease_id)
        return self._leases[lease_id]

    def follow_events(self) -> int:
        """Fold the job's new events into the lease book (from its cursor, at first the deployment block, in
        bounded block ranges with one request each), recording each range's BatchSubmitted and Appealed events
        in the ledger before the book moves past it; returns how many submissions were new."""
        new = 0

        def record_range(end: int, logs: list) -> None:
            nonlocal new
            rows = [(e["args"]["leaseId"], bytes(e["args"]["root"]), e["args"]["worker"],
                     e["args"]["policyVersion"]) for e in logs if e["event"] == "BatchSubmitted"]
            appeals = [(e["args"]["leaseId"], e["args"]["round"]) for e in logs if e["event"] == "Appealed"]
            new += self.store.record_events(self.job.address, rows, end, appeals=appeals)

        update = self._retrying(self.book.poll, record_range)
        self._finished.update((entry.lease_id, entry) for entry in update.finished)
        self._now = self.book.now
        return new

    def _view(self, lease_id: int) -> Lease | LeaseEntry:
        """The lease as the book describes it (no request), else as read from the chain once this round."""
        return self._finished.get(lease_id) or self.book.get(lease_id) or self._lease(lease_id)

    def find_membership(self) -> int:
        """For each open lease whose current round's committee is not known to this ledger yet, work out whether
        this validator sits on it: from the book's entry as the contract would (`rollnet.node.committee`: no
        request per lease), or, where the book cannot say (a lease it no longer holds), by asking the contract."""
        drawn = 0
        for row in self.store.undrawn(self.job.address):
            lease = self._view(row.lease_id)
            weight = None
            if isinstance(lease, LeaseEntry):
                weight = self._retrying(self.committees.weight, lease, row.round, self.me, self.book.head)
            if weight is None:  # a lease the book no longer holds, or whose round start it never saw
                weight = self._retrying(self.job.member_weight, row.lease_id, row.round, self.me)
            self.store.set_membership(self.job.address, row.lease_id, row.round, weight)
            if weight:
                if self.prefetch is not None:
                    self.prefetch(row.root, row.worker)
                drawn += 1
                self.events.emit("drawn", lease=row.lease_id, round=row.round, weight=weight)
        return drawn

    def judge_pending(self) -> int:
        judged = 0
        now = self._retrying(self._chain_time)
        for pending in self.store.to_judge(self.job.address):
            lease = self._lease(pending.lease_id)
            if lease.round != pending.round:
                continue  # the ledger has not followed an appeal yet
            voting = lease.status is LeaseStatus.VOTING and now <= lease.deadline
            contest_until = appeal_deadline(lease, self.spec)
            if not voting and not appealable(lease, now, self.spec):
                continue  # too late to vote or to appeal; a later round may draw us again
            patient = (now < lease.deadline - self.spec.vote_window // 2 if voting
                       else now < contest_until - self.spec.appeal_window // 2)
            context = SubmissionContext(
                job=self.job.address, lease=lease, group_size=self.spec.group_size,
                tasks_per_lease=self.spec.tasks_per_lease,
                policy_root=self._retrying(self.job.policy_root, lease.policy_version),
                worker_active=self._retrying(self.registry.is_active, lease.worker, Role.WORKER),
            )
            try:
                model, tokenizer = self.policies(lease.policy_version)
            except PolicyUnavailable as exc:
                if patient:
                    log.info("lease %d waits for policy version %d: %s", pending.lease_id, lease.policy_version, exc)
                    continue  # judged once the delta arrives: a policy we lag behind is not the worker's fault
                self._record(pending, lease, False, f"{POLICY_UNAVAILABLE} ({exc})")
                judged += 1
                continue
            fetch_started = time.perf_counter()
            data = self.fetch(lease.root, lease.worker)
            fetch_s = time.perf_counter() - fetch_started
            if data is None and patient:
                log.info("lease %d: data not available yet; retrying next round", pending.lease_id)
                continue  # a busy or restarting worker gets half the vote window before "unavailable" counts
            audit = self._audit(pending)
            verify_started = time.perf_counter()
            # every rollout is checked against the chain's generation settings
            check = judge_batch(data, context, self.task, model, tokenizer, self.spec.recipe, audit)
            self._record(pending, lease, check.accept, check.reason, audit,
                         timings={"fetch_s": round(fetch_s, 4),
                                  "verify_s": round(time.perf_counter() - verify_started, 4)})
            judged += 1
        return judged

    def _audit(self, pending: Pending) -> list[int] | None:
        """The rollouts (lease order) this member verifies with the model (`member_audit`)."""
        return member_audit(self.spec, self.job.address, pending.lease_id, pending.round, self.account,
                            lambda: self._retrying(self.job.round_seed, pending.lease_id, 0))

    def _record(self, pending: Pending, lease: object, accept: bool, reason: str,
                audit: list[int] | None = None, timings: dict[str, float] | None = None) -> None:
        audited = None if audit is None else len(audit)
        self.store.record_verdict(self.job.address, pending.lease_id, accept, reason, audited)
        log.info("lease %d: %s (%s)", pending.lease_id, "accept" if accept else "reject", reason)
        self.events.emit("verdict", lease=pending.lease_id, worker=lease.worker, version=lease.policy_version,
                         round=lease.round, accept=accept, reason=reason,
                         checked=self.spec.rollouts_per_lease if audited is None else audited, **(timings or {}))
        if self.publish is not None:
            self.publish(seal_verdict(self.job.address, pending.lease_id, lease.root, accept, reason, self.account))

    def attest_pending(self) -> int:
        """Vote on every judged lease whose current round drew us and that we have not voted in (one transaction).
        Each lease is read afresh here: judging may have taken long enough for a round to be decided and appealed,
        and a vote cast into the wrong round (a sampled accept in an appeal round) would be slashable."""
        self._leases = {}
        now = self._retrying(self._chain_time)
        done, votes = [], {}
        for row in self.store.to_vote(self.job.address):
            lease = self._lease(row.lease_id)
            voted = row.round in self._retrying(self.job.ballot, row.lease_id, self.me)
            if voted or lease.round != row.round or lease.status is not LeaseStatus.VOTING or now > lease.deadline:
                done.append(row)  # voted before a crash, or the round closed without us
            else:
                votes[row.lease_id] = (bool(row.accept), row.round)
        if votes:
            receipt = self._retrying(self.job.vote_batch, {i: accept for i, (accept, _) in votes.items()})
            self.events.emit("attest", leases=list(votes), rounds=[r for _, r in votes.values()],
                             gas=receipt["gasUsed"])
        for row in done:
            self.store.mark_voted(self.job.address, row.lease_id, row.round)
        for lease_id, (_, round_) in votes.items():
            self.store.mark_voted(self.job.address, lease_id, round_)
            self._leases.pop(lease_id, None)
        return len(votes)

    def appeal_lost_rounds(self) -> int:
        """Appeal (with the round's bond) a current decision against this validator's verdict on the batch
        (judged when it sat on one of the lease's committees), unless that verdict was a rejection for lack
        of data (another member may have fetched what we could not)."""
        if not self.appeals:
            return 0
        appealed = 0
        now = self._retrying(self._chain_time)
        for row in self.store.contestable(self.job.address):  # a verdict of ours on the whole batch, or a reject
            if is_unavailability(row.reason):
                continue  # only "we could not get the data"
            lease = self._view(row.lease_id)
            if not appealable(lease, now, self.spec):
                continue
            outcome = current_outcome(self.job, lease, now)
            if outcome is (Outcome.ACCEPT if row.accept else Outcome.REJECT):
                continue
            try:
                self._retrying(self.job.appeal, row.lease_id)
            except ContractRevert as exc:
                log.info("lease %d: appeal refused (%s)", row.lease_id, exc.error_name)
                continue
            self._leases.pop(row.lease_id, None)
            log.warning("lease %d: round %d decided %s against our verdict (%s): appealed", row.lease_id,
                        lease.round, outcome.name.lower(), row.reason)
            self.events.emit("appeal", lease=row.lease_id, round=lease.round + 1, against=outcome.name.lower(),
                             worker=lease.worker)
            appealed += 1
        return appealed

    def settle_and_collect(self, report: RoundReport) -> None:
        """Keeper chores on open leases, each in this validator's turn; once a lease is final: slash its losing
        voters, penalize absent members of rounds that ran to their deadline, collect our rewards, and close
        the row. The book describes each lease; only a lease it no longer holds (it ended before a restart) is
        read from the chain."""
        now = self._retrying(self._chain_time)
        settled, closed = [], 0
        rows = self.store.open_rows(self.job.address)
        still_open = {row.lease_id for row in rows}
        for row in rows:
            lease = self._view(row.lease_id)
            if not lease.final:
                if isinstance(lease, LeaseEntry):
                    self.keeper.act_in_turn(lease, now, self.keeper_grace_s)
                else:
                    self.keeper.act(lease, now)
                continue
            if row.voted_round >= 0 and lease.status is not LeaseStatus.RETURNED:
                entry = lease if isinstance(lease, LeaseEntry) else None
                from_block = lease.anchor_block if isinstance(lease, Lease) else lease.submit_block
                report.slashed_voters += self.keeper.slash_losers(row.lease_id, from_block=from_block, entry=entry)
                report.penalized += self.keeper.penalize_absentees(lease, self._validators)
                settled.append(row.lease_id)
            self.store.close(self.job.address, row.lease_id)
            still_open.discard(row.lease_id)
            closed += 1
        self._finished.clear()  # every open row was read: what is left ended without a row (never submitted)
        for entry in self.book.open_leases():  # everyone's keeper of last resort: expired leases, dead workers
            if entry.lease_id not in still_open:
                self.keeper.act_in_turn(entry, now, self.keeper_grace_s)
        if closed:
            self.keeper.collect(settled)

    def _validators(self) -> list[str]:
        """The validators enlisted in this job (as its events say): only they answer for absence."""
        return list(self.book.enlisted)

    def enlist(self) -> None:
        """Follow this job (once): from the next block on, this validator answers for absence here."""
        if self._enlisted:
            return
        if not self._retrying(self.job.is_enlisted, self.me):
            self._retrying(self.job.enlist)
            self.events.emit("enlist", job=self.job.address)
        self._enlisted = True

    def run_once(self) -> RoundReport:
        self._leases, self._now = {}, None
        self.enlist()
        report = RoundReport(new_submissions=self.follow_events())
        report.drawn = self.find_membership()
        report.judged = self.judge_pending()
        report.attested = self.attest_pending()
        report.appealed = self.appeal_lost_rounds()
        self.settle_and_collect(report)
        return report

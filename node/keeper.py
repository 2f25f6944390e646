"""Chores anyone may do on a job, shared by every role: return expired leases, settle leases whose outcome is
final, slash the voters who voted against a final outcome, collect rewards and withdraw pay; and the one rule
for when an honest worker appeals its own batch's round (`own_batch_appeal`).

Every function takes a lease read from the chain (`Lease`) or as the events describe it (`LeaseEntry`, from
the one lease follower, `rollnet.node.lease_book`): given an entry, nothing is read again from the chain
except what no event states (a member's weight).

Invariants: an action is sent only when the chain's own rules allow it at the latest block's time (`due`
mirrors TrainingJob's deadlines: a vote window that passed counts as closed, its appeal window counted
from the vote deadline; the final round settles at once), so a keeper never pays for a revert it could
foresee; a race lost to another keeper (a ContractRevert) is harmless and ignored; everything owed is
pulled by its owner (`collect`), never pushed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from eth_utils import keccak
from rollnet.node.chain.job import SETTLED_STATUSES, ChainSpec, JobClient, Lease, LeaseStatus, Outcome
from rollnet.node.errors import ContractRevert
from rollnet.node.events import EventLog
from rollnet.node.lease_book import LeaseEntry

log = logging.getLogger(__name__)
KEEPER_GRACE_S = 10  # chain seconds between the turns of a lease's worker, its voters and everyone else


LeaseView = Lease | LeaseEntry


def due(lease: LeaseView, now: int, spec: ChainSpec) -> str | None:
    """The keeper action the chain allows on `lease` at time `now`: 'reclaim', 'finalize' or None."""
    final_round = lease.round >= spec.appeal_rounds
    if lease.status is LeaseStatus.LEASED and now > lease.deadline:
        return "reclaim"
    if lease.status is LeaseStatus.VOTING and now > lease.deadline:
        return "finalize" if final_round or now > lease.deadline + spec.appeal_window else None
    if lease.status is LeaseStatus.DECIDED and (final_round or now > lease.deadline):
        return "finalize"
    return None


def due_since(lease: LeaseView, spec: ChainSpec) -> int:
    """The chain time from which `due` allows the lease's next keeper action (meaningful only while it has one)."""
    final_round = lease.round >= spec.appeal_rounds
    if lease.status is LeaseStatus.VOTING:
        return lease.deadline + 1 + (0 if final_round else spec.appeal_window)
    if lease.status is LeaseStatus.DECIDED and final_round:
        return lease.deadline  # the final round's decision time: due at once
    return lease.deadline + 1


def keeper_turn(lease: LeaseView, address: str, spec: ChainSpec, grace_s: int) -> int:
    """When `address` takes its turn at the lease's due keeper action: the lease's worker (paid by it) at once,
    the lease's voters (rewarded by it) from `grace_s` later, anyone else from `2 * grace_s` later; within
    each group, turns are spread over `grace_s` by a hash of (lease, address), so voters do not all send the
    same transaction in the same block. So a live market settles each lease with about one transaction,
    however many participants watch it, and a dead worker's leases still settle."""
    start = due_since(lease, spec)
    if address.lower() == lease.worker.lower():
        return start
    spread = int.from_bytes(keccak(lease.lease_id.to_bytes(32, "big") + bytes.fromhex(address[2:]))[:8], "big")
    offset = spread * grace_s // 2**64  # 0 .. grace_s - 1
    if isinstance(lease, LeaseEntry) and any(address in ballots for ballots in lease.votes.values()):
        return start + grace_s + offset
    return start + 2 * grace_s + offset


def appealable(lease: LeaseView, now: int, spec: ChainSpec) -> bool:
    """Whether the lease's current decision (or closed vote window) can still be appealed at `now`."""
    if lease.round >= spec.appeal_rounds:
        return False
    if lease.status is LeaseStatus.DECIDED:
        return now <= lease.deadline
    return lease.status is LeaseStatus.VOTING and lease.deadline < now <= lease.deadline + spec.appeal_window


def appeal_deadline(lease: LeaseView, spec: ChainSpec) -> int | None:
    """Until when the lease's current decision can be appealed (None while its votes are open or once final)."""
    if lease.round >= spec.appeal_rounds:
        return None
    if lease.status is LeaseStatus.DECIDED:
        return lease.deadline
    return lease.deadline + spec.appeal_window if lease.status is LeaseStatus.VOTING else None


def final_outcome(job: JobClient, lease: LeaseView, now: int, spec: ChainSpec) -> Outcome | None:
    """The lease's outcome once nothing can change it any more (settled, the final round decided, or an
    appeal window passed unused), else None; an expired lease counts as void."""
    settled = {LeaseStatus.PAID: Outcome.ACCEPT, LeaseStatus.SLASHED: Outcome.REJECT,
               LeaseStatus.LAPSED: Outcome.VOID, LeaseStatus.RETURNED: Outcome.VOID}
    if lease.status in settled:
        return settled[lease.status]
    if due(lease, now, spec) == "finalize":
        return current_outcome(job, lease, now)
    return None


def own_batch_appeal(job: JobClient, lease: LeaseEntry, now: int, spec: ChainSpec,
                     drew_nobody: Callable[[LeaseEntry], bool]) -> Outcome | None:
    """The outcome an honest worker appeals on its own batch, or None: a rejection; or a void round, if somebody
    voted in it, or if nobody was drawn to (a larger committee is drawn afresh). A void round whose drawn members
    stayed away is left: a larger committee of the same absent validators would only burn the bond."""
    if not appealable(lease, now, spec):
        return None
    outcome = current_outcome(job, lease, now)
    if outcome is Outcome.REJECT:
        return outcome
    if outcome is Outcome.VOID and (lease.voted(lease.round) or drew_nobody(lease)):
        return outcome
    return None


def current_outcome(job: JobClient, lease: LeaseView, now: int) -> Outcome:
    """The lease's current round's outcome, counting a passed vote window as closed."""
    if lease.status is LeaseStatus.VOTING and now > lease.deadline:
        if isinstance(lease, LeaseEntry):
            return lease.round_outcome(lease.round)
        return job.outcome_of(lease.lease_id)
    return lease.outcome


class Keeper:
    def __init__(self, job: JobClient, events: EventLog, spec: ChainSpec | None = None):
        self.job = job
        self.events = events
        self.spec = spec or job.spec()

    def act(self, lease: LeaseView, now: int) -> str | None:
        """Do whatever the chain allows on `lease` now; returns the action taken."""
        action = due(lease, now, self.spec)
        if action is None:
            return None
        try:
            getattr(self.job, action)(lease.lease_id)
        except ContractRevert as exc:
            log.info("lease %d: %s lost a race (%s)", lease.lease_id, action, exc.error_name)
            return None
        self.events.emit(action, lease=lease.lease_id, worker=lease.worker, status=lease.status.name.lower())
        return action

    def act_in_turn(self, lease: LeaseView, now: int, grace_s: int) -> str | None:
        """`act`, once this account's turn at the lease's due action has come (`keeper_turn`)."""
        if due(lease, now, self.spec) is None or now < keeper_turn(lease, self.job.client.address, self.spec, grace_s):
            return None
        return self.act(lease, now)

    def slash_losers(self, lease_id: int, from_block: int = 0, entry: LeaseEntry | None = None) -> int:
        """Slash every voter who voted against a settled lease's final outcome (each once; a sampled first round's
        accepts of a rejected batch are not slashable); returns how many. Its votes come from `entry` (the lease
        follower's, once final), else from its Voted events from `from_block` (its submission block, when known)."""
        if entry is not None and entry.final:
            status, outcome = entry.status, entry.outcome
            votes = [(round_, voter, accept) for round_, ballots in entry.votes.items()
                     for voter, accept in ballots.items()]
        else:
            lease = self.job.lease(lease_id)
            status, outcome = lease.status, lease.outcome
            votes = [(v["round"], v["validator"], v["accept"]) for v in self.job.votes(lease_id, from_block=from_block)]
        if status not in SETTLED_STATUSES or outcome not in (Outcome.ACCEPT, Outcome.REJECT):
            return 0
        accepted = outcome is Outcome.ACCEPT
        # TrainingJob.slashLoser: a sampled first round's accept of a batch finally rejected was in good faith.
        sampled_first = self.spec.samples_checked < self.spec.rollouts_per_lease
        losers = dict.fromkeys(voter for round_, voter, accept in votes if accept != accepted
                               and not (sampled_first and not accepted and round_ == 0))
        slashed = 0
        for voter in losers:
            try:
                self.job.slash_loser(lease_id, voter)
            except ContractRevert:
                continue  # already slashed by another keeper
            self.events.emit("slash_loser", lease=lease_id, voter=voter)
            slashed += 1
        return slashed

    def penalize_absentees(self, lease: LeaseView, candidates: Callable[[], Iterable[str]]) -> int:
        """Penalize every drawn member among `candidates()` (asked only if needed: the job's enlisted validators)
        who did not vote in a round of `lease` that ran to its deadline (rounds decided early ask nothing more of
        their members); returns how many. Given an entry, its rounds and ballots come from the events."""
        penalized = 0
        members: list[str] | None = None
        for round_ in range(lease.round + 1):
            if isinstance(lease, LeaseEntry):
                drawn, total = round_ in lease.totals, lease.totals.get(round_, 0)
                leading = max(lease.weights.get(round_, [0, 0]))
            else:
                state = self.job.round(lease.lease_id, round_)
                drawn, total, leading = state.drawn, state.total_weight, max(state.accept_weight, state.reject_weight)
            if not drawn or 2 * leading > total:
                continue
            members = list(candidates()) if members is None else members
            for member in members:
                if member.lower() == lease.worker.lower() or self._voted(lease, round_, member):
                    continue
                if not self.job.member_weight(lease.lease_id, round_, member):
                    continue
                try:
                    self.job.penalize_absent(lease.lease_id, round_, member)
                except ContractRevert:
                    continue  # already penalized
                self.events.emit("penalize_absent", lease=lease.lease_id, round=round_, member=member)
                penalized += 1
        return penalized

    def _voted(self, lease: LeaseView, round_: int, member: str) -> bool:
        if isinstance(lease, LeaseEntry):
            return member in lease.votes.get(round_, {})
        return round_ in self.job.ballot(lease.lease_id, member)

    def collect(self, lease_ids: Iterable[int]) -> int:
        """Claim this account's rewards from settled leases (what reached their pools since its last claim), then
        withdraw everything owed; returns wei withdrawn."""
        me = self.job.client.address
        for lease_id in lease_ids:
            if self.job.reward_of(lease_id, me) > 0:
                try:
                    self.job.claim_reward(lease_id)
                    self.events.emit("claim_reward", lease=lease_id)
                except ContractRevert:
                    pass
        owed = self.job.owed(me)
        if owed:
            self.job.withdraw_payment()
            self.events.emit("withdraw", wei=owed)
        return owed


@dataclass
class AppealRewards:
    """An account's share of the winners' pools of its own leases that settled after an appeal round.

    Invariant: a pool fills only as its losers are slashed and its absent members penalized, so a worker whose
    appeals won slashes the losing voters itself before it claims (their stakes are its reward), then claims
    again, for `watch_s` chain seconds, whatever others' penalties add; what it is entitled to is never left
    behind because it claimed too early."""

    keeper: Keeper
    watch_s: int = 6 * KEEPER_GRACE_S
    _settled: list[LeaseEntry] = field(default_factory=list)
    _until: dict[int, int] = field(default_factory=dict)  # lease -> chain time until which its pool is watched

    def note(self, entry: LeaseEntry) -> None:
        """A lease of this account's that the lease book saw become final."""
        if entry.round > 0:  # appealed (by its worker, or by anyone): an appellant's reward may be owed
            self._settled.append(entry)

    @property
    def pending(self) -> bool:
        return bool(self._settled or self._until)

    def collect(self, now: int) -> int:
        """Slash the losers of newly settled leases this account's appeals won, claim what reached the pools of
        the leases still watched, and withdraw everything owed; returns wei withdrawn."""
        for entry in self._settled:
            if entry.outcome is Outcome.ACCEPT:
                self.keeper.slash_losers(entry.lease_id, entry=entry)
            self._until[entry.lease_id] = now + self.watch_s
        self._settled.clear()
        withdrawn = self.keeper.collect(sorted(self._until))
        self._until = {lease_id: until for lease_id, until in self._until.items() if until >= now}
        return withdrawn

"""The rollout worker's job for one lease: the leased tasks from their on-chain seeds, seeded and proven
rollouts at the current policy, a signed submission stored for peers to fetch, and its root on chain.

Invariant: the tasks are exactly the lease's (task i's seed is keccak(leaseSeed, i), where the lease seed
is drawn on chain from the claim block's hash after the claim, never chosen by the worker); the root
submitted on chain is the object root of the stored bytes, so anyone fetching that root gets exactly what
was signed.

The continuous loop (`WorkerLoop`) generates only with a policy it holds whose root matches the chain's, and never
with one older than the job's staleness bound allows (it waits for the next delta instead); it claims (and draws
seeds for) its next leases and submits its batches on background lanes (`rollnet.node.lease_lanes`), so on a chain
with real block times its transactions share blocks and generation never waits for a receipt; it keeps at most its
in-flight window of leases claimed or waiting for their committees (`rollnet.node.in_flight`: as many as keep
generation busy, halved when its batches arrive at the staleness budget's edge; back-pressure, since when
validators fall behind new batches would only grow stale in their queue), claims no more than the trainer's latest
demand leaves unclaimed (`rollnet.node.demand`: beyond it, batches would reach the trainer too stale to train on),
and claims only while its free stake covers another lease's collateral. It follows the chain through its lease book
(`rollnet.node.lease_book`: only its own leases' events, a fixed number of requests per pass, however many leases
are in flight), and does the keeper chores of its own leases (validators, who follow every lease, do everyone's in
their turn); an honest worker appeals a rejection of its own batch, or a void round in which somebody voted or
nobody was drawn (`keeper.own_batch_appeal`), while appeals remain, and once its appeals won, slashes the losing
voters and claims its share of their stakes (`AppealRewards`). Every claim, submission, appeal and keeper action is
one event in its log.
Keeper duties anyone may do (return expired leases to the queue, settle leases whose outcome is final)
keep the market moving when a participant dies; a lost race for them is harmless.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from eth_account.signers.local import LocalAccount
from rollnet.node.chain.job import ChainSpec, JobClient, Lease, LeaseStatus
from rollnet.node.chain.registry import RegistryClient
from rollnet.node.committee import CommitteeView, drew_nobody
from rollnet.node.demand import unclaimed
from rollnet.node.errors import ChainUnavailable, ContractRevert, RollnetError, TransactionNotSent
from rollnet.node.events import EventLog
from rollnet.node.in_flight import InFlightWindow
from rollnet.node.keeper import KEEPER_GRACE_S, AppealRewards, Keeper, own_batch_appeal
from rollnet.node.lease_book import LeaseBook, LeaseEntry
from rollnet.node.lease_lanes import Claimed, LeaseLanes
from rollnet.node.p2p.objects import ObjectStore, object_root
from rollnet.node.policy_sync import PolicyFollower
from rollnet.node.rollout.backend import PolicyEngine, RolloutBackend
from rollnet.node.rollout.generate import Rollout
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


@dataclass(frozen=True)
class Tamper:
    """How a demonstration cheater departs from honest work (the devnet's `--cheater`); honest by default."""

    model: Callable[[PreTrainedModel], PreTrainedModel] = lambda model: model  # applied by a TransformersEngine
    rollouts: Callable[[list[Rollout]], list[float] | None] = lambda rollouts: None  # claimed rewards, or recompute
    withhold: bool = False


HONEST = Tamper()
IDLE_REVERTS = ("InsufficientEscrow", "JobClosed", "InsufficientActiveStake", "NotActive")
# A submission refused because the lease is no longer this worker's to submit: too stale, expired, or returned.
LOST_LEASE_REVERTS = ("StalePolicy", "LeaseExpired", "WrongStatus", "NotLeaseHolder")
# Demonstration cheats by name; empty unless the devnet's cheater module registered them (see rollnet.devnet.cheats).
TAMPERS: dict[str, Callable[[PreTrainedTokenizerFast], Tamper]] = {}
log = logging.getLogger(__name__)


def claim_with_seed(job: JobClient, timeout_s: float = 60.0, poll_s: float = 0.2,
                    timings: dict[str, float] | None = None,
                    on_claim: Callable[[Lease], None] = lambda lease: None) -> Lease:
    """Claim a lease and draw its prompt seed once the claim block is in the past (on an idle chain that
    needs another block: anvil mines one per transaction, so the draw itself comes next). `on_claim` hears of
    the lease as soon as the claim is mined. `timings`, if given, gets the seconds of the claim (`claim_s`)
    and of waiting for and drawing the seed (`seed_wait_s`)."""
    started = time.perf_counter()
    lease = job.claim()
    claimed = time.perf_counter()
    on_claim(lease)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            # After an outage, the draw may have been mined although its result never reached us: look first.
            drawn = lease if lease.seed_drawn else job.draw_seed(lease.lease_id)
            if timings is not None:
                timings.update(claim_s=claimed - started, seed_wait_s=time.perf_counter() - claimed)
            return drawn
        except (ContractRevert, ChainUnavailable) as exc:
            if isinstance(exc, ContractRevert) and exc.error_name == "SeedAlreadyDrawn":
                # Anyone may draw a lease's seed (it is the claim block's hash either way): someone did.
                return job.client.through_outage(partial(job.lease, lease.lease_id))
            retry = isinstance(exc, ChainUnavailable) or exc.error_name == "RandomnessNotReady"
            if not retry or time.monotonic() > deadline:
                raise
            time.sleep(poll_s)
            if isinstance(exc, ChainUnavailable):
                lease = job.client.through_outage(partial(job.lease, lease.lease_id))


def submit_through_outage(job: JobClient, lease_id: int, root: bytes, policy_version: int) -> None:
    """Submit a prepared batch's root, sending it afresh while the chain's outage keeps it from being signed (up to
    the client's outage bound). The batch is work already done: dropping it to an outage would leave its lease to
    expire, costing its holder the expiry fee and the pay. Once signed, the client itself rides out an outage
    with the same bytes; nothing here ever signs a second copy."""
    job.client.through_outage(lambda: job.submit(lease_id, root, policy_version), retry_on=TransactionNotSent)


def prepare_batch(job: JobClient, lease: Lease, worker: LocalAccount, task: Task, backend: RolloutBackend,
                  store: ObjectStore, *, policy_version: int, policy_root: str, delay_s: float = 0.0,
                  tamper: Tamper = HONEST, timings: dict[str, float] | None = None) -> SubmittedLease:
    """Generate and prove one lease's batch exactly as the job's on-chain recipe says (length, temperature,
    EOS), so the validators check what the worker did; sign it and store it for peers. `timings`, if given,
    gets the seconds of generation with its proofs (`generate_s`) and of signing and storing (`store_s`)."""
    if not lease.seed_drawn:
        raise RollnetError(f"lease {lease.lease_id} has no prompt seed yet: draw it first (claim_with_seed)")
    spec = job.spec()
    recipe = spec.recipe
    started = time.perf_counter()
    rollouts = backend.generate(leased_instances(task, lease, spec.tasks_per_lease), spec.group_size,
                                max_new_tokens=recipe.max_new_tokens, temperature=recipe.temperature,
                                policy_version=policy_version, policy_root=policy_root,
                                ignore_eos=not recipe.stop_on_eos)
    generated = time.perf_counter()
    data = submission_bytes(job.address, lease, worker, task, rollouts, policy_version, tamper.rollouts(rollouts))
    root = object_root(data) if tamper.withhold else store.put(data)
    if delay_s:
        time.sleep(delay_s)  # slower hardware: the policy ages while the batch is produced
    if timings is not None:
        timings.update(generate_s=generated - started, store_s=time.perf_counter() - generated)
    return SubmittedLease(lease.lease_id, root, data, rollouts)


def work_lease(job: JobClient, lease: Lease, worker: LocalAccount, task: Task, backend: RolloutBackend,
               store: ObjectStore, *, policy_version: int, policy_root: str, delay_s: float = 0.0,
               tamper: Tamper = HONEST, timings: dict[str, float] | None = None) -> SubmittedLease:
    """`prepare_batch`, then its root submitted on chain (`timings` also gets the transaction's `submit_s`)."""
    done = prepare_batch(job, lease, worker, task, backend, store, policy_version=policy_version,
                         policy_root=policy_root, delay_s=delay_s, tamper=tamper, timings=timings)
    sent = time.perf_counter()
    submit_through_outage(job, lease.lease_id, done.root, policy_version)
    if timings is not None:
        timings["submit_s"] = time.perf_counter() - sent
    return done


def collateral_room(registry: RegistryClient, worker: str, slash_amount: int, unfinished_claims: int) -> int:
    """How many more leases `worker`'s free stake can lock collateral for, less its claims still in flight.
    Claims sent together are estimated without seeing each other, so one the stake cannot cover would be mined,
    revert and cost its gas; a claim in flight may already be mined (its collateral locked), which only makes
    this cautious until it finishes."""
    return max(0, registry.info(worker).active // max(1, slash_amount) - unfinished_claims)


ADAPTIVE_CAP = 4  # an adaptive window holds at most this many times the staleness budget's leases (at least 1)


def in_flight_window(spec: ChainSpec, max_undecided: int | None) -> InFlightWindow:
    """How many leases a worker keeps in flight at once (claimed, being submitted, or waiting for their
    committees). The worker claims and generates its next leases while earlier ones wait, so the transactions'
    blocks and the committees' latency overlap generation instead of adding to it. By default the window adapts
    (`rollnet.node.in_flight`): it starts at the job's staleness budget (at least 1), holds no more leases than
    keep generation busy, and halves when batches arrive at the budget's edge. `max_undecided` fixes it. The
    worker's collateral bounds it too: a claim its free stake cannot cover is refused, and it waits."""
    budget = spec.max_staleness
    if max_undecided is not None:
        return InFlightWindow(budget, cap=max_undecided, fixed=True, start=max_undecided)
    return InFlightWindow(budget, cap=ADAPTIVE_CAP * max(1, budget))


@dataclass
class WorkerLoop:
    job: JobClient
    account: LocalAccount
    task: Task
    follower: PolicyFollower
    policies: PolicyEngine
    store: ObjectStore
    events: EventLog
    delay_s: float = 0.0
    tamper: Tamper = HONEST
    keeper_every_s: float = 5.0
    keeper_grace_s: int = KEEPER_GRACE_S
    max_undecided: int | None = None  # None: an adaptive window (`in_flight_window`)
    from_block: int = 0  # the market's deployment block: no lease's events come before it
    book_path: Path | None = None  # where the lease follower keeps its cursor (None: in memory)
    submitted: int = 0
    _undecided: list[int] = field(default_factory=list)
    _keeper_at: float = 0.0
    _idle_reason: str = ""
    _appealed: set[tuple[int, int]] = field(default_factory=set)
    _owed_maybe: bool = True  # something may be owed: check (and withdraw) at the next keeper pass
    _bound: int = 0  # leases a bounded `run` submits (0: unbounded)
    _claimed_at: dict[int, float] = field(default_factory=dict)  # lease -> when its claim was sent (monotonic)

    def __post_init__(self) -> None:
        self.keeper = Keeper(self.job, self.events, self.job.spec())
        self.rewards = AppealRewards(self.keeper)
        self.window = in_flight_window(self.job.spec(), self.max_undecided)
        self._window_size = self.window.size()
        self.book = LeaseBook(self.job, self.from_block, self.book_path, worker=self.account.address)
        self.registry = RegistryClient(self.job.client, self.job.registry_address())
        self.committees = CommitteeView(self.job, self.registry, self.from_block)
        self.lanes: LeaseLanes[int | None] = LeaseLanes(self._claim_seeded, self.window.cap)

    def sync(self) -> None:
        """Fold the job's new events (a fixed number of requests, however many leases are in flight) and note
        this worker's own leases that became final."""
        me = self.account.address.lower()
        for entry in self.book.poll().finished:
            if entry.worker.lower() != me:
                continue
            self._owed_maybe = self._owed_maybe or entry.status is LeaseStatus.PAID
            self.rewards.note(entry)

    def step(self) -> bool:
        """Keep claims in flight up to the room back-pressure and the lease window leave, then generate the
        oldest seeded lease's batch and hand its submission to a background lane; returns False when it had to
        wait instead."""
        self.follower.poll()
        self.sync()
        if time.monotonic() - self._keeper_at > self.keeper_every_s:
            self.keep()
        self._note_submissions()
        self._note_decided()
        current = self.job.current_version()
        version = min(self.follower.latest, current)
        if current - version > self.job.spec().max_staleness:
            self.events.emit("waiting_for_policy", have=version, chain=current)
            self.follower.wait_for(current - self.job.spec().max_staleness, timeout=2.0)
            return False  # nothing new is claimed while no policy is fresh enough to work it
        self.lanes.claim_ahead(self.lanes.claiming + self._room(version))
        if not self.lanes.wait_ready(timeout=0.5):
            return False  # back-pressure (no room for another batch), or the claims are not mined yet
        # Everything generation needs is read before a lease is taken, so no outage drops a lease taken.
        backend = self.policies.at(version)
        policy_root = self.job.policy_root(version).hex()
        try:
            claimed = self.lanes.ready()
        except ContractRevert as exc:
            if exc.error_name != "RandomnessExpired":
                raise
            # More than 256 blocks passed between the claim and the seed draw (a busy chain, or this worker
            # stalled): the lease can only expire now, costing the expiry fee. Claim afresh.
            self.events.emit("lost_lease", reason=exc.error_name)
            return False
        assert claimed is not None  # the oldest claim finished, and it did not fail
        lease = claimed.lease
        if self.book.now and self.book.now >= lease.deadline:
            self.events.emit("lost_lease", lease=lease.lease_id, version=version, reason="LeaseExpired")
            self._claimed_at.pop(lease.lease_id, None)
            return False  # it waited too long (for a policy, or behind a slow batch): never work an expired lease
        timings = dict(claimed.timings)
        started = time.perf_counter()
        done = prepare_batch(self.job, lease, self.account, self.task, backend, self.store,
                             policy_version=version, policy_root=policy_root,
                             delay_s=self.delay_s, tamper=self.tamper, timings=timings)
        self.window.note_batch(time.perf_counter() - started)
        self.lanes.submit(done.lease_id, partial(self._send, done, version, timings, started))
        return True

    def _room(self, version: int) -> int:
        """How many more leases this worker may claim now. The batches of all its leases in flight (claimed,
        being submitted, waiting for their committees) fit within the in-flight window, so a claimed lease is never
        held back by back-pressure. Claimed leases not yet worked are no more than it generates in half a lease
        window at its measured batch time (one until it has measured one), so none waits until it expires. A
        bounded run claims no more than it has left to submit, and no claim goes out that its free stake, less
        the claims in flight, cannot cover (`collateral_room`)."""
        in_flight = self.lanes.claiming + self.lanes.submitting
        room = self.window.size() - len(self._undecided) - in_flight
        half_lease = self.job.spec().lease_duration / 2
        batch_s = self.window.batch_s
        ahead = 1 if batch_s is None else max(1, int(half_lease / max(batch_s, 1e-3)))
        room = min(room, ahead - self.lanes.claiming)
        if self._bound:
            room = min(room, self._bound - self.submitted - in_flight)
        if room > 0:
            room = min(room, self._demand_room(version))
        if room > 0:  # one read, only when it would claim: never more claims than free stake covers
            covered = collateral_room(self.registry, self.account.address, self.job.spec().slash_amount,
                                      self.lanes.unfinished_claims)
            if covered == 0 and not (self.lanes.claiming or self.lanes.submitting or self._undecided):
                self._idle("InsufficientActiveStake")  # nothing in flight will free collateral: say why it waits
            room = min(room, covered)
        return max(0, room)

    def _demand_room(self, version: int) -> int:
        """How many more leases the trainer's demand leaves for batches generated with `version`
        (`rollnet.node.demand`): what is wanted, less the claims mined since it counted and this worker's claims on
        their way, and one more claim per read at most (workers reading the same count at once then overshoot it by
        one lease each). One read, only when it would claim; no fresh demand heard: no limit."""
        demand = self.follower.demand
        if demand is None:
            return self.window.cap
        spec = self.job.spec()
        left = unclaimed(demand, spec.tasks_per_lease, spec.max_staleness, version, self.job.lease_count())
        left -= self.lanes.claiming
        if left <= 0 and not (self.lanes.claiming or self.lanes.submitting or self._undecided):
            self._idle("no demand")  # the trainer holds enough batches in flight to train on: say why it waits
        return max(0, min(1, left))

    def _idle(self, reason: str) -> None:
        """Note (once per reason in a row) that there is no work this worker can take now, and why."""
        if reason != self._idle_reason:
            self.events.emit("idle", reason=reason)
        self._idle_reason = reason

    def _claim_seeded(self) -> Claimed:
        """(On a lane.) Claim a lease and draw its seed."""
        timings: dict[str, float] = {}
        sent = time.monotonic()

        def claimed(lease: Lease) -> None:
            self._claimed_at[lease.lease_id] = sent
            self._idle_reason = ""  # working again: the next wait is reported afresh
            self.events.emit("claim", lease=lease.lease_id, first_task=lease.first_task)

        lease = claim_with_seed(self.job, timings=timings, on_claim=claimed)
        return Claimed(lease, timings)

    def _send(self, done: SubmittedLease, version: int, timings: dict[str, float], started: float) -> int | None:
        """(On a lane.) Submit a prepared batch's root; its g (the chain's version less the batch's) once mined, or
        None if the lease was lost meanwhile."""
        sent = time.perf_counter()
        try:
            submit_through_outage(self.job, done.lease_id, done.root, version)
        except ContractRevert as exc:
            if exc.error_name not in LOST_LEASE_REVERTS:
                raise
            # Too slow for this lease: the policy aged past the bound or the lease ran out (and a keeper, maybe
            # this worker, returned it to the queue, costing the expiry fee); the work is lost, never paid.
            self.events.emit("lost_lease", lease=done.lease_id, version=version, reason=exc.error_name)
            return None
        timings["submit_s"] = time.perf_counter() - sent
        # The submission is mined: an outage now must not drop its record (the lease would count as never sent).
        chain_version = self.job.client.through_outage(self.job.current_version)
        self.events.emit("submit", lease=done.lease_id, version=version, chain_version=chain_version,
                         g=chain_version - version, rollouts=len(done.rollouts), root=done.root.hex(),
                         seconds=round(time.perf_counter() - started, 4),
                         **{name: round(value, 4) for name, value in timings.items()})
        return chain_version - version

    def _note_submissions(self, wait_all: bool = False) -> None:
        """Count the submissions the lanes finished; the first failure (other than a lost lease) is raised
        after all are counted."""
        failure = None
        for item in self.lanes.finished(wait_all):
            if item.error is not None:
                if failure is not None:
                    log.warning("lease %d: submission failed too: %s", item.lease_id, item.error)
                failure = failure or item.error
            elif item.result is not None:
                self.submitted += 1
                self._undecided.append(item.lease_id)
                self.window.note_submitted(item.result)
            else:
                self._claimed_at.pop(item.lease_id, None)
        if failure is not None:
            raise failure
        self._note_window()

    def _note_decided(self) -> None:
        """Drop the leases the chain decided from those waiting, noting how long each held its slot."""
        waiting = []
        for lease_id in self._undecided:
            if self._waiting(lease_id):
                waiting.append(lease_id)
            elif lease_id in self._claimed_at:
                self.window.note_decided(time.monotonic() - self._claimed_at.pop(lease_id))
        self._undecided = waiting
        # A claim that failed after it was mined (its seed drawn too late) or a submission that failed leaves its
        # claim time behind: forget any older than two lease durations that no longer waits for a decision.
        # (A lane's thread adds claim times meanwhile: pop from a snapshot, never rebuild the dict.)
        horizon = time.monotonic() - 2 * self.job.spec().lease_duration
        for lease in [lease for lease, at in list(self._claimed_at.items()) if at <= horizon and lease not in waiting]:
            self._claimed_at.pop(lease, None)
        self._note_window()

    def _note_window(self) -> None:
        size = self.window.size()
        if size != self._window_size:
            self._window_size = size
            self.events.emit("window", size=size, batch_s=self.window.batch_s, occupancy_s=self.window.occupancy_s)

    def _waiting(self, lease_id: int) -> bool:
        """Whether a lease this worker submitted before the last `sync` still waits for its committee (a lease the
        book no longer holds became final)."""
        entry = self.book.get(lease_id)
        return entry is not None and entry.status in (LeaseStatus.LEASED, LeaseStatus.VOTING)

    def keep(self) -> None:
        """Keeper duties on this worker's own leases in flight (its turn comes first), appeals of its wrongly
        judged batches, then collect what it is owed (asked of the chain only when something may be owed)."""
        self._keeper_at = time.monotonic()
        now = self.book.now or self.job.client.now()
        me = self.account.address.lower()
        for entry in self.book.open_leases():
            if entry.worker.lower() == me:
                self._appeal_if_wronged(entry, now)
            self.keeper.act_in_turn(entry, now, self.keeper_grace_s)
        if self._owed_maybe or self.rewards.pending:
            self.rewards.collect(now)
            self._owed_maybe = False

    def _appeal_if_wronged(self, lease: LeaseEntry, now: int) -> None:
        """An honest worker knows its batch is good: it appeals a rejection or a void round while it can."""
        if self.tamper is not HONEST or (lease.lease_id, lease.round) in self._appealed:
            return
        outcome = own_batch_appeal(self.job, lease, now, self.job.spec(), self._drew_nobody)
        if outcome is None:
            return
        try:
            self.job.appeal(lease.lease_id)
        except ContractRevert as exc:
            log.info("lease %d: appeal refused (%s)", lease.lease_id, exc.error_name)
            return
        self._appealed.add((lease.lease_id, lease.round))
        self.events.emit("appeal", lease=lease.lease_id, round=lease.round + 1, against=outcome.name.lower())

    def _drew_nobody(self, lease: LeaseEntry) -> bool:
        """Whether no validator was drawn to the lease's current round (asked only of a void, unvoted round)."""
        try:
            return drew_nobody(self.committees, lease, lease.round, self.book.head)
        except ChainUnavailable:
            raise  # the loop rides out outages
        except RollnetError as exc:  # an endpoint refusing the lookup costs this appeal, never the worker
            log.warning("lease %d: could not tell whether its round drew anybody: %s", lease.lease_id, exc)
            return False

    def run(self, leases: int = 0, stop: Callable[[], bool] = lambda: False) -> None:
        """Work until `leases` are submitted (0: until `stop`), riding out chain outages; submissions in flight
        when it stops are waited for, claims not yet worked are left to expire."""
        self._bound = leases
        try:
            self._run(leases, stop)
        finally:
            try:
                self._note_submissions(wait_all=True)
            except RollnetError as exc:
                log.warning("a last submission failed: %s", exc)
            for claimed in self.lanes.close():
                self.events.emit("lost_lease", lease=claimed.lease.lease_id, reason="stopped")

    def _run(self, leases: int, stop: Callable[[], bool]) -> None:
        backoff = 0.2
        while not stop() and (leases == 0 or self.submitted < leases):
            try:
                if not self.step() and not self.lanes.claiming:
                    time.sleep(0.2)  # (a step waiting for a claim has waited already)
                backoff = 0.2
            except ChainUnavailable as exc:
                log.warning("chain unavailable (%s); retrying in %.1f s", exc, backoff)
                self.events.emit("chain_unavailable", wait_s=backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except ContractRevert as exc:
                if exc.error_name not in IDLE_REVERTS:
                    raise
                if leases and exc.error_name not in ("InsufficientActiveStake", "NotActive"):
                    return  # a bounded run ends when there is no more work
                self._idle(exc.error_name)
                self.keep()  # no new work now: keep serving, settling and collecting
                time.sleep(1.0)

"""The chain-fed trainer: admits validated rollout batches from the market, trains, and publishes each
version on chain and as a signed delta over libp2p.

Invariants: a batch reaches the buffer only through `admit_submission` (its first committee's acceptance by
gossip, under the verdict book's rule, or a final acceptance on chain) and only once: the ledger (SQLite)
records each lease's outcome, so a restarted trainer never admits a batch twice; version v is published on
chain only after the trainer's state for v is saved and v is in its policy store, and announced by gossip
only after the chain holds it, so a follower can always check an announcement against the chain; a
restart publishes what is missing (on chain, then by gossip) and nothing twice. Recent announcements are
repeated, because gossip can be missed. Chain outages back off and retry; they never skip a batch or a version.
A batch's bytes are fetched in the background from the moment its submission is seen, while its committee
judges it and while the trainer trains (`Fetcher`: content-addressed, so what arrives is what was submitted);
admission only reads them, and never waits for a fetch still running. Before each step, and whenever it changes,
the trainer gossips its demand (`rollnet.node.demand`): how many more leases it can train on within the
staleness budget and its steps left, counted against the claims its lease book has folded.
"""

from __future__ import annotations

import logging
import queue
import statistics
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

from rollnet.node.chain.job import ChainSpec, JobClient, Lease, LeaseStatus, Outcome
from rollnet.node.chain.registry import RegistryClient
from rollnet.node.committee import CommitteeView
from rollnet.node.demand import OpenLease, in_flight, leases_wanted, presumed_lost_after
from rollnet.node.errors import ChainUnavailable, RollnetError
from rollnet.node.events import EventLog
from rollnet.node.keeper import final_outcome
from rollnet.node.lease_book import LeaseBook, LeaseEntry
from rollnet.node.ledger import Pending, SubmissionLedger
from rollnet.node.model.identity import loaded_model_files_hash
from rollnet.node.p2p.authorize import JobAuthorizer
from rollnet.node.p2p.envelopes import MAX_GROUPS, Demand, EnvelopeError, PolicyAnnouncement, seal
from rollnet.node.p2p.fetch import Fetcher
from rollnet.node.p2p.host import P2PNode, topics
from rollnet.node.p2p.prefetch import Prefetcher
from rollnet.node.rollout.submission import SubmissionError, parse_submission
from rollnet.node.verdicts import BookCommittee, VerdictBook
from rollnet.trainer.admission import admit_submission
from rollnet.trainer.buffer import RolloutBuffer
from rollnet.trainer.local import HELD_OUT_PROMPTS, held_out_accuracy
from rollnet.trainer.trainer import StepReport, Trainer

log = logging.getLogger(__name__)
DEMAND_EVERY_S = 5.0  # an unchanged demand is repeated this often (gossip can be missed; followers let it age out)
DEMAND_CHECK_S = 0.5  # the demand is counted again at most this often
CLAIM_TIMES_KEPT = 16  # claim-to-submission times whose median says when a claimed lease is presumed lost


def chain_decision(job: JobClient, lease: Lease | LeaseEntry, now: int, spec: ChainSpec) -> bool | None:
    """What the chain says of a batch once its outcome is final: True accepted, False rejected, void or gone,
    None not final yet (an appealable decision can still be overturned)."""
    outcome = final_outcome(job, lease, now, spec)
    return None if outcome is None else outcome is Outcome.ACCEPT


@dataclass
class StepContext:
    """What a step's event says besides the trainer's report, kept until its version is persisted."""
    reward: float
    groups: int
    consumed: int
    per_worker: dict[str, Counter]


@dataclass
class MarketCounts:
    admitted_batches: int = 0
    refused_batches: int = 0
    samples: Counter = field(default_factory=Counter)


class MarketTrainer:
    def __init__(self, trainer: Trainer, job: JobClient, registry: RegistryClient, node: P2PNode,
                 ledger: SubmissionLedger, fetch: Fetcher, events: EventLog, *, held_out_every: int = 10,
                 held_out_prompts: int = HELD_OUT_PROMPTS, reannounce_s: float = 2.0, recent_versions: int = 8,
                 from_block: int = 0, lease_book_path: Path | None = None):
        self.trainer = trainer
        self.job = job
        self.registry = registry
        self.node = node
        self.ledger = ledger
        self.events = events
        self.held_out_every = held_out_every
        self.held_out_prompts = held_out_prompts
        self.reannounce_s = reannounce_s
        spec = job.spec()
        self.spec = spec
        if spec.trainer.lower() != trainer.signer.address.lower():
            raise RollnetError(f"job {job.address} names trainer {spec.trainer}, not {trainer.signer.address}")
        config = trainer.config
        contradictions = config.contradictions(spec.recipe)
        if contradictions:
            raise RollnetError(f"the trainer's settings contradict the job's recipe on chain "
                               f"({'; '.join(contradictions)}): build its config with GRPOConfig.for_recipe")
        if trainer.store.roots.get(0) != job.policy_root(0):
            raise RollnetError("the base model's bf16 content root differs from the job's model root: deploy the "
                               "job with model_root = the base model's root (see `rollnet model init`)")
        files_hash = loaded_model_files_hash(trainer.model, trainer.tokenizer)
        if files_hash != spec.model_files_hash:
            raise RollnetError(f"the base model's config and tokenizer ({files_hash.hex()[:16]}…) are not the job's "
                               f"model_files_hash ({spec.model_files_hash.hex()[:16]}…): deploy the job with the "
                               "values `rollnet model identity FOLDER` prints")
        self.buffer = RolloutBuffer(config.group_size, spec.max_staleness,
                                    trainer.model.config.vocab_size)
        self.buffer.advance(trainer.version)
        self.leases = LeaseBook(job, from_block, lease_book_path)
        self.leases.align(ledger.cursor(job.address))
        self.book = VerdictBook(job.address, BookCommittee(CommitteeView(job, registry, from_block), self.leases))
        self.verdict_topic = topics(job.address)["verdict"]
        self.policy_topic = topics(job.address)["policy"]
        node.subscribe(self.verdict_topic, authorize=JobAuthorizer(job.address, spec.trainer, registry))
        self.counts = MarketCounts()
        self._announcements: dict[int, bytes] = {}
        self._recent = recent_versions
        self._announced_at = 0.0
        self._worker_of_seed: dict[int, str] = {}
        self._last_version_at = time.time()
        self._recent_announced = False
        self._finished: dict[int, LeaseEntry] = {}  # leases the lease book saw end, until admitted or refused
        self._persisted_version = trainer.version  # the newest version whose state and delta are written
        self._publishing = threading.RLock()  # versions go on chain and out by gossip from two threads
        self._on_chain = 0  # the newest version this trainer saw on chain after publishing
        self.prefetcher = Prefetcher(fetch)  # each batch's bytes, fetched from the moment it is submitted
        node.policy_source = lambda start: [self._announcements[v] for v in sorted(self._announcements) if v >= start]
        self._target: int | None = None  # the version `run` trains up to (None: no target)
        self._demand_nonce = time.time_ns()  # unique across restarts: followers admit each nonce once
        self._demand_counted_at = 0.0
        self._claimed_at: dict[int, int] = {}  # lease -> chain seconds at its claim, while only claimed
        self._submitted_at: dict[int, int] = {}  # lease -> chain seconds when seen submitted, until judged
        self._claim_to_submit: deque[float] = deque(maxlen=CLAIM_TIMES_KEPT)  # seconds, recent leases
        self._demand_lock = threading.Lock()  # the demand goes out from the run loop and from its repeater
        self._demand_body: Demand | None = None  # the last demand counted, repeated while the trainer trains
        self._demand_stop = threading.Event()
        self._demand_repeater: threading.Thread | None = None

    def announce_recent(self) -> None:
        """After a (re)start: announce the recent versions already on chain, so followers can catch up."""
        if self._recent_announced:
            return
        on_chain = self.job.current_version()
        with self._publishing:
            for version in sorted(self.trainer.store.deltas)[-self._recent:]:
                if version <= on_chain and version not in self._announcements:
                    self._announce(version)
        self._recent_announced = True

    # ------------------------------------------------------------------ publishing

    def publish_current(self) -> None:
        """Put every persisted version the chain lacks on chain, in order (the job takes versions one by one: one
        whose transaction an outage held back goes before the next), each announced with its delta once mined
        (from the run loop and from the trainer's writing thread: one at a time)."""
        with self._publishing:
            version = self._persisted_version
            if version == 0 or (version <= self._on_chain and version in self._announcements):
                return  # published and announced: nothing to ask the chain (the run loop calls this every pass)
            self.job.publish_up_to(version, self.trainer.store.roots.__getitem__, on_published=self._announce)
            self._on_chain = version
            if version not in self._announcements:
                self._announce(version)

    def _announce(self, version: int) -> None:
        store = self.trainer.store
        if version not in store.deltas:
            return
        data = store.delta_path(version).read_bytes()
        delta_root = self.node.store.put(data)
        body = PolicyAnnouncement(job=self.job.address, nonce=version, timestamp=time.time(), version=version,
                                  base_version=store.deltas[version], target_root=store.roots[version].hex(),
                                  delta_root=delta_root.hex(), delta_size=len(data))
        self._announcements[version] = seal(body, self.trainer.signer)
        for old in sorted(self._announcements)[:-self._recent]:
            del self._announcements[old]
        self.node.publish(self.policy_topic, self._announcements[version])
        self._announced_at = time.monotonic()

    def reannounce(self) -> None:
        with self._publishing:
            if time.monotonic() - self._announced_at < self.reannounce_s:
                return
            for version in sorted(self._announcements):
                self.node.publish(self.policy_topic, self._announcements[version])
            self._announced_at = time.monotonic()

    # ------------------------------------------------------------------ admission

    def take_verdicts(self) -> None:
        while True:
            try:
                message = self.node.gossip_inbox.get_nowait()
            except queue.Empty:
                return
            if message.topic != self.verdict_topic:
                continue
            try:
                self.book.add(message.data)
            except EnvelopeError as exc:
                log.info("dropped a verdict: %s", exc)

    def follow_submissions(self) -> None:
        """Fold the job's new events into the lease book (from its cursor, at first the deployment block, in
        bounded block ranges), recording each range's BatchSubmitted events in the ledger first."""
        def record(end: int, logs: list) -> None:
            rows = [(e["args"]["leaseId"], bytes(e["args"]["root"]), e["args"]["worker"], e["args"]["policyVersion"])
                    for e in logs if e["event"] == "BatchSubmitted"]
            self.ledger.record_events(self.job.address, rows, end)
            for _, root, worker, version in rows:
                if self.trainer.version - version <= self.buffer.max_staleness:
                    self.prefetcher.start(root, worker)

        update = self.leases.poll(record)
        now = self.leases.now
        for entry in update.finished:
            self._finished[entry.lease_id] = entry
            self._claimed_at.pop(entry.lease_id, None)
        for entry in self.leases.open_leases():
            if entry.status is LeaseStatus.LEASED:
                self._claimed_at.setdefault(entry.lease_id, entry.deadline - self.spec.lease_duration)
                continue
            self._submitted_at.setdefault(entry.lease_id, now)
            if (claimed_at := self._claimed_at.pop(entry.lease_id, None)) is not None:
                self._claim_to_submit.append(max(0.0, float(now - claimed_at)))  # seen at this poll: a round late

    def close(self) -> None:
        """Stop the background fetches (those running finish within the fetcher's deadline) and the demand's
        repeater."""
        self._demand_stop.set()
        self.prefetcher.close()

    def admit_ready(self) -> int:
        """Admit or refuse every batch whose decision is known and whose bytes have arrived; returns how many."""
        unjudged = self.ledger.unjudged(self.job.address)
        self._finished = {row.lease_id: self._finished[row.lease_id] for row in unjudged
                          if row.lease_id in self._finished}
        decided = 0
        for row in unjudged:
            if self.trainer.version - row.policy_version > self.buffer.max_staleness:
                self._decide(row, False, "too stale for the buffer", Counter({"too stale": 1}))
                decided += 1
                continue
            lease = self._finished.get(row.lease_id) or self.leases.get(row.lease_id) or self.job.lease(row.lease_id)
            # Gossip speaks for the first round only: once appealed, or settled against, the chain decides.
            gossip_quorum = (lease.round == 0 and not (lease.final and lease.status is not LeaseStatus.PAID)
                             and self.book.admitted(row.lease_id, row.root))
            decision = True
            if not gossip_quorum:
                decision = chain_decision(self.job, lease, self.leases.now, self.spec)
                if decision is False:
                    self._decide(row, False, f"{lease.status.name.lower()} on chain", Counter({"refused": 1}))
                    decided += 1
                    continue
            if decision is None:
                continue  # not accepted by gossip, not final on chain: wait
            if not self.prefetcher.ready(row.root, row.worker):
                continue  # its bytes are still arriving: admission never waits for a transfer
            data = self.prefetcher.take(row.root, row.worker)
            if data is None:
                continue  # the worker could not be reached: fetched again from the next round on
            counts = admit_submission(data, row.lease_id, row.root, self.book, self.buffer,
                                      accepted_on_chain=not gossip_quorum)
            if counts.get("admitted"):
                for seed in self._seeds(data):
                    self._worker_of_seed[seed] = row.worker
            self._decide(row, bool(counts.get("admitted")), ",".join(sorted(counts)), counts)
            decided += 1
        return decided

    @staticmethod
    def _seeds(data: bytes) -> set[int]:
        try:
            return {r.task_seed for r in parse_submission(data).rollout_batch().to_rollouts()}
        except SubmissionError:
            return set()

    def _decide(self, row: Pending, admitted: bool, reason: str, counts: Counter) -> None:
        self.ledger.record_verdict(self.job.address, row.lease_id, admitted, reason)
        self.ledger.mark_attested(self.job.address, [row.lease_id])
        if admitted:
            self.counts.admitted_batches += 1
        else:
            self.counts.refused_batches += 1
        self.counts.samples.update(counts)
        self.events.emit("admission", lease=row.lease_id, worker=row.worker, version=row.policy_version,
                         trainer_version=self.trainer.version, admitted=admitted, counts=dict(counts))

    # ------------------------------------------------------------------ demand

    def start_demand(self, steps: int) -> None:
        """Train up to version `steps`: count the demand at once, so no worker claims before it hears one, and
        keep repeating it (with a fresh timestamp) while the trainer trains and says nothing new."""
        self._target = steps
        try:
            self.follow_submissions()
            self.announce_demand(force=True)
        except ChainUnavailable as exc:  # the run loop counts it once the chain is back
            log.warning("the demand waits for the chain (%s)", exc)
        if self._demand_repeater is None:
            self._demand_repeater = threading.Thread(target=self._repeat_demand, name="demand", daemon=True)
            self._demand_repeater.start()

    def announce_demand(self, force: bool = False) -> None:
        """Count what this trainer's demand depends on (`rollnet.node.demand`) and gossip it when it changed;
        counted at most every DEMAND_CHECK_S unless `force`d (the repeater sends the same count every
        DEMAND_EVERY_S). Called before a step (the trainer counts nothing while it trains), it counts as if the step
        were taken: the version after it, and the buffer without its groups."""
        if not force and time.monotonic() - self._demand_counted_at < DEMAND_CHECK_S:
            return
        self._demand_counted_at = time.monotonic()
        prompts, target = self.trainer.config.prompts_per_step, self._target
        version, ready, now = self.trainer.version, self.buffer.ready_groups, self.leases.now
        if ready >= prompts and (target is None or version < target):
            version, ready = version + 1, ready - prompts  # the step about to be taken
        lost_after = presumed_lost_after(statistics.median(self._claim_to_submit) if self._claim_to_submit else None,
                                         self.spec.lease_duration)
        unjudged = self.ledger.unjudged(self.job.address)
        waiting = {row.lease_id for row in unjudged}
        self._submitted_at = {lease: at for lease, at in self._submitted_at.items() if lease in waiting}
        leases = [OpenLease(row.lease_id, True, row.policy_version, self._submitted_at.setdefault(row.lease_id, now),
                            decided_against=self._decided_against(row.lease_id))
                  for row in unjudged]
        leases += [OpenLease(entry.lease_id, False, version,
                             self._claimed_at.setdefault(entry.lease_id, entry.deadline - self.spec.lease_duration))
                   for entry in self.leases.open_leases()
                   if entry.status is LeaseStatus.LEASED and now < entry.deadline]
        flying = in_flight(leases, version, self.spec.max_staleness, now, lost_after, self.spec.vote_window)
        supply = min(MAX_GROUPS, ready + self.spec.tasks_per_lease * flying)
        body = Demand(job=self.job.address, nonce=0, timestamp=time.time(), version=version,
                      prompts_per_step=prompts, supply_groups=supply,
                      steps_left=None if target is None else max(0, target - version),
                      claims_seen=self.leases.claims)
        if self._demand_body is not None and body.model_dump(exclude={"nonce", "timestamp"}) == \
                self._demand_body.model_dump(exclude={"nonce", "timestamp"}):
            return  # unchanged: the repeater sends it again
        on_chain = min(self._on_chain, version)
        self.events.emit("demand", version=version, supply_groups=supply, in_flight=flying,
                         claims_seen=body.claims_seen, steps_left=body.steps_left, chain_version=on_chain,
                         wanted=leases_wanted(body, self.spec.tasks_per_lease, self.spec.max_staleness, on_chain))
        self._send_demand(body)

    def _decided_against(self, lease_id: int) -> bool:
        """Whether the lease book has the lease's current round decided reject or void (final or not)."""
        entry = self._finished.get(lease_id) or self.leases.get(lease_id)
        if entry is None:
            return False
        return entry.status is LeaseStatus.DECIDED and entry.outcome in (Outcome.REJECT, Outcome.VOID) or \
            entry.status in (LeaseStatus.SLASHED, LeaseStatus.LAPSED, LeaseStatus.RETURNED)

    def _send_demand(self, body: Demand) -> None:
        """Seal `body` with a fresh nonce and timestamp (followers keep the newest), and gossip it."""
        with self._demand_lock:
            self._demand_nonce += 1
            fresh = body.model_copy(update={"nonce": self._demand_nonce, "timestamp": time.time()})
            self.node.publish(self.policy_topic, seal(fresh, self.trainer.signer))
            self._demand_body = fresh

    def _repeat_demand(self) -> None:
        """(On its own thread.) The last count again every DEMAND_EVERY_S: the trainer counts nothing while it
        trains, and gossip can be missed. Repeating an old count is safe: workers subtract the claims since."""
        while not self._demand_stop.wait(DEMAND_EVERY_S):
            body = self._demand_body
            if body is None or time.time() - body.timestamp < DEMAND_EVERY_S:
                continue
            try:
                self._send_demand(body)
            except Exception as exc:  # noqa: BLE001 - a host shutting down; the next repeat tries again
                log.info("could not repeat the demand: %s", exc)

    # ------------------------------------------------------------------ training

    def held_out(self) -> float:
        accuracy = held_out_accuracy(self.trainer, self.held_out_prompts)
        self.events.emit("held_out", version=self.trainer.version, accuracy=accuracy)
        return accuracy

    def train_if_ready(self) -> bool:
        config = self.trainer.config
        if self.buffer.ready_groups < config.prompts_per_step:
            return False
        groups = self.buffer.take(config.prompts_per_step)
        per_worker: dict[str, Counter] = {}
        for group in groups:
            worker = self._worker_of_seed.pop(group.task_seed, "unknown")
            per_worker.setdefault(worker, Counter())[self.trainer.version - group.version] += len(group.rollouts)
        rewards = [r for g in groups for r in self.trainer.rewards(g)]
        context = StepContext(reward=sum(rewards) / max(1, len(rewards)), groups=len(groups),
                              consumed=sum(len(g.rollouts) for g in groups), per_worker=per_worker)
        report = self.trainer.train_on(groups, on_persisted=lambda done: self._finish_step(done, context))
        self.buffer.advance(self.trainer.version)
        if report.optimizer_steps and self.trainer.version % self.held_out_every == 0:
            self.held_out()
        return True

    def _finish_step(self, report: StepReport, context: StepContext) -> None:
        """A persisted step (on the trainer's writing thread, when it writes in the background): its event
        (publish_s: from the end of its training until its state and delta were written), then its version on
        chain and announced at once. A chain outage here is retried by the run loop, which publishes every pass."""
        self._persisted_version = max(self._persisted_version, report.version)
        now = time.time()
        self.events.emit(
            "step", version=report.version, reward=context.reward, groups=context.groups,
            groups_without_signal=report.groups_without_signal, samples=report.samples,
            consumed=context.consumed, loss=report.loss,
            max_ratio=report.max_ratio,
            clipped=report.clipped_fraction, staleness={str(g): n for g, n in Counter(report.staleness).items()},
            per_worker={w: {str(g): n for g, n in c.items()} for w, c in context.per_worker.items()},
            delta_bytes=report.published.delta_bytes if report.published else None,
            changed_fraction=report.published.changed_fraction if report.published else None,
            train_s=round(report.seconds, 4), publish_s=round(time.perf_counter() - report.ended_at, 4),
            interval_s=round(now - self._last_version_at, 4))
        self._last_version_at = now
        try:
            self.publish_current()
        except ChainUnavailable as exc:
            log.warning("version %d waits for the chain (%s)", report.version, exc)

    def round(self) -> bool:
        """One pass: verdicts, new submissions, admission, maybe a training step, re-announcements; whether it
        admitted, refused or trained anything."""
        self.take_verdicts()
        self.follow_submissions()
        decided = self.admit_ready()
        self.announce_demand(force=bool(decided))  # before a step: the trainer says nothing while it trains
        trained = self.train_if_ready()
        self.reannounce()
        return bool(decided) or trained

    def run(self, steps: int, poll_s: float = 0.2) -> None:
        """Train until version `steps` exists, then see every version persisted and on chain."""
        backoff = poll_s
        self.start_demand(steps)
        while self.trainer.version < steps or self._on_chain < self.trainer.version:
            try:
                if self.trainer.version < steps:
                    self.publish_current()
                    self.announce_recent()
                    if not self.round():
                        time.sleep(poll_s)  # nothing to do: wait for the chain and the gossip
                else:
                    self.announce_demand()  # nothing more is wanted
                    self.trainer.close()  # the last steps written, their callbacks run
                self.publish_current()
                backoff = poll_s
            except ChainUnavailable as exc:
                log.warning("chain unavailable (%s); retrying in %.1f s", exc, backoff)
                self.events.emit("chain_unavailable", wait_s=backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

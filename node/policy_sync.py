"""Following a job's policy: signed announcements arrive by gossip, deltas by content root over libp2p.

Invariants: the follower's store starts from the job's base model, accepted only if its bf16 content
root equals the model root in the job's on-chain spec (version 0); a version is added only from a delta
that the job's trainer signed, that extends the version before it, and whose target root equals the
root the trainer published on chain for that version; the fetched delta stays in the node's object
store, so every follower serves what it has fetched (the broadcast becomes a tree). Gossip can be
missed (py-libp2p's gossipsub does not reach a peer that restarted under the same peer ID), so when the
chain is ahead and nothing was heard, the follower pulls the signed announcements from its peers
(`ask_policy`, a few peers per pull, every connected peer in turn), checked exactly like gossiped ones; it
serves the ones it accepted the same way.
Announcements wait here until their base version arrives. Only the policy topic is read from the node's
gossip inbox. The trainer's demand (`Demand`, on the same topic) is kept here too: the newest one the trainer
signed, and only while it is under `DEMAND_TTL_S` old (by its timestamp and by when it was heard), so a replayed
or long-silent demand never holds a worker back; without one, `demand` is None. A demand with no steps left (the
trainer is done) is kept until a newer one replaces it. The trainer's clock and the follower's may differ by
less than `DEMAND_TTL_S`; beyond that, its demands are not followed (workers claim as they would without it).
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass

from rollnet.node.chain.job import JobClient
from rollnet.node.chain.registry import RegistryClient
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import ChainUnavailable, DeltaError, RollnetError
from rollnet.node.events import EventLog
from rollnet.node.model.policies import bf16_policy
from rollnet.node.p2p.authorize import JobAuthorizer
from rollnet.node.p2p.envelopes import Demand, EnvelopeError, PolicyAnnouncement, open_envelope
from rollnet.node.p2p.host import P2PNode, topics
from rollnet.node.p2p.objects import ObjectError
from transformers import PreTrainedModel

log = logging.getLogger(__name__)
PULL_EVERY_S = 1.0
PULL_PEERS = 4
KEEP_ANNOUNCEMENTS = 16
DEMAND_TTL_S = 120.0  # longer than a training step: the trainer says nothing new while it trains


@dataclass
class Heard:
    announcement: PolicyAnnouncement
    origin: str
    heard_at: float
    data: bytes


class PolicyFollower:
    def __init__(self, node: P2PNode, store: PolicyStore, job: JobClient, registry: RegistryClient,
                 events: EventLog | None = None, fetch_timeout: float = 30.0):
        self.node = node
        self.store = store
        self.job = job
        self.events = events or EventLog(None)
        self.fetch_timeout = fetch_timeout
        self.topic = topics(job.address)["policy"]
        self._heard: dict[int, Heard] = {}
        self._accepted: dict[int, bytes] = {}
        self._checked_chain_at = 0.0
        self._pulls = 0  # pulls so far: each asks the next few peers, so every connected peer is asked in turn
        self._demand: tuple[Demand, float] | None = None  # the newest demand heard, and when (monotonic)
        self.authorize = JobAuthorizer(job.address, job.spec().trainer, registry)
        node.subscribe(self.topic, authorize=self.authorize)
        node.policy_source = self.provide

    def ensure_base(self, base: PreTrainedModel, strict: bool = True) -> bool:
        """Anchor version 0 (the job's base model) in the store, checked against the on-chain spec; a store
        that already holds versions (an anchor from elsewhere) needs no base. A mismatch is an error when
        `strict` (a worker cannot work without it); otherwise it is logged and False is returned."""
        if self.store.roots:
            return True
        try:
            self.store.add_anchor(0, bf16_policy(base), root=self.job.policy_root(0))
            return True
        except DeltaError:
            message = ("the local base model is not the job's model: its content root differs from the model root "
                       "in the job's spec")
            if strict:
                raise RollnetError(message) from None
            log.warning("%s; only versions from a trainer anchor can be checked", message)
            return False

    @property
    def latest(self) -> int:
        return self.store.latest or 0

    def poll(self) -> list[int]:
        """Take announcements from gossip and add every version now reachable; returns the versions added."""
        while True:
            try:
                message = self.node.gossip_inbox.get_nowait()
            except queue.Empty:
                break
            if message.topic == self.topic:
                self._hear(message.data, message.origin)
        if self.latest + 1 not in self._heard and time.monotonic() - self._checked_chain_at > PULL_EVERY_S:
            self._pull_if_behind()
        added = []
        while (heard := self._heard.get(self.latest + 1)) is not None:
            if not self._add(heard):
                break
            added.append(heard.announcement.version)
        for version in [v for v in self._heard if v <= self.latest]:
            del self._heard[version]
        return added

    def _hear(self, data: bytes, origin: str) -> None:
        try:
            envelope, body = open_envelope(data)
        except EnvelopeError:
            return
        if isinstance(body, PolicyAnnouncement) and body.version > self.latest and self.authorize(envelope, body):
            self._heard.setdefault(body.version, Heard(body, origin, time.time(), data))
        elif isinstance(body, Demand) and time.time() - body.timestamp < DEMAND_TTL_S:
            held = self.demand
            if (held is None or body.timestamp > held.timestamp) and self.authorize(envelope, body):
                self._demand = (body, time.monotonic())

    @property
    def demand(self) -> Demand | None:
        """The trainer's newest demand, if it is fresh (see the module); None when there is none to follow."""
        if self._demand is None:
            return None
        body, heard_at = self._demand
        if body.steps_left == 0:
            return body  # the trainer is done: it stays done until it says otherwise
        if time.monotonic() - heard_at >= DEMAND_TTL_S or time.time() - body.timestamp >= DEMAND_TTL_S:
            return None
        return body

    def _pull_if_behind(self) -> None:
        self._checked_chain_at = time.monotonic()
        try:
            if self.job.current_version() <= self.latest:
                return
        except ChainUnavailable:
            return
        peers = self.node.connected_peers()
        start = self._pulls * PULL_PEERS % max(1, len(peers))
        self._pulls += 1
        for peer in (peers[start:] + peers[:start])[:PULL_PEERS]:
            try:
                for data in self.node.ask_policy(peer, self.latest + 1):
                    self._hear(data, peer)
            except Exception as exc:  # noqa: BLE001 - a peer that cannot answer is skipped
                log.info("policy pull from %s failed: %s", peer, exc)
            if self.latest + 1 in self._heard:
                return

    def provide(self, from_version: int) -> list[bytes]:
        """The announcements this follower accepted, from `from_version` on (served to peers who ask)."""
        return [self._accepted[v] for v in sorted(self._accepted) if v >= from_version]

    def _add(self, heard: Heard) -> bool:
        announcement = heard.announcement
        if announcement.base_version != self.latest:
            log.warning("version %d extends %d, not our latest %d", announcement.version, announcement.base_version,
                        self.latest)
            return False
        root = bytes.fromhex(announcement.delta_root)
        started = time.time()
        providers = list(dict.fromkeys([heard.origin, *self.node.connected_peers()]))
        try:
            if not self.node.store.complete(root):
                self.node.fetch(root, providers, timeout=self.fetch_timeout)
            data = self.node.store.read(root)
            on_chain = self.job.policy_root(announcement.version)
            if on_chain != bytes.fromhex(announcement.target_root):
                log.info("version %d is announced but not (yet) published on chain", announcement.version)
                return False
            self.store.add_delta(data)
        except (ObjectError, DeltaError, ChainUnavailable, OSError) as exc:
            log.warning("could not add version %d yet: %s", announcement.version, exc)
            return False
        except Exception as exc:  # noqa: BLE001 - a failed fetch (a vanished peer) is retried on the next poll
            log.warning("fetching version %d failed: %s", announcement.version, exc)
            return False
        now = time.time()
        self._accepted[announcement.version] = heard.data
        for old in sorted(self._accepted)[:-KEEP_ANNOUNCEMENTS]:
            del self._accepted[old]
        self.events.emit("policy", version=announcement.version, delta_bytes=len(data),
                         fetch_s=round(now - started, 4), broadcast_s=round(now - announcement.timestamp, 4))
        return True

    def wait_for(self, version: int, timeout: float, poll_s: float = 0.1) -> bool:
        deadline = time.monotonic() + timeout
        while self.latest < version:
            if time.monotonic() > deadline:
                return False
            self.poll()
            time.sleep(poll_s)
        return True

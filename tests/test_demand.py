"""The trainer's demand for leases (rollnet.node.demand): its arithmetic, and a follower on real libp2p hosts and a
real anvil that holds only the trainer's own, fresh, newest demand."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import client_for
from rollnet.node.chain.anvil import AnvilProcess
from rollnet.node.chain.job import JobClient
from rollnet.node.chain.registry import RegistryClient
from rollnet.node.config import Deployment
from rollnet.node.delta.store import PolicyStore
from rollnet.node.demand import (
    OpenLease,
    horizon_groups,
    in_flight,
    leases_wanted,
    presumed_lost_after,
    unclaimed,
)
from rollnet.node.keys import dev_account
from rollnet.node.p2p.envelopes import Demand, EnvelopeError, open_envelope, seal
from rollnet.node.p2p.host import P2PNode, topics
from rollnet.node.p2p.identity import load_or_create_identity
from rollnet.node.p2p.objects import ObjectStore
from rollnet.node.policy_sync import DEMAND_TTL_S, PolicyFollower
from test_market_e2e import REQUESTER, _deploy_job

JOB = dev_account(19).address


def demand_of(version: int, supply_groups: int, prompts_per_step: int = 4, steps_left: int | None = None,
              claims_seen: int = 0) -> Demand:
    return Demand(job=JOB, nonce=1, timestamp=time.time(), version=version, prompts_per_step=prompts_per_step,
                  supply_groups=supply_groups, steps_left=steps_left, claims_seen=claims_seen)


def test_the_trainer_wants_what_it_can_train_within_the_budget_and_its_steps_left() -> None:
    smol = {"tasks_per_lease": 4, "max_staleness": 2}  # one lease a step (4 prompts), as SmolLM2's devnet
    embedded = {"tasks_per_lease": 8, "max_staleness": 4}  # four leases a step (32 prompts)
    # Nothing in flight, batches generated with the trainer's version: the steps from V to V + g, g + 1 of them.
    assert horizon_groups(4, 2, lag=0, steps_left=None) == 12
    assert leases_wanted(demand_of(0, 0), chain_version=0, **smol) == 3
    assert leases_wanted(demand_of(0, 0, prompts_per_step=32), chain_version=0, **embedded) == 20
    # The trainer's newest versions are not on chain yet: a batch generated with the chain's is older, and fewer
    # steps can take it. The worker counts with the version it generates with, so a version that reaches the
    # chain while the trainer trains (saying nothing) opens room at once.
    assert [leases_wanted(demand_of(3, 0), chain_version=c, **smol) for c in (3, 2, 1, 0)] == [3, 2, 1, 0]
    assert leases_wanted(demand_of(3, 0), chain_version=5, **smol) == 3  # a chain ahead of the count: no lag
    # What the buffer holds and what is in flight is supply: only the rest is wanted, and never less than nothing.
    assert leases_wanted(demand_of(3, supply_groups=8), chain_version=3, **smol) == 1
    assert leases_wanted(demand_of(3, supply_groups=32), chain_version=3, **smol) == 0
    assert leases_wanted(demand_of(5, 51, prompts_per_step=32), chain_version=5, **embedded) == 14  # ceil(109 / 8)
    # Steps left: nothing past the last step, and nothing once it is reached.
    assert leases_wanted(demand_of(4, 0, steps_left=1), chain_version=4, **smol) == 1
    assert leases_wanted(demand_of(4, 4, steps_left=1), chain_version=4, **smol) == 0
    assert leases_wanted(demand_of(5, 0, steps_left=0), chain_version=5, **smol) == 0
    # On-policy (g = 0): the next step only, and nothing while the trainer's version is not on chain.
    on_policy = {"tasks_per_lease": 4, "max_staleness": 0}
    assert leases_wanted(demand_of(2, 0), chain_version=2, **on_policy) == 1
    assert leases_wanted(demand_of(2, 0), chain_version=1, **on_policy) == 0


def test_a_lease_is_in_flight_while_fresh_and_its_worker_not_presumed_gone() -> None:
    leases = [
        OpenLease(1, submitted=True, policy_version=5, since=990),
        OpenLease(2, submitted=True, policy_version=2, since=990),  # 6 - 2 > g = 2: it would arrive too stale
        OpenLease(3, submitted=False, policy_version=6, since=990),
        OpenLease(4, submitted=False, policy_version=6, since=900),  # claimed 100 s ago: presumed lost
        OpenLease(5, submitted=False, policy_version=6, since=None),  # claimed before this trainer started
        OpenLease(6, submitted=True, policy_version=6, since=920),  # unjudged 80 s after submission: within the
        OpenLease(7, submitted=True, policy_version=6, since=800),  # vote window and 40 s, not 200 s after
        OpenLease(8, submitted=True, policy_version=6, since=990, decided_against=True),  # its committee rejected it
    ]
    assert in_flight(leases, version=6, max_staleness=2, now=1000, presumed_lost_s=40.0, vote_window_s=60) == 4
    assert in_flight(leases, version=6, max_staleness=2, now=1000, presumed_lost_s=1800.0, vote_window_s=60) == 6
    # Twice the measured claim-to-submission time, at least 10 s, at most the lease; the lease before any measure.
    assert presumed_lost_after(None, 1800) == 1800
    assert presumed_lost_after(20.0, 1800) == 40.0
    assert presumed_lost_after(2.0, 1800) == 10.0
    assert presumed_lost_after(5000.0, 1800) == 1800


def test_a_worker_may_claim_what_is_wanted_less_the_claims_mined_since() -> None:
    demand = demand_of(3, supply_groups=0, claims_seen=10)  # 3 wanted at the trainer's version
    counts = (10, 11, 12, 13, 20)
    assert [unclaimed(demand, 4, 2, chain_version=3, lease_count=count) for count in counts] == [3, 2, 1, 0, 0]
    assert unclaimed(demand, 4, 2, chain_version=3, lease_count=9) == 3  # a node behind the count reads no more
    assert unclaimed(demand, 4, 2, chain_version=2, lease_count=11) == 1  # one version behind: 2 wanted, 1 claimed


def test_a_demand_message_is_schema_checked() -> None:
    signer, job = dev_account(0), dev_account(19).address
    good = seal(Demand(job=job, nonce=1, timestamp=time.time(), version=0, prompts_per_step=4, supply_groups=2,
                       steps_left=None, claims_seen=0), signer)
    assert open_envelope(good)[1].supply_groups == 2
    for field, value in (("supply_groups", -1), ("supply_groups", 10**8), ("prompts_per_step", 0),
                         ("steps_left", -1), ("claims_seen", -3), ("version", "x"), ("wanted", 3)):
        raw = json.loads(good)
        raw["body"][field] = value
        with pytest.raises(EnvelopeError, match="malformed"):
            open_envelope(json.dumps(raw).encode())


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Callable[[str], P2PNode]]:
    started: list[P2PNode] = []

    def start(name: str) -> P2PNode:
        folder = tmp_path / name
        folder.mkdir()
        node = P2PNode(load_or_create_identity(folder), ObjectStore(folder / "objects"), gate=None).start()
        started.append(node)
        return node

    yield start
    for node in started:
        node.stop()


def _held_after(follower: PolicyFollower, wait_s: float) -> Demand | None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        follower.poll()
        time.sleep(0.1)
    return follower.demand


def test_a_follower_holds_only_the_trainers_fresh_newest_demand(market: Deployment, anvil: AnvilProcess,
                                                                tmp_path: Path,
                                                                nodes: Callable[[str], P2PNode]) -> None:
    """Who gains by breaking the rule: a rival worker who makes the others believe nothing is wanted, and has the
    job's leases to itself. It can forge a demand under its own key, alter the trainer's, or replay an old one of
    the trainer's that wanted nothing. None of it moves an honest worker's room to claim."""
    job = _deploy_job(market, anvil)
    trainer, rival = dev_account(REQUESTER), dev_account(7)
    chain = JobClient(client_for(anvil, 1), job)
    assert chain.spec().trainer == trainer.address
    trainer_node, worker_node, rival_node = nodes("trainer"), nodes("worker"), nodes("rival")
    observer = nodes("observer")  # takes every well-signed message: it shows what the rival's host sent
    for node in (trainer_node, rival_node):
        worker_node.connect([node.addr])
    observer.connect([rival_node.addr, trainer_node.addr])
    follower = PolicyFollower(worker_node, PolicyStore(tmp_path / "policies", trainer=trainer.address), chain,
                              RegistryClient(client_for(anvil, 1), market.registry))
    topic = topics(job)["policy"]
    for node in (trainer_node, rival_node, observer):
        node.subscribe(topic)
    time.sleep(1.5)  # one heartbeat: the mesh forms
    now = time.time()
    observed: set[int] = set()

    def sent(*nonces: int) -> bool:
        """Whether the observer received the messages of these nonces (waiting up to 10 s)."""
        deadline = time.monotonic() + 10
        while not set(nonces) <= observed and time.monotonic() < deadline:
            try:
                observed.add(open_envelope(observer.gossip_inbox.get(timeout=0.2).data)[1].nonce)
            except queue.Empty:
                continue
        return set(nonces) <= observed

    spec = chain.spec()

    def demand(nonce: int, wanted: int, timestamp: float) -> Demand:
        """A demand for `wanted` leases at the chain's version (the job's supply already covers the rest)."""
        prompts = 4 * spec.tasks_per_lease  # four leases a step
        horizon = (spec.max_staleness + 1) * prompts
        return Demand(job=job, nonce=nonce, timestamp=timestamp, version=chain.current_version(),
                      prompts_per_step=prompts, supply_groups=horizon - wanted * spec.tasks_per_lease,
                      claims_seen=chain.lease_count())

    def room(held: Demand) -> int:
        return unclaimed(held, spec.tasks_per_lease, spec.max_staleness, chain.current_version(), chain.lease_count())

    # A genuine demand from long ago that wanted nothing, replayed by the rival: too old to follow.
    rival_node.publish(topic, seal(demand(1, 0, now - DEMAND_TTL_S - 5), trainer))
    assert sent(1) and _held_after(follower, 1.0) is None
    trainer_node.publish(topic, seal(demand(2, 3, now), trainer))
    held = _held_after(follower, 1.5)
    assert sent(2) and held is not None
    before = room(held)
    assert before == 3
    forged = seal(demand(3, 0, now + 1), rival)  # a newer demand under the rival's own key
    altered = json.loads(seal(demand(4, 3, now + 2), trainer))
    altered["body"]["supply_groups"] += 3 * spec.tasks_per_lease  # the trainer's signature over another body
    older = seal(demand(5, 0, now - 10), trainer)  # genuine, but older than the one held
    dropped = sum(worker_node.stats.gossip_dropped.values())
    for message in (forged, json.dumps(altered).encode(), older):
        rival_node.publish(topic, message)
    assert sent(3, 5)  # the forgery and the older genuine demand went out (the alteration's signature does not
    # recover: hosts refuse it, the rival's own included)
    held = _held_after(follower, 1.5)
    assert sum(worker_node.stats.gossip_dropped.values()) > dropped  # the forgery reached the worker's host
    assert held is not None and held.nonce == 2
    # The attacker's gain: the leases the honest worker stopped claiming.
    assert before - room(held) == 0
    # The trainer's newer count replaces the older one.
    trainer_node.publish(topic, seal(demand(6, 1, time.time()), trainer))
    held = _held_after(follower, 1.5)
    assert held is not None and room(held) == 1

"""The on-chain half of the market end to end on a real anvil, through the Python bindings: committees,
appeals, collateral, pull payments, and peer-ID proofs."""

from __future__ import annotations

import pytest
from conftest import ETH, REPO, advance_time, client_for, freeze_in_background
from rollnet.node.chain.anvil import AnvilProcess
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.job import FactoryClient, JobClient, LeaseStatus, Outcome
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.config import Deployment
from rollnet.node.errors import ContractRevert, TransactionNotSent
from rollnet.node.events import EventLog
from rollnet.node.keeper import AppealRewards, Keeper
from rollnet.node.keys import dev_account
from rollnet.node.lease_book import LeaseBook
from rollnet.node.p2p.identity import PeerIdentity
from rollnet.node.spec import load_job_spec
from rollnet.node.worker import claim_with_seed, submit_through_outage

WORKER, VALIDATOR_A, VALIDATOR_B, LATECOMER, REQUESTER = 1, 2, 3, 4, 0
PAY = 64 * 10**15  # 8 tasks x 8 completions x 0.001 ETH


def _deploy_job(market: Deployment, anvil: AnvilProcess, **changes: object) -> str:
    for index, role in ((WORKER, Role.WORKER), (VALIDATOR_A, Role.VALIDATOR), (VALIDATOR_B, Role.VALIDATOR)):
        RegistryClient(client_for(anvil, index), market.registry).join(PeerIdentity.generate(), role, 10 * ETH)
    requester = client_for(anvil, REQUESTER)
    spec = load_job_spec(REPO / "examples" / "job.toml").model_copy(update=changes)
    address = FactoryClient(requester, market.factory).create_job(spec.to_abi(requester.address), 5 * ETH)
    JobClient(requester, address).publish_policy(1, b"\x11" * 32)
    return address


@pytest.fixture
def job(market: Deployment, anvil: AnvilProcess) -> str:
    return _deploy_job(market, anvil)


def _submitted_lease(anvil: AnvilProcess, job: str) -> tuple[JobClient, int]:
    worker = JobClient(client_for(anvil, WORKER), job)
    lease = claim_with_seed(worker)
    assert lease.status is LeaseStatus.LEASED and lease.seed_drawn
    assert lease.task_seed(0) != lease.task_seed(1)
    worker.submit(lease.lease_id, b"\x22" * 32, 1)
    return worker, lease.lease_id


def test_an_accepted_batch_pays_the_worker_after_the_appeal_window(market: Deployment, anvil: AnvilProcess,
                                                                   job: str) -> None:
    worker, lease_id = _submitted_lease(anvil, job)
    registry = RegistryClient(worker.client, market.registry)
    assert registry.info(worker.client.address).locked == ETH  # the lease's collateral
    a, b = (JobClient(client_for(anvil, v), job) for v in (VALIDATOR_A, VALIDATOR_B))
    # Two validators of equal stake and an expected committee of 3: both sit, each with half the weight.
    assert a.member_weight(lease_id, 0, a.client.address) == b.member_weight(lease_id, 0, b.client.address) > 0
    assert a.member_weight(lease_id, 0, worker.client.address) == 0  # never on its own committee
    a.vote(lease_id, True)
    assert worker.lease(lease_id).status is LeaseStatus.VOTING  # half the stake is not a majority
    b.vote_batch({lease_id: True})
    lease = worker.lease(lease_id)
    assert lease.status is LeaseStatus.DECIDED and lease.outcome is Outcome.ACCEPT
    with pytest.raises(ContractRevert, match="DeadlineNotReached"):
        worker.finalize(lease_id)
    advance_time(worker.client, 3601)
    worker.finalize(lease_id)
    assert worker.owed(worker.client.address) == PAY
    assert registry.info(worker.client.address).locked == 0
    balance_before = worker.client.balance(worker.client.address)
    receipt = worker.withdraw_payment()
    gas_cost = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    assert worker.client.balance(worker.client.address) == balance_before + PAY - gas_cost
    state = worker.status()
    assert state.escrow == 5 * ETH - PAY
    assert state.balance == state.escrow + state.total_owed + state.bonds_held + state.pool_held + state.burned


def test_a_rejected_batch_loses_its_collateral_to_the_voters_never_to_the_requester(
        market: Deployment, anvil: AnvilProcess, job: str) -> None:
    worker, lease_id = _submitted_lease(anvil, job)
    for validator in (VALIDATOR_A, VALIDATOR_B):
        JobClient(client_for(anvil, validator), job).vote(lease_id, False)
    advance_time(worker.client, 3601)
    worker.finalize(lease_id)
    registry = RegistryClient(worker.client, market.registry)
    info = registry.info(worker.client.address)
    assert worker.lease(lease_id).status is LeaseStatus.SLASHED
    assert (info.active, info.locked) == (9 * ETH, 0)
    state = worker.status()
    assert state.escrow == 5 * ETH and state.reserved == 0  # the slash does not go to the requester's escrow
    assert state.burned == ETH // 10
    for validator in (VALIDATOR_A, VALIDATOR_B):
        voter = JobClient(client_for(anvil, validator), job)
        assert voter.reward_of(lease_id, voter.client.address) == 45 * ETH // 100
        voter.claim_reward(lease_id)
        assert voter.owed(voter.client.address) == 45 * ETH // 100
    requester = JobClient(client_for(anvil, REQUESTER), job)
    before = requester.client.balance(requester.client.address)
    receipt = requester.close()
    refunded = requester.client.balance(requester.client.address) - before + receipt["gasUsed"] * receipt[
        "effectiveGasPrice"]
    assert refunded == 5 * ETH  # the escrow only


def test_an_appeal_to_the_whole_validator_stake_overturns_a_wrong_rejection(market: Deployment,
                                                                           anvil: AnvilProcess) -> None:
    job = _deploy_job(market, anvil, appeal_rounds=1)
    worker, lease_id = _submitted_lease(anvil, job)
    a, b = (JobClient(client_for(anvil, v), job) for v in (VALIDATOR_A, VALIDATOR_B))
    a.vote(lease_id, False)
    b.vote(lease_id, False)  # both first-round members reject an honest batch
    assert worker.lease(lease_id).outcome is Outcome.REJECT
    newcomer = client_for(anvil, LATECOMER)  # an honest validator with a stake majority joins before the appeal
    RegistryClient(newcomer, market.registry).join(PeerIdentity.generate(), Role.VALIDATOR, 30 * ETH)
    worker.appeal(lease_id)  # the worker knows its batch is honest
    lease = worker.lease(lease_id)
    assert (lease.status, lease.round) == (LeaseStatus.VOTING, 1)
    assert worker.committee_size(1) is None  # the final round seats every validator, weighted by stake
    honest = JobClient(newcomer, job)
    worker.client.rpc("evm_mine", [])
    assert honest.member_weight(lease_id, 1, newcomer.address) == 30 * ETH
    a.vote(lease_id, False)
    honest.vote(lease_id, True)  # 30 of 50 ETH: decided at once, and final
    worker.finalize(lease_id)
    lease = worker.lease(lease_id)
    assert (lease.status, lease.outcome) == (LeaseStatus.PAID, Outcome.ACCEPT)
    keeper = Keeper(honest, EventLog(None))
    assert keeper.slash_losers(lease_id) == 2  # both voters of the wrong rejection, each once
    registry = RegistryClient(worker.client, market.registry)
    assert registry.info(a.client.address).active == 9 * ETH
    assert registry.info(b.client.address).active == 9 * ETH
    pool = 2 * ETH * 9 // 10  # two voter slashes, less the 10% burned
    assert worker.reward_of(lease_id, worker.client.address) == pool // 4  # the winning appellant's share
    assert honest.reward_of(lease_id, newcomer.address) == pool - pool // 4  # the only winning voter
    worker.claim_reward(lease_id)
    bond = worker.appeal_bond(1)
    assert worker.owed(worker.client.address) == PAY + bond + pool // 4
    state = worker.status()
    assert state.balance == state.escrow + state.total_owed + state.bonds_held + state.pool_held + state.burned


def test_stale_and_unpublished_submissions_are_refused_on_chain(anvil: AnvilProcess, job: str) -> None:
    requester = JobClient(client_for(anvil, REQUESTER), job)
    worker = JobClient(client_for(anvil, WORKER), job)
    raced = claim_with_seed(worker)  # claimed at version 1
    with pytest.raises(ContractRevert, match="policy version 2 is not published yet: current is 1"):
        worker.submit(raced.lease_id, b"\x33" * 32, 2)
    for version in range(2, 7):
        requester.publish_policy(version, bytes([version]) * 32)
    with pytest.raises(ContractRevert, match="the next policy version is 6 \\+ 1, not 9"):
        requester.publish_policy(9, b"\x09" * 32)
    lease = claim_with_seed(worker)  # claimed at version 6
    with pytest.raises(ContractRevert, match="policy version 1 is too stale: current is 6, max staleness 4"):
        worker.submit(lease.lease_id, b"\x33" * 32, 1)
    worker.submit(lease.lease_id, b"\x33" * 32, 2)
    assert worker.lease(lease.lease_id).policy_version == 2
    # A trainer racing ahead cannot make a lease in flight fail: the version current at its claim stays valid.
    worker.submit(raced.lease_id, b"\x34" * 32, 1)
    assert worker.lease(raced.lease_id).status is LeaseStatus.VOTING


def test_versions_held_back_by_an_outage_are_published_in_order_before_the_newest(anvil: AnvilProcess,
                                                                                  job: str) -> None:
    """The job takes versions one by one: a trainer whose version 2 never reached the chain (an outage) and
    that has since written 3 and 4 publishes 2, 3, 4 in that order; publishing 4 alone is refused."""
    trainer = JobClient(client_for(anvil, REQUESTER), job)
    roots = {version: bytes([version]) * 32 for version in range(1, 6)}
    with pytest.raises(ContractRevert, match="the next policy version is 1 \\+ 1, not 4"):
        trainer.publish_policy(4, roots[4])
    announced: list[int] = []
    assert trainer.publish_up_to(4, roots.__getitem__, on_published=announced.append) == [2, 3, 4]
    assert announced == [2, 3, 4]
    assert [trainer.policy_root(v) for v in range(2, 5)] == [roots[v] for v in range(2, 5)]
    assert trainer.publish_up_to(4, roots.__getitem__, on_published=announced.append) == []  # nothing twice
    assert trainer.publish_up_to(3, roots.__getitem__) == [] and trainer.current_version() == 4
    # A copy of version 5 sent before an outage lands after the chain was read: the version is there with this
    # trainer's root, so it counts as published and the next one follows.
    earlier_copy = JobClient(client_for(anvil, REQUESTER), job)

    def root_landing_meanwhile(version: int) -> bytes:
        if version == 5 and earlier_copy.current_version() < 5:
            earlier_copy.publish_policy(5, roots[5])
        return roots[version]

    roots[6] = b"\x06" * 32
    restarted = JobClient(client_for(anvil, REQUESTER), job)  # its nonces read after the other copy's
    assert restarted.publish_up_to(6, root_landing_meanwhile) == [5, 6]
    assert [trainer.policy_root(v) for v in (5, 6)] == [roots[5], roots[6]]
    with pytest.raises(ContractRevert, match="the next policy version is 6 \\+ 1, not 6"):
        restarted.publish_policy(6, b"\x07" * 32)  # another root for a published version is still refused


def test_a_peer_id_is_registered_only_by_the_holder_of_its_key(market: Deployment, anvil: AnvilProcess) -> None:
    victim, squatter = client_for(anvil, 5), client_for(anvil, 6)
    victim_peer = PeerIdentity.generate()
    registry = RegistryClient(squatter, market.registry)
    # The squatter signs with its own key, or replays the victim's signature made for the victim's address.
    for signature in (registry.binding_signature(PeerIdentity.generate()),
                      RegistryClient(victim, market.registry).binding_signature(victim_peer)):
        with pytest.raises(ContractRevert, match="did not sign this binding"):
            squatter.transact(registry.contract.functions.join(victim_peer.peer_id_bytes, signature, 1), value=ETH)
    with pytest.raises(ContractRevert, match="not a libp2p secp256k1 key"):
        squatter.transact(registry.contract.functions.join(b"peer-of-someone", b"\x00" * 65, 1), value=ETH)
    RegistryClient(victim, market.registry).join(victim_peer, Role.WORKER, ETH)
    assert registry.owner_of_peer(victim_peer.peer_id_bytes) == victim.address


def test_a_worker_whose_appeal_won_claims_the_losers_stakes_however_late_they_reach_the_pool(
        market: Deployment, anvil: AnvilProcess) -> None:
    job = _deploy_job(market, anvil, appeal_rounds=1)
    a, b = (JobClient(client_for(anvil, v), job) for v in (VALIDATOR_A, VALIDATOR_B))
    for validator in (a, b):
        validator.enlist()  # enlisted members answer for their absence
    worker, lease_id = _submitted_lease(anvil, job)
    me = worker.client.address
    a.vote(lease_id, False)  # half the committee rejects an honest batch, the other half never votes
    advance_time(worker.client, worker.lease(lease_id).deadline + 1 - worker.client.now())
    newcomer = client_for(anvil, LATECOMER)
    RegistryClient(newcomer, market.registry).join(PeerIdentity.generate(), Role.VALIDATOR, 30 * ETH)
    worker.appeal(lease_id)  # against the closed round's rejection
    honest = JobClient(newcomer, job)
    worker.client.rpc("evm_mine", [])
    honest.vote(lease_id, True)  # 30 of 50 ETH in the final round: accepted, final at once
    worker.finalize(lease_id)

    book = LeaseBook(worker, market.deployed_at_block, worker=me)
    (entry,) = book.poll().finished
    assert (entry.round, entry.outcome) == (1, Outcome.ACCEPT)
    rewards = AppealRewards(Keeper(worker, EventLog(None)))
    rewards.note(entry)
    withdrawn = rewards.collect(worker.client.now())  # the worker slashes the loser itself before it claims
    claimed = worker.contract.functions.rewardClaimed(lease_id, me).call()
    assert claimed > 0 and worker.reward_of(lease_id, me) == 0 and worker.owed(me) == 0
    assert withdrawn == PAY + worker.appeal_bond(1) + claimed  # its pay, its bond back, its share of the loser's stake
    assert RegistryClient(worker.client, market.registry).info(a.client.address).active == 9 * ETH

    # The absent member's penalty reaches the pool later, from another keeper: the worker claims it too.
    assert Keeper(honest, EventLog(None)).penalize_absentees(entry, lambda: [a.client.address, b.client.address]) == 1
    assert worker.reward_of(lease_id, me) > 0 and rewards.pending
    late = rewards.collect(worker.client.now())
    assert worker.reward_of(lease_id, me) == 0
    assert late == worker.contract.functions.rewardClaimed(lease_id, me).call() - claimed > 0
    advance_time(worker.client, rewards.watch_s + 1)
    rewards.collect(worker.client.now())
    assert not rewards.pending  # watched for a bounded time, then forgotten


def test_a_prepared_batch_is_submitted_through_a_frozen_chain_not_dropped(anvil: AnvilProcess, job: str) -> None:
    """A worker whose submission meets an outage (anvil SIGSTOPped past the request timeout) sends it once the
    chain is back: the batch is work done, and dropping it would leave the lease to expire, costing the honest
    worker the expiry fee and the pay. The bare transaction fails on the same outage before it is signed (what the
    worker did before), spending no nonce: the next one is mined at once."""
    worker = JobClient(ChainClient(anvil.url, dev_account(WORKER), request_timeout=0.5, outage_seconds=30), job)
    first, second = claim_with_seed(worker), claim_with_seed(worker)
    mined = worker.client.transactions
    for lease, send in ((first, None), (second, submit_through_outage)):
        thaw = freeze_in_background(anvil, 3.0)
        try:
            if send is None:
                with pytest.raises(TransactionNotSent):  # (a ChainUnavailable) the estimate failed: nothing signed
                    worker.submit(lease.lease_id, b"\x44" * 32, 1)
            else:
                send(worker, lease.lease_id, b"\x55" * 32, 1)
        finally:
            thaw.join()
    assert worker.lease(first.lease_id).status is LeaseStatus.LEASED  # the bare send's batch was never submitted
    kept = worker.lease(second.lease_id)
    assert (kept.status, kept.root, kept.policy_version) == (LeaseStatus.VOTING, b"\x55" * 32, 1)
    submitted = worker.client.events(worker.contract, "BatchSubmitted", 0)
    assert [e["args"]["leaseId"] for e in submitted] == [second.lease_id]  # sent once
    assert worker.client.transactions == mined + 1  # one submission mined; the failed one spent nothing

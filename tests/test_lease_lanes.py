"""A worker's lease lanes against a real anvil that mines a block every two seconds (an L2's cadence): claims made
ahead share blocks instead of taking two each, one after the other; every lease's seed is drawn after its claim's
block; submissions are mined while the caller goes on; and every claim and submission reaches the caller exactly
once, failures included."""

from __future__ import annotations

from functools import partial

import pytest
from conftest import ETH, REPO, client_for
from rollnet.node.chain.anvil import AnvilProcess, start_anvil
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.deploy import RegistryParams, deploy_market
from rollnet.node.chain.job import FactoryClient, JobClient, LeaseStatus
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.config import Deployment
from rollnet.node.errors import ContractRevert
from rollnet.node.keys import dev_account
from rollnet.node.lease_lanes import Claimed, LeaseLanes
from rollnet.node.p2p.identity import PeerIdentity
from rollnet.node.spec import load_job_spec
from rollnet.node.worker import claim_with_seed, collateral_room

REQUESTER, WORKER, STRANGER = 0, 1, 9
LEASES = 3


def _claim(job: JobClient) -> Claimed:
    timings: dict[str, float] = {}
    lease = claim_with_seed(job, timings=timings)
    return Claimed(lease, timings)


def _staffed_job(market: Deployment, anvil: AnvilProcess, stake: int = 10 * ETH) -> str:
    """The example job with version 1 published and one worker staked `stake` (10 ETH); its address."""
    RegistryClient(client_for(anvil, WORKER), market.registry).join(PeerIdentity.generate(), Role.WORKER, stake)
    requester = client_for(anvil, REQUESTER)
    spec = load_job_spec(REPO / "examples" / "job.toml")
    address = FactoryClient(requester, market.factory).create_job(spec.to_abi(requester.address), 5 * ETH)
    JobClient(requester, address).publish_policy(1, b"\x11" * 32)
    return address


def test_claims_and_submissions_share_blocks_and_each_reaches_the_caller_once() -> None:
    anvil = start_anvil()
    try:
        market = deploy_market(ChainClient(anvil.url, dev_account(REQUESTER)),
                               RegistryParams(unbonding_period_seconds=3 * 86_400))
        address = _staffed_job(market, anvil)
        anvil.mine_every(2)  # set up at once, then a block every two seconds
        job = JobClient(client_for(anvil, WORKER), address)
        nonce = job.client.w3.eth.get_transaction_count(job.client.address)

        lanes: LeaseLanes[object] = LeaseLanes(partial(_claim, job), width=LEASES)
        lanes.claim_ahead(LEASES)
        lanes.claim_ahead(LEASES)  # already in flight: nothing more is claimed
        assert lanes.claiming == LEASES
        claimed = []
        while len(claimed) < LEASES:
            if (got := lanes.ready(timeout=30)) is not None:
                claimed.append(got)
        assert lanes.claiming == 0 and lanes.ready() is None
        ids = sorted(c.lease.lease_id for c in claimed)
        assert ids == list(range(1, LEASES + 1))  # three distinct leases, each handed out once
        assert all(c.lease.seed_drawn and c.timings["claim_s"] > 0 for c in claimed)

        claims = {e["args"]["leaseId"]: e["blockNumber"] for e in job.client.events(job.contract, "TaskClaimed", 0)}
        seeds = {e["args"]["leaseId"]: e["blockNumber"] for e in job.client.events(job.contract, "SeedDrawn", 0)}
        assert all(seeds[i] > claims[i] for i in ids)  # every seed from a block after its claim
        # One after the other, three leases take at least six blocks (claim, then seed draw, each in its own block).
        spanned = max(seeds.values()) - min(claims.values()) + 1
        assert spanned < 2 * LEASES, (claims, seeds)

        for lease_id in ids:
            lanes.submit(lease_id, partial(job.submit, lease_id, bytes([lease_id]) * 32, 1))
        with pytest.raises(ValueError, match="already being submitted"):
            lanes.submit(ids[0], partial(job.submit, ids[0], b"\x01" * 32, 1))
        lanes.submit(99, partial(job.submit, 99, b"\x63" * 32, 1))  # no such lease: refused by the contract
        finished = {item.lease_id: item for item in lanes.finished(wait_all=True)}
        assert sorted(finished) == [*ids, 99] and lanes.submitting == 0 and lanes.finished() == []
        assert all(finished[i].error is None and finished[i].result["status"] == 1 for i in ids)
        assert isinstance(finished[99].error, ContractRevert) and finished[99].result is None
        submitted = {e["blockNumber"] for e in job.client.events(job.contract, "BatchSubmitted", 0)}
        assert len(submitted) < LEASES and all(job.lease(i).status is LeaseStatus.VOTING for i in ids)
        # Nine transactions from one key on three threads: no nonce was used twice or skipped, none reverted.
        assert job.client.w3.eth.get_transaction_count(job.client.address) == nonce + 3 * LEASES
        assert job.client.transactions == 3 * LEASES
        # A lease claimed and seeded but never taken is handed back when the lanes close, to be reported.
        lanes.claim_ahead(1)
        assert lanes.wait_ready(timeout=30)
        (abandoned,) = lanes.close()
        assert abandoned.lease.lease_id == LEASES + 1 and abandoned.lease.seed_drawn

        # A claim that fails (an unstaked stranger) raises once, to the caller, and is then gone.
        stranger = LeaseLanes(partial(_claim, JobClient(client_for(anvil, STRANGER), address)), width=1)
        stranger.claim_ahead(1)
        with pytest.raises(ContractRevert, match="not an active, staked worker") as refused:
            while stranger.ready(timeout=30) is None:
                pass
        assert refused.value.error_name == "NotActive"
        assert stranger.claiming == 0 and stranger.ready() is None
        stranger.close()
    finally:
        anvil.stop()


def test_a_seed_someone_else_drew_is_the_workers_seed(market: Deployment, anvil: AnvilProcess) -> None:
    """Anyone may draw a lease's seed (it is the claim block's hash whoever sends it): a worker beaten to it takes
    the drawn lease instead of failing."""
    address = _staffed_job(market, anvil)
    stranger = JobClient(client_for(anvil, STRANGER), address)
    lease = claim_with_seed(JobClient(client_for(anvil, WORKER), address),
                            on_claim=lambda claimed: stranger.draw_seed(claimed.lease_id))
    assert lease.seed_drawn and lease.seed == stranger.lease(lease.lease_id).seed


def test_claims_sent_together_never_exceed_what_free_stake_covers() -> None:
    """A worker's claims in flight are estimated without seeing each other, so a claim its free stake cannot
    cover would be mined, revert and cost its gas. With stake for two leases' collateral and room for four, the
    capped worker sends two claims, both mined; sent uncapped, the third reverts on chain and the worker pays for
    nothing."""
    anvil = start_anvil()
    try:
        market = deploy_market(ChainClient(anvil.url, dev_account(REQUESTER)),
                               RegistryParams(unbonding_period_seconds=3 * 86_400))
        address = _staffed_job(market, anvil, stake=2 * ETH)
        anvil.mine_every(2)  # set up at once, then a block every two seconds
        for index, capped in ((WORKER, True), (STRANGER, False)):
            job = JobClient(client_for(anvil, index), address)
            if index == STRANGER:  # staked the same, from another client so its join is not counted below
                RegistryClient(client_for(anvil, STRANGER), market.registry).join(PeerIdentity.generate(),
                                                                                  Role.WORKER, 2 * ETH)
            registry = RegistryClient(job.client, job.registry_address())
            slash = job.spec().slash_amount
            lanes: LeaseLanes[object] = LeaseLanes(partial(_claim, job), width=4)
            wanted = min(4, collateral_room(registry, job.client.address, slash, lanes.unfinished_claims)) \
                if capped else 3
            lanes.claim_ahead(wanted)
            if capped:  # while they are in flight, nothing more is covered
                assert collateral_room(registry, job.client.address, slash, lanes.unfinished_claims) == 0
            outcomes = []
            while lanes.claiming:
                try:
                    if (got := lanes.ready(timeout=30)) is not None:
                        outcomes.append(got.lease.lease_id)
                except ContractRevert as exc:
                    outcomes.append(exc.error_name)
            lanes.close()
            failed = [o for o in outcomes if not isinstance(o, int)]
            if capped:  # two claims and their two seed draws, all mined and all useful
                assert wanted == 2 and len(outcomes) == 2 and failed == [] and job.client.transactions == 4
                assert collateral_room(registry, job.client.address, slash, 0) == 0
            else:  # the same four, and a fifth: the claim that reverted on chain, its gas paid for nothing
                assert failed == ["InsufficientActiveStake"] and job.client.transactions == 5
    finally:
        anvil.stop()

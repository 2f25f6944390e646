"""Committee membership computed locally from the lease book agrees with the contract's `memberWeight` for every
validator, lease and round (sampled rounds, the final round that seats everyone, drawn and undrawn rounds, and
a round whose randomness expired), while asking the chain only for the registry's weights once per start block."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ETH, REPO, advance_time, client_for, mine_blocks
from rollnet.node.chain.anvil import AnvilProcess
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.job import FactoryClient, JobClient
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.committee import BLOCKHASH_WINDOW, CommitteeView, drew_nobody
from rollnet.node.config import Deployment
from rollnet.node.errors import ConfigError
from rollnet.node.keys import dev_account
from rollnet.node.lease_book import LeaseBook
from rollnet.node.p2p.identity import PeerIdentity
from rollnet.node.spec import load_job_spec
from rollnet.node.units import eth_to_wei
from rollnet.node.verdicts import BookCommittee
from rollnet.node.weight_history import WeightHistory
from rollnet.node.worker import claim_with_seed

REQUESTER, WORKER = 0, 1
STAKES = {2: 5, 3: 6, 4: 8, 5: 10, 6: 20, 7: 40}  # validator account -> ETH: some always seated, some sampled


def _agree(job: JobClient, view: CommitteeView, book: LeaseBook, lease_id: int, round_: int) -> int:
    """Compare every validator's (and the worker's) local weight with the contract's; returns the seats."""
    entry = book.get(lease_id)
    seats = 0
    for index in [WORKER, *STAKES]:
        member = dev_account(index).address
        local = view.weight(entry, round_, member, book.head)
        assert local == job.member_weight(lease_id, round_, member), (lease_id, round_, index)
        seats += local > 0
    return seats


def test_the_local_committee_is_the_contracts(market: Deployment, anvil: AnvilProcess) -> None:
    RegistryClient(client_for(anvil, WORKER), market.registry).join(PeerIdentity.generate(), Role.WORKER, 10 * ETH)
    for index, stake in STAKES.items():
        RegistryClient(client_for(anvil, index), market.registry).join(PeerIdentity.generate(), Role.VALIDATOR,
                                                                        stake * ETH)
    requester = client_for(anvil, REQUESTER)
    spec = load_job_spec(REPO / "examples" / "job.toml")
    address = FactoryClient(requester, market.factory).create_job(spec.to_abi(requester.address), 5 * ETH)
    JobClient(requester, address).publish_policy(1, b"\x11" * 32)
    worker = JobClient(client_for(anvil, WORKER), address)
    leases = []
    for _ in range(8):
        lease_id = claim_with_seed(worker).lease_id
        worker.submit(lease_id, b"\x22" * 32, 1)
        leases.append(lease_id)
    for lease_id in leases[::2]:
        worker.draw_committee(lease_id)  # half drawn (seed and total from CommitteeDrawn), half not
    reader = JobClient(ChainClient(anvil.url), address)
    book = LeaseBook(reader, market.deployed_at_block)
    book.poll()
    view = CommitteeView(reader, RegistryClient(reader.client, market.registry), market.deployed_at_block)
    before = sum(reader.client.requests.values())
    seats = [_agree(worker, view, book, lease_id, 0) for lease_id in leases]
    # The registry's weights from its events: the start check, the head and one eth_getLogs; the committee size
    # once; nothing per lease, start block or validator.
    assert sum(reader.client.requests.values()) - before <= 4
    assert max(seats) >= 2 and any(0 < s < len(STAKES) for s in seats)  # sampled committees, not everyone

    # The trainer's verdict book seats members the same way, drawn on chain or not (half of these are not).
    committee, registry = BookCommittee(view, book), view.registry
    for lease_id in leases:
        start = book.get(lease_id).starts[0][0]
        for index in STAKES:
            member = dev_account(index).address
            seat = committee.seat(lease_id, member)
            assert seat.weight == worker.member_weight(lease_id, 0, member)
            assert seat.total == registry.total_weight_at(start - 1)
            assert seat.stake == (registry.weight_at(member, start - 1) if seat.weight else 0)
    # Its vote window is open, and nobody objected yet; a member's reject on chain is an objection, which gossip
    # that never carried it cannot outvote.
    target = leases[6]
    assert not committee.vote_closed(target) and not committee.objected(target)
    rejecter = next(index for index in STAKES if committee.seat(target, dev_account(index).address).weight)
    JobClient(client_for(anvil, rejecter), address).vote(target, False)
    book.poll()
    assert committee.objected(target) and not committee.objected(leases[0])
    # A weight history must start before any validator held weight, or it would miss their weight.
    with pytest.raises(ConfigError, match="follow the registry from its deployment block"):
        WeightHistory(registry, book.head).total_at(book.head)

    # Appeals: round 1 (committee 6 of 89 ETH, still sampled) and round 2 (final: every validator, by stake).
    appealed = leases[1]
    for round_ in (1, 2):
        advance_time(worker.client, worker.lease(appealed).deadline + 1 - worker.client.now())
        worker.appeal(appealed)  # against a void round: nobody voted
        book.poll()
        assert book.get(appealed).round == round_
        seated = _agree(worker, view, book, appealed, round_)
    assert seated == len(STAKES)  # the final round seats everyone

    # A round never drawn whose start block's hash is gone: no committee, here as on chain.
    mine_blocks(worker.client, BLOCKHASH_WINDOW + 2)
    book.poll()
    assert _agree(worker, view, book, leases[3], 0) == 0
    # ...which is not an empty draw: the members may have stayed away, so it is no reason to appeal
    assert not drew_nobody(view, book.get(leases[3]), 0, book.head)

    # Weights change: one validator adds stake, one unbonds below the minimum (its weight drops to 0). Rounds that
    # start afterwards see the new weights and earlier ones keep theirs, here as on chain.
    RegistryClient(worker.client, market.registry).add_stake(10 * ETH)  # room for more leases
    RegistryClient(client_for(anvil, 2), market.registry).add_stake(30 * ETH)
    RegistryClient(client_for(anvil, 3), market.registry).request_unbond(5 * ETH)  # 6 - 5 = 1 < the 5 minimum
    later = []
    for _ in range(4):
        lease_id = claim_with_seed(worker).lease_id
        worker.submit(lease_id, b"\x22" * 32, 1)
        later.append(lease_id)
    book.poll()
    for lease_id in [*leases[4:], *later]:
        _agree(worker, view, book, lease_id, 0)
    assert view.weights.weight_at(dev_account(3).address, book.head) == 0
    assert view.weights.weight_at(dev_account(2).address, book.head) == 35 * ETH


def test_a_round_that_drew_nobody_is_known_locally_and_its_worker_appeals_it(market: Deployment,
                                                                             anvil: AnvilProcess) -> None:
    """Committees are drawn by self-selection, so a round can seat nobody (here each of 6 equal validators sits
    with probability 1/6). Nobody can vote there, and the round would lapse void and unpaid: the honest worker
    appeals it (a larger committee is drawn afresh), while a round whose drawn members stayed away is left."""
    from rollnet.node.chain.job import Outcome
    from rollnet.node.keeper import own_batch_appeal

    validators = range(2, 8)
    leases_at_most = 30  # P(a lease seats nobody) = (5/6)^6 = 0.33: 30 leases without both kinds, about 1 in 160,000
    spec = load_job_spec(REPO / "examples" / "job.toml").model_copy(update={"committee_size": 1})
    collateral = eth_to_wei(spec.slash_eth, "slash_eth")  # every submitted lease stays locked until it settles
    RegistryClient(client_for(anvil, WORKER), market.registry).join(PeerIdentity.generate(), Role.WORKER,
                                                                    leases_at_most * collateral + 10 * ETH)
    for index in validators:
        RegistryClient(client_for(anvil, index), market.registry).join(PeerIdentity.generate(), Role.VALIDATOR,
                                                                        10 * ETH)
    requester = client_for(anvil, REQUESTER)
    address = FactoryClient(requester, market.factory).create_job(spec.to_abi(requester.address), 5 * ETH)
    JobClient(requester, address).publish_policy(1, b"\x11" * 32)
    worker = JobClient(client_for(anvil, WORKER), address)
    registry = RegistryClient(worker.client, market.registry)
    view = CommitteeView(worker, registry, market.deployed_at_block)
    book = LeaseBook(worker, market.deployed_at_block, worker=worker.client.address)
    listed = [dev_account(i).address for i in validators]
    empty = seated = None
    for _ in range(leases_at_most):
        lease_id = claim_with_seed(worker).lease_id
        worker.submit(lease_id, b"\x22" * 32, 1)
        book.poll()
        entry = book.get(lease_id)
        before = sum(worker.client.requests.values())
        nobody = drew_nobody(view, entry, 0, book.head)
        assert sum(worker.client.requests.values()) - before <= 4  # new weight events (and, once, the size)
        before = sum(worker.client.requests.values())
        assert drew_nobody(view, entry, 0, book.head) == nobody
        assert sum(worker.client.requests.values()) == before  # asked again: nothing read
        assert nobody == all(worker.member_weight(lease_id, 0, v) == 0 for v in listed)  # the contract agrees
        if nobody and empty is None:
            empty = lease_id
        elif not nobody and seated is None:
            seated = lease_id
        if empty and seated:
            break
    assert empty and seated
    closed = max(worker.lease(empty).deadline, worker.lease(seated).deadline) + 1  # both vote windows over
    advance_time(worker.client, closed - worker.client.now())
    book.poll()
    wanted = {lease_id: own_batch_appeal(worker, book.get(lease_id), book.now, worker.spec(),
                                         lambda e: drew_nobody(view, e, e.round, book.head))
              for lease_id in (empty, seated)}
    assert wanted == {empty: Outcome.VOID, seated: None}  # the absent members' round is not worth a bond
    worker.appeal(empty)
    book.poll()
    assert book.get(empty).round == 1



def test_several_weight_changes_in_one_block_leave_the_last_as_the_contract_does(market: Deployment,
                                                                                 anvil: AnvilProcess) -> None:
    """Anvil mines a block per transaction unless told otherwise: here automine is off while four weight changes
    wait in the pool (two stake increases by one validator, an unbonding below the minimum, a join), then one
    block holds them all. The history's weights and total at that block and the one before are the contract's
    `weightsAt`: the last change of a validator in a block wins."""
    first, second, third, joiner = 2, 3, 4, 5
    for index in (first, second, third):
        RegistryClient(client_for(anvil, index), market.registry).join(PeerIdentity.generate(), Role.VALIDATOR,
                                                                        STAKES[index] * ETH)
    reader = RegistryClient(ChainClient(anvil.url), market.registry)
    history = WeightHistory(reader, market.deployed_at_block)
    before = reader.client.block_number()
    assert history.total_at(before) == (STAKES[first] + STAKES[second] + STAKES[third]) * ETH

    registries = {index: RegistryClient(client_for(anvil, index), market.registry)
                  for index in (first, second, joiner)}
    changes = [lambda: registries[first].add_stake(3 * ETH), lambda: registries[first].add_stake(4 * ETH),
               lambda: registries[second].request_unbond(2 * ETH),  # 6 - 2 = 4 < the 5 minimum: weight 0
               lambda: registries[joiner].join(PeerIdentity.generate(), Role.VALIDATOR, STAKES[joiner] * ETH)]
    rpc = reader.client.rpc
    rpc("evm_setAutomine", [False])
    try:
        with ThreadPoolExecutor(len(changes)) as pool:
            sent = [pool.submit(change) for change in changes]
            deadline = time.monotonic() + 30
            while int(str(rpc("txpool_status", [])["pending"]), 0) < len(changes):
                assert time.monotonic() < deadline, "the weight changes never reached the pool"
                time.sleep(0.05)
            rpc("evm_mine", [])
            receipts = [future.result(timeout=60) for future in sent]
    finally:
        rpc("evm_setAutomine", [True])
    assert {receipt["blockNumber"] for receipt in receipts} == {before + 1}  # one block holds all four
    rpc("evm_mine", [])  # the contract answers for past blocks only
    for at in (before, before + 1):
        for index in (first, second, third, joiner):
            member = dev_account(index).address
            assert history.weight_at(member, at) == reader.weight_at(member, at), (index, at)
        assert history.total_at(at) == reader.total_weight_at(at), at
    assert history.weight_at(dev_account(first).address, before + 1) == (STAKES[first] + 7) * ETH
    assert history.weight_at(dev_account(second).address, before + 1) == 0
    assert history.weight_at(dev_account(joiner).address, before + 1) == STAKES[joiner] * ETH

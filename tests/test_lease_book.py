"""The lease book against a real anvil: it says what the chain says of every lease in flight, a poll costs the
same few requests however many leases there are, it resumes from its saved cursor, and keepers take turns so a
due lease is settled by one transaction rather than by everyone watching it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ETH, REPO, advance_time, client_for, mine_blocks
from rollnet.node.chain.anvil import AnvilProcess, start_anvil
from rollnet.node.chain.client import LOG_RANGE_BLOCKS, ChainClient
from rollnet.node.chain.deploy import RegistryParams, deploy_market
from rollnet.node.chain.job import FactoryClient, JobClient, LeaseStatus, Outcome
from rollnet.node.chain.logs import EventDecoder
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.committee import CommitteeView
from rollnet.node.config import Deployment
from rollnet.node.errors import ChainUnavailable
from rollnet.node.events import EventLog
from rollnet.node.keeper import KEEPER_GRACE_S, Keeper, current_outcome, due, keeper_turn
from rollnet.node.keys import dev_account
from rollnet.node.lease_book import LeaseBook, book_file
from rollnet.node.p2p.identity import PeerIdentity
from rollnet.node.spec import load_job_spec
from rollnet.node.verdicts import BookCommittee, VerdictBook, seal_verdict
from rollnet.node.worker import claim_with_seed

WORKER, VALIDATOR_A, VALIDATOR_B, BYSTANDER, REQUESTER = 1, 2, 3, 4, 0


def _job(market: Deployment, anvil: AnvilProcess) -> str:
    """The example job (committee 3, two appeal rounds); a worker, two validators and a staked bystander."""
    parties = ((WORKER, Role.WORKER), (VALIDATOR_A, Role.VALIDATOR), (VALIDATOR_B, Role.VALIDATOR),
               (BYSTANDER, Role.WORKER))
    for index, role in parties:
        RegistryClient(client_for(anvil, index), market.registry).join(PeerIdentity.generate(), role, 10 * ETH)
    requester = client_for(anvil, REQUESTER)
    spec = load_job_spec(REPO / "examples" / "job.toml")
    address = FactoryClient(requester, market.factory).create_job(spec.to_abi(requester.address), 5 * ETH)
    job = JobClient(requester, address)
    job.publish_policy(1, b"\x11" * 32)
    for index in (VALIDATOR_A, VALIDATOR_B):
        JobClient(client_for(anvil, index), address).enlist()
    return address


def _agrees_with_chain(book: LeaseBook, job: JobClient) -> None:
    """Every lease in flight, as the book has it, is the chain's lease (outcomes judged at the chain's clock)."""
    now = job.client.now()
    for entry in book.open_leases():
        lease = job.lease(entry.lease_id)
        assert (entry.worker, entry.status, entry.round, entry.deadline) == \
            (lease.worker, lease.status, lease.round, lease.deadline), entry.lease_id
        assert current_outcome(job, entry, now) is current_outcome(job, lease, now)
    on_chain = [i for i in range(1, job.lease_count() + 1) if not job.lease(i).final]
    assert sorted(e.lease_id for e in book.open_leases()) == on_chain


def test_the_fast_decoder_reads_every_event_as_web3_does(market: Deployment, anvil: AnvilProcess) -> None:
    address = _job(market, anvil)
    worker = JobClient(client_for(anvil, WORKER), address)
    a, b = (JobClient(client_for(anvil, i), address) for i in (VALIDATOR_A, VALIDATOR_B))
    lease_id = claim_with_seed(worker).lease_id
    worker.submit(lease_id, b"\x22" * 32, 1)
    a.vote(lease_id, False)
    b.vote(lease_id, False)
    worker.appeal(lease_id)
    client = ChainClient(anvil.url)
    contract = JobClient(client, address).contract
    names = {item["name"] for item in contract.abi if item.get("type") == "event"}
    fast = client.logs(contract, sorted(names), 0, client.block_number())
    assert {tuple(log["args"]) for log in fast if log["event"] == "Initialized"} == {("requester", "budget"),
                                                                                  ("version",)}  # both overloads
    fast = [log for log in fast if log["event"] != "Initialized"]  # web3 decodes only one overload by name
    slow = []
    for name in sorted(names - {"Initialized"}):
        slow += [dict(log) for log in contract.events[name]().get_logs(from_block=0)]
    slow.sort(key=lambda log: (log["blockNumber"], log["logIndex"]))
    assert {log["event"] for log in fast} >= {"TaskClaimed", "SeedDrawn", "BatchSubmitted", "Voted", "RoundDecided",
                                              "Appealed", "Enlisted", "PolicyPublished"}
    assert [(log["event"], dict(log["args"]), log["blockNumber"], log["logIndex"]) for log in fast] == \
        [(log["event"], dict(log["args"]), log["blockNumber"], log["logIndex"]) for log in slow]


def _poll_requests(book: LeaseBook) -> int:
    requests = book.job.client.requests
    before = sum(requests.values())
    book.poll()
    return sum(requests.values()) - before


def test_the_book_is_the_chain_for_every_lease_in_flight_at_a_fixed_cost_per_poll(
        market: Deployment, anvil: AnvilProcess, tmp_path: Path) -> None:
    address = _job(market, anvil)
    reader = JobClient(ChainClient(anvil.url), address)
    book = LeaseBook(reader, market.deployed_at_block, tmp_path / "book.json")
    worker = JobClient(client_for(anvil, WORKER), address)
    a, b = (JobClient(client_for(anvil, i), address) for i in (VALIDATOR_A, VALIDATOR_B))

    leases = [claim_with_seed(worker).lease_id for _ in range(6)]
    first_cost = _poll_requests(book)
    _agrees_with_chain(book, reader)
    assert set(book.enlisted) == {a.client.address, b.client.address}

    accepted, rejected, split, appealed, settled, expiring = leases
    for lease_id in leases[:-1]:
        worker.submit(lease_id, b"\x22" * 32, 1)
    a.vote(accepted, True)
    b.vote(accepted, True)
    a.vote(rejected, False)
    b.vote(rejected, False)
    a.vote(split, True)
    b.vote(split, False)
    a.vote_batch({appealed: False, settled: True})
    b.vote_batch({appealed: False, settled: True})
    worker.appeal(appealed)
    other = JobClient(client_for(anvil, BYSTANDER), address)
    for _ in range(8):  # more leases in flight, none of them changing the cost of a poll
        claim_with_seed(other)
    assert _poll_requests(book) == first_cost == 3  # the head, the clock, one eth_getLogs
    _agrees_with_chain(book, reader)
    assert book.get(split).round_outcome(0) is Outcome.VOID and book.get(appealed).round == 1

    # A worker's own book asks only for its own leases' events: the same entries, at a fixed cost too.
    own = LeaseBook(reader, market.deployed_at_block, worker=other.client.address)
    own.poll()
    assert sorted(own.leases) == sorted(i for i, e in book.leases.items() if e.worker == other.client.address)
    assert all(own.leases[i] == book.leases[i] for i in own.leases) and not own.enlisted
    mine = LeaseBook(reader, market.deployed_at_block, worker=worker.client.address)
    mine.poll()
    assert mine.leases == {i: e for i, e in book.leases.items() if e.worker == worker.client.address}
    assert _poll_requests(mine) == 2  # nothing new: the head and the clock

    # Time alone: the split round's window closes, then every appeal window; the book's view follows the clock.
    advance_time(reader.client, 3600 + 600 + 1)
    book.poll()
    _agrees_with_chain(book, reader)
    keeper = Keeper(JobClient(client_for(anvil, REQUESTER), address), EventLog(None))
    for lease_id in (settled, expiring):
        keeper.act(book.get(lease_id), reader.client.now())
    update = book.poll()
    assert {e.lease_id: e.status for e in update.finished} == {settled: LeaseStatus.PAID,
                                                               expiring: LeaseStatus.RETURNED}
    assert update.finished[0].votes  # the votes travel with the finished lease, for the keeper's slashing
    _agrees_with_chain(book, reader)

    # A restarted participant resumes from the saved cursor: the same state, without folding the past again.
    resumed = LeaseBook(reader, market.deployed_at_block, tmp_path / "book.json")
    assert resumed.cursor == book.cursor and resumed.leases == book.leases
    assert resumed.enlisted == book.enlisted
    assert resumed.claims == book.claims == reader.lease_count() == 14  # the job's leaseCount at the cursor
    assert _poll_requests(resumed) == 2 and not resumed.poll().finished  # no new block: nothing read, nothing again
    # A book saved before it counted claims is folded again from the deployment block: its count is never low.
    state = json.loads((tmp_path / "book.json").read_text())
    del state["claims"]
    (tmp_path / "book.json").write_text(json.dumps(state))
    older = LeaseBook(reader, market.deployed_at_block, tmp_path / "book.json")
    assert older.cursor == market.deployed_at_block - 1 and older.claims == 0
    older.poll()
    assert older.claims == 14 and older.leases == book.leases


def test_a_due_lease_is_settled_once_by_its_worker_and_by_the_others_only_when_it_is_not(
        market: Deployment, anvil: AnvilProcess) -> None:
    _keepers_take_turns(market, anvil)


def test_keepers_take_turns_on_a_chain_with_a_block_every_two_seconds() -> None:
    """The same with a block every two seconds, an L2's cadence (the market and its stakes are set up at once,
    then `evm_setIntervalMining`): a seed waits for the next block, every transaction for its block, and the turns
    still hold."""
    anvil = start_anvil()
    try:
        market = deploy_market(ChainClient(anvil.url, dev_account(0)),
                               RegistryParams(unbonding_period_seconds=3 * 86_400))
        _keepers_take_turns(market, anvil, block_time_s=2)
    finally:
        anvil.stop()


def _keepers_take_turns(market: Deployment, anvil: AnvilProcess, block_time_s: int = 0) -> None:
    address = _job(market, anvil)
    if block_time_s:
        anvil.mine_every(block_time_s)
    worker = JobClient(client_for(anvil, WORKER), address)
    a, b = (JobClient(client_for(anvil, i), address) for i in (VALIDATOR_A, VALIDATOR_B))
    bystander = JobClient(client_for(anvil, BYSTANDER), address)
    paid, orphan = (claim_with_seed(worker).lease_id for _ in range(2))
    for lease_id in (paid, orphan):
        worker.submit(lease_id, b"\x22" * 32, 1)
        a.vote_batch({lease_id: True})
        b.vote_batch({lease_id: True})
    book = LeaseBook(JobClient(ChainClient(anvil.url), address), market.deployed_at_block)
    book.poll()
    spec = worker.spec()
    entry = book.get(paid)
    start = entry.deadline + 1
    turns = {name: keeper_turn(entry, job.client.address, spec, KEEPER_GRACE_S)
             for name, job in (("worker", worker), ("voter", a), ("bystander", bystander))}
    assert turns["worker"] == start and start + KEEPER_GRACE_S <= turns["voter"] < start + 2 * KEEPER_GRACE_S
    assert start + 2 * KEEPER_GRACE_S <= turns["bystander"] < start + 3 * KEEPER_GRACE_S
    voter_turns = {keeper_turn(entry, voter.client.address, spec, KEEPER_GRACE_S) for voter in (a, b)}
    assert len(voter_turns) == 2  # the voters' turns are spread, not one slot they all send in

    # At the moment it is due, everyone watching tries: only the worker sends anything.
    advance_time(worker.client, entry.deadline + 1 - worker.client.now())
    now = worker.client.now()
    assert due(entry, now, spec) == "finalize"
    sent = {}
    for name, job in (("voter", a), ("bystander", bystander), ("worker", worker)):
        before = sum(job.client.requests.values())
        action = Keeper(job, EventLog(None), spec).act_in_turn(book.get(paid), now, KEEPER_GRACE_S)
        sent[name] = (action, sum(job.client.requests.values()) - before)
    assert sent["voter"] == (None, 0) and sent["bystander"] == (None, 0) and sent["worker"][0] == "finalize"
    assert worker.lease(paid).status is LeaseStatus.PAID

    # A worker that vanished: its voters settle it after the grace, the bystander later still if they do not.
    book.poll()
    orphaned = book.get(orphan)
    voters_turn = keeper_turn(orphaned, a.client.address, spec, KEEPER_GRACE_S)
    assert Keeper(bystander, EventLog(None), spec).act_in_turn(orphaned, voters_turn, KEEPER_GRACE_S) is None
    advance_time(worker.client, max(0, voters_turn - worker.client.now()))
    assert Keeper(a, EventLog(None), spec).act_in_turn(orphaned, worker.client.now(), KEEPER_GRACE_S) == "finalize"
    assert worker.lease(orphan).status is LeaseStatus.PAID


def test_a_poll_that_loses_the_chain_midway_hands_over_what_it_folded_and_counts_each_vote_once(
        market: Deployment, anvil: AnvilProcess, tmp_path: Path) -> None:
    address = _job(market, anvil)
    worker = JobClient(client_for(anvil, WORKER), address)
    a, b = (JobClient(client_for(anvil, i), address) for i in (VALIDATOR_A, VALIDATOR_B))
    lease_id = claim_with_seed(worker).lease_id
    worker.submit(lease_id, b"\x22" * 32, 1)
    a.vote_batch({lease_id: True})
    b.vote_batch({lease_id: True})
    advance_time(worker.client, worker.lease(lease_id).deadline + 1 - worker.client.now())
    worker.finalize(lease_id)
    mine_blocks(worker.client, LOG_RANGE_BLOCKS + 5)  # a second range of blocks to read

    # A repeated Voted log (a node answering a range twice) does not count its weight twice.
    (voted, *_) = worker.client.logs(worker.contract, ["Voted"], market.deployed_at_block, worker.client.block_number())
    twice = LeaseBook(worker, market.deployed_at_block)
    twice._fold("TaskClaimed", {"leaseId": lease_id, "worker": worker.client.address, "expiresAt": 0}, 0)
    for _ in range(2):
        twice._fold("Voted", dict(voted["args"]), voted["blockNumber"])
    assert twice.get(lease_id).weights[0] == [voted["args"]["weight"], 0]

    # The chain dies once the first range is folded: the lease that range finished is handed over, not lost.
    path = tmp_path / "book.json"
    book = LeaseBook(JobClient(ChainClient(anvil.url), address), market.deployed_at_block, path)
    later = JobClient(ChainClient(anvil.url), address)  # a client made while the chain answered
    update = book.poll(on_range=lambda end, logs: anvil.stop())
    assert [entry.lease_id for entry in update.finished] == [lease_id]
    assert book.cursor == market.deployed_at_block + LOG_RANGE_BLOCKS - 1  # saved after the first range only
    resumed = LeaseBook(later, market.deployed_at_block, path)
    assert resumed.cursor == book.cursor and resumed.get(lease_id) is None  # handed over exactly once
    with pytest.raises(ChainUnavailable):
        resumed.poll()  # nothing folded in this poll: the caller sees the outage


def test_each_follower_keeps_its_own_book_and_hashed_topics_are_never_decoded(tmp_path: Path) -> None:
    job = "0x" + "ab" * 20
    files = {book_file(tmp_path, job, follower) for follower in
             (f"worker-{dev_account(1).address}", f"validator-{dev_account(2).address}", "trainer")}
    assert len(files) == 3  # a worker, a validator and a trainer sharing a data directory never share a cursor
    named = {"type": "event", "name": "Named", "anonymous": False,
             "inputs": [{"name": "label", "type": "string", "indexed": True}]}
    with pytest.raises(ValueError, match="label"):
        EventDecoder([named], ["Named"])  # its topic holds keccak(label), not the label


def test_a_restarted_trainer_admits_by_the_committees_votes_on_chain_without_their_gossip(
        market: Deployment, anvil: AnvilProcess) -> None:
    """The verdict book counts a member's round-0 vote to accept on chain as its verdict, for the root the lease was
    submitted with: a trainer that restarted after the verdicts' gossip went by admits as soon as the votes are
    mined, not an appeal window later. A rejection by gossip still objects, another root is never admitted, and a
    lone accepting member (half the stake) is not enough, on chain as by gossip."""
    address = _job(market, anvil)
    worker = JobClient(client_for(anvil, WORKER), address)
    a, b = (JobClient(client_for(anvil, i), address) for i in (VALIDATOR_A, VALIDATOR_B))
    root = b"\x22" * 32
    leases = [claim_with_seed(worker).lease_id for _ in range(2)]
    for lease_id in leases:
        worker.submit(lease_id, root, 1)
    reader = JobClient(ChainClient(anvil.url), address)
    book = LeaseBook(reader, market.deployed_at_block)
    view = CommitteeView(reader, RegistryClient(reader.client, market.registry), market.deployed_at_block)
    verdicts = VerdictBook(address, BookCommittee(view, book))

    a.vote_batch({lease_id: True for lease_id in leases})
    book.poll()
    assert not any(verdicts.admitted(lease_id, root) for lease_id in leases)  # 10 of 20 ETH: no majority
    verdicts.add(seal_verdict(address, leases[0], root, True, "ok", dev_account(VALIDATOR_A)))
    assert not verdicts.admitted(leases[0], root)  # its gossip and its vote are one member, counted once
    b.vote_batch({lease_id: True for lease_id in leases})
    book.poll()
    first, second = leases
    assert verdicts.admitted(first, root)  # no gossip heard at all
    assert not verdicts.admitted(first, b"\x33" * 32)  # only the submitted root
    verdicts.add(seal_verdict(address, second, root, False, "TOPLOC", dev_account(VALIDATOR_A)))
    assert not verdicts.admitted(second, root)  # a member's rejection by gossip objects over its vote on chain

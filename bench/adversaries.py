"""Adversaries against rollnet's trustless settlement, end to end on a real anvil and the real contracts.

What it shows
-------------
Cheating workers (kind "cheat"). One honest worker and nine cheats each claim one lease of a job at policy
version 2 (collateral locked at the claim, the prompt seed drawn after it) and submit: fabricated
completions, a substituted model (1e-3 weight noise), a precision change (bf16), tokens not chosen by the
seeded sampler (teacher-forced answers), an over-stale policy (version 1 weights claimed as version 2), a
replay of the honest worker's submission, inflated claimed rewards, withheld data, and rollouts for prompts
other than the leased ones. Two validator daemons, staked before any batch is submitted (committees are
drawn from the stake at the block before submission), each with a libp2p host on 127.0.0.1, the default
model and a SQLite ledger, find the committees they sit on, fetch, judge, gossip signed verdicts and vote.
Validator B is killed mid-verification and restarted from its ledger; data that cannot be fetched is
retried for half the vote window. The trainer's verdict book admits exactly the honest batch. After the
appeal window a keeper finalizes every lease.

Partial cheats (kind "partial"), against sampled verification: a job of 8 tasks x 8 samples per lease whose
first-round members each verify 1/8 of a batch (8 rollouts, drawn from randomness fixed after submission),
three validator daemons (so the whole expected committee of 3 sits) and three cheating workers that
teacher-force the answers of 1 of 64, 1 of 8 and half of their rollouts (the rest honestly sampled) and keep
claiming leases until one is caught (at most PARTIAL_MAX_LEASES). Each lease runs to its final outcome: a
member whose sample holds a fake rejects and appeals, the appeal round verifies everything. Reported per
cheater: leases until caught against the sizing rule's 1 / P(c), P(c) = 1 - (1 - c)^(8 x 3), and its net
gain (the faked part's pay of every accepted lease, less the collateral it lost: the honest part's pay is
wages); the validators' net (none may lose: sampled accepts of a batch finally rejected are not slashable).

Economic attacks (kind "economic"), on the real contracts through the Python bindings; votes are cast
directly, because the question is who gains, not how a batch is checked. Honest parties follow the
protocol: they vote the truth, appeal every round they lost while appeals remain, slash the losers
(Keeper.slash_losers), claim their rewards and withdraw. Adversaries vote first (they may front-run).
- requester: a spec with a huge slash is refused by the factory; on its own job the requester stakes the
  minimum as a validator, votes to reject honest batches against an honest stake majority and appeals
  every round it loses; close() refunds it only the unreserved escrow.
- collusion: a validator minority votes for a colluding worker's cheats and against honest work, on
  committees sampled from 8 validators (expected first committee 3), swept over its stake share.
- appeal: a staked griefer appeals correct decisions, each at the last moment of the appeal window.
- hoard: a worker with the minimum stake tries to hold every lease.
- grind: a worker draws its prompt seeds, inspects the prompts and abandons the leases it dislikes.
- squat: an attacker tries to register a victim's libp2p peer ID.

Accounting
----------
A party's wealth is its wallet + the gas it paid (ChainClient.fees_paid_wei, so gas never counts) +
its registry stake (active, locked, unbonding) + what the case's jobs owe it + its unclaimed rewards there.
Its net gain is wealth after - wealth before, with wages taken out: a requester adds back what it paid for
accepted honest work and a worker subtracts what it was paid for it (compute sold at the posted price is
neither an attack's gain nor a loss; pay for an accepted cheat is a gain and the requester's loss).
attacker_net_wei sums the attackers' net gains; honest_loss_wei sums max(0, -net) over the honest
parties of the same scenario (for cheat rows: the requester, both validators and the honest worker over
all ten leases, an upper bound on any one row's share). gas_per_accepted_sample is the honest cheat-scenario
lease's gasUsed from the receipts (claim, drawSeed, submit, its share of each validator's voteBatch,
finalize, withdrawPayment) over its accepted samples.

Invariants (asserted by tests/test_validator.py on the --quick run): the honest worker is paid in full and
never slashed; every cheat is rejected and loses its whole collateral; each validator votes exactly once
per lease; the trainer admits only the honest batch; for every case attacker_net_wei <= 0 and
honest_loss_wei == 0; every partial cheater is caught and its net gain is negative, and no validator loses;
a colluding minority loses at every share below half of the validator stake, and
collusion first pays from a share above one half (the final round is a vote of every validator by stake).
All work is bounded by counts (leases, claims, sweep points), never by wall-clock time.

Usage: python bench/adversaries.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import torch
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from rich.console import Console
from rich.table import Table
from rollnet.node.chain.anvil import start_anvil
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.deploy import RegistryParams, deploy_market
from rollnet.node.chain.job import FactoryClient, JobClient, Lease, LeaseStatus, Outcome
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.cli.context import make_console
from rollnet.node.committee import CommitteeView
from rollnet.node.config import resolve_data_dir
from rollnet.node.delta.checkpoint import content_root
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import ContractRevert
from rollnet.node.events import EventLog
from rollnet.node.keeper import KEEPER_GRACE_S, Keeper, current_outcome
from rollnet.node.keys import dev_account
from rollnet.node.lease_book import LeaseBook
from rollnet.node.ledger import SubmissionLedger
from rollnet.node.model.builder import _batch, build_default_model
from rollnet.node.model.loading import load_policy
from rollnet.node.model.policies import StorePolicies
from rollnet.node.p2p.fetch import Fetcher, p2p_fetcher
from rollnet.node.p2p.gate import PeerGate
from rollnet.node.p2p.host import P2PNode
from rollnet.node.p2p.identity import PeerIdentity, load_or_create_identity
from rollnet.node.p2p.objects import ObjectStore, object_root
from rollnet.node.rollout.generate import Rollout, generate
from rollnet.node.sampling import catch_probability, expected_leases_until_caught
from rollnet.node.spec import JobSpecFile
from rollnet.node.tasks import load_task
from rollnet.node.verdicts import BookCommittee, VerdictBook, seal_verdict
from rollnet.node.worker import claim_with_seed, leased_instances, submission_bytes
from rollnet.trainer.admission import admit_submission
from rollnet.trainer.buffer import RolloutBuffer
from rollnet.trainer.trainer import bf16_policy
from rollnet.validator.daemon import RoundReport, ValidatorDaemon
from transformers import PreTrainedModel, PreTrainedTokenizerFast
from web3.contract.contract import ContractConstructor, ContractFunction
from web3.types import TxReceipt

ETH = 10**18
DAY = 86_400
TASK = load_task("addition-2digit")
DEPLOYER, REQUESTER = 0, 1  # dev accounts; every case deploys its own market with account 0
CHEATS = ["fabricated completions", "substituted model (1e-3 noise)", "precision change (bf16)",
          "tokens not chosen by the seeded sampler", "over-stale policy claimed as current",
          "replayed earlier submission", "inflated claimed rewards", "withheld data", "prompts other than leased"]
CASES = ["honest", *CHEATS]
B_KILLED_AFTER_FETCHES = 4
WORKER_STAKE = 5 * ETH  # each cheat scenario worker's
POLICY_ROOT = b"\x11" * 32  # version 1 of the economic cases' jobs (no model is needed there)
HONEST_VALIDATORS, COLLUDERS = 5, 3  # the collusion sweep's 8 validators
PARTIAL_CHEATS = {"1 of 64": 1, "1 of 8": 8, "half": 32}  # rollouts faked per lease of 64
PARTIAL_MAX_LEASES = 40  # a 1-of-64 cheat escapes 40 leases with chance (63/64)^(8 x 3 x 40), about 1e-4
SWEEP_STAKE = 200 * ETH  # all validators' stake in each sweep point


# ---------------------------------------------------------------------------------------------- chain plumbing

@dataclass(frozen=True)
class Spent:
    """One mined transaction: the contract function, its arguments and the gas it used."""

    function: str
    args: tuple
    gas: int


class MeteredClient(ChainClient):
    """A ChainClient that also keeps every mined transaction's gasUsed with what it paid for."""

    def __init__(self, rpc_url: str, account: LocalAccount):
        super().__init__(rpc_url, account)
        self.spent: list[Spent] = []

    def transact(self, fn: ContractFunction | ContractConstructor, value: int = 0, headroom: int = 0) -> TxReceipt:
        receipt = super().transact(fn, value, headroom)
        self.spent.append(Spent(getattr(fn, "fn_name", "constructor"), tuple(getattr(fn, "args", None) or ()),
                                receipt["gasUsed"]))
        return receipt


@dataclass
class Party:
    """A participant of one scenario: its own client (so its gas is its own) and its side."""

    name: str
    client: MeteredClient
    honest: bool
    wage_wei: int = 0  # paid to it for accepted honest work
    purchases_wei: int = 0  # paid by it (a requester) for accepted honest work
    _jobs: dict[str, JobClient] = field(default_factory=dict, repr=False)

    @property
    def address(self) -> str:
        return self.client.address

    def job(self, address: str) -> JobClient:
        if address not in self._jobs:
            self._jobs[address] = JobClient(self.client, address)
        return self._jobs[address]


class Market:
    """One deployment of the three contracts on the bench's anvil. Each scenario deploys its own, so the
    validator sets, stakes and committees of different scenarios never mix."""

    def __init__(self, url: str, deployer: ChainClient):
        self.url = url
        self.deployment = deploy_market(deployer, RegistryParams(unbonding_period_seconds=7 * DAY))
        self.reader = ChainClient(url)
        self.registry = RegistryClient(self.reader, self.deployment.registry)
        self.jobs: list[str] = []

    def party(self, name: str, index: int, honest: bool = True) -> Party:
        return Party(name, MeteredClient(self.url, dev_account(index)), honest)

    def registry_of(self, party: Party) -> RegistryClient:
        return RegistryClient(party.client, self.deployment.registry)

    def join(self, party: Party, role: Role, stake_wei: int, identity: PeerIdentity | None = None) -> None:
        self.registry_of(party).join(identity or PeerIdentity.generate(), role, stake_wei)

    def create_job(self, requester: Party, spec: JobSpecFile, budget_wei: int) -> str:
        address = FactoryClient(requester.client, self.deployment.factory).create_job(
            spec.to_abi(requester.address), budget_wei)
        self.jobs.append(address)
        return address

    def view(self, job: str) -> JobClient:
        return JobClient(self.reader, job)

    def wealth(self, party: Party) -> int:
        """Wallet + gas paid + registry stake + what this market's jobs owe it + its unclaimed rewards."""
        info = self.registry.info(party.address)
        total = (self.reader.balance(party.address) + party.client.fees_paid_wei + info.active + info.locked
                 + info.unbonding)
        for address in self.jobs:
            job = self.view(address)
            total += job.owed(party.address)
            total += sum(job.reward_of(i, party.address) for i in range(1, job.lease_count() + 1))
        return total

    def now(self) -> int:
        return self.reader.latest_timestamp()

    def advance_to(self, timestamp: int) -> None:
        """Mine a block at `timestamp` or later (anvil's clock: evm_increaseTime, then evm_mine)."""
        seconds = timestamp - self.now()
        if seconds > 0:
            self.reader.rpc("evm_increaseTime", [seconds])
        self.reader.rpc("evm_mine", [])


class Books:
    """A scenario's net gains from chain state: wealth now - wealth at the start, wages taken out."""

    def __init__(self, market: Market, parties: Sequence[Party]):
        self.market = market
        self.parties = list(parties)
        self.before = {p.name: market.wealth(p) for p in self.parties}

    def nets(self) -> dict[str, int]:
        return {p.name: self.market.wealth(p) - self.before[p.name] + p.purchases_wei - p.wage_wei
                for p in self.parties}

    def result(self, name: str, outcome: str, **details: object) -> dict:
        nets = self.nets()
        return {"name": name, "kind": "economic", "outcome": outcome, **attacker_and_honest(self.parties, nets),
                "net_wei": nets, **details}


def attacker_and_honest(parties: Sequence[Party], nets: dict[str, int]) -> dict[str, int]:
    return {"attacker_net_wei": sum(nets[p.name] for p in parties if not p.honest),
            "honest_loss_wei": sum(max(0, -nets[p.name]) for p in parties if p.honest)}


def revert_of(action: Callable[[], object]) -> str | None:
    """The decoded revert of `action` ("Name: message"), or None if it went through."""
    try:
        action()
    except ContractRevert as exc:
        return f"{exc.error_name}: {exc}"
    return None


def eth(wei: int) -> str:
    return f"{wei / ETH:+.4f}"


# ---------------------------------------------------------------------------------------------- disputes

@dataclass
class Batch:
    """A submitted lease and the truth about it: an honest validator accepts it iff `honest`."""

    lease_id: int
    worker: Party
    honest: bool
    submitted_at: int
    outcomes: list[Outcome] = field(default_factory=list)  # each round's decision
    status: LeaseStatus = LeaseStatus.VOTING
    settled_at: int = 0

    @property
    def truth(self) -> Outcome:
        return Outcome.ACCEPT if self.honest else Outcome.REJECT

    @property
    def wrong(self) -> Outcome:
        return Outcome.REJECT if self.honest else Outcome.ACCEPT

    @property
    def settled_right(self) -> bool:
        return self.status is (LeaseStatus.PAID if self.honest else LeaseStatus.SLASHED)


def submit_batch(market: Market, worker: Party, job: str, honest: bool = True) -> Batch:
    """Claim a lease (seed drawn after the claim) and submit a root for it at the current version."""
    client = worker.job(job)
    lease = claim_with_seed(client)
    client.submit(lease.lease_id, keccak(text=f"{job}/{lease.lease_id}"), client.current_version())
    return Batch(lease.lease_id, worker, honest, market.now())


@dataclass
class Dispute:
    """Drives batches of one job through their rounds. Every drawn voter votes (adversaries first, against
    the truth; honest ones the truth); the honest appellant appeals every round the truth lost (or that
    ended void) while appeals remain; the adversary appellant, if any, every round the truth won, at the
    last moment of the appeal window if `appeal_late`. Then a keeper finalizes and slashes the losers."""

    market: Market
    job: str
    voters: list[Party]
    honest_appellant: Party
    adversary_appellant: Party | None = None
    appeal_late: bool = False

    def __post_init__(self) -> None:
        self.view = self.market.view(self.job)
        self.spec = self.view.spec()

    def run(self, batches: list[Batch]) -> None:
        final = self.spec.appeal_rounds
        for round_ in range(final + 1):
            live = [b for b in batches if self._in_round(b, round_)]
            for batch in live:
                self._vote(batch)
            self._close_votes(live)
            self._appeal([(b, who) for b in live if (who := self._record(b, may_appeal=round_ < final))])
        self._settle(batches)

    def _in_round(self, batch: Batch, round_: int) -> bool:
        lease = self.view.lease(batch.lease_id)
        return lease.status is LeaseStatus.VOTING and lease.round == round_

    def _vote(self, batch: Batch) -> None:
        for voter in sorted(self.voters, key=lambda p: p.honest):  # adversaries first
            job = voter.job(self.job)
            lease = job.lease(batch.lease_id)
            if lease.status is not LeaseStatus.VOTING:
                return  # decided early
            if job.member_weight(batch.lease_id, lease.round, voter.address):
                job.vote(batch.lease_id, batch.honest if voter.honest else not batch.honest)

    def _close_votes(self, live: list[Batch]) -> None:
        """Let the vote window of every round not decided early pass (it is then decided by the larger side)."""
        open_ = [self.view.lease(b.lease_id) for b in live]
        deadlines = [lease.deadline for lease in open_ if lease.status is LeaseStatus.VOTING]
        if deadlines:
            self.market.advance_to(max(deadlines) + 1)

    def _record(self, batch: Batch, may_appeal: bool) -> Party | None:
        """Note the round's decision; who appeals it (None: nobody)."""
        outcome = current_outcome(self.view, self.view.lease(batch.lease_id), self.market.now())
        batch.outcomes.append(outcome)
        if not may_appeal:
            return None
        if outcome is not batch.truth:
            return self.honest_appellant
        return self.adversary_appellant

    def _appeal_deadline(self, lease: Lease) -> int:
        return lease.deadline if lease.status is LeaseStatus.DECIDED else lease.deadline + self.spec.appeal_window

    def _appeal(self, appeals: list[tuple[Batch, Party]]) -> None:
        if not appeals:
            return
        if self.appeal_late:
            deadline = min(self._appeal_deadline(self.view.lease(b.lease_id)) for b, _ in appeals)
            self.market.advance_to(deadline - 2)
        for batch, appellant in appeals:
            appellant.job(self.job).appeal(batch.lease_id)

    def _settle(self, batches: list[Batch]) -> None:
        keeper = Keeper(self.honest_appellant.job(self.job), EventLog(None), self.spec)
        leases = [self.view.lease(b.lease_id) for b in batches]
        waiting = [self._appeal_deadline(lease) for lease in leases
                   if not lease.final and lease.round < self.spec.appeal_rounds]
        if waiting:
            self.market.advance_to(max(waiting) + 1)
        now = self.market.now()
        for batch in batches:
            keeper.act(self.view.lease(batch.lease_id), now)
            batch.status = self.view.lease(batch.lease_id).status
            batch.settled_at = now
        for batch in batches:
            keeper.slash_losers(batch.lease_id)


def pay_wages(batches: list[Batch], requester: Party, lease_cost: int) -> None:
    """Book the pay for accepted honest work as a wage (worker) and a purchase (requester)."""
    for batch in batches:
        if batch.honest and batch.status is LeaseStatus.PAID:
            batch.worker.wage_wei += lease_cost
            requester.purchases_wei += lease_cost


def collect(parties: Sequence[Party], job: str, lease_ids: list[int]) -> None:
    """Every party claims its rewards and withdraws what it is owed."""
    for party in parties:
        Keeper(party.job(job), EventLog(None)).collect(lease_ids)


def close_job(requester: Party, job: str) -> dict[str, int]:
    """close(): what was refunded, against the escrow and its reserved part just before."""
    before = requester.job(job).status()
    requester.job(job).close()
    after = requester.job(job).status()
    return {"escrow_wei": before.escrow, "reserved_wei": before.reserved, "refunded_wei": before.escrow - after.escrow}


def job_events(market: Market, job: str, name: str) -> list[dict]:
    view = market.view(job)
    return [dict(log["args"]) for log in market.reader.events(view.contract, name, 0)]


def bonds_lost(market: Market, job: str, party: Party) -> int:
    """Appeal bonds `party` posted on `job` and did not get back."""
    posted = sum(e["bond"] for e in job_events(market, job, "Appealed") if e["appellant"] == party.address)
    refunded = sum(e["amount"] for e in job_events(market, job, "BondRefunded") if e["appellant"] == party.address)
    return posted - refunded


def spec_fee(market: Market, job: str) -> int:
    return market.view(job).spec().expiry_fee


def economic_spec(**changes: object) -> JobSpecFile:
    """The economic scenarios' job: 8 tasks x 8 samples per lease at 0.001 ETH (0.064 ETH a lease)."""
    return cheat_spec().model_copy(update={"group_size": 8, "tasks_per_lease": 8, **changes})


def cheat_spec() -> JobSpecFile:
    return JobSpecFile(model="embedded", task=TASK.name, trainer="self", group_size=4, tasks_per_lease=2,
                       max_staleness=4, committee_size=3, appeal_rounds=2, clip_epsilon=Decimal("0.2"),
                       clip_delta=Decimal("4.0"), lease_seconds=600, vote_seconds=600, appeal_seconds=3600,
                       reward_per_sample_eth=Decimal("0.001"), slash_eth=Decimal(1), expiry_fee_eth=Decimal("0.05"),
                       voter_slash_eth=Decimal(1), absent_penalty_eth=Decimal("0.1"),
                       appeal_bond_eth=Decimal("0.5"))


def new_job(market: Market, requester: Party, spec: JobSpecFile, budget_wei: int = 2 * ETH) -> str:
    job = market.create_job(requester, spec, budget_wei)
    requester.job(job).publish_policy(1, POLICY_ROOT)
    return job


# ---------------------------------------------------------------------------------------------- economic cases

def requester_theft(market: Market) -> dict:
    """The requester tries to keep both its money and the workers' collateral."""
    attacker = market.party("requester", REQUESTER, honest=False)
    validators = [market.party(f"validator {i}", 2 + i) for i in range(2)]
    worker = market.party("worker", 4)
    books = Books(market, [attacker, *validators, worker])
    for validator in validators:
        market.join(validator, Role.VALIDATOR, 20 * ETH)
    market.join(worker, Role.WORKER, 10 * ETH)
    spec = economic_spec()
    greedy = spec.model_copy(update={"slash_eth": Decimal(1000)})  # would take 1000 ETH per rejected lease
    refused = revert_of(lambda: market.create_job(attacker, greedy, 2 * ETH))
    stake = market.registry.min_stake(Role.VALIDATOR)
    market.join(attacker, Role.VALIDATOR, stake)  # on its own job's committees
    job = new_job(market, attacker, spec)
    batches = [submit_batch(market, worker, job) for _ in range(2)]
    early_close = close_job(attacker, job)  # while the batches are judged: only the unreserved escrow
    Dispute(market, job, [*validators, attacker], honest_appellant=worker, adversary_appellant=attacker).run(batches)
    pay_wages(batches, attacker, market.view(job).lease_cost())
    collect(books.parties, job, [b.lease_id for b in batches])
    late_close = close_job(attacker, job)
    info = market.registry.info(attacker.address)
    paid = sum(b.status is LeaseStatus.PAID for b in batches)
    return books.result(
        "requester theft: huge slash, then voting down honest work on its own job",
        f"spec refused; {paid}/{len(batches)} honest batches paid; requester slashed, lost its bonds",
        attack="requester", refused_spec=refused, leases=len(batches),
        appeals_by_requester=sum(e["appellant"] == attacker.address for e in job_events(market, job, "Appealed")),
        round_outcomes=[[o.name.lower() for o in b.outcomes] for b in batches],
        requester_slashed_wei=stake - info.active - info.locked - info.unbonding,
        requester_bonds_lost_wei=bonds_lost(market, job, attacker), close_during_votes=early_close,
        close_after=late_close,
        refunds_only_unreserved=early_close["refunded_wei"] == early_close["escrow_wei"] - early_close["reserved_wei"],
    )


def collusion_point(market: Market, percent: int, leases: int) -> dict:
    """Colluders holding `percent` of the validator stake vote for their worker's cheats and against honest
    work, before anyone else; they appeal only when they hold a stake majority (else the final round is lost
    for sure). The honest side's appellant appeals every wrong decision, including a round the colluders
    decided before any honest member voted (the protocol; note that validator/daemon.py appeals only rounds
    it judged before they closed, so its validators alone would let such a round stand)."""
    requester = market.party("requester", REQUESTER)
    honest = [market.party(f"validator {i}", 2 + i) for i in range(HONEST_VALIDATORS)]
    colluders = [market.party(f"colluder {i}", 2 + HONEST_VALIDATORS + i, honest=False) for i in range(COLLUDERS)]
    worker = market.party("honest worker", 2 + HONEST_VALIDATORS + COLLUDERS)
    cheat = market.party("colluding worker", 3 + HONEST_VALIDATORS + COLLUDERS, honest=False)
    books = Books(market, [requester, *honest, *colluders, worker, cheat])
    colluder_stake = SWEEP_STAKE * percent // 100 // COLLUDERS
    honest_stake = SWEEP_STAKE * (100 - percent) // 100 // HONEST_VALIDATORS
    for party, stake in [*((h, honest_stake) for h in honest), *((c, colluder_stake) for c in colluders)]:
        market.join(party, Role.VALIDATOR, stake)
    for party in (worker, cheat):
        market.join(party, Role.WORKER, 10 * ETH)
    job = new_job(market, requester, economic_spec())
    batches = [submit_batch(market, cheat, job, honest=False) if i % 2 == 0 else submit_batch(market, worker, job)
               for i in range(leases)]
    majority = COLLUDERS * colluder_stake > HONEST_VALIDATORS * honest_stake
    Dispute(market, job, [*honest, *colluders], honest_appellant=honest[0],
            adversary_appellant=colluders[0] if majority else None).run(batches)
    pay_wages(batches, requester, market.view(job).lease_cost())
    collect(books.parties, job, [b.lease_id for b in batches])
    close_job(requester, job)
    nets = books.nets()
    totals = attacker_and_honest(books.parties, nets)
    return {
        "share": round(COLLUDERS * colluder_stake / (COLLUDERS * colluder_stake + HONEST_VALIDATORS * honest_stake), 4),
        "leases": leases, "colluders_net_wei": totals["attacker_net_wei"], "honest_loss_wei": totals["honest_loss_wei"],
        "colluding_validators_net_wei": sum(nets[c.name] for c in colluders),
        "first_rounds_won_by_colluders": sum(b.outcomes[0] is b.wrong for b in batches),
        "overturned_on_appeal": sum(b.wrong in b.outcomes[:-1] and b.settled_right for b in batches),
        "wrong_final_outcomes": sum(not b.settled_right for b in batches),
        "appeals": sum(len(b.outcomes) - 1 for b in batches),
        "round_outcomes": [[o.name.lower() for o in b.outcomes] for b in batches], "net_wei": nets,
    }


def collusion_row(point: dict) -> dict:
    return {
        "name": f"collusion: {point['share']:.0%} of the stake votes for cheats, against honest work",
        "kind": "economic", "attack": "collusion",
        "outcome": f"{point['wrong_final_outcomes']} wrong of {point['leases']}; "
                   f"{point['overturned_on_appeal']} overturned on appeal",
        "attacker_net_wei": point["colluders_net_wei"], "honest_loss_wei": point["honest_loss_wei"],
        **{k: v for k, v in point.items() if k not in ("colluders_net_wei", "honest_loss_wei")},
    }


def appeal_griefing(market: Market) -> dict:
    """A staked griefer appeals every correct decision, each at the end of its appeal window."""
    requester = market.party("requester", REQUESTER)
    griefer = market.party("griefer", 2, honest=False)
    validators = [market.party(f"validator {i}", 3 + i) for i in range(3)]
    worker = market.party("worker", 6)
    books = Books(market, [requester, griefer, *validators, worker])
    for validator in validators:
        market.join(validator, Role.VALIDATOR, 10 * ETH)
    market.join(worker, Role.WORKER, 10 * ETH)
    market.join(griefer, Role.WORKER, market.registry.min_stake(Role.WORKER))  # any staked party may appeal
    spec = economic_spec()
    job = new_job(market, requester, spec)
    batch = submit_batch(market, worker, job)
    Dispute(market, job, validators, honest_appellant=worker, adversary_appellant=griefer,
            appeal_late=True).run([batch])
    lease_cost = market.view(job).lease_cost()
    pay_wages([batch], requester, lease_cost)
    collect(books.parties, job, [batch.lease_id])
    close_job(requester, job)
    return books.result(
        "appeal griefing: a staked griefer appeals correct decisions",
        f"{batch.status.name.lower()} after {len(batch.outcomes) - 1} appeals; griefer lost its bonds",
        attack="appeal", round_outcomes=[o.name.lower() for o in batch.outcomes],
        griefer_bonds_lost_wei=bonds_lost(market, job, griefer),
        honest_paid_wei=lease_cost if batch.status is LeaseStatus.PAID else 0,
        pay_delay_s=batch.settled_at - batch.submitted_at, undisputed_pay_delay_s=spec.appeal_seconds + 1,
        longest_delay_bound_s=spec.appeal_rounds * (spec.appeal_seconds + spec.vote_seconds) + spec.appeal_seconds,
    )


def hoard(market: Market) -> dict:
    """A worker with the minimum stake tries to hold every lease of a job."""
    requester = market.party("requester", REQUESTER)
    hoarder = market.party("hoarder", 2, honest=False)
    worker = market.party("honest worker", 3)
    validators = [market.party(f"validator {i}", 4 + i) for i in range(2)]
    books = Books(market, [requester, hoarder, worker, *validators])
    for validator in validators:
        market.join(validator, Role.VALIDATOR, 10 * ETH)
    market.join(worker, Role.WORKER, 10 * ETH)
    stake = market.registry.min_stake(Role.WORKER)
    market.join(hoarder, Role.WORKER, stake)
    spec = economic_spec(slash_eth=Decimal("0.25"), expiry_fee_eth=Decimal("0.05"))
    job = new_job(market, requester, spec)
    slash = market.view(job).spec().slash_amount
    held: list[Lease] = []
    refusal = None
    for _ in range(stake // slash + 1):  # one more than its stake can back
        try:
            held.append(hoarder.job(job).claim())
        except ContractRevert as exc:
            refusal = f"{exc.error_name}: {exc}"
            break
    dispute = Dispute(market, job, validators, honest_appellant=worker)
    first = submit_batch(market, worker, job)  # the honest worker still gets a lease at once
    dispute.run([first])  # the hoarded leases expire meanwhile
    keeper = Keeper(worker.job(job), EventLog(None), spec=market.view(job).spec())
    now = market.now()
    reclaimed = [keeper.act(market.view(job).lease(lease.lease_id), now) for lease in held]
    refusal_after = revert_of(lambda: hoarder.job(job).claim())
    second = submit_batch(market, worker, job)  # the returned tasks go to the honest worker
    dispute.run([second])
    batches = [first, second]
    pay_wages(batches, requester, market.view(job).lease_cost())
    collect(books.parties, job, [b.lease_id for b in batches])
    close_job(requester, job)
    return books.result(
        "hoard leases: a minimum-stake worker tries to hold every lease",
        f"held {len(held)} (stake / slash), refused beyond; every lease expired for the fee",
        attack="hoard", stake_wei=stake, slash_wei=slash, held=len(held), refused_beyond=refusal,
        reclaimed=reclaimed.count("reclaim"), refused_after_fees=refusal_after, fee_wei=spec_fee(market, job),
        fees_burned_wei=market.view(job).status().burned,
        honest_leases_paid=sum(b.status is LeaseStatus.PAID for b in batches),
        honest_worker_got_returned_tasks=market.view(job).lease(second.lease_id).first_task
        in {lease.first_task for lease in held},
    )


def grind(market: Market, claims: int) -> dict:
    """A worker claims, draws each seed, inspects the prompts and keeps only the lease it likes best
    (the fewest three-digit sums); the others it abandons."""
    requester = market.party("requester", REQUESTER)
    grinder = market.party("grinder", 2, honest=False)
    validators = [market.party(f"validator {i}", 3 + i) for i in range(2)]
    books = Books(market, [requester, grinder, *validators])
    for validator in validators:
        market.join(validator, Role.VALIDATOR, 10 * ETH)
    spec = economic_spec(slash_eth=Decimal("0.25"), expiry_fee_eth=Decimal("0.05"))
    job = new_job(market, requester, spec)
    market.join(grinder, Role.WORKER, max(market.registry.min_stake(Role.WORKER),
                                          claims * market.view(job).spec().slash_amount))
    client = grinder.job(job)
    drawn, seed_at_claim, in_claim_block = [], [], []
    for _ in range(claims):
        lease = client.claim()
        seed_at_claim.append(lease.seed.hex())
        # drawSeed evaluated in the claim's own block: that block's hash does not exist while it is built
        in_claim_block.append(revert_of(lambda lease=lease: grinder.client.call(
            client.contract.functions.drawSeed(lease.lease_id), block="latest")))
        drawn.append(client.draw_seed(lease.lease_id))
    scores = [sum(int(i.answer) >= 100 for i in leased_instances(TASK, lease, spec.tasks_per_lease))
              for lease in drawn]
    kept = drawn[scores.index(min(scores))]
    client.submit(kept.lease_id, keccak(text=f"{job}/{kept.lease_id}"), 1)
    batch = Batch(kept.lease_id, grinder, honest=True, submitted_at=market.now())
    Dispute(market, job, validators, honest_appellant=validators[0]).run([batch])  # the abandoned ones expire
    keeper = Keeper(validators[0].job(job), EventLog(None))
    now = market.now()
    reclaimed = [keeper.act(market.view(job).lease(lease.lease_id), now) for lease in drawn if lease is not kept]
    lease_cost = market.view(job).lease_cost()
    pay_wages([batch], requester, lease_cost)
    collect(books.parties, job, [batch.lease_id])
    close_job(requester, job)
    return books.result(
        "grind prompt seeds: claim, inspect the prompts, abandon the disliked",
        f"kept 1 of {claims}; {reclaimed.count('reclaim')} abandoned leases cost the fee",
        attack="grind", seeds_at_claim_zero=all(int(s, 16) == 0 for s in seed_at_claim),
        draw_seed_in_claim_block=in_claim_block,
        three_digit_sums_per_lease=scores, kept_lease=kept.lease_id, abandoned=reclaimed.count("reclaim"),
        fee_wei=spec_fee(market, job), pay_per_lease_wei=lease_cost,
        kept_status=batch.status.name.lower(),
    )


def squat(market: Market) -> dict:
    """An attacker tries to register a victim's libp2p peer ID before the victim does."""
    attacker = market.party("squatter", 2, honest=False)
    victim = market.party("victim", 3)
    books = Books(market, [attacker, victim])
    victim_peer = PeerIdentity.generate()
    attacker_registry = market.registry_of(attacker)
    functions = attacker_registry.contract.functions

    def join_as(signature: bytes) -> Callable[[], object]:
        return lambda: attacker.client.transact(functions.join(victim_peer.peer_id_bytes, signature,
                                                               int(Role.WORKER)), value=ETH)

    own = attacker_registry.binding_signature(PeerIdentity.generate())  # signed by a key the attacker holds
    replayed = market.registry_of(victim).binding_signature(victim_peer)  # the victim's, for the victim's address
    refusals = {"join, own signature": revert_of(join_as(own)), "join, victim's signature replayed":
                revert_of(join_as(replayed))}
    market.join(attacker, Role.WORKER, ETH)  # under its own peer ID, then it tries to rotate to the victim's
    refusals["setPeerId, victim's signature replayed"] = revert_of(
        lambda: attacker.client.transact(functions.setPeerId(victim_peer.peer_id_bytes, replayed)))
    market.join(victim, Role.WORKER, ETH, identity=victim_peer)
    owner = market.registry.owner_of_peer(victim_peer.peer_id_bytes)
    all_refused = all(refusals.values())
    return books.result(
        "squat a victim's peer ID",
        "every attempt refused; the victim registered it" if all_refused and owner == victim.address
        else "A SQUAT WENT THROUGH", attack="squat", refusals=refusals, victim_owns_peer_id=owner == victim.address,
    )


def economic_cases(url: str, deployer: ChainClient, quick: bool) -> tuple[list[dict], list[dict]]:
    """Every economic case on its own market; the collusion sweep's points; returns (rows, sweep)."""
    rows = [requester_theft(Market(url, deployer))]
    percents, leases = ((20, 40, 60), 2) if quick else ((10, 20, 30, 40, 60), 6)
    sweep = [collusion_point(Market(url, deployer), percent, leases) for percent in percents]
    rows += [collusion_row(point) for point in sweep if point["share"] < 0.5]
    rows += [appeal_griefing(Market(url, deployer)), hoard(Market(url, deployer)),
             grind(Market(url, deployer), claims=3 if quick else 4), squat(Market(url, deployer))]
    return rows, sweep


def wins_from(sweep: list[dict]) -> float | None:
    """The smallest share at which the colluders' net gain is positive."""
    return next((p["share"] for p in sorted(sweep, key=lambda p: p["share"]) if p["colluders_net_wei"] > 0), None)


# ---------------------------------------------------------------------------------------------- cheating workers

@dataclass(frozen=True)
class Policies:
    base: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    v1: PreTrainedModel
    v2: PreTrainedModel
    roots: dict[int, bytes]


def rounded(model: torch.nn.Module) -> torch.nn.Module:
    """The model as workers run a published bf16 policy: weights rounded to bf16, computed in fp32."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for tensor in out.state_dict().values():
            tensor.copy_(tensor.to(torch.bfloat16))
    return out.eval()


def noisy(model: torch.nn.Module, scale: float = 1e-3) -> torch.nn.Module:
    out = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in out.parameters():
            parameter.mul_(1 + scale * torch.randn_like(parameter))
    return out


def build_policies() -> Policies:
    """The default model as version 1 and one training step on from it as version 2."""
    base, tokenizer = load_policy(build_default_model(resolve_data_dir(None) / "models"))
    v1 = rounded(base)
    newer = copy.deepcopy(v1).train()
    optimizer = torch.optim.AdamW(newer.parameters(), lr=1e-3)
    ids, labels = _batch(TASK, tokenizer, range(60_000, 60_128))
    newer(input_ids=ids, labels=labels).loss.backward()
    optimizer.step()
    v2 = rounded(newer)
    return Policies(base, tokenizer, v1, v2, {v: content_root(bf16_policy(m)) for v, m in ((1, v1), (2, v2))})


def fabricate(rollouts: list[Rollout], tokenizer: PreTrainedTokenizerFast) -> None:
    generator = torch.Generator().manual_seed(1)
    for r in rollouts:
        r.tokens = torch.randint(0, len(tokenizer), (len(r.tokens),), generator=generator).tolist()
        r.text = tokenizer.decode(r.tokens, skip_special_tokens=True)


def teacher_force(rollouts: list[Rollout], tokenizer: PreTrainedTokenizerFast) -> None:
    """Write the right answers (and one wrong one) instead of sampling them."""
    for index, r in enumerate(rollouts):
        answer = TASK.instance(r.task_seed).answer
        r.text = answer if index else str(int(answer) + 1)
        r.tokens = tokenizer.encode(r.text) + [tokenizer.eos_token_id]
        r.logprobs = [0.0] * len(r.tokens)


def cheat_submission(case: str, job: str, lease: Lease, account: LocalAccount, policies: Policies,
                     spec: JobSpecFile, honest_bytes: bytes) -> bytes:
    """The signed submission `case` makes for its lease."""
    if case == "replayed earlier submission":
        return honest_bytes  # someone else's signed batch, fetched from the swarm and resubmitted
    instances = leased_instances(TASK, lease, spec.tasks_per_lease)
    model = {"substituted model (1e-3 noise)": lambda: noisy(policies.v2),
             "precision change (bf16)": lambda: copy.deepcopy(policies.v2).to(torch.bfloat16),
             "over-stale policy claimed as current": lambda: policies.v1}.get(case, lambda: policies.v2)()
    if case == "prompts other than leased":
        instances = [TASK.instance(i.seed + 1) for i in instances]
    rollouts = generate(model, policies.tokenizer, instances, spec.group_size, max_new_tokens=6, policy_version=2,
                        policy_root=policies.roots[2].hex())
    if case == "fabricated completions":
        fabricate(rollouts, policies.tokenizer)
    elif case == "tokens not chosen by the seeded sampler":
        teacher_force(rollouts, policies.tokenizer)
    rewards = None  # recomputed from the completions
    if case == "inflated claimed rewards":
        rewards = [TASK.reward(TASK.instance(r.task_seed), r.text) + 0.5 for r in rollouts]
    return submission_bytes(job, lease, account, TASK, rollouts, 2, rewards)


@dataclass
class Swarm:
    """The cheat scenario's libp2p hosts, each registered on chain with its peer ID and listen address."""

    market: Market
    work: Path
    nodes: dict[str, P2PNode] = field(default_factory=dict)

    def join(self, party: Party, role: Role, stake_wei: int) -> P2PNode:
        folder = self.work / party.name.replace(" ", "-").replace(":", "")
        gate = PeerGate(RegistryClient(ChainClient(self.market.url), self.market.deployment.registry))
        node = P2PNode(load_or_create_identity(folder), ObjectStore(folder / "objects"), gate=gate).start()
        self.nodes[party.name] = node
        registry = self.market.registry_of(party)
        registry.join(node.identity, role, stake_wei)
        registry.set_listen_addrs([node.addr])
        return node

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()


def dies_after(fetch: Fetcher, limit: int) -> Fetcher:
    """`fetch`, except that the process 'dies' (KeyboardInterrupt) on fetch number limit + 1."""
    calls = 0

    def fetch_or_die(root: bytes, worker: str) -> bytes | None:
        nonlocal calls
        calls += 1
        if calls > limit:
            raise KeyboardInterrupt("validator killed mid-verification")
        return fetch(root, worker)

    return fetch_or_die


@dataclass
class Judges:
    """The two validator daemons of the cheat scenario, rebuilt from their ledgers at every call."""

    swarm: Swarm
    job: str
    validators: list[Party]
    policies: StorePolicies
    gossip: list[bytes] = field(default_factory=list)

    def daemon(self, party: Party, fetch_limit: int | None = None) -> ValidatorDaemon:
        registry = self.swarm.market.registry_of(party)
        fetch = p2p_fetcher(self.swarm.nodes[party.name], registry, timeout_s=30)
        if fetch_limit is not None:
            fetch = dies_after(fetch, fetch_limit)
        return ValidatorDaemon(party.job(self.job), registry, party.client.account, TASK, self.policies, fetch,
                               self.ledger(party), publish=self.gossip.append)

    def ledger(self, party: Party) -> SubmissionLedger:
        return SubmissionLedger(self.swarm.work / party.name.replace(" ", "-") / "validator.sqlite")

    def run(self) -> RoundReport:
        """A judges everything; B is killed mid-verification and restarted; after half the vote window both
        run again (withheld data then counts as unavailable). Returns B's report after its restart."""
        a, b = self.validators
        self.daemon(a).run_once()
        try:
            self.daemon(b, fetch_limit=B_KILLED_AFTER_FETCHES).run_once()
        except KeyboardInterrupt:
            pass
        restarted = self.daemon(b).run_once()
        market = self.swarm.market
        market.advance_to(market.now() + market.view(self.job).spec().vote_window // 2 + 1)
        for party in self.validators:
            self.daemon(party).run_once()
        return restarted

    def reasons(self, lease_id: int) -> list[str]:
        return sorted({row.reason for party in self.validators
                       for row in self.ledger(party).all(self.job) if row.lease_id == lease_id and row.reason})


def submit_cheats(market: Market, job: str, workers: dict[str, Party], swarm: Swarm, policies: Policies,
                  spec: JobSpecFile) -> dict[str, tuple[int, bytes]]:
    """Each worker claims one lease and submits its (honest or cheating) batch at version 2."""
    submitted: dict[str, tuple[int, bytes]] = {}
    for case in CASES:
        party = workers[case]
        client = party.job(job)
        lease = claim_with_seed(client)
        data = cheat_submission(case, job, lease, party.client.account, policies, spec,
                                submitted.get("honest", (0, b""))[1])
        root = object_root(data) if case == "withheld data" else swarm.nodes[party.name].store.put(data)
        client.submit(lease.lease_id, root, 2)
        submitted[case] = (lease.lease_id, data)
    return submitted


def trainer_admission(market: Market, job: str, judges: Judges, submitted: dict[str, tuple[int, bytes]],
                      workers: dict[str, Party], vocab_size: int, spec: JobSpecFile) -> tuple[VerdictBook, dict]:
    """The trainer's verdict book (first committees' seats from its lease book and the registry's weights) and
    buffer, fed every verdict plus one forged by a worker; which batches enter the buffer."""
    view = market.view(job)
    leases = LeaseBook(view, market.deployment.deployed_at_block)
    leases.poll()
    book = VerdictBook(job, BookCommittee(CommitteeView(view, market.registry, market.deployment.deployed_at_block),
                                          leases))
    for data in judges.gossip:
        book.add(data)
    lease_id = submitted["inflated claimed rewards"][0]
    book.add(seal_verdict(job, lease_id, view.lease(lease_id).root, True, "ok",
                          workers["honest"].client.account))  # a worker is not on any committee
    buffer = RolloutBuffer(spec.group_size, spec.max_staleness, vocab_size)
    buffer.advance(2)
    admitted = {case: admit_submission(data, lease_id, view.lease(lease_id).root, book, buffer)["admitted"]
                for case, (lease_id, data) in submitted.items()}
    return book, admitted


def lease_gas(lease_id: int, worker: Party, others: Sequence[Party]) -> dict[str, float]:
    """Gas of one lease's transactions from the parties' receipts; a voteBatch is shared by its leases."""
    steps: Counter = Counter()
    for spent in worker.client.spent:
        if spent.function in ("claim", "withdrawPayment") or (
                spent.function in ("drawSeed", "submit") and spent.args[0] == lease_id):
            steps[spent.function] += spent.gas
    for party in (worker, *others):
        for spent in party.client.spent:
            if spent.function == "voteBatch" and lease_id in spent.args[0]:
                steps["vote"] += spent.gas / len(spent.args[0])
            elif spent.function in ("vote", "finalize") and spent.args[0] == lease_id:
                steps[spent.function] += spent.gas
    return dict(steps)


def settle_cheats(market: Market, job: str, judges: Judges, requester: Party, honest: Party, honest_lease: int,
                  lease_ids: list[int]) -> int:
    """After the appeal window a keeper finalizes every lease; validators slash losers and collect; the honest
    worker withdraws its pay (returned); the requester closes the job."""
    view = market.view(job)
    market.advance_to(max(view.lease(i).deadline for i in lease_ids) + 1)
    keeper = Keeper(requester.job(job), EventLog(None))
    now = market.now()
    for lease_id in lease_ids:
        keeper.act(view.lease(lease_id), now)
    for party in judges.validators:
        judges.daemon(party).run_once()
    paid = Keeper(honest.job(job), EventLog(None)).collect([honest_lease])
    close_job(requester, job)
    return paid


def in_swarm(scenario: Callable[[Market, Swarm, Policies], dict], url: str, deployer: ChainClient,
             policies: Policies, work: Path) -> dict:
    """Run `scenario` on its own market and libp2p swarm, whose hosts are stopped however it ends."""
    market = Market(url, deployer)
    swarm = Swarm(market, work)
    try:
        return scenario(market, swarm, policies)
    finally:
        swarm.stop()


def publish_policies(swarm: Swarm, requester: Party, job: str, policies: Policies) -> StorePolicies:
    """The trainer stores version 1 as an anchor and version 2 as a signed delta and publishes both roots;
    validators rebuild each claimed version from them and check it against the root on chain."""
    store = PolicyStore(swarm.work / "policies", trainer=requester.address)
    store.publish(1, bf16_policy(policies.v1), requester.client.account)
    store.publish(2, bf16_policy(policies.v2), requester.client.account, previous=bf16_policy(policies.v1))
    for version in (1, 2):
        requester.job(job).publish_policy(version, policies.roots[version])
    return StorePolicies(store, policies.base, policies.tokenizer, swarm.market.view(job).policy_root)


def cheat_scenario(market: Market, swarm: Swarm, policies: Policies) -> dict:
    requester = market.party("requester", REQUESTER)
    validators = [market.party(f"validator {name}", 2 + i) for i, name in enumerate("ab")]
    workers = {case: market.party(f"worker: {case}", 4 + i, honest=case == "honest") for i, case in enumerate(CASES)}
    books = Books(market, [requester, *validators, *workers.values()])
    for party in validators:  # staked before any submission: committees come from the stake before it
        swarm.join(party, Role.VALIDATOR, 10 * ETH)
    for party in workers.values():
        swarm.join(party, Role.WORKER, WORKER_STAKE)
    spec = cheat_spec()
    job = market.create_job(requester, spec, 2 * ETH)
    judges = Judges(swarm, job, validators, publish_policies(swarm, requester, job, policies))
    view = market.view(job)

    submitted = submit_cheats(market, job, workers, swarm, policies, spec)
    restarted = judges.run()
    book, admitted = trainer_admission(market, job, judges, submitted, workers, policies.v2.config.vocab_size, spec)
    decided = {case: view.lease(lease_id).outcome for case, (lease_id, _) in submitted.items()}
    lease_ids = [lease_id for lease_id, _ in submitted.values()]
    lease_cost = view.lease_cost()
    honest_lease = submitted["honest"][0]
    honest_paid = settle_cheats(market, job, judges, requester, workers["honest"], honest_lease, lease_ids)
    if view.lease(honest_lease).status is LeaseStatus.PAID:
        workers["honest"].wage_wei = requester.purchases_wei = lease_cost
    nets = books.nets()
    honest_loss = attacker_and_honest([p for p in books.parties if p.honest], nets)["honest_loss_wei"]
    voted = Counter((v["leaseId"], v["validator"]) for v in view.votes())
    rows = []
    for case, (lease_id, _) in submitted.items():
        party, lease = workers[case], view.lease(lease_id)
        info = market.registry.info(party.address)
        rows.append({
            "name": case, "kind": "cheat", "honest": case == "honest", "attacker_net_wei": nets[party.name],
            "honest_loss_wei": honest_loss, "outcome": lease.status.name.lower(),
            "decided": decided[case].name.lower(), "final_status": lease.status.name.lower(),
            "rejected": int(lease.status is LeaseStatus.SLASHED), "collateral_wei": view.spec().slash_amount,
            "slashed_wei": WORKER_STAKE - info.active - info.locked,
            "paid_wei": honest_paid if case == "honest" else view.owed(party.address),
            "reasons": judges.reasons(lease_id), "votes": [voted[(lease_id, v.address)] for v in validators],
            "admitted_by_trainer": book.admitted(lease_id, lease.root), "trainer_buffer_admitted": admitted[case],
        })
    honest_row = rows[0]
    steps = lease_gas(honest_lease, workers["honest"], [requester, *validators])
    samples = spec.group_size * spec.tasks_per_lease
    return {
        "cases": rows[1:], "honest": honest_row, "honest_paid_wei": honest_paid,
        "honest_slashed_wei": honest_row["slashed_wei"], "lease_cost_wei": lease_cost,
        "gas_per_lease_steps": {k: round(v) for k, v in steps.items()},
        "gas_per_accepted_sample": round(sum(steps.values()) / samples, 1),
        "validator_b_killed_after_fetches": B_KILLED_AFTER_FETCHES,
        "validator_b_after_restart": {"judged": restarted.judged, "attested": restarted.attested},
        "every_vote_exactly_once": all(voted[(i, v.address)] == 1 for i in lease_ids for v in validators),
        "gossiped_verdicts": len(judges.gossip), "cheat_scenario_net_wei": nets,
    }


# ---------------------------------------------------------------------------------------------- partial cheats

def partial_spec() -> JobSpecFile:
    """64 rollouts a lease, each first-round member verifying 1/8 of them; 1 of 64 is the smallest cheat."""
    return cheat_spec().model_copy(update={"group_size": 8, "tasks_per_lease": 8, "sampled_fraction": Decimal("0.125"),
                                           "detectable_cheat_fraction": Decimal("0.015625")})


def partial_submission(job: str, lease: Lease, account: LocalAccount, policies: Policies, spec: JobSpecFile,
                       faked: int) -> tuple[bytes, list[int]]:
    """An honest batch at version 2 with `faked` rollouts (at random positions) replaced by teacher-forced
    answers that keep the recipe's bounds and recomputed rewards: only the model's checks can tell them.
    Returns the signed submission and the faked positions (lease order)."""
    instances = leased_instances(TASK, lease, spec.tasks_per_lease)
    rollouts = generate(policies.v2, policies.tokenizer, instances, spec.group_size, max_new_tokens=6,
                        policy_version=2, policy_root=policies.roots[2].hex())
    positions = sorted(random.Random(lease.seed).sample(range(len(rollouts)), faked))
    for index in positions:
        rollout = rollouts[index]
        rollout.text = TASK.instance(rollout.task_seed).answer
        rollout.tokens = policies.tokenizer.encode(rollout.text) + [policies.tokenizer.eos_token_id]
        rollout.logprobs = [0.0] * len(rollout.tokens)
    return submission_bytes(job, lease, account, TASK, rollouts, 2), positions


def run_to_final(market: Market, judges: Judges, job: str, lease_id: int, steps: int = 12) -> Lease:
    """Let the three daemons verify, vote, appeal and settle the lease: run them all; where that changed
    nothing, move the clock past the lease's current deadline (vote or appeal window) and every keeper's turn."""
    view = market.view(job)
    for _ in range(steps):
        before = view.lease(lease_id)
        for party in judges.validators:
            judges.daemon(party).run_once()
        lease = view.lease(lease_id)
        if lease.final:
            for party in judges.validators:  # slash losers, collect rewards
                judges.daemon(party).run_once()
            return lease
        if (lease.round, lease.status, lease.outcome) == (before.round, before.status, before.outcome):
            market.advance_to(lease.deadline + 1 + 3 * KEEPER_GRACE_S)  # past every keeper's turn
    raise RuntimeError(f"lease {lease_id} did not settle in {steps} steps")


def partial_scenario(market: Market, swarm: Swarm, policies: Policies) -> dict:
    requester = market.party("requester", REQUESTER)
    validators = [market.party(f"validator {name}", 2 + i) for i, name in enumerate("abc")]
    cheaters = {name: market.party(f"worker: fakes {name}", 5 + i, honest=False)
                for i, name in enumerate(PARTIAL_CHEATS)}
    books = Books(market, [requester, *validators, *cheaters.values()])
    for party in validators:
        swarm.join(party, Role.VALIDATOR, 10 * ETH)
    for party in cheaters.values():
        swarm.join(party, Role.WORKER, WORKER_STAKE)
    spec = partial_spec()
    job = market.create_job(requester, spec, 20 * ETH)
    judges = Judges(swarm, job, validators, publish_policies(swarm, requester, job, policies))
    view = market.view(job)
    chain_spec = view.spec()
    lease_cost = view.lease_cost()
    rows = []
    for name, faked in PARTIAL_CHEATS.items():
        party = cheaters[name]
        leases, caught_by, paid_for_fakes = 0, None, 0
        while caught_by is None and leases < PARTIAL_MAX_LEASES:
            lease = claim_with_seed(party.job(job))
            data, positions = partial_submission(job, lease, party.client.account, policies, spec, faked)
            party.job(job).submit(lease.lease_id, swarm.nodes[party.name].store.put(data), 2)
            leases += 1
            final = run_to_final(market, judges, job, lease.lease_id)
            if final.status is LeaseStatus.PAID:  # the honest part's pay is a wage, the faked part's a gain
                fake_pay = lease_cost * faked // chain_spec.rollouts_per_lease
                party.wage_wei += lease_cost - fake_pay
                requester.purchases_wei += lease_cost - fake_pay
                paid_for_fakes += fake_pay
            elif final.status is LeaseStatus.SLASHED:
                caught_by = final.round
        Keeper(party.job(job), EventLog(None)).collect([i for i in range(1, view.lease_count() + 1)
                                                        if view.lease(i).worker == party.address])
        fraction = faked / chain_spec.rollouts_per_lease
        rows.append({"name": f"partial cheat: fakes {name}", "kind": "partial", "faked_per_lease": faked,
                     "cheat_fraction": fraction, "leases": leases, "caught": caught_by is not None,
                     "requester_paid_for_fakes_wei": paid_for_fakes,
                     "caught_in_round": caught_by,
                     "expected_leases_until_caught": round(expected_leases_until_caught(
                         fraction, chain_spec.samples_checked, chain_spec.committee_size), 2),
                     "catch_probability": round(catch_probability(
                         fraction, chain_spec.samples_checked, chain_spec.committee_size), 4)})
    close_job(requester, job)
    nets = books.nets()
    for row, party in zip(rows, cheaters.values(), strict=True):
        row["attacker_net_wei"] = nets[party.name]
        row["outcome"] = f"caught after {row['leases']} leases" if row["caught"] else f"not caught in {row['leases']}"
    validator_nets = {p.name: nets[p.name] for p in validators}
    # The validators must lose nothing. The requester pays for the fakes that went unnoticed (reported apart):
    # sampling trades verification compute for that bounded loss, which the cheater's slash outweighs.
    honest_loss = attacker_and_honest(validators, nets)["honest_loss_wei"]
    for row in rows:
        row["honest_loss_wei"] = honest_loss
    return {"rows": rows, "validator_net_wei": validator_nets, "requester_net_wei": nets[requester.name],
            "samples_checked": chain_spec.samples_checked, "rollouts_per_lease": chain_spec.rollouts_per_lease,
            "committee_size": chain_spec.committee_size, "slashed_validators": sum(
                1 for v in validators if market.registry.info(v.address).active < 10 * ETH)}


# ---------------------------------------------------------------------------------------------- report

def first_reason(reasons: list[str]) -> str:
    """A rejection reason without its 'task N sample M:' prefix, shortened for the table."""
    return re.sub(r"^task \d+ sample \d+: ", "", (reasons or [""])[0])[:70]


def print_report(console: Console, report: dict) -> None:
    cheats = Table(title="cheating workers: 1 lease each (2 tasks x 4 samples), 2 validators, collateral 1 ETH")
    for column in ("case", "round 0", "final", "collateral slashed ETH", "paid ETH", "net ETH", "votes A/B",
                   "trainer buffer", "first reason"):
        cheats.add_column(column)
    for row in [report["honest"], *(c for c in report["cases"] if c["kind"] == "cheat")]:
        cheats.add_row(row["name"], row["decided"], row["final_status"], f"{row['slashed_wei'] / ETH:g}",
                       f"{row['paid_wei'] / ETH:g}", eth(row["attacker_net_wei"]), "/".join(map(str, row["votes"])),
                       str(row["trainer_buffer_admitted"]), first_reason(row["reasons"]))
    console.print(cheats)
    partial = report["partial"]
    table = Table(title=f"partial cheats against sampled verification: each of {partial['committee_size']} members "
                        f"verifies {partial['samples_checked']} of {partial['rollouts_per_lease']} rollouts")
    for column in ("cheat", "P(caught) per lease", "leases until caught", "expected 1/P", "caught in round",
                   "net ETH", "requester paid for fakes ETH"):
        table.add_column(column, justify="right")
    for row in (c for c in report["cases"] if c["kind"] == "partial"):
        table.add_row(row["name"], f"{row['catch_probability']:.3f}",
                      str(row["leases"]) + ("" if row["caught"] else " (not caught)"),
                      f"{row['expected_leases_until_caught']:.2f}", str(row["caught_in_round"]),
                      eth(row["attacker_net_wei"]), eth(row["requester_paid_for_fakes_wei"]))
    console.print(table)
    console.print(f"the requester paid {eth(-partial['requester_net_wei'])} ETH for fakes that went unnoticed "
                  f"(the faked parts of accepted leases); validators' net over the partial cheats: "
                  f"{ {k: eth(v) for k, v in partial['validator_net_wei'].items()} }; "
                  f"validators slashed: {partial['slashed_validators']}")
    cases = Table(title="every case: net gains from chain state (gas excluded, wages taken out)")
    for column in ("case", "kind", "outcome", "attacker net ETH", "honest loss ETH"):
        cases.add_column(column)
    for row in report["cases"]:
        cases.add_row(row["name"], row["kind"], row["outcome"], eth(row["attacker_net_wei"]),
                      eth(row["honest_loss_wei"]))
    console.print(cases)
    sweep = Table(title=f"collusion sweep: {COLLUDERS} colluders, {HONEST_VALIDATORS} honest validators, "
                        "expected first committee 3, 2 appeal rounds (the last seats everyone)")
    for column in ("colluders' share", "leases", "colluders net ETH", "honest loss ETH", "first rounds won",
                   "overturned on appeal", "wrong final outcomes"):
        sweep.add_column(column, justify="right")
    for point in report["collusion_sweep"]:
        sweep.add_row(f"{point['share']:.0%}", str(point["leases"]), eth(point["colluders_net_wei"]),
                      eth(point["honest_loss_wei"]), str(point["first_rounds_won_by_colluders"]),
                      str(point["overturned_on_appeal"]), str(point["wrong_final_outcomes"]))
    console.print(sweep)
    economic = {row["attack"]: row for row in report["cases"] if row["kind"] == "economic"}
    console.print(f"requester's huge slash: {economic['requester']['refused_spec']}")
    console.print(f"hoarder: {economic['hoard']['refused_beyond']}")
    console.print(f"grinder, drawSeed in the claim block: {economic['grind']['draw_seed_in_claim_block'][0]}")
    console.print(f"squatter: {economic['squat']['refusals']}")
    console.print(f"collusion first pays from a {report['collusion_wins_from_share']} share of validator stake; "
                  f"gas per accepted sample {report['gas_per_accepted_sample']} ({report['gas_per_lease_steps']})")
    console.print(f"every vote exactly once: {report['every_vote_exactly_once']}; validator B killed after "
                  f"{report['validator_b_killed_after_fetches']} fetches, restarted: "
                  f"{report['validator_b_after_restart']}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Adversaries against the trustless settlement.")
    parser.add_argument("--quick", action="store_true", help="fewer collusion points, leases and grinding claims")
    parser.add_argument("--json", type=Path, default=Path("bench/results/adversaries.json"))
    args = parser.parse_args()
    console = make_console()
    torch.set_num_threads(2)
    started = time.perf_counter()
    policies = build_policies()
    anvil = start_anvil()
    try:
        deployer = ChainClient(anvil.url, dev_account(DEPLOYER))
        with tempfile.TemporaryDirectory(prefix="rollnet-adversaries-") as work:
            report = in_swarm(cheat_scenario, anvil.url, deployer, policies, Path(work))
        with tempfile.TemporaryDirectory(prefix="rollnet-partial-") as work:
            partial = in_swarm(partial_scenario, anvil.url, deployer, policies, Path(work))
        rows, sweep = economic_cases(anvil.url, deployer, args.quick)
    finally:
        anvil.stop()
    report = {"benchmark": "adversaries", "quick": args.quick, **report,
              "cases": [*report["cases"], *partial.pop("rows"), *rows], "partial": partial,
              "collusion_sweep": sweep, "collusion_wins_from_share": wins_from(sweep),
              "seconds": round(time.perf_counter() - started, 1)}
    print_report(console, report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    console.print(f"wrote {args.json} in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()

"""What a devnet run did, gathered from the participants' event logs and from the chain.

Invariants: `RunState` only reads: event logs incrementally (each whole line once) and the chain through
calls and logs, never transactions, so watching a run cannot change it; every number the live view and
the report show comes from here, and the chain's numbers (payments, slashes, gas) from the chain itself,
not from what a participant says about itself.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from web3 import Web3

from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.job import JobClient
from rollnet.node.chain.registry import RegistryClient
from rollnet.node.events import read_events

CONTRACTS = ("TrainingJob", "NodeRegistry", "JobFactory")
OUTCOMES = {1: "accepted", 2: "rejected", 3: "void"}
JOB_EVENTS = ["RoundDecided", "CommitteeDrawn", "Voted", "Appealed", "Settled", "PaymentWithdrawn"]
REGISTRY_EVENTS = ["Slashed", "CollateralReleased"]
SETUP_CALLS = {"join", "createJob", "setAddrs", "setListenAddrs", "(deploy)", "setFactory"}


@dataclass
class ParticipantState:
    name: str
    role: str
    address: str
    events: list[dict] = field(default_factory=list)
    offset: int = 0

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind]

    @property
    def policy_version(self) -> int | None:
        versions = [e["version"] for e in self.events if e["kind"] == "policy"]
        return max(versions) if versions else None


@dataclass
class ChainSnapshot:
    block: int = 0
    version: int = 0
    leases: int = 0
    escrow: int = 0
    stake: dict[str, int] = field(default_factory=dict)
    owed: dict[str, int] = field(default_factory=dict)
    decided: Counter = field(default_factory=Counter)  # accepted / rejected / void: final outcomes (settled)
    rounds: Counter = field(default_factory=Counter)  # round decisions by outcome, appeals included
    committees: dict[int, list[dict]] = field(default_factory=dict)  # lease -> votes (round, validator, accept, share)
    appeals: list[dict] = field(default_factory=list)
    settled_paid: dict[str, int] = field(default_factory=dict)  # worker -> wei credited
    slashed: dict[str, int] = field(default_factory=dict)  # node -> wei slashed
    withdrawn: dict[str, int] = field(default_factory=dict)


class RunState:
    def __init__(self, participants: list[tuple[str, str, str, Path]]):
        """`participants`: (name, role, address, data dir) of each process."""
        self.people = {name: ParticipantState(name, role, address) for name, role, address, _ in participants}
        self._paths = {name: folder / "events.jsonl" for name, _, _, folder in participants}
        self.chain = ChainSnapshot()
        self._event_block = 0
        self._totals: dict[tuple[int, int], int] = {}

    def name_of(self, address: str) -> str:
        for person in self.people.values():
            if person.address.lower() == address.lower():
                return person.name
        return address[:10]

    # ------------------------------------------------------------------ event logs

    def read(self) -> None:
        for name, path in self._paths.items():
            person = self.people[name]
            events, person.offset = read_events(path, person.offset)
            person.events += events

    @property
    def trainer(self) -> ParticipantState:
        return next(p for p in self.people.values() if p.role == "trainer")

    def steps(self) -> list[dict]:
        return self.trainer.of("step")

    def held_out(self) -> list[dict]:
        return self.trainer.of("held_out")

    def staleness_histogram(self) -> Counter:
        total: Counter = Counter()
        for step in self.steps():
            total.update({int(g): n for g, n in step["staleness"].items()})
        return total

    def staleness_by_worker(self) -> dict[str, Counter]:
        out: dict[str, Counter] = {}
        for step in self.steps():
            for worker, histogram in step["per_worker"].items():
                out.setdefault(self.name_of(worker), Counter()).update({int(g): n for g, n in histogram.items()})
        return out

    def broadcasts(self) -> list[dict]:
        """Every follower's receipt of every version: delta bytes, fetch and announce-to-applied seconds."""
        return [dict(e, who=p.name) for p in self.people.values() if p.role != "trainer" for e in p.of("policy")]

    # ------------------------------------------------------------------ chain

    def _note_job_event(self, kind: str, args: dict) -> None:
        snapshot = self.chain
        if kind == "RoundDecided":
            snapshot.rounds[OUTCOMES.get(args["outcome"], "pending")] += 1
        elif kind == "CommitteeDrawn":
            self._totals[(args["leaseId"], args["round"])] = args["totalWeight"]
        elif kind == "Voted":
            total = self._totals.get((args["leaseId"], args["round"])) or 0
            snapshot.committees.setdefault(args["leaseId"], []).append(
                {"round": args["round"], "validator": self.name_of(args["validator"]), "accept": args["accept"],
                 "share": args["weight"] / total if total else None})
        elif kind == "Appealed":
            snapshot.appeals.append({"lease": args["leaseId"], "round": args["round"],
                                     "appellant": self.name_of(args["appellant"])})
        elif kind == "Settled":
            snapshot.decided[OUTCOMES.get(args["outcome"], "pending")] += 1
            if args["paid"]:
                name = self.name_of(args["worker"])
                snapshot.settled_paid[name] = snapshot.settled_paid.get(name, 0) + args["paid"]
        elif kind == "PaymentWithdrawn":
            name = self.name_of(args["account"])
            snapshot.withdrawn[name] = snapshot.withdrawn.get(name, 0) + args["amount"]

    def poll_chain(self, client: ChainClient, job: JobClient, registry: RegistryClient) -> None:
        snapshot = self.chain
        status = job.status()
        snapshot.block = client.block_number()
        snapshot.version, snapshot.leases, snapshot.escrow = status.current_version, status.lease_count, status.escrow
        for person in self.people.values():
            info = registry.info(person.address)
            snapshot.stake[person.name] = info.active + info.locked
            snapshot.owed[person.name] = job.owed(person.address)
        head = snapshot.block
        if head >= self._event_block:
            for event in client.logs(job.contract, JOB_EVENTS, self._event_block, head):  # one query, chain order
                self._note_job_event(event["event"], event["args"])
            for event in client.logs(registry.contract, REGISTRY_EVENTS, self._event_block, head):
                slashed = event["event"] == "Slashed"
                if slashed or event["args"]["taken"]:  # a slash; a rejected lease's collateral or an expiry fee
                    name = self.name_of(event["args"]["node"])
                    taken = event["args"]["amount"] if slashed else event["args"]["taken"]
                    snapshot.slashed[name] = snapshot.slashed.get(name, 0) + taken
            self._event_block = head + 1


def gas_by_call(client: ChainClient, addresses: dict[str, str], from_block: int) -> dict[str, dict]:
    """Gas used per contract function over the run: {function: {"calls", "gas"}} (setup calls marked)."""
    contracts = [client.w3.eth.contract(address=Web3.to_checksum_address(a), abi=client.contract(n, a).abi)
                 for n, a in addresses.items()]
    by_address = {c.address.lower(): c for c in contracts}
    job_abi = client.contract("TrainingJob", addresses["TrainingJob"]).abi
    out: dict[str, dict] = {}
    for number in range(from_block, client.block_number() + 1):
        block = client.w3.eth.get_block(number, full_transactions=True)
        for tx in block["transactions"]:
            receipt = client.w3.eth.get_transaction_receipt(tx["hash"])
            name = _function_name(tx, by_address, job_abi, client)
            entry = out.setdefault(name, {"calls": 0, "gas": 0, "setup": name in SETUP_CALLS})
            entry["calls"] += 1
            entry["gas"] += receipt["gasUsed"]
    return out


def _function_name(tx: dict, by_address: dict, job_abi: list, client: ChainClient) -> str:
    if tx["to"] is None:
        return "(deploy)"
    data = bytes(tx["input"])
    if not data:
        return "(transfer)"
    contract = by_address.get(tx["to"].lower())
    if contract is None:  # a job other than the tracked one: decode with the job's ABI
        contract = client.w3.eth.contract(address=tx["to"], abi=job_abi)
    try:
        function, _ = contract.decode_function_input(data)
        return function.fn_name
    except ValueError:
        return "(unknown)"

"""Typed access to JobFactory and TrainingJob: create a job, the policy clock, leases, votes, money.

Invariants: amounts are wei ints; each method is one transaction or one call; receipts are decoded into
the event fields callers need (lease ids, seeds), never re-derived off chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from eth_utils import keccak
from rollnet.node.chain.client import ChainClient
from web3.logs import DISCARD
from web3.types import TxReceipt


class LeaseStatus(IntEnum):
    NONE = 0
    LEASED = 1
    SUBMITTED = 2
    ACCEPTED = 3
    REJECTED = 4
    CHALLENGED = 5
    PAID = 6
    SLASHED = 7
    RETURNED = 8
    LAPSED = 9


@dataclass(frozen=True)
class Lease:
    lease_id: int
    worker: str
    deadline: int
    status: LeaseStatus
    first_task: int
    policy_version: int
    accept_votes: int
    reject_votes: int
    seed: bytes
    root: bytes

    def task_seed(self, task_index: int) -> bytes:
        """Seed of the lease's `task_index`-th task: keccak256(abi.encode(leaseSeed, taskIndex))."""
        return keccak(self.seed + task_index.to_bytes(32, "big"))


@dataclass(frozen=True)
class ChallengeState:
    challenger: str
    deadline: int
    original_accepted: bool
    resolved: bool
    overturned: bool


@dataclass(frozen=True)
class JobStatus:
    address: str
    requester: str
    spec: dict
    balance: int
    escrow: int
    reserved: int
    total_owed: int
    bonds_held: int
    current_version: int
    lease_count: int
    closed: bool


SPEC_FIELDS = (
    "model_hash", "task_set_id", "trainer", "arbiter", "group_size", "tasks_per_lease", "max_staleness",
    "quorum", "clip_epsilon_milli", "clip_delta_milli", "lease_duration", "vote_window", "challenge_window",
    "resolve_window", "reward_per_sample", "slash_amount", "challenge_bond",
)


class FactoryClient:
    def __init__(self, client: ChainClient, address: str):
        self.client = client
        self.contract = client.contract("JobFactory", address)

    def create_job(self, spec_tuple: tuple, budget_wei: int) -> str:
        receipt = self.client.transact(self.contract.functions.createJob(spec_tuple), value=budget_wei)
        (event,) = self.contract.events.JobCreated().process_receipt(receipt, errors=DISCARD)
        return event["args"]["job"]

    def jobs(self) -> list[str]:
        count = self.client.call(self.contract.functions.jobCount())
        return [self.client.call(self.contract.functions.jobs(i)) for i in range(count)]

    def is_job(self, address: str) -> bool:
        return self.client.call(self.contract.functions.isJob(address))


class JobClient:
    def __init__(self, client: ChainClient, address: str):
        self.client = client
        self.address = address
        self.contract = client.contract("TrainingJob", address)

    def _call(self, name: str, *args: object) -> object:
        return self.client.call(getattr(self.contract.functions, name)(*args))

    def spec(self) -> dict:
        return dict(zip(SPEC_FIELDS, self._call("spec"), strict=True))

    def status(self) -> JobStatus:
        return JobStatus(
            address=self.address,
            requester=self._call("requester"),
            spec=self.spec(),
            balance=self.client.balance(self.address),
            escrow=self._call("escrow"),
            reserved=self._call("reserved"),
            total_owed=self._call("totalOwed"),
            bonds_held=self._call("bondsHeld"),
            current_version=self._call("currentVersion"),
            lease_count=self._call("leaseCount"),
            closed=self._call("closed"),
        )

    def current_version(self) -> int:
        """The job's policy clock: the latest version the trainer published."""
        return self._call("currentVersion")

    def lease_count(self) -> int:
        return self._call("leaseCount")

    def lease(self, lease_id: int) -> Lease:
        raw = self._call("getLease", lease_id)
        worker, deadline, status, first, version, acc, rej, seed, root = raw
        return Lease(
            lease_id, worker, deadline, LeaseStatus(status), first, version, acc, rej, bytes(seed), bytes(root)
        )

    def policy_root(self, version: int) -> bytes:
        """The content root of `version`'s weights; version 0 is the job's base model (the spec's model root)."""
        if version == 0:
            return bytes(self.spec()["model_hash"])
        return bytes(self._call("policyRoot", version))

    def vote_of(self, lease_id: int, address: str) -> int:
        """0 none, 1 accept, 2 reject, 3 slashed after losing a challenge."""
        return int(self._call("votes", lease_id, address))

    def has_voted(self, lease_id: int, address: str) -> bool:
        return self.vote_of(lease_id, address) != 0

    def owed(self, address: str) -> int:
        return self._call("owed", address)

    def _send(self, name: str, *args: object, value: int = 0) -> TxReceipt:
        return self.client.transact(getattr(self.contract.functions, name)(*args), value=value)

    def publish_policy(self, version: int, root: bytes) -> TxReceipt:
        return self._send("publishPolicy", version, root)

    def claim(self) -> Lease:
        receipt = self._send("claim")
        (event,) = self.contract.events.TaskClaimed().process_receipt(receipt, errors=DISCARD)
        return self.lease(event["args"]["leaseId"])

    def submit(self, lease_id: int, root: bytes, policy_version: int) -> TxReceipt:
        return self._send("submit", lease_id, root, policy_version)

    def attest(self, lease_id: int, accept: bool) -> TxReceipt:
        return self._send("attest", lease_id, accept)

    def attest_batch(self, verdicts: dict[int, bool]) -> TxReceipt:
        ids = list(verdicts)
        return self._send("attestBatch", ids, [verdicts[i] for i in ids])

    def finalize(self, lease_id: int) -> TxReceipt:
        return self._send("finalize", lease_id)

    def lapse(self, lease_id: int) -> TxReceipt:
        return self._send("lapse", lease_id)

    def reclaim(self, lease_id: int) -> TxReceipt:
        return self._send("reclaim", lease_id)

    def challenge(self, lease_id: int, bond_wei: int) -> TxReceipt:
        return self._send("challenge", lease_id, value=bond_wei)

    def resolve(self, lease_id: int, accept: bool) -> TxReceipt:
        return self._send("resolve", lease_id, accept)

    def challenge_state(self, lease_id: int) -> ChallengeState:
        challenger, deadline, original_accepted, resolved, overturned = self._call("challenges", lease_id)
        return ChallengeState(challenger, deadline, original_accepted, resolved, overturned)

    def voters(self, lease_id: int) -> dict[str, bool]:
        """Each validator's vote on a lease (True = accept), from its Attested events."""
        logs = self.client.events(self.contract, "Attested", 0)
        return {log["args"]["validator"]: log["args"]["accept"] for log in logs if log["args"]["leaseId"] == lease_id}

    def slash_voter(self, lease_id: int, validator: str) -> TxReceipt:
        return self._send("slashVoter", lease_id, validator)

    def withdraw_payment(self) -> TxReceipt:
        return self._send("withdrawPayment")

    def close(self) -> TxReceipt:
        return self._send("close")

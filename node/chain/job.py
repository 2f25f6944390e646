"""Typed access to JobFactory and TrainingJob: create a job, the policy clock, leases and their seeds,
committees and votes, appeals, settlement, rewards and money.

Invariants: amounts are wei ints; each method is one transaction or one call; receipts are decoded into
the event fields callers need (lease ids), never re-derived off chain; who sits on a committee and with
what weight is always asked of the contract (`member_weight`), never recomputed here. The spec is read
once per client and typed (`ChainSpec`, its recipe a `Recipe`): `initialize` fixes it for the job's life.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from eth_utils import keccak
from rollnet.node.chain.client import ChainClient
from rollnet.node.errors import ConfigError, ContractRevert
from rollnet.node.recipe import Recipe
from web3.logs import DISCARD
from web3.types import TxReceipt


class LeaseStatus(IntEnum):
    NONE = 0
    LEASED = 1
    VOTING = 2
    DECIDED = 3
    PAID = 4
    SLASHED = 5
    RETURNED = 6
    LAPSED = 7


FINAL_STATUSES = (LeaseStatus.PAID, LeaseStatus.SLASHED, LeaseStatus.RETURNED, LeaseStatus.LAPSED)
SETTLED_STATUSES = (LeaseStatus.PAID, LeaseStatus.SLASHED, LeaseStatus.LAPSED)


class Outcome(IntEnum):
    PENDING = 0
    ACCEPT = 1
    REJECT = 2
    VOID = 3


@dataclass(frozen=True)
class Lease:
    lease_id: int
    worker: str
    status: LeaseStatus
    outcome: Outcome  # the current round's decision (PENDING while its votes are open)
    round: int
    first_task: int
    deadline: int  # lease expiry, then the current round's vote deadline, then its appeal deadline
    policy_version: int
    anchor_block: int  # the claim block until submission, then the submission block
    seed: bytes  # the prompt seed (zero bytes until drawn)
    root: bytes

    @property
    def seed_drawn(self) -> bool:
        return any(self.seed)

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    def task_seed(self, task_index: int) -> bytes:
        """Seed of the lease's `task_index`-th task: keccak256(abi.encode(leaseSeed, taskIndex))."""
        return keccak(self.seed + task_index.to_bytes(32, "big"))


@dataclass(frozen=True)
class RoundState:
    round: int
    accept_weight: int
    reject_weight: int
    start_block: int
    seed: bytes  # 20 bytes; zero until the committee is drawn
    total_weight: int
    appellant: str | None  # who appealed into this round (None for round 0)

    @property
    def drawn(self) -> bool:
        return any(self.seed)


@dataclass(frozen=True)
class JobStatus:
    address: str
    requester: str
    spec: ChainSpec
    balance: int
    escrow: int
    reserved: int
    total_owed: int
    bonds_held: int
    pool_held: int
    burned: int
    current_version: int
    lease_count: int
    closed: bool


@dataclass(frozen=True)
class ChainSpec:
    """A job's `JobSpec` as the contract returns it, typed; the one spec every role reads."""

    model_hash: bytes
    task_config_hash: bytes
    trainer: str
    group_size: int
    tasks_per_lease: int
    max_staleness: int
    committee_size: int
    appeal_rounds: int
    clip_epsilon_milli: int
    clip_delta_milli: int
    lease_duration: int
    vote_window: int
    appeal_window: int
    reward_per_sample: int
    slash_amount: int
    expiry_fee: int
    voter_slash: int
    absent_penalty: int
    appeal_bond: int
    model_name: str
    task_name: str
    max_new_tokens: int
    temperature_milli: int
    chat_template: bool
    stop_on_eos: bool
    model_files_hash: bytes
    samples_checked: int  # rollouts each first-round committee member verifies (appeal rounds: all)
    min_cheat_ppm: int  # smallest faked fraction of a batch (ppm) the factory's sizing rule covers

    @property
    def rollouts_per_lease(self) -> int:
        return self.group_size * self.tasks_per_lease

    @property
    def recipe(self) -> Recipe:
        return Recipe(
            model_name=self.model_name, model_root="0x" + self.model_hash.hex(),
            model_files_hash="0x" + self.model_files_hash.hex(), task_name=self.task_name,
            task_config_hash="0x" + self.task_config_hash.hex(), max_new_tokens=self.max_new_tokens,
            temperature=self.temperature_milli / 1000, chat_template=self.chat_template,
            stop_on_eos=self.stop_on_eos, group_size=self.group_size, max_staleness=self.max_staleness,
            clip_epsilon=self.clip_epsilon_milli / 1000, clip_delta=self.clip_delta_milli / 1000)

VOTE_CODES = {1: True, 2: False}
# Gas a vote may need beyond its estimate when other votes land first in the same block: drawing the round's
# committee (its seed and stake snapshot) and deciding the round. Estimated alone, a vote that another
# member's vote overtakes ran out of gas on chain (bench/scale.py, 1 s blocks).
VOTE_HEADROOM_GAS = 120_000
# Likewise a claim: whether it pops a returned task or takes the next, and the registry's collateral books.
CLAIM_HEADROOM_GAS = 60_000
MAX_ROUNDS = 4  # JobFactory.MAX_APPEAL_ROUNDS + 1: the ballot's low 8 bits, 2 per round


class FactoryClient:
    def __init__(self, client: ChainClient, address: str):
        self.client = client
        self.contract = client.contract("JobFactory", address)

    def validate(self, spec_tuple: tuple) -> None:
        """Ask the factory whether it would accept `spec_tuple` (ContractRevert naming the field if not)."""
        self.client.call(self.contract.functions.validateSpec(spec_tuple))

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
        self._spec: ChainSpec | None = None
        self._roots: dict[int, bytes] = {}  # published policy roots (immutable on chain)

    def _call(self, name: str, *args: object) -> object:
        return self.client.call(getattr(self.contract.functions, name)(*args))

    def registry_address(self) -> str:
        """The node registry the job locks collateral and slashes in (fixed at creation)."""
        return self._call("registry")

    def spec(self) -> ChainSpec:
        """The job's spec (read once: `initialize` fixes it for the job's life)."""
        if self._spec is None:
            try:
                self._spec = ChainSpec(*self._call("spec"))
            except UnicodeDecodeError:  # a factory from before names were checked as text
                raise ConfigError(f"job {self.address}'s recipe names a model or task that is not text: no "
                                  "participant can run it") from None
        return self._spec

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
            pool_held=self._call("poolHeld"),
            burned=self._call("burned"),
            current_version=self._call("currentVersion"),
            lease_count=self._call("leaseCount"),
            closed=self._call("closed"),
        )

    def current_version(self) -> int:
        """The job's policy clock: the latest version the trainer published."""
        return self._call("currentVersion")

    def lease_count(self) -> int:
        return self._call("leaseCount")

    def lease_cost(self) -> int:
        """Wei one accepted lease pays its worker (rewardPerSample x groupSize x tasksPerLease)."""
        return self._call("leaseCost")

    def lease(self, lease_id: int) -> Lease:
        worker, status, outcome, round_, first, deadline, version, anchor, seed, root = self._call("getLease",
                                                                                                   lease_id)
        return Lease(lease_id, worker, LeaseStatus(status), Outcome(outcome), round_, first, deadline, version,
                     anchor, bytes(seed), bytes(root))

    def round(self, lease_id: int, round_: int) -> RoundState:
        (accept, reject, start, seed, total), appellant = self._call("getRound", lease_id, round_)
        return RoundState(round_, accept, reject, start, bytes(seed), total,
                          None if int(appellant, 16) == 0 else appellant)

    def outcome_of(self, lease_id: int) -> Outcome:
        """The current round's outcome, counting a passed vote window as closed."""
        return Outcome(self._call("outcomeOf", lease_id))

    def member_weight(self, lease_id: int, round_: int, address: str) -> int:
        """`address`'s vote weight in that round's committee (0: not drawn). Asked of the pending block, whose
        view of the round's start block hash exists from the block after the round started."""
        return self.client.call(self.contract.functions.memberWeight(lease_id, round_, address), block="pending")

    def round_seed(self, lease_id: int, round_: int) -> bytes:
        """That round's committee seed, as `member_weight` sees it (asked of the pending block); 20 zero bytes
        while the round's start block hash is unknown, or once it is lost unstored."""
        return bytes(self.client.call(self.contract.functions.roundSeed(lease_id, round_), block="pending"))

    def committee_size(self, round_: int) -> int | None:
        """The expected committee size of a round (None for the final round, where every validator sits)."""
        size = self._call("committeeSizeOf", round_)
        return None if size == 2**256 - 1 else size

    def appeal_bond(self, round_: int) -> int:
        """The bond an appeal into `round_` (>= 1) posts."""
        return self._call("appealBondFor", round_)

    def ballot(self, lease_id: int, address: str) -> dict[int, bool]:
        """`address`'s votes on a lease: {round: accept}."""
        bits = self._call("ballots", lease_id, address)
        return {r: VOTE_CODES[(bits >> (2 * r)) & 3] for r in range(MAX_ROUNDS) if (bits >> (2 * r)) & 3 in VOTE_CODES}

    def policy_root(self, version: int) -> bytes:
        """The content root of `version`'s weights; version 0 is the job's base model (the spec's model root).
        The job never changes a published (non-zero) root, so each is read from the chain once; a version not
        published yet reads as zero bytes and is asked again next time."""
        root = self._roots.get(version)
        if root is None:
            root = bytes(self._call("policyRoot", version))
            if any(root):
                self._roots[version] = root
        return root

    def is_enlisted(self, address: str) -> bool:
        return self._call("enlistedAt", address) != 0 and self._call("delistedAt", address) == 0

    def owed(self, address: str) -> int:
        return self._call("owed", address)

    def reward_of(self, lease_id: int, address: str) -> int:
        """Everything `address` is entitled to from a settled lease's pools so far, less what it claimed."""
        return self._call("rewardOf", lease_id, address) - self._call("rewardClaimed", lease_id, address)

    def votes(self, lease_id: int | None = None, from_block: int = 0) -> list[dict]:
        """Voted events (lease, round, validator, accept, weight), optionally of one lease."""
        logs = self.client.events(self.contract, "Voted", from_block)
        return [dict(log["args"]) for log in logs if lease_id is None or log["args"]["leaseId"] == lease_id]

    def _send(self, name: str, *args: object, value: int = 0, headroom: int = 0) -> TxReceipt:
        return self.client.transact(getattr(self.contract.functions, name)(*args), value=value, headroom=headroom)

    def enlist(self) -> TxReceipt:
        """Follow this job as a validator: answer for absence from the committees this address is drawn for."""
        return self._send("enlist")

    def delist(self) -> TxReceipt:
        return self._send("delist")

    def publish_policy(self, version: int, root: bytes) -> TxReceipt:
        return self._send("publishPolicy", version, root)

    def publish_up_to(self, version: int, root_of: Callable[[int], bytes],
                      on_published: Callable[[int], None] = lambda version: None) -> list[int]:
        """Publish every version after the chain's current one up to `version`, in order (the job takes them one
        by one, so a version whose transaction an outage held back goes before the next); `on_published(v)` right
        after each is mined. Returns the versions published (none if the chain already has `version`)."""
        published = []
        for missing in range(self.current_version() + 1, version + 1):
            try:
                self.publish_policy(missing, root_of(missing))
            except ContractRevert as exc:
                # An earlier copy whose receipt an outage hid may have landed since the chain was read: then
                # the version is there (with our root), and the next one follows.
                if exc.error_name != "VersionNotNext" or self.policy_root(missing) != root_of(missing):
                    raise
            published.append(missing)
            on_published(missing)
        return published

    def claim(self) -> Lease:
        """Lease the next tasks (collateral locked); the prompt seed is drawn afterwards with `draw_seed`."""
        receipt = self._send("claim", headroom=CLAIM_HEADROOM_GAS)
        (event,) = self.contract.events.TaskClaimed().process_receipt(receipt, errors=DISCARD)
        return self.client.through_outage(lambda: self.lease(event["args"]["leaseId"]))

    def draw_seed(self, lease_id: int) -> Lease:
        self._send("drawSeed", lease_id)
        return self.client.through_outage(lambda: self.lease(lease_id))

    def submit(self, lease_id: int, root: bytes, policy_version: int) -> TxReceipt:
        return self._send("submit", lease_id, root, policy_version)

    def draw_committee(self, lease_id: int) -> TxReceipt:
        return self._send("drawCommittee", lease_id)

    def vote(self, lease_id: int, accept: bool) -> TxReceipt:
        return self._send("vote", lease_id, accept, headroom=VOTE_HEADROOM_GAS)

    def vote_batch(self, verdicts: dict[int, bool]) -> TxReceipt:
        ids = list(verdicts)
        headroom = min(VOTE_HEADROOM_GAS * len(ids), 5_000_000)
        return self._send("voteBatch", ids, [verdicts[i] for i in ids], headroom=headroom)

    def appeal(self, lease_id: int) -> TxReceipt:
        """Appeal the lease's current decision, posting the next round's bond."""
        return self._send("appeal", lease_id, value=self.appeal_bond(self.lease(lease_id).round + 1))

    def finalize(self, lease_id: int) -> TxReceipt:
        return self._send("finalize", lease_id)

    def reclaim(self, lease_id: int) -> TxReceipt:
        return self._send("reclaim", lease_id)

    def slash_loser(self, lease_id: int, voter: str) -> TxReceipt:
        return self._send("slashLoser", lease_id, voter)

    def penalize_absent(self, lease_id: int, round_: int, member: str) -> TxReceipt:
        return self._send("penalizeAbsent", lease_id, round_, member)

    def claim_reward(self, lease_id: int) -> TxReceipt:
        return self._send("claimReward", lease_id)

    def withdraw_payment(self) -> TxReceipt:
        return self._send("withdrawPayment")

    def close(self) -> TxReceipt:
        return self._send("close")

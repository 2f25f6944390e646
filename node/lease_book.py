"""The one follower of a job's lease lifecycle: every unfinished lease's holder, status, round, outcome,
deadline and votes, and the job's enlisted validators, folded from the job's events in bounded block ranges
from a persisted cursor (at first, the market's deployment block).

Invariants:
- Each event is folded exactly once: the cursor passes a range only once all of that range's logs are folded,
  and the state is saved with the cursor (written whole, then renamed into place, so a crash leaves the last
  saved state).
- An entry says what `getLease` would say, except where time alone changes the chain's view (a vote window
  that passed counts as closed, its outcome the larger side of its votes): `due`, `appealable` and
  `current_outcome` in `rollnet.node.keeper` derive that from the deadline and the folded votes.
- One `poll` makes a fixed number of requests (the head, the chain's clock, and one eth_getLogs per
  2,000 blocks; a worker's own book, which follows only its leases, two while it has leases in flight). That
  number does not grow with the number of leases, participants or events. Keeper work comes from the
  deadlines the events carry, never from reading every lease.
- A worker's own book (`worker=`) asks the node only for that worker's leases' events (by their indexed
  worker, then their lease ids), so what it fetches and decodes grows with its own work, not the market's.
  The validators and the trainer follow the whole job.
- An entry is dropped once final, and handed over exactly once, by the poll that folded its end
  (`Update.finished`), so the saved state grows with the leases in flight, never with the job's history. A
  caller that crashed before acting on it reads that lease from the chain once, and sees it final. A poll
  that folded some ranges and then lost the chain hands over what it folded and stops; the next poll goes on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollnet.node.chain.client import LOG_RANGE_BLOCKS
from rollnet.node.chain.job import FINAL_STATUSES, JobClient, LeaseStatus, Outcome
from rollnet.node.errors import ChainUnavailable

WORKER_EVENTS = ["TaskClaimed", "LeaseReturned", "BatchSubmitted", "Settled"]  # each indexes the worker as topic 2
LEASE_EVENTS = ["CommitteeDrawn", "Voted", "RoundDecided", "Appealed"]  # each indexes the lease as topic 1
FOLLOWED_EVENTS = ["TaskClaimed", "LeaseReturned", "BatchSubmitted", "CommitteeDrawn", "Voted", "RoundDecided",
                   "Appealed", "Settled", "Enlisted", "Delisted"]
SETTLED_AS = {Outcome.ACCEPT: LeaseStatus.PAID, Outcome.REJECT: LeaseStatus.SLASHED, Outcome.VOID: LeaseStatus.LAPSED}


def book_file(data_dir: Path, job: str, follower: str) -> Path:
    """Where a participant keeps its book of `job`'s leases: one file per follower (its role, and a worker's
    address), so a worker, a validator and a trainer sharing a data directory never load each other's cursor."""
    return data_dir / f"lease-book-{job.lower()}-{follower.lower()}.json"


@dataclass
class LeaseEntry:
    """One lease as its events describe it (the fields `keeper.due` reads match `chain.job.Lease`'s)."""

    lease_id: int
    worker: str
    status: LeaseStatus
    round: int = 0
    outcome: Outcome = Outcome.PENDING
    deadline: int = 0
    submit_block: int = 0  # the block of its submission (0 until submitted)
    policy_version: int = 0
    root: str = ""  # hex of the submitted root
    votes: dict[int, dict[str, bool]] = field(default_factory=dict)  # round -> {validator: accept}
    weights: dict[int, list[int]] = field(default_factory=dict)  # round -> [accept weight, reject weight]
    totals: dict[int, int] = field(default_factory=dict)  # round -> its committee's total weight, once drawn
    seeds: dict[int, str] = field(default_factory=dict)  # round -> hex of its committee seed, once drawn
    starts: dict[int, list] = field(default_factory=dict)  # round -> [start block, hex of its hash] (committee draw)

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    def round_outcome(self, round_: int) -> Outcome:
        """A round's outcome by its larger side (TrainingJob._roundOutcome): void when tied or unvoted."""
        accept, reject = self.weights.get(round_, [0, 0])
        return Outcome.ACCEPT if accept > reject else Outcome.REJECT if reject > accept else Outcome.VOID

    def voted(self, round_: int) -> bool:
        return any(self.weights.get(round_, [0, 0]))


@dataclass
class Update:
    """What one poll folded: its logs in chain order (for a caller with its own records, like the validator's
    ledger) and the leases that became final, with their votes."""

    logs: list[dict] = field(default_factory=list)
    finished: list[LeaseEntry] = field(default_factory=list)


class LeaseBook:
    def __init__(self, job: JobClient, from_block: int, state_path: Path | None = None, worker: str | None = None):
        self.job = job
        self.worker = worker  # follow only this worker's leases (its own book), else the whole job
        self.from_block = from_block
        self.state_path = state_path
        self.cursor = from_block - 1  # the last block folded
        self.leases: dict[int, LeaseEntry] = {}
        self.enlisted: dict[str, None] = {}  # ordered set of enlisted, not delisted, validators
        self.now = 0  # the chain's clock at the last poll (the pending block's timestamp)
        self.head = from_block - 1  # the chain's head at the last poll
        self.claims = 0  # the highest lease id whose claim was folded (a whole-job book: the job's leaseCount then)
        if state_path is not None and state_path.exists():
            self._load(state_path)

    # ------------------------------------------------------------------ following

    def poll(self, on_range: Callable[[int, list], None] | None = None) -> Update:
        """Fold every log from the cursor to the head, saving after each range. `on_range(last block, logs)`, if
        given, records each range in the caller's own store before the book saves it, so that store's cursor
        is never behind the book's (a crash in between folds the range again; the store ignores repeats)."""
        client = self.job.client
        head = self.head = client.block_number()
        self.now = client.now()
        update = Update()
        if head <= self.cursor:
            return update
        low, first = self.cursor + 1, self.cursor + 1
        while low <= head:
            end = min(head, low + LOG_RANGE_BLOCKS - 1)
            try:
                logs = self._logs(low, end)
            except ChainUnavailable:
                if low == first:
                    raise  # nothing folded yet: the caller sees the outage
                return update  # what the earlier ranges folded (and pruned) is handed over, never lost
            low = end + 1
            for log in logs:
                block_hash = bytes(log.get("blockHash") or b"").hex()
                self._fold(log["event"], dict(log["args"]), log["blockNumber"], block_hash)
            if on_range is not None:
                on_range(end, logs)
            self.cursor = end
            update.finished.extend(self._prune())
            self._save()
            update.logs.extend(logs)
        return update

    def _logs(self, low: int, high: int) -> list[dict]:
        """The followed events of blocks low..high in chain order: the job's, or one worker's leases'."""
        client, contract = self.job.client, self.job.contract
        if self.worker is None:
            return client.logs(contract, FOLLOWED_EVENTS, low, high)
        worker_topic = bytes(12) + bytes.fromhex(self.worker[2:])
        own = client.logs(contract, WORKER_EVENTS, low, high, match=[None, [worker_topic]])
        ids = {i for i, entry in self.leases.items() if not entry.final}
        ids |= {log["args"]["leaseId"] for log in own if log["event"] == "TaskClaimed"}
        if ids:
            own += client.logs(contract, LEASE_EVENTS, low, high, match=[[i.to_bytes(32, "big") for i in sorted(ids)]])
            own.sort(key=lambda log: (log["blockNumber"], log["logIndex"]))
        return own

    def align(self, store_cursor: int) -> None:
        """Fold again from the deployment block if the caller's store (whose cursor is `store_cursor`) is behind
        this book, e.g. a ledger deleted while the book's file was kept."""
        if store_cursor < self.cursor:
            self.cursor, self.leases, self.enlisted, self.claims = self.from_block - 1, {}, {}, 0
            self._save()

    def _fold(self, event: str, args: dict, block: int, block_hash: str = "") -> None:
        if event == "Enlisted":
            self.enlisted[args["validator"]] = None
            return
        if event == "Delisted":
            self.enlisted.pop(args["validator"], None)
            return
        lease_id = args["leaseId"]
        if event == "TaskClaimed":
            self.claims = max(self.claims, lease_id)
            self.leases[lease_id] = LeaseEntry(lease_id, args["worker"], LeaseStatus.LEASED,
                                               deadline=args["expiresAt"])
            return
        entry = self.leases.get(lease_id)
        if entry is None:
            return  # claimed before this book's first block (a state file from another deployment is refused)
        if event == "LeaseReturned":
            entry.status = LeaseStatus.RETURNED
        elif event == "BatchSubmitted":
            entry.status, entry.deadline, entry.submit_block = LeaseStatus.VOTING, args["voteDeadline"], block
            entry.policy_version, entry.root = args["policyVersion"], bytes(args["root"]).hex()
            entry.starts[0] = [block, block_hash]  # round 0 starts at the submission block
        elif event == "CommitteeDrawn":
            entry.totals[args["round"]] = args["totalWeight"]
            entry.seeds[args["round"]] = bytes(args["seed"]).hex()
        elif event == "Voted":
            round_, ballots = args["round"], entry.votes.setdefault(args["round"], {})
            if args["validator"] in ballots:
                return  # one ballot per member and round (TrainingJob refuses a second): count its weight once
            ballots[args["validator"]] = args["accept"]
            side = entry.weights.setdefault(round_, [0, 0])
            side[0 if args["accept"] else 1] += args["weight"]
        elif event == "RoundDecided":
            entry.status, entry.outcome, entry.deadline = LeaseStatus.DECIDED, Outcome(args["outcome"]), \
                args["appealDeadline"]
        elif event == "Appealed":
            entry.status, entry.round, entry.outcome = LeaseStatus.VOTING, args["round"], Outcome.PENDING
            entry.deadline = args["voteDeadline"]
            entry.starts[args["round"]] = [block, block_hash]  # an appeal's round starts at its block
        elif event == "Settled":
            entry.outcome = Outcome(args["outcome"])
            entry.status = SETTLED_AS[entry.outcome]

    # ------------------------------------------------------------------ reading

    def open_leases(self) -> list[LeaseEntry]:
        return [entry for entry in self.leases.values() if not entry.final]

    def get(self, lease_id: int) -> LeaseEntry | None:
        return self.leases.get(lease_id)

    def _prune(self) -> list[LeaseEntry]:
        """Drop (and return) the leases that became final: the book keeps only the ones in flight."""
        return [self.leases.pop(i) for i in [i for i, entry in self.leases.items() if entry.final]]

    # ------------------------------------------------------------------ persistence

    def _save(self) -> None:
        if self.state_path is None:
            return
        # (each entry's fields as `asdict` gives them, uncopied)
        state = {"job": self.job.address, "from_block": self.from_block, "worker": self.worker, "cursor": self.cursor,
                 "claims": self.claims, "enlisted": list(self.enlisted),
                 "leases": [vars(entry) for entry in self.leases.values()]}
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.state_path.with_name(f"{self.state_path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(state))
        os.replace(temporary, self.state_path)

    def _load(self, path: Path) -> None:
        try:
            state = json.loads(path.read_text())
            if (state["job"].lower() != self.job.address.lower() or state["from_block"] != self.from_block
                    or state.get("worker") != self.worker):
                return  # another job's, deployment's or follower's book: start afresh
            leases = {}
            for raw in state["leases"]:
                raw["status"], raw["outcome"] = LeaseStatus(raw["status"]), Outcome(raw["outcome"])
                raw["votes"] = {int(r): dict(v) for r, v in raw["votes"].items()}
                raw["weights"] = {int(r): list(w) for r, w in raw["weights"].items()}
                raw["totals"] = {int(r): int(t) for r, t in raw["totals"].items()}
                raw["seeds"] = {int(r): str(seed) for r, seed in raw.get("seeds", {}).items()}
                raw["starts"] = {int(r): list(start) for r, start in raw.get("starts", {}).items()}
                leases[raw["lease_id"]] = LeaseEntry(**raw)
            claims = int(state["claims"])  # a book saved before it counted claims is folded again
        except (OSError, ValueError, KeyError, TypeError):
            return  # unreadable: fold again from the deployment block (every event is on chain)
        self.cursor, self.leases, self.enlisted = state["cursor"], leases, dict.fromkeys(state["enlisted"])
        self.claims = claims

"""A thousand workers against the real contracts (issue 17): what grows, and with what, as a market grows.

One anvil (a block every second, as on a fast L2) and the real contracts. W staked worker accounts and V
staked, enlisted validator accounts are driven by a few processes, one thread per participant. Every claim,
seed draw, submission, committee draw, vote, settlement, reward claim and withdrawal is a real transaction.
Each participant follows the chain the way the real roles do: its own `LeaseBook` (one fixed set of requests
per poll; a worker's book only its own leases) and `Keeper` turns (a due lease is settled by its worker
first, then its voters, then anyone).

Only the model work is simulated, by sleeps of a real lease's measured durations on the embedded model
(BENCHMARKS.md, `bench/efficiency.py`: generation 0.12 s per lease, a committee member's sampled
verification 0.02 s). The submitted roots are random, so every batch is "accepted": this bench measures the
market's machinery, and `bench/adversaries.py` measures its judgement. Not done: a sample of leases carrying
real rollouts, fetched and verified over libp2p, inside this bench (the devnet and `bench/efficiency.py` do
that with real participants, at 3 workers and 2 validators).

Each worker does `--leases` leases; the job has the shortest windows a spec allows (60 s to vote, 60 s to
appeal), and the chain's clock runs by itself, so each lease is settled in its worker's keeper turn, and a
round drawn too few members to decide early waits for its vote window, as it would in a live market. The row
ends when every lease is settled and paid out. A trainer-side reader follows the same events and times each
batch from its submission to its first decision.

Measured per row: RPC requests per lease (all participants) and per participant per second, by role;
transactions and gas per accepted sample (everything after setup, withdrawals included); verifications per
validator per lease (and per lease in all); the trainer-side admission latency; and, from the gas per step
(`--samples-per-step` samples), the chain throughput a training step needs and the fastest step a chain with
2 s blocks and `--block-gas-limit` allows.

Usage: python bench/scale.py [--quick | --rows 10x5,1000x50] [--json PATH] [--leases N] [--processes P]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from rich.table import Table
from rollnet.node.chain.anvil import start_anvil
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.deploy import RegistryParams, deploy_market
from rollnet.node.chain.job import FactoryClient, JobClient, LeaseStatus
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.cli.context import make_console
from rollnet.node.committee import CommitteeView
from rollnet.node.errors import ContractRevert
from rollnet.node.events import EventLog
from rollnet.node.keeper import KEEPER_GRACE_S, Keeper
from rollnet.node.keys import dev_account
from rollnet.node.lease_book import LeaseBook
from rollnet.node.p2p.identity import PeerIdentity
from rollnet.node.spec import load_job_spec
from rollnet.node.units import eth_to_wei
from rollnet.node.worker import claim_with_seed

ETH = 10**18
REPO = Path(__file__).resolve().parents[1]
GENERATE_S = 0.12  # a lease's generation on the embedded model (bench/efficiency.py's latency breakdown)
VERIFY_S = 0.02  # a committee member's sampled verification of one lease (ditto)
TICK_S = 1.0  # the coordinator's poll interval, and each participant's in a market of up to 100
POLLS_PER_S = 100  # the whole bench's participants poll about this often together: two cores host them all


def scale_account(index: int) -> LocalAccount:
    """The bench's deterministic account number `index` (funded with anvil_setBalance; never a real key)."""
    return Account.from_key(keccak(b"rollnet bench/scale account" + index.to_bytes(4, "big")))


# ---------------------------------------------------------------------------------------------- participants

class Participant:
    """One account following the job through its own lease book, doing its keeper chores in its turn."""

    def __init__(self, rpc_url: str, account: LocalAccount, job: str, from_block: int, own_leases_only: bool = False):
        self.client = ChainClient(rpc_url, account)
        self.job = JobClient(self.client, job)
        self.spec = self.job.spec()
        self.book = LeaseBook(self.job, from_block, worker=account.address if own_leases_only else None)
        self.keeper = Keeper(self.job, EventLog(None), self.spec)
        self.polls = 0

    def keep(self) -> None:
        for entry in self.book.open_leases():
            self.keeper.act_in_turn(entry, self.book.now, KEEPER_GRACE_S)

    def totals(self) -> dict:
        return {"requests": sum(self.client.requests.values()), "by_method": dict(self.client.requests),
                "polls": self.polls,
                "gas": self.client.gas_used, "transactions": self.client.transactions}


class SimWorker(Participant):
    """A worker as `WorkerLoop` is one: its own leases' events only, its own leases' keeper chores."""

    def __init__(self, *args: object, leases: int, generate_s: float):
        super().__init__(*args, own_leases_only=True)
        self.todo = leases
        self.generate_s = generate_s
        self.mine: set[int] = set()
        self.owed_maybe = False
        self.lost = 0  # leases whose seed could not be drawn any more (over 256 blocks after the claim)

    def tick(self) -> None:
        update = self.book.poll()
        if any(entry.lease_id in self.mine for entry in update.finished):
            self.owed_maybe = True
        self.keep()
        if self.todo:
            try:
                lease = claim_with_seed(self.job)
            except ContractRevert as exc:
                if exc.error_name != "RandomnessExpired":
                    raise
                self.lost += 1  # as WorkerLoop does: the lease can only expire; claim afresh next tick
                return
            time.sleep(self.generate_s)  # generation, simulated by its measured duration
            self.job.submit(lease.lease_id, keccak(os.urandom(32)), 1)
            self.mine.add(lease.lease_id)
            self.todo -= 1
        if self.owed_maybe:
            self.keeper.collect([])
            self.owed_maybe = False


class SimValidator(Participant):
    def __init__(self, *args: object, verify_s: float):
        super().__init__(*args)
        self.verify_s = verify_s
        registry = RegistryClient(self.client, self.client.call(self.job.contract.functions.registry()))
        self.committees = CommitteeView(self.job, registry)
        self.unknown: list[tuple[int, int]] = []  # (lease, round) whose committee this validator has not asked about
        self.to_vote: set[int] = set()
        self.verified = 0
        self.voted: set[tuple[int, int]] = set()

    def tick(self) -> None:
        """As the validator daemon does: learn of new rounds, work out whether it sits on them (locally, from the
        book: `rollnet.node.committee`), verify and vote, then keeper chores on every lease in its turn (the
        market's keeper of last resort)."""
        update = self.book.poll()
        for log in update.logs:
            if log["event"] == "BatchSubmitted":
                self.unknown.append((log["args"]["leaseId"], 0))
            elif log["event"] == "Appealed":
                self.unknown.append((log["args"]["leaseId"], log["args"]["round"]))
        for lease_id, round_ in self.unknown:
            entry = self.book.get(lease_id)
            if entry is not None and self.committees.weight(entry, round_, self.client.address, self.book.head):
                time.sleep(self.verify_s)  # the member's sampled verification, simulated by its measured duration
                self.verified += 1
                self.to_vote.add(lease_id)
        self.unknown = []
        votes = {i: True for i in self.to_vote if (entry := self.book.get(i)) is not None
                 and entry.status is LeaseStatus.VOTING and entry.deadline >= self.book.now}
        if votes:
            self.job.vote_batch(votes)
        self.to_vote = set()
        self.keep()
        finished = [entry.lease_id for entry in update.finished
                    if any(self.client.address in ballots for ballots in entry.votes.values())]
        if finished:
            self.keeper.collect(finished)

    def totals(self) -> dict:
        return {**super().totals(), "verified": self.verified}


def worker_totals(worker: SimWorker) -> dict:
    return {**Participant.totals(worker), "lost": worker.lost}


class TrainerReader:
    """The trainer's side: follows the same events (no key) and times each batch from submission to acceptance."""

    def __init__(self, rpc_url: str, job: str, from_block: int):
        self.client = ChainClient(rpc_url)
        self.book = LeaseBook(JobClient(self.client, job), from_block)
        self.submitted_at: dict[int, float] = {}
        self.admission_s: list[float] = []
        self.paid = 0

    def tick(self) -> None:
        now = time.monotonic()
        update = self.book.poll()
        self.paid += sum(entry.status is LeaseStatus.PAID for entry in update.finished)
        for log in update.logs:
            lease_id = log["args"].get("leaseId")
            if log["event"] == "BatchSubmitted":
                self.submitted_at[lease_id] = now
            elif log["event"] == "RoundDecided" and lease_id in self.submitted_at:
                self.admission_s.append(now - self.submitted_at.pop(lease_id))


# ---------------------------------------------------------------------------------------------- processes

def participant_tick_s(participants: int) -> float:
    """Each participant's poll interval: 1 s, longer where two cores could not serve everyone's polls (1,050
    participants poll every 10.5 s). A real participant runs on its own machine; here they share two cores, and
    a saturated machine would measure itself, not the protocol."""
    return max(TICK_S, participants / POLLS_PER_S)


def drive(rpc_url: str, job: str, from_block: int, workers: list[int], validators: list[int], leases: int,
          generate_s: float, verify_s: float, tick_s: float, stop: threading.Event | object, results: object) -> None:
    """One driver process: a thread per participant, each ticking every `tick_s` until `stop` is set."""
    people: list[Participant] = [SimWorker(rpc_url, scale_account(i), job, from_block, leases=leases,
                                           generate_s=generate_s) for i in workers]
    people += [SimValidator(rpc_url, scale_account(i), job, from_block, verify_s=verify_s) for i in validators]
    started = time.monotonic()

    def run(person: Participant) -> None:
        time.sleep(tick_s * random.random())  # participants start at random phases, as strangers would
        while not stop.is_set():
            began = time.monotonic()
            person.polls += 1
            try:
                person.tick()
            except ContractRevert:
                pass  # a lost race (another keeper settled first): harmless
            except Exception as exc:  # noqa: BLE001 - the bench reports and goes on, as a participant would
                print(f"{type(person).__name__} {person.client.address[:10]}: {type(exc).__name__}: {exc}",
                      flush=True)
            time.sleep(max(0.0, tick_s - (time.monotonic() - began)))

    with ThreadPoolExecutor(len(people)) as pool:
        list(pool.map(run, people))
    seconds = time.monotonic() - started
    results.put({"seconds": seconds,
                 "workers": [worker_totals(p) for p in people if isinstance(p, SimWorker)],
                 "validators": [p.totals() for p in people if isinstance(p, SimValidator)]})


def setup(rpc_url: str, workers: int, validators: int, leases: int) -> tuple[str, int, int]:
    """Deploy the market and a job with room for every lease; fund, register and stake everyone; validators
    enlist. Returns (job, deployment block, lease cost)."""
    deployer = ChainClient(rpc_url, dev_account(0))
    market = deploy_market(deployer, RegistryParams(unbonding_period_seconds=30 * 86_400))
    # The example job, with the shortest vote and appeal windows a spec may have, so the clock runs by itself.
    spec = load_job_spec(REPO / "examples" / "job.toml").model_copy(update={"vote_seconds": 60,
                                                                         "appeal_seconds": 60})
    total = workers + validators

    def join(index: int) -> None:
        account = scale_account(index)
        deployer.rpc("anvil_setBalance", [account.address, hex(1_000 * ETH)])
        client = ChainClient(rpc_url, account)
        role, stake = (Role.WORKER, 2 * ETH) if index < workers else (Role.VALIDATOR, 10 * ETH)
        RegistryClient(client, market.registry).join(PeerIdentity.generate(), role, stake)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(join, range(total)))
    lease_cost = eth_to_wei(spec.reward_per_sample_eth) * spec.group_size * spec.tasks_per_lease
    job = FactoryClient(deployer, market.factory).create_job(spec.to_abi(deployer.address),
                                                             (workers * leases + 1) * lease_cost + ETH)
    JobClient(deployer, job).publish_policy(1, b"\x11" * 32)

    def enlist(index: int) -> None:
        JobClient(ChainClient(rpc_url, scale_account(index)), job).enlist()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(enlist, range(workers, total)))
    return job, market.deployed_at_block, lease_cost


def run_row(workers: int, validators: int, leases: int, processes: int, generate_s: float, verify_s: float,
            samples_per_step: int, block_gas_limit: int, console: object) -> dict:
    # A block every second, as on a fast L2: with a block per transaction, a thousand workers' transactions
    # made 256 blocks in seconds, and claims lost their seed block before their seed could be drawn.
    anvil = start_anvil(extra_args=["--gas-limit", str(block_gas_limit), "--block-time", "1"])
    try:
        return measure_row(anvil.url, workers, validators, leases, processes, generate_s, verify_s,
                           samples_per_step, block_gas_limit, console)
    finally:
        anvil.stop()


def measure_row(rpc_url: str, workers: int, validators: int, leases: int, processes: int, generate_s: float,
                verify_s: float, samples_per_step: int, block_gas_limit: int, console: object) -> dict:
    setup_started = time.monotonic()
    job, from_block, lease_cost = setup(rpc_url, workers, validators, leases)
    console.print(f"  {workers} workers, {validators} validators staked and enlisted "
                  f"({time.monotonic() - setup_started:.0f} s)")
    first_block = ChainClient(rpc_url).block_number() + 1  # the run's transactions start here, after setup
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    results = context.Queue()
    shares = [(list(range(p, workers, processes)), list(range(workers + p, workers + validators, processes)))
              for p in range(processes)]
    tick_s = participant_tick_s(workers + validators)
    drivers = [context.Process(target=drive, args=(rpc_url, job, from_block, w, v, leases, generate_s, verify_s,
                                                   tick_s, stop, results)) for w, v in shares]
    for process in drivers:
        process.start()
    trainer = TrainerReader(rpc_url, job, from_block)
    reader = JobClient(ChainClient(rpc_url), job)
    expected = workers * leases
    started = time.monotonic()
    shown = 0.0
    while True:
        if time.monotonic() - shown > 10:
            statuses = Counter(entry.status.name.lower() for entry in trainer.book.open_leases())
            console.print(f"  {reader.lease_count()} of {expected} leases claimed; in flight: {dict(statuses)}; "
                          f"paid {trainer.paid}")
            shown = time.monotonic()
        claimed = reader.lease_count() >= expected  # read before the poll, so the book has folded those claims
        trainer.tick()
        in_flight = trainer.book.open_leases()
        if claimed and not in_flight:
            break
        time.sleep(TICK_S)
    decided_s = time.monotonic() - started
    time.sleep(3 * tick_s)  # the last withdrawals
    stop.set()
    parts = [results.get(timeout=120) for _ in drivers]
    for process in drivers:
        process.join(timeout=60)
    row = summarize(workers, validators, expected, trainer.paid, parts, trainer, decided_s, lease_cost,
                    samples_per_step, block_gas_limit, reader.spec())
    row["participant_tick_s"] = tick_s
    by_function = gas_by_function(reader, first_block)
    samples = max(1, trainer.paid * reader.spec().rollouts_per_lease)
    row["gas_per_accepted_sample_by_function"] = {name: round(gas / samples) for name, gas in by_function.items()}
    return row


def gas_by_function(job: JobClient, first_block: int) -> dict[str, int]:
    """The gas of every transaction mined from `first_block` on, by the function it called (a chain scan: the
    participants' own counts give the totals, this their composition)."""
    client = job.client
    contract = job.contract
    gas: Counter[str] = Counter()
    for number in range(first_block, client.block_number() + 1):
        block = client.w3.eth.get_block(number, full_transactions=True)
        for tx in block["transactions"]:
            receipt = client.w3.eth.get_transaction_receipt(tx["hash"])
            data = bytes(tx["input"])
            try:
                name = contract.get_function_by_selector(data[:4]).fn_name if len(data) >= 4 else "transfer"
            except ValueError:
                name = "other"
            gas[name if receipt["status"] == 1 else f"{name} (reverted: a lost race)"] += receipt["gasUsed"]
    return dict(gas.most_common())


def summarize(workers: int, validators: int, leases: int, paid: int, parts: list[dict], trainer: TrainerReader,
              seconds: float, lease_cost: int, samples_per_step: int, block_gas_limit: int, spec: object) -> dict:
    by_role = {role: [t for part in parts for t in part[role]] for role in ("workers", "validators")}
    duration = max(part["seconds"] for part in parts)
    requests = {role: sum(t["requests"] for t in totals) for role, totals in by_role.items()}
    polls = {role: sum(t["polls"] for t in totals) for role, totals in by_role.items()}
    methods = {role: sum((Counter(t["by_method"]) for t in totals), Counter()) for role, totals in by_role.items()}
    gas = sum(t["gas"] for totals in by_role.values() for t in totals)
    transactions = sum(t["transactions"] for totals in by_role.values() for t in totals)
    samples = paid * spec.group_size * spec.tasks_per_lease
    verified = [t["verified"] for t in by_role["validators"]]
    gas_per_sample = gas / max(1, samples)
    tx_per_sample = transactions / max(1, samples)
    step_gas = gas_per_sample * samples_per_step
    return {
        "workers": workers, "validators": validators, "leases": leases, "accepted_leases": paid,
        "unpaid_leases": leases - paid,  # a first round that drew no member lapses void when its window closes
        "leases_lost_before_seed": sum(t["lost"] for t in by_role["workers"]),
        "seconds": round(seconds, 1),
        "rpc_calls_per_lease": round(sum(requests.values()) / leases, 1),
        "rpc_calls_per_lease_by_role": {role: round(n / leases, 1) for role, n in requests.items()},
        "rpc_calls_per_lease_by_method": {role: {m: round(n / leases, 1) for m, n in counts.most_common()}
                                          for role, counts in methods.items()},
        "rpc_calls_per_participant_per_tick": {role: round(n / max(1, polls[role]), 2)
                                               for role, n in requests.items()},
        "rpc_calls_per_participant_per_s": {role: round(n / max(1, len(by_role[role])) / duration, 2)
                                            for role, n in requests.items()},
        "transactions_per_accepted_sample": round(tx_per_sample, 4),
        "gas_per_accepted_sample": round(gas_per_sample),
        "verifications_per_validator_per_lease": round(statistics.mean(verified) / leases, 4),
        "verifications_per_lease": round(sum(verified) / leases, 2),
        "admission_latency_s": latency_summary(trainer.admission_s),
        "step": {"samples": samples_per_step, "transactions": round(tx_per_sample * samples_per_step, 1),
                 "gas": round(step_gas),
                 "min_step_s_at_2s_blocks": round(2.0 * step_gas / block_gas_limit, 3)},
    }


def latency_summary(seconds: list[float]) -> dict:
    """Median and 90th percentile; a round drawn too few members to decide early waits for its vote window."""
    if not seconds:
        return {"median": None, "p90": None, "decided_early": 0.0}
    ordered = sorted(seconds)
    return {"median": round(statistics.median(ordered), 2), "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
            "decided_early": round(sum(s < 60 for s in ordered) / len(ordered), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 and 40 workers, 5 and 10 validators")
    parser.add_argument("--json", type=Path, default=Path("bench/results/scale.json"))
    parser.add_argument("--rows", default=None, help="rows as WORKERSxVALIDATORS, comma-separated (e.g. 4x3)")
    parser.add_argument("--leases", type=int, default=1, help="leases per worker")
    parser.add_argument("--processes", type=int, default=4, help="driver processes")
    parser.add_argument("--generate-s", type=float, default=GENERATE_S)
    parser.add_argument("--verify-s", type=float, default=VERIFY_S)
    parser.add_argument("--samples-per-step", type=int, default=256, help="the devnet's 32 prompts x 8 samples")
    parser.add_argument("--block-gas-limit", type=int, default=30_000_000)
    args = parser.parse_args()
    console = make_console()
    rows = [(10, 5), (40, 10)] if args.quick else [(10, 5), (100, 5), (100, 50), (1000, 5), (1000, 50)]
    if args.rows:
        rows = [tuple(int(n) for n in row.split("x")) for row in args.rows.split(",")]
    results = []
    for workers, validators in rows:
        console.print(f"[bold]{workers} workers, {validators} validators[/bold]")
        results.append(run_row(workers, validators, args.leases, min(args.processes, workers), args.generate_s,
                               args.verify_s, args.samples_per_step, args.block_gas_limit, console))
    base = results[0]
    table = Table(title="bench/scale.py: the market's load as it grows (simulated model work, real transactions)")
    for column in ("workers", "validators", "poll s", "unpaid", "RPC / lease", "RPC / worker / poll",
                   "RPC / validator / poll",
                   "gas / sample", "vs first", "verif. / validator / lease", "verif. / lease",
                   "admission s (median)", "tx / step", "min step s (2 s blocks)"):
        table.add_column(column, justify="right")
    for row in results:
        table.add_row(str(row["workers"]), str(row["validators"]), f"{row['participant_tick_s']:.1f}",
                      str(row["unpaid_leases"]), f"{row['rpc_calls_per_lease']:.1f}",
                      f"{row['rpc_calls_per_participant_per_tick']['workers']:.2f}",
                      f"{row['rpc_calls_per_participant_per_tick']['validators']:.2f}",
                      f"{row['gas_per_accepted_sample']:,}",
                      f"{row['gas_per_accepted_sample'] / base['gas_per_accepted_sample']:.3f}",
                      f"{row['verifications_per_validator_per_lease']:.3f}", f"{row['verifications_per_lease']:.2f}",
                      str(row["admission_latency_s"]["median"]), f"{row['step']['transactions']:.0f}",
                      f"{row['step']['min_step_s_at_2s_blocks']:.3f}")
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": results, "generate_s": args.generate_s, "verify_s": args.verify_s,
                                     "leases_per_worker": args.leases, "block_gas_limit": args.block_gas_limit},
                                    indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

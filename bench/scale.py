"""A thousand workers against the real contracts (issue 17): what grows, and with what, as a market grows.

One anvil (the setup mined at once, then a block every second, as on a fast L2) and the real contracts. W
staked worker accounts and V staked, enlisted validator accounts are driven by a few processes, one thread per
participant. Every claim, seed draw, submission, committee draw, vote, settlement, reward claim and withdrawal
is a real transaction.
Each participant follows the chain the way the real roles do: its own `LeaseBook` (one fixed set of requests
per poll; a worker's book only its own leases) and `Keeper` turns (a due lease is settled by its worker
first, then its voters, then anyone).

For most leases the model work is simulated, by sleeps of a real lease's measured durations on the embedded
model (BENCHMARKS.md, `bench/efficiency.py`: generation 0.12 s per lease, a committee member's sampled
verification 0.02 s), and the submitted roots are random, so those batches are "accepted": this bench measures
the market's machinery, and `bench/adversaries.py` measures its judgement.

A sample of the workers (one in `--real-every`, at least one) carries real rollouts. Such a worker starts as a
real worker does (`node.participant.start_participant`: its registered peer ID, a libp2p host behind the stake
gate, its listen address on chain) and produces each batch with the embedded model (`node.worker.prepare_batch`:
the chain's seeds and recipe, TOPLOC proofs, signed, stored for peers). A validator drawn for one of its leases
fetches the batch over libp2p from the worker's registered address (`node.p2p.fetch`, from its own libp2p host
with its registered peer ID) and judges it as the daemon does (`validator.checks`: its own sample in round 0,
against the policy the chain published, which is the embedded model's root), and votes its verdict. The
participants of a driver process share one copy of the model, one at a time.

Each worker does `--leases` leases; the job has the shortest windows a spec allows (60 s to vote, 60 s to
appeal), and the chain's clock runs by itself, so each lease is settled in its worker's keeper turn, and a
round drawn too few members to decide early waits for its vote window, as it would in a live market; a round
that drew nobody is appealed by its worker once that window closes (`keeper.own_batch_appeal`, as `WorkerLoop`
does). With `--skip-appeal-windows` (for tests), the chain's clock moves on past the appeal windows, one lease
at a time, while every open lease is decided and accepted. The row ends when every lease is settled and paid
out. A trainer-side reader follows the same events and times each batch from its submission to its first
decision.

Measured per row: RPC requests per lease (all participants) and per participant per second, by role;
transactions and gas per accepted sample (everything after setup, withdrawals included); verifications per
validator per lease (and per lease in all); the trainer-side admission latency; and, from the gas per step
(`--samples-per-step` samples), the chain throughput a training step needs and the fastest step a chain with
2 s blocks and `--block-gas-limit` allows.

Usage: python bench/scale.py [--quick | --rows 10x5,1000x50] [--json PATH] [--leases N] [--processes P]
                           [--real-every N] [--skip-appeal-windows]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from rich.table import Table
from rollnet.node.chain.anvil import AnvilProcess, start_anvil
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.deploy import RegistryParams, deploy_market
from rollnet.node.chain.job import FactoryClient, JobClient, LeaseStatus, Outcome
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.cli.context import make_console
from rollnet.node.cli.job_cmd import base_model_root
from rollnet.node.committee import CommitteeView, drew_nobody
from rollnet.node.config import resolve_data_dir
from rollnet.node.errors import ContractRevert
from rollnet.node.events import EventLog
from rollnet.node.keeper import KEEPER_GRACE_S, Keeper, due_since, own_batch_appeal
from rollnet.node.keys import dev_account
from rollnet.node.lease_book import LeaseBook, LeaseEntry
from rollnet.node.model.builder import build_default_model
from rollnet.node.model.loading import load_policy
from rollnet.node.p2p.fetch import p2p_fetcher
from rollnet.node.p2p.gate import PeerGate
from rollnet.node.p2p.host import P2PNode
from rollnet.node.p2p.identity import PeerIdentity, load_or_create_identity
from rollnet.node.p2p.objects import ObjectStore
from rollnet.node.participant import start_participant
from rollnet.node.recipe import recipe_task
from rollnet.node.rollout.backend import TransformersBackend
from rollnet.node.spec import load_job_spec
from rollnet.node.units import eth_to_wei
from rollnet.node.worker import claim_with_seed, prepare_batch
from rollnet.validator.checks import SubmissionContext, judge_batch, member_audit

ETH = 10**18
REPO = Path(__file__).resolve().parents[1]
GENERATE_S = 0.12  # a lease's generation on the embedded model (bench/efficiency.py's latency breakdown)
VERIFY_S = 0.02  # a committee member's sampled verification of one lease (ditto)
TICK_S = 1.0  # the coordinator's poll interval, and each participant's in a market of up to 100
POLLS_PER_S = 100  # the whole bench's participants poll about this often together: two cores host them all
REAL_EVERY = 50  # one worker in this many carries real rollouts, fetched and verified over libp2p
POLICY_VERSION = 1  # the version the bench publishes: the embedded model's own root


def scale_account(index: int) -> LocalAccount:
    """The bench's deterministic account number `index` (funded with anvil_setBalance; never a real key)."""
    return Account.from_key(keccak(b"rollnet bench/scale account" + index.to_bytes(4, "big")))


def real_workers(workers: int, every: int) -> list[int]:
    """The worker indices that carry real rollouts: one in `every`, at least one."""
    return list(range(0, workers, every))


class RealModel:
    """The embedded model and the job's task, shared by a driver process's real participants one at a time (its
    forward hooks, which TOPLOC reads, are not thread-safe). It refuses to work unless the chain's policy root for
    the version the bench published is this model's own."""

    def __init__(self, job: JobClient):
        folder = build_default_model(resolve_data_dir(None) / "models")
        self.model, self.tokenizer = load_policy(folder)
        self.backend = TransformersBackend(self.model, self.tokenizer)
        self.recipe = job.spec().recipe
        self.task = recipe_task(self.recipe, self.tokenizer)
        self.root = base_model_root(folder)
        if job.policy_root(POLICY_VERSION) != self.root:
            raise RuntimeError(f"the chain's policy {POLICY_VERSION} is not the embedded model's root")
        self.lock = threading.Lock()


class SharedModel:
    """A driver process's `RealModel`, loaded on first use (most drivers' participants never need it)."""

    def __init__(self, job: JobClient):
        self.job = job
        self._model: RealModel | None = None
        self._lock = threading.Lock()

    def get(self) -> RealModel:
        with self._lock:
            if self._model is None:
                self._model = RealModel(self.job)
            return self._model


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
        registry = RegistryClient(self.client, self.job.registry_address())
        self.committees = CommitteeView(self.job, registry, self.book.from_block)
        self.appealed: set[tuple[int, int]] = set()

    def drew_nobody(self, entry: LeaseEntry) -> bool:
        return drew_nobody(self.committees, entry, entry.round, self.book.head)

    def appeal_empty_rounds(self) -> None:
        """As `WorkerLoop` does: appeal its own batch's void round if nobody was drawn to it (own_batch_appeal)."""
        for entry in self.book.open_leases():
            if (entry.lease_id, entry.round) in self.appealed:
                continue
            if own_batch_appeal(self.job, entry, self.book.now, self.spec, self.drew_nobody) is not None:
                self.appealed.add((entry.lease_id, entry.round))
                self.job.appeal(entry.lease_id)

    def tick(self) -> None:
        update = self.book.poll()
        if any(entry.lease_id in self.mine for entry in update.finished):
            self.owed_maybe = True
        self.appeal_empty_rounds()
        self.keep()
        if self.todo:
            try:
                lease = claim_with_seed(self.job)
            except ContractRevert as exc:
                if exc.error_name != "RandomnessExpired":
                    raise
                self.lost += 1  # as WorkerLoop does: the lease can only expire; claim afresh next tick
                return
            self.job.submit(lease.lease_id, self.produce(lease), lease.policy_version)
            self.mine.add(lease.lease_id)
            self.todo -= 1
        if self.owed_maybe:
            self.keeper.collect([])
            self.owed_maybe = False

    def produce(self, lease: object) -> bytes:
        """The batch's root: generation simulated by its measured duration, a random root."""
        time.sleep(self.generate_s)
        return keccak(os.urandom(32))

    def stop(self) -> None:
        pass


class RealWorker(SimWorker):
    """A worker whose batches are real: the embedded model's rollouts for the lease's chain-drawn seeds, proven,
    signed and served over libp2p from the host `start_participant` starts (its address published on chain)."""

    def __init__(self, *args: object, leases: int, data_dir: Path, registry: str, model: SharedModel):
        super().__init__(*args, leases=leases, generate_s=0.0)
        self.model = model
        self.participant = start_participant(RegistryClient(self.client, registry), self.job, data_dir,
                                             data_dir / "objects", listen="/ip4/127.0.0.1/tcp/0",
                                             registry_peers=0)  # it serves: the members dial it
        self.generated_s: list[float] = []

    def produce(self, lease: object) -> bytes:
        real = self.model.get()
        started = time.perf_counter()
        with real.lock:
            done = prepare_batch(self.job, lease, self.client.account, real.task, real.backend,
                                 self.participant.node.store, policy_version=lease.policy_version,
                                 policy_root=real.root.hex())
        self.generated_s.append(time.perf_counter() - started)
        return done.root

    def stop(self) -> None:
        self.participant.node.stop()


class SimValidator(Participant):
    def __init__(self, *args: object, verify_s: float, data_dir: Path, real: set[str], model: SharedModel):
        super().__init__(*args)
        self.verify_s = verify_s
        self.registry = RegistryClient(self.client, self.job.registry_address())
        self.committees = CommitteeView(self.job, self.registry, self.book.from_block)
        self.unknown: list[tuple[int, int]] = []  # (lease, round) whose committee this validator has not asked about
        self.to_vote: dict[int, bool] = {}
        self.verified = 0
        self.voted: set[tuple[int, int]] = set()
        self.data_dir = data_dir
        self.real = real  # the addresses of the workers whose batches are real (lower case)
        self.model = model
        self.node: P2PNode | None = None  # started on its first real fetch
        self.real_lane = ThreadPoolExecutor(1)  # real batches are fetched and judged here, off the voting tick
        self.judging: dict[tuple[int, int], Future] = {}
        self.real_verdicts: list[dict] = []

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
                if entry.worker.lower() in self.real:  # fetched and judged on its own lane, as a daemon's own machine
                    self.judging[(lease_id, round_)] = self.real_lane.submit(self.judge_real, entry, round_)
                    continue
                time.sleep(self.verify_s)  # the member's sampled verification, simulated by its duration
                self.to_vote[lease_id] = True
                self.verified += 1
        self.unknown = []
        for key, judged in list(self.judging.items()):
            if judged.done():
                del self.judging[key]
                verdict = judged.result()
                if verdict is None:
                    self.unknown.append(key)  # its data is not here yet: patience, as the daemon's
                else:
                    self.to_vote[key[0]] = verdict
                    self.verified += 1
        votes = {i: accept for i, accept in self.to_vote.items() if (entry := self.book.get(i)) is not None
                 and entry.status is LeaseStatus.VOTING and entry.deadline >= self.book.now}
        if votes:
            self.job.vote_batch(votes)
        self.to_vote = {}
        self.keep()
        finished = [entry.lease_id for entry in update.finished
                    if any(self.client.address in ballots for ballots in entry.votes.values())]
        if finished:
            self.keeper.collect(finished)

    def judge_real(self, entry: LeaseEntry, round_: int) -> bool | None:
        """Fetch a real batch over libp2p from its worker's registered address and judge it as the daemon does:
        the lease and the policy root as the chain has them, this member's own sample in round 0. None while the
        data cannot be fetched and the first half of the vote window lasts (then it counts against the worker)."""
        if self.node is None:
            self.node = P2PNode(load_or_create_identity(self.data_dir), ObjectStore(self.data_dir / "objects"),
                                gate=PeerGate(self.registry)).start()
        lease = self.job.lease(entry.lease_id)
        context = SubmissionContext(job=self.job.address, lease=lease, group_size=self.spec.group_size,
                                    tasks_per_lease=self.spec.tasks_per_lease,
                                    policy_root=self.job.policy_root(lease.policy_version),
                                    worker_active=self.registry.is_active(lease.worker, Role.WORKER))
        audit = member_audit(self.spec, self.job.address, lease.lease_id, round_, self.client.account,
                             lambda: self.job.round_seed(lease.lease_id, 0))
        started = time.perf_counter()
        data = p2p_fetcher(self.node, self.registry)(lease.root, lease.worker)
        fetched = time.perf_counter()
        if data is None and self.book.now < lease.deadline - self.spec.vote_window // 2:
            return None
        real = self.model.get()
        with real.lock:
            check = judge_batch(data, context, real.task, real.model, real.tokenizer, real.recipe, audit)
        self.real_verdicts.append({"lease": lease.lease_id, "accept": check.accept, "reason": check.reason,
                                   "bytes": len(data or b""), "fetch_s": round(fetched - started, 4),
                                   "verify_s": round(time.perf_counter() - fetched, 4),
                                   "audited": self.spec.rollouts_per_lease if audit is None else len(audit)})
        return check.accept

    def stop(self) -> None:
        self.real_lane.shutdown(wait=True, cancel_futures=True)
        if self.node is not None:
            self.node.stop()

    def totals(self) -> dict:
        return {**super().totals(), "verified": self.verified, "real_verdicts": self.real_verdicts}


def worker_totals(worker: SimWorker) -> dict:
    return {**Participant.totals(worker), "lost": worker.lost,
            "real_generate_s": worker.generated_s if isinstance(worker, RealWorker) else []}


class TrainerReader:
    """The trainer's side: follows the same events (no key) and times each batch from submission to acceptance."""

    def __init__(self, rpc_url: str, job: str, from_block: int, real: set[str]):
        self.client = ChainClient(rpc_url)
        self.book = LeaseBook(JobClient(self.client, job), from_block)
        self.real = real
        self.submitted_at: dict[int, float] = {}
        self.admission_s: list[float] = []
        self.paid = 0
        self.real_paid = 0
        self.real_unpaid = 0

    def tick(self) -> None:
        now = time.monotonic()
        update = self.book.poll()
        self.paid += sum(entry.status is LeaseStatus.PAID for entry in update.finished)
        for entry in update.finished:
            if entry.worker.lower() in self.real:
                self.real_paid += entry.status is LeaseStatus.PAID
                self.real_unpaid += entry.status is not LeaseStatus.PAID
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
          generate_s: float, verify_s: float, tick_s: float, stop: threading.Event | object, results: object,
          real: list[int], home: str, registry: str) -> None:
    """One driver process: a thread per participant, each ticking every `tick_s` until `stop` is set. The workers
    in `real` (of every process) carry real rollouts; `home` holds the participants' libp2p identities (made at
    setup)."""
    import torch

    torch.set_num_threads(1)
    model = SharedModel(JobClient(ChainClient(rpc_url), job))
    real_addresses = {scale_account(i).address.lower() for i in real}
    people: list[Participant] = [
        RealWorker(rpc_url, scale_account(i), job, from_block, leases=leases, data_dir=Path(home) / f"p{i}",
                   registry=registry, model=model) if i in real else
        SimWorker(rpc_url, scale_account(i), job, from_block, leases=leases, generate_s=generate_s)
        for i in workers]
    people += [SimValidator(rpc_url, scale_account(i), job, from_block, verify_s=verify_s,
                            data_dir=Path(home) / f"p{i}", real=real_addresses, model=model) for i in validators]
    started = time.monotonic()

    parent = os.getppid()

    def run(person: Participant) -> None:
        time.sleep(tick_s * random.random())  # participants start at random phases, as strangers would
        while not stop.is_set() and os.getppid() == parent:  # a driver whose bench was killed stops too
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

    try:
        with ThreadPoolExecutor(len(people)) as pool:
            list(pool.map(run, people))
    finally:
        for person in people:
            person.stop()
    seconds = time.monotonic() - started
    results.put({"seconds": seconds,
                 "workers": [worker_totals(p) for p in people if isinstance(p, SimWorker)],
                 "validators": [p.totals() for p in people if isinstance(p, SimValidator)]})


def setup(rpc_url: str, workers: int, validators: int, leases: int, real: list[int],
          home: Path) -> tuple[str, int, int, str]:
    """Deploy the market and a job with room for every lease; fund, register and stake everyone (real workers
    and validators with the libp2p identities kept in `home`); validators enlist; publish the embedded model's
    root as the policy. Returns (job, deployment block, lease cost, registry)."""
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
        keeps_host = index in real or index >= workers
        identity = load_or_create_identity(home / f"p{index}") if keeps_host else PeerIdentity.generate()
        RegistryClient(client, market.registry).join(identity, role, stake)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(join, range(total)))
    lease_cost = eth_to_wei(spec.reward_per_sample_eth) * spec.group_size * spec.tasks_per_lease
    job = FactoryClient(deployer, market.factory).create_job(spec.to_abi(deployer.address),
                                                             (workers * leases + 1) * lease_cost + ETH)
    JobClient(deployer, job).publish_policy(POLICY_VERSION, base_model_root(build_default_model(
        resolve_data_dir(None) / "models")))  # real batches are generated and judged with this model

    def enlist(index: int) -> None:
        JobClient(ChainClient(rpc_url, scale_account(index)), job).enlist()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(enlist, range(workers, total)))
    return job, market.deployed_at_block, lease_cost, market.registry


def run_row(workers: int, validators: int, leases: int, processes: int, generate_s: float, verify_s: float,
            samples_per_step: int, block_gas_limit: int, real_every: int, console: object,
            skip_appeal_windows: bool = False) -> dict:
    anvil = start_anvil(extra_args=["--gas-limit", str(block_gas_limit)])
    try:
        with tempfile.TemporaryDirectory(prefix="rollnet-scale-") as home:
            return measure_row(anvil, workers, validators, leases, processes, generate_s, verify_s,
                               samples_per_step, block_gas_limit, real_workers(workers, real_every), Path(home),
                               console, skip_appeal_windows)
    finally:
        anvil.stop()


def measure_row(anvil: AnvilProcess, workers: int, validators: int, leases: int, processes: int, generate_s: float,
                verify_s: float, samples_per_step: int, block_gas_limit: int, real: list[int], home: Path,
                console: object, skip_appeal_windows: bool) -> dict:
    rpc_url = anvil.url
    setup_started = time.monotonic()
    job, from_block, lease_cost, registry = setup(rpc_url, workers, validators, leases, real, home)
    # The setup is mined at once; then a block every second, as on a fast L2: with a block per transaction, a
    # thousand workers' transactions made 256 blocks in seconds, and claims lost their seed block before their
    # seed could be drawn.
    anvil.mine_every(1)
    console.print(f"  {workers} workers ({len(real)} with real rollouts), {validators} validators staked and "
                  f"enlisted ({time.monotonic() - setup_started:.0f} s)")
    first_block = ChainClient(rpc_url).block_number() + 1  # the run's transactions start here, after setup
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    results = context.Queue()
    shares = [(list(range(p, workers, processes)), list(range(workers + p, workers + validators, processes)))
              for p in range(processes)]
    tick_s = participant_tick_s(workers + validators)
    drivers = [context.Process(target=drive, args=(rpc_url, job, from_block, w, v, leases, generate_s, verify_s,
                                                   tick_s, stop, results, real, str(home),
                                                   registry)) for w, v in shares]
    for process in drivers:
        process.start()
    trainer = TrainerReader(rpc_url, job, from_block, {scale_account(i).address.lower() for i in real})
    reader = JobClient(ChainClient(rpc_url), job)
    expected = workers * leases
    started = time.monotonic()
    shown = 0.0
    skipped_s = 0
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
        if skip_appeal_windows and claimed and all(entry.status is LeaseStatus.DECIDED
                                                   and entry.outcome is Outcome.ACCEPT for entry in in_flight):
            skipped_s += skip_to_settlement(reader, in_flight)
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
    row["appeal_windows_skipped_s"] = skipped_s
    row["real"] = real_summary(parts, trainer, len(real) * leases)
    by_function = gas_by_function(reader, first_block)
    samples = max(1, trainer.paid * reader.spec().rollouts_per_lease)
    row["gas_per_accepted_sample_by_function"] = {name: round(gas / samples) for name, gas in by_function.items()}
    return row


def skip_to_settlement(job: JobClient, accepted: list[LeaseEntry]) -> int:
    """Move the chain's clock on to when the first of the `accepted` leases may be settled, past an appeal
    window nobody has cause to use (`--skip-appeal-windows`, for tests: the caller skips only while every open
    lease is decided and accepted). One lease at a time, so each lease's keeper turns keep their order (its
    worker first); the seconds skipped."""
    spec = job.spec()
    gap = min(due_since(entry, spec) for entry in accepted) - job.client.now()
    if gap <= 0:
        return 0
    job.client.rpc("evm_increaseTime", [gap])
    job.client.rpc("evm_mine", [])  # the jump is in a block before anyone reads the clock again
    return gap


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


def real_summary(parts: list[dict], trainer: TrainerReader, leases: int) -> dict:
    """The leases that carried real rollouts: how they were decided, and what fetching and judging them cost."""
    verdicts = [v for part in parts for t in part["validators"] for v in t["real_verdicts"]]
    generated = [s for part in parts for t in part["workers"] for s in t["real_generate_s"]]

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 4) if values else None

    return {"leases": leases, "paid": trainer.real_paid, "unpaid": trainer.real_unpaid,
            "verdicts": len(verdicts), "accepted_verdicts": sum(v["accept"] for v in verdicts),
            "rejections": sorted({v["reason"] for v in verdicts if not v["accept"]}),
            "fetched_bytes_median": median([v["bytes"] for v in verdicts]),
            "fetch_s_median": median([v["fetch_s"] for v in verdicts]),
            "verify_s_median": median([v["verify_s"] for v in verdicts]),
            "audited_rollouts_median": median([v["audited"] for v in verdicts]),
            "generate_s_median": median(generated)}


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
    parser.add_argument("--skip-appeal-windows", action="store_true",
                        help="while every open lease is decided and accepted, move the chain's clock past the "
                        "appeal windows (for tests: a row's seconds, per-second rates and per-lease RPC counts then "
                        "leave the skipped windows out, so they do not compare with full runs)"),
    parser.add_argument("--real-every", type=int, default=REAL_EVERY,
                        help="one worker in this many (at least one) carries real rollouts over libp2p")
    args = parser.parse_args()
    if args.real_every < 1:
        parser.error("--real-every must be at least 1 (one worker in N carries real rollouts)")
    console = make_console()
    rows = [(10, 5), (40, 10)] if args.quick else [(10, 5), (100, 5), (100, 50), (1000, 5), (1000, 50)]
    if args.rows:
        rows = [tuple(int(n) for n in row.split("x")) for row in args.rows.split(",")]
    results = []
    for workers, validators in rows:
        console.print(f"[bold]{workers} workers, {validators} validators[/bold]")
        results.append(run_row(workers, validators, args.leases, min(args.processes, workers), args.generate_s,
                               args.verify_s, args.samples_per_step, args.block_gas_limit, args.real_every,
                               console, args.skip_appeal_windows))
    base = results[0]
    table = Table(title="bench/scale.py: the market's load as it grows (simulated model work, real transactions)")
    for column in ("workers", "validators", "poll s", "unpaid", "RPC / lease", "RPC / worker / poll",
                   "RPC / validator / poll",
                   "gas / sample", "vs first", "verif. / validator / lease", "verif. / lease",
                   "admission s (median)", "tx / step", "min step s (2 s blocks)", "real leases paid",
                   "real verdicts (accept)", "real fetch / verify s"):
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
                      f"{row['step']['min_step_s_at_2s_blocks']:.3f}",
                      f"{row['real']['paid']} of {row['real']['leases']}",
                      f"{row['real']['verdicts']} ({row['real']['accepted_verdicts']})",
                      f"{row['real']['fetch_s_median']} / {row['real']['verify_s_median']}")
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": results, "generate_s": args.generate_s, "verify_s": args.verify_s,
                                     "real_every": args.real_every,
                                     "leases_per_worker": args.leases, "block_gas_limit": args.block_gas_limit},
                                    indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

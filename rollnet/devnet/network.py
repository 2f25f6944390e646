"""A whole market on one machine: anvil, the contracts, a requester's job, and every participant as its own
OS process (trainer, workers, validators, optionally a cheater) with its own key, data directory, SQLite
store, event log and libp2p host.

Invariants: every process this starts is stopped by `stop()` (Ctrl-C included): children first get
SIGINT and time to finish cleanly, then SIGKILL; anvil last, after it has dumped its state into the run
directory, so the whole run stays inspectable. Children run in their own sessions, so a terminal's Ctrl-C
reaches only the orchestrator, which stops them in order. Every participant's data directory holds the
deployment, so it finds the chain and contracts itself; nothing but loopback addresses is used.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollnet.node.chain.anvil import AnvilProcess, start_anvil
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.deploy import deploy_market
from rollnet.node.chain.job import FactoryClient, JobClient
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.cli.job_cmd import base_model_root
from rollnet.node.config import Deployment, resolve_data_dir
from rollnet.node.errors import ConfigError, RollnetError
from rollnet.node.keys import dev_account
from rollnet.node.model.builder import METADATA, build_default_model
from rollnet.node.model.identity import folder_model_files_hash
from rollnet.node.model.loading import PRESET_BUILDERS
from rollnet.node.model.pinned import EMBEDDED_MODEL, EMBEDDED_TASK, PRESETS
from rollnet.node.p2p.identity import load_or_create_identity
from rollnet.node.rollout.backend_names import BACKENDS, require_vllm
from rollnet.node.spec import JobSpecFile
from rollnet.node.tasks import load_task
from rollnet.node.units import WEI_PER_ETH as ETH
from rollnet.trainer.local import HELD_OUT_PROMPTS
from rollnet.trainer.pipeline import LocalRecipe

REQUESTER, TRAINER, FIRST_NODE = 0, 1, 2
WORKER_NICENESS = 10
CHEAT_MODES = ("fabricate", "noise", "wrong-tokens", "inflate", "withhold")


def nice_session(pid: int, niceness: int, tries: int = 10) -> bool:
    """Lower the CPU priority of child `pid`'s session (it runs in its own) by `niceness`; whether it held.
    With the kernel's autogroup scheduling each session is a group, and groups share the CPU equally whatever
    their members' nice values, so a child's own nice value counts against other sessions only once its group's
    is set too (/proc/PID/autogroup). Without CAP_SYS_ADMIN the kernel allows one such change per 100 ms, so a
    refusal (EAGAIN) is retried; a kernel without autogroups needs nothing."""
    path = Path(f"/proc/{pid}/autogroup")
    for _ in range(tries):
        try:
            path.write_text(str(niceness))
            return True
        except BlockingIOError:
            time.sleep(0.1)
        except OSError:
            return False
    return False


@dataclass(frozen=True)
class DevnetConfig:
    """What `rollnet devnet` runs; the defaults finish within five minutes on two cores."""

    out: Path
    workers: int = 3
    validators: int = 2
    steps: int = 40
    max_staleness: int = 4
    cheater: str | None = None
    worker_delays: tuple[float, ...] = (0.0, 0.0, 0.5)
    prompts_per_step: int = 32
    tasks_per_lease: int = 8
    group_size: int = 8
    lr: float = 2e-5
    stake_eth: int = 100  # each open lease locks 1 ETH of collateral until it settles (after the appeal window)
    budget_eth: int = 50
    lease_seconds: int = 60
    vote_seconds: int = 120
    appeal_seconds: int = 60  # the factory's shortest window
    held_out_every: int = 10
    max_undecided: int | None = None  # None: each worker's adaptive in-flight window (node.in_flight)
    model: Path | None = None  # a folder `rollnet model init` made (default: the embedded model)
    backend: str = "transformers"  # the honest workers' rollout backend (the cheater's is transformers)
    preset: str | None = None  # a real model rollnet converts itself (model.pinned.PRESETS), instead of `model`
    task: str = EMBEDDED_TASK
    max_new_tokens: int = 6
    chat_template: bool = False
    held_out_prompts: int = HELD_OUT_PROMPTS
    # After the run, the local two-process pipeline (rollnet.trainer.pipeline) trains this many steps of the same
    # batch, so the report can state the market's efficiency against it (0: not measured; embedded model only).
    baseline_steps: int = 0
    block_time_s: int = 0  # 0: anvil mines each transaction at once; N: a block every N seconds (an L2's cadence)

    @classmethod
    def real_model(cls, out: Path, preset: str, task: str, **overrides: object) -> DevnetConfig:
        """A run on a real model sized for two cores: short GRPO steps (4 prompts × 4 samples of up to the
        preset's completion limit, one lease each), lr 3e-6, leases and votes that outlast CPU generation and
        verification, and a 32-task held-out set evaluated at the start and the end."""
        defaults: dict[str, object] = {
            "workers": 2, "validators": 2, "steps": 5, "max_staleness": 2, "worker_delays": (0.0, 0.0),
            "prompts_per_step": 4, "tasks_per_lease": 4, "group_size": 4, "lr": 3e-6, "lease_seconds": 1800,
            "vote_seconds": 1800, "held_out_every": 1000, "max_new_tokens": PRESETS[preset].completion_tokens,
            "chat_template": True, "held_out_prompts": 32}
        return cls(out=out, preset=preset, task=task, **{**defaults, **overrides})  # type: ignore[arg-type]

    def check(self) -> None:
        if self.workers < 1 or self.validators < 1:
            raise ConfigError("a devnet needs at least one worker and one validator")
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.backend == "vllm":
            require_vllm()
        if FIRST_NODE + self.workers + self.validators + (1 if self.cheater else 0) > 20:
            raise ConfigError("at most 18 workers, validators and cheater together (anvil funds 20 accounts)")
        if self.cheater is not None and self.cheater not in CHEAT_MODES:
            raise ConfigError(f"unknown cheater mode {self.cheater!r}: one of {', '.join(CHEAT_MODES)}")
        if self.steps < 1:
            raise ConfigError("--steps must be at least 1")
        if not 0 <= self.block_time_s <= 60:
            raise ConfigError("--block-time is whole seconds from 0 (a block per transaction) to 60")
        if self.preset is not None and self.preset not in PRESETS:
            raise ConfigError(f"unknown model preset {self.preset!r}: one of {', '.join(PRESETS)}")
        if self.preset is None and self.model is not None and not (self.model / METADATA).is_file():
            raise ConfigError(f"--model {self.model}: the devnet takes a folder `rollnet model init` built (the "
                              f"embedded model) or a preset ({', '.join(PRESETS)})")
        if self.preset is None and self.task != EMBEDDED_TASK:
            raise ConfigError(f"--task {self.task}: the embedded model is built for {EMBEDDED_TASK}; other tasks "
                              f"need a real model (--model {', '.join(PRESETS)})")
        load_task(self.task)  # an unknown task is a clear error before anything starts

    def model_folder(self) -> Path:
        """The base model's folder: the preset converted (once), the given folder, or the embedded build."""
        models = resolve_data_dir(None) / "models"
        if self.preset is not None:
            return PRESET_BUILDERS[self.preset](models)
        return self.model or build_default_model(models)

    def local_recipe(self, folder: Path) -> LocalRecipe:
        """The same model, task, prompt format, batch and learning rate for the local baselines."""
        return LocalRecipe(folder=str(folder), task=self.task, chat_template=self.chat_template,
                           prompts=self.prompts_per_step, group=self.group_size, max_new_tokens=self.max_new_tokens,
                           lr=self.lr)

    @property
    def committee_size(self) -> int:
        """Expected first-round committee: every validator up to three (with equal stakes all of them sit, and
        a round is decided once votes holding more than half the validator stake agree)."""
        return min(3, self.validators)


@dataclass
class Participant:
    name: str
    role: str  # trainer, worker, validator, cheater
    account: int
    data_dir: Path
    argv: list[str]
    module: str = "rollnet.cli"
    process: subprocess.Popen | None = None
    starts: int = 0
    asked_to_stop_at: float | None = None  # when this process was sent SIGINT (monotonic), if it was

    @property
    def address(self) -> str:
        return dev_account(self.account).address

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def events_path(self) -> Path:
        return self.data_dir / "events.jsonl"


@dataclass
class Devnet:
    config: DevnetConfig
    anvil: AnvilProcess | None = None
    deployment: Deployment | None = None
    job: str = ""
    model: Path | None = None
    participants: dict[str, Participant] = field(default_factory=dict)
    started_at: float = 0.0
    cpu_at_start: float = 0.0  # this (the orchestrator's) process's CPU seconds when the run started

    # ------------------------------------------------------------------ setting up

    def start(self) -> Devnet:
        """Chain, contracts, the job, the trainer (starting up while the others stake), then, once it listens,
        everyone else."""
        config = self.config
        config.check()
        config.out.mkdir(parents=True, exist_ok=True)
        self.started_at = time.time()
        self.cpu_at_start = time.process_time()  # a caller may have worked before (bench/efficiency.py's arms)
        self.model = config.model_folder()
        # The setup (contracts, the job, the stakes) is mined at once; the run has its block time from the first
        # worker or validator on (`block_time_s`), so a slow chain costs the run, not minutes of deployment (the
        # trainer, started first, may see its registration mined at once).
        self.anvil = start_anvil(log_path=config.out / "anvil.log",
                                 extra_args=["--dump-state", str(config.out / "anvil-state.json")])
        requester = ChainClient(self.anvil.url, dev_account(REQUESTER))
        self.deployment = deploy_market(requester)
        self.job = self._create_job(requester)
        self._plan()
        for person in self.participants.values():
            person.data_dir.mkdir(parents=True, exist_ok=True)
            self.deployment.save(person.data_dir)
        self.launch("trainer")  # it starts up (seconds) while the others stake
        for person in self.participants.values():
            if person.role in ("worker", "validator", "cheater"):
                identity = load_or_create_identity(person.data_dir)
                registry = RegistryClient(ChainClient(self.anvil.url, dev_account(person.account)),
                                          self.deployment.registry)
                role = Role.VALIDATOR if person.role == "validator" else Role.WORKER
                registry.join(identity, role, config.stake_eth * ETH)
        if config.block_time_s:
            self.anvil.mine_every(config.block_time_s)
        bootstrap = self._trainer_addr()
        for person in self.participants.values():
            if person.role != "trainer":
                person.argv += ["--bootstrap", bootstrap]
                self.launch(person.name)
        return self

    def _create_job(self, requester: ChainClient) -> str:
        config = self.config
        if config.preset is not None:  # rollnet pins the preset's root and files hash itself
            pinned: dict[str, str | None] = {"model": config.preset, "model_root": None, "model_files_hash": None}
        else:
            pinned = {"model": EMBEDDED_MODEL, "model_root": "0x" + base_model_root(self.model).hex(),
                      "model_files_hash": "0x" + folder_model_files_hash(self.model).hex()}
        spec = JobSpecFile(
            **pinned, task=config.task, trainer=dev_account(TRAINER).address,
            max_new_tokens=config.max_new_tokens, chat_template=config.chat_template,
            group_size=config.group_size, tasks_per_lease=config.tasks_per_lease,
            max_staleness=config.max_staleness, committee_size=config.committee_size, appeal_rounds=1,
            clip_epsilon=0.2, clip_delta=4.0, lease_seconds=config.lease_seconds, vote_seconds=config.vote_seconds,
            appeal_seconds=config.appeal_seconds, reward_per_sample_eth="0.001", slash_eth="1",
            expiry_fee_eth="0.05", voter_slash_eth="1", absent_penalty_eth="0.1", appeal_bond_eth="0.5")
        return FactoryClient(requester, self.deployment.factory).create_job(spec.to_abi(requester.address),
                                                                           config.budget_eth * ETH)

    def _plan(self) -> None:
        config, out = self.config, self.config.out
        common = ["--job", self.job, "--model", str(self.model)]

        def add(name: str, role: str, account: int, argv: list[str], module: str = "rollnet.cli") -> None:
            folder = out / name
            self.participants[name] = Participant(name, role, account, folder,
                                                  ["--data-dir", str(folder), *argv, "--dev-account", str(account)],
                                                  module)

        add("trainer", "trainer", TRAINER,
            ["trainer", "run", *common, "--steps", str(config.steps), "--run-dir", str(out / "trainer"),
             "--prompts-per-step", str(config.prompts_per_step), "--lr", str(config.lr),
             "--held-out-every", str(config.held_out_every), "--held-out-prompts", str(config.held_out_prompts)])
        account = FIRST_NODE
        for i in range(config.workers):
            delay = config.worker_delays[i] if i < len(config.worker_delays) else 0.0
            add(f"worker-{i}", "worker", account,
                ["node", "work", *common, "--leases", "0", "--serve", "0", "--delay", str(delay),
                 *(["--max-undecided", str(config.max_undecided)] if config.max_undecided else []),
                 "--backend", config.backend])
            account += 1
        for i in range(config.validators):
            add(f"validator-{i}", "validator", account, ["validator", "run", *common, "--interval", "0.3"])
            account += 1
        if config.cheater:
            add("cheater", "cheater", account,
                ["node", "work", *common, "--leases", "0", "--serve", "0", "--cheat", config.cheater],
                module="rollnet.devnet.cheats")

    def _trainer_addr(self, timeout: float = 120.0) -> str:
        path = self.participants["trainer"].data_dir / "p2p-addr"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if not self.participants["trainer"].alive:
                raise RollnetError(f"the trainer exited during start-up: see {self.log_path('trainer')}")
            if time.monotonic() > deadline:
                raise RollnetError("the trainer did not start listening within two minutes")
            time.sleep(0.2)
        return path.read_text().strip()

    # ------------------------------------------------------------------ processes

    def log_path(self, name: str) -> Path:
        return self.participants[name].data_dir / "process.log"

    def launch(self, name: str) -> Participant:
        person = self.participants[name]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ROLLNET_RPC_URL": self.anvil.url, "PYTHONUNBUFFERED": "1"}
        env.pop("ROLLNET_PRIVATE_KEY", None)
        env.pop("ROLLNET_DEPLOYMENT", None)
        # Workers stand for contributors' own machines: here they share the cores, so they yield them to
        # the trainer and validators (the critical path) instead of starving them.
        niceness = WORKER_NICENESS if person.role in ("worker", "cheater") else 0
        with self.log_path(name).open("ab") as log:
            person.process = subprocess.Popen([sys.executable, "-m", person.module, *person.argv], stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                              start_new_session=True,
                                              preexec_fn=(lambda: os.nice(niceness)) if niceness else None)
        if niceness:
            nice_session(person.process.pid, niceness)
        person.starts += 1
        person.asked_to_stop_at = None
        return person

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        person = self.participants[name]
        if person.alive:
            person.process.send_signal(sig)
            person.process.wait(30)

    def freeze_chain(self, seconds: float) -> None:
        """SIGSTOP anvil for `seconds`, then SIGCONT: an unresponsive chain endpoint."""
        os.kill(self.anvil.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(self.anvil.pid, signal.SIGCONT)

    def stop_roles(self, *roles: str, timeout: float = 20.0) -> None:
        """Ask every live process of `roles` to stop (SIGINT, once: a process asked before is not interrupted again
        in its clean-up), then kill what has not stopped within `timeout` of its first asking. An interrupt while
        waiting (a second Ctrl-C) kills them all at once and is raised again."""
        chosen = [p for p in self.participants.values() if p.role in roles and p.alive]
        now = time.monotonic()
        for person in chosen:
            if person.asked_to_stop_at is None:
                person.process.send_signal(signal.SIGINT)
                person.asked_to_stop_at = now
        try:
            for person in chosen:
                try:
                    person.process.wait(max(0.1, person.asked_to_stop_at + timeout - time.monotonic()))
                except subprocess.TimeoutExpired:
                    person.process.kill()
        finally:
            for person in chosen:
                if person.alive:
                    person.process.kill()
                person.process.wait(10)

    def anvil_cpu_seconds(self) -> float | None:
        """The chain node's CPU seconds so far (user + system, from /proc; None where there is no /proc)."""
        try:
            fields = Path(f"/proc/{self.anvil.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, AttributeError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15

    def stop(self) -> None:
        """Stop every participant, then the chain (even when interrupted while stopping them)."""
        try:
            self.stop_roles("trainer", "worker", "validator", "cheater")
        finally:
            if self.anvil is not None:
                self.anvil.stop(timeout=10)
                self.anvil = None

    # ------------------------------------------------------------------ chain access for the orchestrator

    def client(self, account: int = REQUESTER) -> ChainClient:
        return ChainClient(self.anvil.url, dev_account(account))

    def job_client(self, account: int = REQUESTER) -> JobClient:
        return JobClient(self.client(account), self.job)


"""`rollnet devnet`: a real decentralized GRPO run on one machine, on the embedded defaults, with a live view
and a report at the end.

Invariant: the run directory keeps everything (each participant's data directory with its event log,
SQLite store, policy store and process log; anvil's log and dumped state; the report), whether the run
ends by itself or by Ctrl-C; every process it started is stopped when it returns. A finished run writes
the chain's final policy version out as a Hugging Face folder (`final-policy/`), which the report names.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.live import Live

from rollnet.devnet.live import render
from rollnet.devnet.network import CHEAT_MODES, Devnet, DevnetConfig
from rollnet.devnet.observe import RunState, gas_by_call
from rollnet.devnet.report import write_report
from rollnet.node.chain.job import JobClient, LeaseStatus
from rollnet.node.chain.registry import RegistryClient
from rollnet.node.cli.context import make_console
from rollnet.node.errors import RollnetError
from rollnet.node.events import EventLog
from rollnet.node.keeper import Keeper
from rollnet.node.model.loading import load_policy, preset_of
from rollnet.node.model.pinned import EMBEDDED_MODEL, EMBEDDED_TASK, PRESETS
from rollnet.trainer.export import export_version
from rollnet.trainer.pipeline import run_arm

__all__ = ["Devnet", "DevnetConfig", "devnet", "finish_run", "run_devnet"]


def watch(net: Devnet, state: RunState, console: Console, live: bool, timeout_s: float) -> None:
    """Follow the run until the trainer exits (or `timeout_s`), redrawing the live view."""
    job, registry = net.job_client(), RegistryClient(net.client(), net.deployment.registry)
    trainer = net.participants["trainer"]
    view = Live(console=console, refresh_per_second=2, transient=False) if live else contextlib.nullcontext()
    deadline = time.monotonic() + timeout_s
    last_chain, last_line = 0.0, time.monotonic()
    chain_every = 1.0 if live else 5.0  # the chain's side is drawn live; otherwise it is only summed at the end
    with view:
        while trainer.alive:
            if time.monotonic() > deadline:
                raise RollnetError(f"the run did not finish within {timeout_s:.0f} s; see the process logs in "
                                   f"{net.config.out}")
            state.read()
            if time.monotonic() - last_chain > chain_every:
                with contextlib.suppress(RollnetError):
                    state.poll_chain(job.client, job, registry)
                last_chain = time.monotonic()
            alive = {name: p.alive for name, p in net.participants.items()}
            if live:
                view.update(render(state, net.started_at, net.config.steps, net.config.max_staleness, alive))
            elif time.monotonic() - last_line > 15:
                steps = state.steps()
                console.print(f"{time.time() - net.started_at:5.0f} s: step {len(steps)}/{net.config.steps}"
                              + (f", reward {steps[-1]['reward']:.3f}" if steps else ""))
                last_line = time.monotonic()
            time.sleep(0.5)
    if trainer.process.returncode != 0:
        raise RollnetError(f"the trainer failed (exit {trainer.process.returncode}): see {net.log_path('trainer')}")


def settle(net: Devnet, console: Console, wait_s: float = 90.0) -> None:
    """Wind down like a requester whose training is done: close the job (no new claims; workers keep
    serving), let committees decide every batch in flight, stop everyone, then, as the keeper anyone may be,
    move the chain's clock past every appeal window and settle each lease (paid, slashed, void or returned),
    on a chain with a block time mining each settling transaction at once (nobody else is left to wait for),
    slash the voters who lost, and sweep the escrow that settling released back to the requester."""
    job = net.job_client()
    job.close()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        now = job.client.now()
        leases = [job.lease(i) for i in range(1, job.lease_count() + 1)]
        if not any(lease.status in (LeaseStatus.LEASED, LeaseStatus.VOTING) and lease.deadline >= now
                   for lease in leases):
            break
        time.sleep(0.5)
    net.stop_roles("validator", "worker", "cheater")
    spec = job.spec()
    open_leases = [lease for lease in (job.lease(i) for i in range(1, job.lease_count() + 1)) if not lease.final]
    last = max((lease.deadline + spec.appeal_window for lease in open_leases), default=0)
    now = job.client.now()
    if last >= now:  # nobody is left to act: the keeper fast-forwards the local chain past every window
        job.client.rpc("evm_increaseTime", [last - now + 1])
    block_time = net.config.block_time_s
    if block_time:  # ... and mines its own settling at once (one transaction a lease, each a block's wait)
        job.client.rpc("evm_setAutomine", [True])
    try:
        job.client.rpc("evm_mine", [])
        keeper = Keeper(job, EventLog(None), spec)
        now = job.client.now()
        for lease in open_leases:
            keeper.act(job.lease(lease.lease_id), now)
        for lease in open_leases:
            keeper.slash_losers(lease.lease_id)
        job.close()
    finally:
        if block_time:  # (a failure to restore it must not hide the settling's own)
            with contextlib.suppress(RollnetError):
                net.anvil.mine_every(block_time)
    console.print("settled: every lease paid, slashed, void or returned after its appeal window; escrow refunded")


def finish_run(net: Devnet, state: RunState, console: Console) -> dict:
    """Settle, then gather the chain's numbers and write the report."""
    settle(net, console)
    job = net.job_client()
    state.read()
    state.poll_chain(job.client, job, RegistryClient(job.client, net.deployment.registry))
    addresses = {"TrainingJob": net.job, "NodeRegistry": net.deployment.registry,
                 "JobFactory": net.deployment.factory}
    gas = gas_by_call(job.client, addresses, net.deployment.deployed_at_block)
    params = sum(p.numel() for p in load_policy(net.model)[0].parameters())
    config = net.config
    run = {"model": config.preset or EMBEDDED_MODEL, "task": config.task, "max_new_tokens": config.max_new_tokens,
           "prompts_per_step": config.prompts_per_step, "held_out_prompts": config.held_out_prompts,
           "tasks_per_lease": config.tasks_per_lease,
           "workers": config.workers, "validators": config.validators, "steps": config.steps, "lr": config.lr,
           "backend": config.backend, "block_time_s": config.block_time_s,
           "max_undecided": config.max_undecided, "group_size": config.group_size,
           "cheater": config.cheater, "max_staleness": config.max_staleness, "job": net.job,
           "rpc_url": net.anvil.url, "seconds": time.time() - net.started_at, "cores": os.cpu_count(),
           "chain_cpu_s": net.anvil_cpu_seconds(), "orchestrator_cpu_s": time.process_time() - net.cpu_at_start}
    from rollnet.devnet.report import build_report

    try:
        run["final_policy"] = export_final(net, job, console)
    except RollnetError as exc:  # the report is written all the same, and says why there is no folder
        console.print(f"[red]final policy not exported:[/] {exc}")
        run["final_policy"] = {"error": str(exc)}
    report = build_report(state, params=params, budget=config.max_staleness, gas=gas, run=run)
    report.update(efficiency_against_baseline(net, report, console))
    files = write_report(report, config.out)
    console.print(f"report: {', '.join(str(f) for f in files[:2])} and {len(files) - 2} plots")
    return report


def efficiency_against_baseline(net: Devnet, report: dict, console: Console) -> dict:
    """The run's efficiency: its trained samples/s over the local two-process pipeline's on the same model,
    task and batch, measured now that the market's processes are stopped (`baseline_steps`). Empty when not
    measured."""
    config = net.config
    market = report["throughput"]["trained_samples_per_s"]
    if not config.baseline_steps or not market:
        return {}
    console.print(f"baseline: the local two-process pipeline, {config.baseline_steps} steps of the same batch")
    result = run_arm(config.local_recipe(net.model), config.max_staleness, config.baseline_steps)
    local = result["samples_trained_on"] / result["seconds"]
    return {"baseline": {"arm": "async_local", "steps": config.baseline_steps, "samples_per_s": local},
            "efficiency": market / local}


def export_final(net: Devnet, job: JobClient, console: Console) -> dict:
    """The chain's newest version, written out of the trainer's run as a Hugging Face folder (trainer.export),
    checked against the chain's root; the report names it."""
    version = job.current_version()
    out = net.config.out / "final-policy"
    shutil.rmtree(out, ignore_errors=True)  # a rerun into the same directory writes its own final version
    exported = export_version(net.config.out / "trainer", version, out, job.policy_root(version),
                              job.spec().model_files_hash)
    console.print(f"final policy (version {version}, root {exported.root.hex()[:16]}…): {out}")
    return {"version": version, "folder": str(out), "root": exported.root.hex()}


BASELINE_STEPS = 10  # the local pipeline's steps after an embedded-model run: about 15 s, start-up included
REAL_MODEL_TASK = "gym:gcd:last-number"  # SmolLM2's sampled reward 0.11, half its groups with spread (BENCHMARKS.md)
REAL_MODEL_SETUP_S, REAL_MODEL_STEP_S = 1800.0, 600.0  # the run's time limit: 1,246 s for 5 steps was measured


def run_devnet(config: DevnetConfig, console: Console, live: bool = True, timeout_s: float = 1200.0) -> dict:
    config.check()  # a bad flag is one line before anything starts
    net = Devnet(config)
    try:
        console.print(f"[bold]devnet[/] in {config.out}: starting chain, contracts, job and "
                      f"{config.workers + config.validators + 1 + bool(config.cheater)} processes")
        net.start()
        console.print(f"chain {net.anvil.url}, job {net.job}, trainer at {net._trainer_addr()}")
        state = RunState([(p.name, p.role, p.address, p.data_dir) for p in net.participants.values()])
        watch(net, state, console, live, timeout_s)
        report = finish_run(net, state, console)
        held = report["held_out"]
        console.print(f"held-out greedy accuracy {held['base']:.3f} -> {held['final']:.3f}; realised staleness "
                      f"mean {report['staleness']['mean_g']:.2f} (budget {config.max_staleness}); "
                      f"{report['run']['seconds']:.0f} s")
        if report.get("efficiency") is not None:
            console.print(f"trained {report['throughput']['trained_samples_per_s']:.1f} samples/s: efficiency "
                          f"{report['efficiency']:.3f} against the local two-process pipeline "
                          f"({report['baseline']['samples_per_s']:.0f} samples/s)")
        return report
    except KeyboardInterrupt:
        console.print(f"interrupted: stopping every process; everything is kept in {config.out}")
        raise
    finally:
        net.stop()


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def devnet(
    out: Path = typer.Option(None, "--out", help="run directory, kept afterwards (default runs/devnet-<time>)"),
    workers: int = typer.Option(None, "--workers", min=1, help="default 3; 2 on a real model"),
    validators: int = typer.Option(None, "--validators", min=1, help="default 2"),
    steps: int = typer.Option(None, "--steps", min=1, help="policy versions to train (default 40; 5 on a real model)"),
    max_staleness: int = typer.Option(None, "--max-staleness", min=0,
                                      help="the staleness budget (default 4; 2 on a real model)"),
    cheater: str = typer.Option(None, "--cheater", help=f"add a worker that cheats: {', '.join(CHEAT_MODES)}"),
    lr: float = typer.Option(None, "--lr", help="default 2e-5; 3e-6 on a real model"),
    max_undecided: int = typer.Option(None, "--max-undecided", min=1,
                                      help="leases a worker keeps in flight, claimed or waiting for validators "
                                      "(back-pressure; default: each worker's adaptive window)"),
    held_out_every: int = typer.Option(None, "--held-out-every", min=1,
                                       help="versions between held-out evaluations (default 10; a real model: only "
                                       "the first and the last)"),
    model: str = typer.Option(None, "--model", help=f"base model: a folder `rollnet model init` made, or a preset "
                              f"({', '.join(PRESETS)}); default: the embedded model"),
    task: str = typer.Option(None, "--task", help=f"the job's task (default {EMBEDDED_TASK}; a real model: "
                             f"{REAL_MODEL_TASK})"),
    backend: str = typer.Option(None, "--backend", help="the workers' rollout backend: transformers or vllm"),
    block_time: int = typer.Option(None, "--block-time", help="seconds between blocks (default 0: anvil mines "
                                   "each transaction at once; 2 is an L2's cadence)"),
    live: bool = typer.Option(True, "--live/--no-live", help="redraw a live view (else a line every 15 s)"),
) -> None:
    """Run a whole market locally: chain, contracts, a job, a trainer, workers and validators as processes."""
    out = out or Path("runs") / time.strftime("devnet-%Y%m%d-%H%M%S")
    if out.exists() and any(out.iterdir()):
        raise RollnetError(f"{out} is not empty: pick another --out or remove it (runs are kept for inspection)")
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)  # `kill`/`docker stop` clean up like Ctrl-C
    given = {"workers": workers, "validators": validators, "steps": steps, "max_staleness": max_staleness,
             "cheater": cheater, "lr": lr, "max_undecided": max_undecided, "held_out_every": held_out_every,
             "backend": backend, "block_time_s": block_time}
    chosen = {name: value for name, value in given.items() if value is not None}
    preset = preset_of(Path(model), None) if model else None  # a folder of a preset's name is ambiguous
    if preset is not None:
        config = DevnetConfig.real_model(out, preset, task or REAL_MODEL_TASK, **chosen)
        timeout_s = REAL_MODEL_SETUP_S + REAL_MODEL_STEP_S * config.steps
    else:
        config = DevnetConfig(out=out, model=Path(model) if model else None, task=task or EMBEDDED_TASK,
                              baseline_steps=BASELINE_STEPS, **chosen)
        timeout_s = 1200.0
    console = make_console()
    run_devnet(config, console, live=live and console.is_terminal, timeout_s=timeout_s)

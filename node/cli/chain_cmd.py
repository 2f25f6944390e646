"""`rollnet chain up|down`: start (or attach to) a chain, deploy the contracts, remember where they are.

Invariant: `up` is idempotent (a running deployment is reported, not replaced); `down` stops only the
anvil that `up` started and forgets the deployment.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rollnet.node import keys
from rollnet.node.chain.anvil import start_anvil, stop_pid, wait_until_answering
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.deploy import RegistryParams, deploy_market
from rollnet.node.cli import params
from rollnet.node.cli.context import DevAccountOption, KeyOption, console, get_context
from rollnet.node.config import Deployment, deployment_path
from rollnet.node.errors import ChainUnavailable, ConfigError, KeystoreError
from rollnet.node.units import eth_to_wei, format_eth

app = typer.Typer(help="Start a local chain (or use one) and deploy rollnet's contracts.", no_args_is_help=True)

FAUCET_ETH = "100"


def _running(deployment: Deployment) -> bool:
    try:
        wait_until_answering(deployment.rpc_url, timeout=1.0)
        return True
    except ChainUnavailable:
        return False


@app.command()
def up(
    ctx: typer.Context,
    rpc_url: str = typer.Option(None, "--rpc-url", help="deploy to this chain instead of starting anvil",
                                **params.URL),
    port: int = typer.Option(None, "--port", help="anvil port (default: a free one)", **params.PORT),
    key: str = KeyOption,
    dev_account: int = DevAccountOption,
    min_worker_stake: str = typer.Option("1", help="minimum worker stake, ETH", **params.ETH),
    min_validator_stake: str = typer.Option("5", help="minimum validator stake, ETH", **params.ETH),
    unbonding_seconds: int = typer.Option(7 * 86_400, help="unbonding period, seconds", min=1),
) -> None:
    """Start anvil on 127.0.0.1 (unless --rpc-url), deploy the contracts and save their addresses."""
    cli = get_context(ctx)
    rpc_url = rpc_url or cli.rpc_url_option
    existing = Deployment.load_optional(cli.data_dir)
    if existing is not None and existing.anvil_pid is not None and _running(existing):
        console.print(f"chain already up at {existing.rpc_url} (registry {existing.registry})")
        return
    params = RegistryParams(
        min_worker_stake_eth=min_worker_stake,
        min_validator_stake_eth=min_validator_stake,
        unbonding_period_seconds=unbonding_seconds,
    )
    eth_to_wei(min_worker_stake, "--min-worker-stake")
    eth_to_wei(min_validator_stake, "--min-validator-stake")

    anvil = None
    if rpc_url is None:
        anvil = start_anvil(port=port, log_path=cli.data_dir / "anvil.log", detach=True)
        rpc_url = anvil.url
        deployer = keys.dev_account(0 if dev_account is None else dev_account)
        console.print(f"anvil listening on {rpc_url} (pid {anvil.pid}, chain {anvil.chain_id})")
    else:
        deployer = cli.signer(key, dev_account)
    try:
        client = ChainClient(rpc_url, deployer)
        deployment = deploy_market(client, params, anvil_pid=anvil.pid if anvil else None)
        deployment.save(cli.data_dir)
        if anvil is not None:
            _fund_local_key(cli.data_dir, client)
    except BaseException:
        if anvil is not None:
            anvil.stop()
        raise
    console.print(f"registry    {deployment.registry}")
    console.print(f"job factory {deployment.factory}")
    console.print(f"saved to    {deployment_path(cli.data_dir)}")


def _fund_local_key(data_dir: Path, client: ChainClient) -> None:
    """On a fresh local anvil, give the default keystore some ETH from dev account 0."""
    try:
        address = keys.keystore_address(data_dir, keys.DEFAULT_KEY_NAME)
    except KeystoreError:  # no default key yet is normal
        console.print("no default key yet: `rollnet keys new`, or pass --dev-account N to commands")
        return
    amount = eth_to_wei(FAUCET_ETH)
    client.transfer(address, amount)
    console.print(f"funded your key {address} with {format_eth(amount)} from anvil's dev account")


@app.command()
def fund(
    ctx: typer.Context,
    amount: str = typer.Option(FAUCET_ETH, "--amount", help="ETH to send", **params.ETH),
    to: str = typer.Option(None, "--to", help="recipient (default: this data dir's keystore --key)",
                           **params.ADDRESS),
    key: str = KeyOption,
    dev_account: int = typer.Option(0, "--from-dev-account", help="anvil dev account that pays", **params.DEV_ACCOUNT),
) -> None:
    """Local devnets only: send ETH from one of anvil's funded dev accounts (a faucet for fresh keys)."""
    cli = get_context(ctx)
    recipient = to or keys.keystore_address(cli.data_dir, key)
    client, _ = cli.client(keys.dev_account(dev_account))
    if not client.w3.is_address(recipient):
        raise ConfigError(f"{recipient!r} is not an address")
    wei = eth_to_wei(amount, "--amount")
    client.transfer(recipient, wei)
    console.print(f"sent {format_eth(wei)} to {recipient}")


@app.command()
def down(ctx: typer.Context) -> None:
    """Stop the anvil `chain up` started and forget the deployment."""
    cli = get_context(ctx)
    deployment = Deployment.load_optional(cli.data_dir)
    if deployment is None:
        raise ConfigError(f"no chain is up for {cli.data_dir}")
    if deployment.anvil_pid is not None and stop_pid(deployment.anvil_pid):
        console.print(f"stopped anvil (pid {deployment.anvil_pid})")
    deployment_path(cli.data_dir).unlink()
    console.print("deployment forgotten")

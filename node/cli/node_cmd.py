"""`rollnet node join|status|unbond|withdraw`: a contributor's stake and identity on chain.

Invariant: `join` registers the libp2p peer ID of this data directory's identity, so the address and the
peer the node answers as are bound on chain; stake checks happen before any transaction is sent.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import typer
from rich.table import Table
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.cli.context import DevAccountOption, KeyOption, console, get_context
from rollnet.node.errors import RollnetError
from rollnet.node.p2p.identity import b58encode, load_or_create_identity
from rollnet.node.units import eth_to_wei, format_eth

app = typer.Typer(help="Register this node (stake), inspect it, unbond and withdraw.", no_args_is_help=True)


def _registry(ctx: typer.Context, key: str, dev_account: int | None) -> RegistryClient:
    cli = get_context(ctx)
    client, deployment = cli.client(cli.signer(key, dev_account))
    return RegistryClient(client, deployment.registry)


@app.command()
def join(
    ctx: typer.Context,
    stake: str = typer.Option(..., "--stake", help="ETH to stake"),
    role: str = typer.Option("worker", "--role", help="worker or validator"),
    key: str = KeyOption,
    dev_account: int = DevAccountOption,
) -> None:
    """Register this node with its libp2p peer ID and stake ETH for a role."""
    parsed_role = Role.parse(role)
    stake_wei = eth_to_wei(stake, "--stake")
    registry = _registry(ctx, key, dev_account)
    address = registry.client.address
    minimum = registry.min_stake(parsed_role)
    if stake_wei < minimum:
        raise RollnetError(
            f"stake {format_eth(stake_wei)} is below the {parsed_role.name.lower()} minimum of {format_eth(minimum)}"
        )
    if registry.info(address).registered:
        raise RollnetError(f"{address} is already registered: see `rollnet node status`")
    balance = registry.client.balance(address)
    if balance < stake_wei:
        raise RollnetError(f"{address} holds {format_eth(balance)}, less than the stake {format_eth(stake_wei)}")
    identity = load_or_create_identity(get_context(ctx).data_dir)
    registry.join(identity.peer_id_bytes, parsed_role, stake_wei)
    console.print(
        f"joined as {parsed_role.name.lower()}: {address} staked {format_eth(stake_wei)}, peer {identity.peer_id}"
    )


@app.command()
def status(ctx: typer.Context, key: str = KeyOption, dev_account: int = DevAccountOption) -> None:
    """Show this node's registration, stake and wallet balance."""
    registry = _registry(ctx, key, dev_account)
    address = registry.client.address
    info = registry.info(address)
    table = Table(show_header=False, box=None)
    table.add_row("address", address)
    table.add_row("wallet", format_eth(registry.client.balance(address)))
    if not info.registered:
        table.add_row("registered", "no (run `rollnet node join --stake ETH`)")
        console.print(table)
        return
    roles = ", ".join(role.name.lower() for role in Role if role in info.roles)
    table.add_row("peer id", b58encode(info.peer_id))
    table.add_row("roles", roles)
    table.add_row("active stake", format_eth(info.active))
    table.add_row("unbonding", format_eth(info.unbonding))
    if info.unbonding:
        when = datetime.fromtimestamp(info.unbond_ready_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        table.add_row("withdrawable at", when)
    for role in Role:
        if role in info.roles:
            active = "yes" if registry.is_active(address, role) else "no (stake below minimum)"
            table.add_row(f"active {role.name.lower()}", active)
    console.print(table)


@app.command()
def unbond(
    ctx: typer.Context,
    amount: str = typer.Argument(..., help="ETH to move from active stake to unbonding"),
    key: str = KeyOption,
    dev_account: int = DevAccountOption,
) -> None:
    """Start unbonding AMOUNT ETH; it becomes withdrawable after the unbonding period."""
    amount_wei = eth_to_wei(amount, "AMOUNT")
    registry = _registry(ctx, key, dev_account)
    registry.request_unbond(amount_wei)
    info = registry.info(registry.client.address)
    wait = max(0, info.unbond_ready_at - int(time.time()))
    console.print(f"unbonding {format_eth(info.unbonding)}; withdrawable in {wait} s (`rollnet node withdraw`)")


@app.command()
def withdraw(ctx: typer.Context, key: str = KeyOption, dev_account: int = DevAccountOption) -> None:
    """Withdraw unbonded stake once the unbonding period has passed."""
    registry = _registry(ctx, key, dev_account)
    amount = registry.info(registry.client.address).unbonding
    registry.withdraw()
    console.print(f"withdrew {format_eth(amount)}")

"""`rollnet keys new|import|show`: encrypted eth-account keystores in the data directory.

Invariant: no command prints or logs a private key; `import` reads it from a hidden prompt or
ROLLNET_PRIVATE_KEY, never from argv (which other users can see in the process list).
"""

from __future__ import annotations

import os
import sys

import typer
from eth_account import Account
from rollnet.node import keys
from rollnet.node.cli.context import console, get_context, prompt_password
from rollnet.node.errors import KeystoreError

app = typer.Typer(help="Manage this node's Ethereum keys (encrypted keystores).", no_args_is_help=True)

NameOption = typer.Option(keys.DEFAULT_KEY_NAME, "--name", help="keystore name")


@app.command()
def new(ctx: typer.Context, name: str = NameOption) -> None:
    """Create a new random key, encrypted with a password."""
    data_dir = get_context(ctx).data_dir
    keys.keystore_path(data_dir, name)  # validates the name before asking for a password
    password = keys.password_from_env_or(prompt_password, confirm=True)
    account = keys.save_keystore(data_dir, name, Account.create().key, password)
    console.print(f"created key [bold]{name}[/] {account.address}")
    console.print(f"keystore: {keys.keystore_path(data_dir, name)}")


@app.command("import")
def import_key(ctx: typer.Context, name: str = NameOption) -> None:
    """Import a private key (from ROLLNET_PRIVATE_KEY or a hidden prompt) into an encrypted keystore."""
    data_dir = get_context(ctx).data_dir
    keys.keystore_path(data_dir, name)
    raw = os.environ.get(keys.PRIVATE_KEY_ENV)
    if raw is None:
        if not sys.stdin.isatty():
            raise KeystoreError(f"no private key: set {keys.PRIVATE_KEY_ENV} or run in a terminal")
        raw = typer.prompt("Private key (hex)", hide_input=True)
    try:
        private_key = Account.from_key(raw.strip()).key
    except (ValueError, TypeError):
        raise KeystoreError("that is not a valid private key (expected 32 bytes of hex)") from None
    password = keys.password_from_env_or(prompt_password, confirm=True)
    account = keys.save_keystore(data_dir, name, private_key, password)
    console.print(f"imported key [bold]{name}[/] {account.address}")


@app.command()
def show(ctx: typer.Context, name: str = NameOption) -> None:
    """Show a key's address and keystore path (never the key)."""
    data_dir = get_context(ctx).data_dir
    address = keys.keystore_address(data_dir, name)
    console.print(f"{name}\t{address}\t{keys.keystore_path(data_dir, name)}")

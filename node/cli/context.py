"""Options shared by every command (data dir, RPC URL, log level) and how commands get a client and key.

Invariant: a command that uses saved contract addresses always talks to a chain whose id matches the
deployment's; signer precedence is --dev-account, then ROLLNET_PRIVATE_KEY, then the keystore --key.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import typer
from eth_account.signers.local import LocalAccount
from rich.console import Console
from rollnet.node import keys
from rollnet.node.chain.client import ChainClient
from rollnet.node.cli import params
from rollnet.node.config import Deployment, resolve_data_dir, resolve_rpc_url
from rollnet.node.errors import KeystoreError


def make_console(stderr: bool = False) -> Console:
    """A console that wraps nothing: addresses and peer IDs must stay copyable even when piped."""
    probe = Console(stderr=stderr)
    return Console(stderr=stderr, soft_wrap=True, width=None if probe.is_terminal else 200)


console = make_console()

KeyOption = typer.Option(keys.DEFAULT_KEY_NAME, "--key", help="keystore name under <data-dir>/keys")
DevAccountOption = typer.Option(
    None, "--dev-account", help="use Anvil's funded dev account N (local devnets only)", **params.DEV_ACCOUNT
)


def prompt_password(confirm: bool) -> str:
    if not sys.stdin.isatty():
        raise KeystoreError(f"no password: set {keys.PASSWORD_ENV} or run in a terminal")
    return typer.prompt("Keystore password", hide_input=True, confirmation_prompt=confirm)


@dataclass
class CliContext:
    data_dir_option: Path | None
    rpc_url_option: str | None
    _data_dir: Path | None = field(default=None, init=False)

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            self._data_dir = resolve_data_dir(self.data_dir_option)
        return self._data_dir

    def deployment(self) -> Deployment:
        return Deployment.load(self.data_dir)

    def signer(self, key_name: str, dev_account: int | None) -> LocalAccount:
        if dev_account is not None:
            return keys.dev_account(dev_account)
        from_env = keys.account_from_env()
        if from_env is not None:
            return from_env
        if not keys.keystore_path(self.data_dir, key_name).exists():
            raise KeystoreError(
                f"no key named {key_name!r} in {self.data_dir / 'keys'}: run `rollnet keys new`"
                " (or pass --dev-account N on a local devnet)"
            )
        password = keys.password_from_env_or(prompt_password, confirm=False)
        return keys.load_keystore(self.data_dir, key_name, password)

    def client(self, account: LocalAccount | None = None) -> tuple[ChainClient, Deployment]:
        """A client for the saved deployment, on a chain whose id must match it."""
        deployment = self.deployment()
        url = resolve_rpc_url(self.rpc_url_option, self.data_dir)
        return ChainClient(url, account, expected_chain_id=deployment.chain_id), deployment


def get_context(ctx: typer.Context) -> CliContext:
    obj = ctx.find_root().obj
    assert isinstance(obj, CliContext)
    return obj


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

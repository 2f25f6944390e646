"""Ethereum keys: encrypted eth-account keystores in the data directory, or Anvil's dev accounts.

Invariants: a private key is never printed, logged or written unencrypted; keystore files are mode 0600
under `<data-dir>/keys/<name>.json`; the password comes from `ROLLNET_PASSWORD` or an interactive prompt.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from rollnet.node.chain.anvil import DEV_MNEMONIC
from rollnet.node.errors import KeystoreError

PASSWORD_ENV = "ROLLNET_PASSWORD"
PRIVATE_KEY_ENV = "ROLLNET_PRIVATE_KEY"
DEFAULT_KEY_NAME = "default"
# scrypt at n=2^15 decrypts in ~0.1 s: strong enough for a hot node key, quick enough for a CLI.
SCRYPT_N = 2**15

Account.enable_unaudited_hdwallet_features()

PasswordSource = Callable[[bool], str]


def keys_dir(data_dir: Path) -> Path:
    path = data_dir / "keys"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def keystore_path(data_dir: Path, name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise KeystoreError(f"invalid key name {name!r}: use letters, digits, - and _")
    return keys_dir(data_dir) / f"{name}.json"


def password_from_env_or(prompt: PasswordSource, confirm: bool) -> str:
    password = os.environ.get(PASSWORD_ENV)
    if password is None:
        password = prompt(confirm)
    if not password:
        raise KeystoreError(f"an empty password is not allowed (set {PASSWORD_ENV} or type one)")
    return password


def save_keystore(data_dir: Path, name: str, private_key: bytes | str, password: str) -> LocalAccount:
    path = keystore_path(data_dir, name)
    if path.exists():
        raise KeystoreError(f"key {name!r} already exists at {path}; choose another --name")
    account = Account.from_key(private_key)
    encrypted = Account.encrypt(account.key, password, kdf="scrypt", iterations=SCRYPT_N)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(encrypted, handle)
    return account


def keystore_address(data_dir: Path, name: str) -> str:
    path = keystore_path(data_dir, name)
    if not path.exists():
        raise KeystoreError(f"no key named {name!r} in {path.parent}: run `rollnet keys new`")
    try:
        raw_address = json.loads(path.read_text())["address"]
        return to_checksum_address("0x" + raw_address.removeprefix("0x"))
    except (json.JSONDecodeError, KeyError, ValueError) as exc:
        raise KeystoreError(f"{path} is not a keystore file") from exc


def load_keystore(data_dir: Path, name: str, password: str) -> LocalAccount:
    path = keystore_path(data_dir, name)
    if not path.exists():
        raise KeystoreError(f"no key named {name!r} in {path.parent}: run `rollnet keys new`")
    try:
        keystore = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise KeystoreError(f"{path} is not a keystore file") from exc
    try:
        return Account.from_key(Account.decrypt(keystore, password))
    except ValueError:
        raise KeystoreError(f"wrong password for key {name!r} ({path})") from None


def dev_account(index: int) -> LocalAccount:
    """Anvil's funded dev account `index` (public test mnemonic; devnets only)."""
    if not 0 <= index < 20:
        raise KeystoreError(f"dev account {index} does not exist: Anvil funds accounts 0-19")
    return Account.from_mnemonic(DEV_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}")


def account_from_env() -> LocalAccount | None:
    raw = os.environ.get(PRIVATE_KEY_ENV)
    if not raw:
        return None
    try:
        return Account.from_key(raw)
    except (ValueError, TypeError):
        raise KeystoreError(f"{PRIVATE_KEY_ENV} is not a valid private key") from None

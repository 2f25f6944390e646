"""What a command-line value may look like, checked in one place for every command while the line is parsed.

Invariant: a value whose *shape* is wrong (a port out of range, an amount that is not a non-negative number
of ETH, a non-address, a URL rollnet cannot dial, an unknown log level, a malformed multiaddr, a directory
where a file belongs or the reverse) is a usage error: exit 2 with click's usage line and one
`Error: Invalid value for '--opt': ...` line, raised before any command body runs, so it never reaches a
key, a file or the chain. Whether a well-formed value names something that exists (a spec file, a model
folder, a task, a key, a chain) is the command's runtime check: exit 1 with one `error:` line. Values come
out normalised: addresses EIP-55 checksummed, log levels lower-case, surrounding whitespace dropped.

Use: `typer.Option(..., callback=params.eth_amount, metavar="ETH")`, and `**params.INPUT_FILE` (or
INPUT_DIR, OUTPUT_FILE, STATE_DIR) on every `Path` parameter so its kind is declared.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import SplitResult, urlsplit

import multiaddr as multiaddr_lib
import typer
from eth_utils import is_checksum_address, to_checksum_address
from rollnet.node.spec import MAX_ETH
from rollnet.node.units import WEI_PER_ETH

LOG_LEVELS = ("debug", "info", "warning", "error")
RPC_SCHEMES = ("http", "https")
LATEST = "latest"
_HEX_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")

# Path kinds: typer refuses the wrong kind (a directory given as a file, or a file as a directory) at parse
# time; whether an input exists is for the code that reads it. `writable` marks outputs (state the command
# writes, created on demand); inputs are read.
INPUT_FILE: dict[str, Any] = {"file_okay": True, "dir_okay": False}
INPUT_DIR: dict[str, Any] = {"file_okay": False, "dir_okay": True}
OUTPUT_FILE: dict[str, Any] = {"file_okay": True, "dir_okay": False, "writable": True}
STATE_DIR: dict[str, Any] = {"file_okay": False, "dir_okay": True, "writable": True}


def _refuse(message: str) -> typer.BadParameter:
    return typer.BadParameter(message)


def eth_amount(value: str | None) -> str | None:
    """A non-negative amount of ETH with at most 18 decimals (1 wei), at most MAX_ETH."""
    if value is None:
        return None
    text = value.strip()
    try:
        amount = Decimal(text)
    except (InvalidOperation, ValueError):
        raise _refuse(f"{value!r} is not a number of ETH (examples: 10, 0.05)") from None
    if not amount.is_finite() or amount < 0:
        raise _refuse(f"{value!r} is not a non-negative number of ETH")
    if amount > MAX_ETH:
        raise _refuse(f"{value!r} ETH is more than exists (at most {MAX_ETH:,} ETH)")
    if (amount * WEI_PER_ETH) % 1:
        raise _refuse(f"{value!r} has more than 18 decimal places (1 wei is 1e-18 ETH)")
    return text


def address(value: str | None) -> str | None:
    """An Ethereum address in any case, returned checksummed; mixed case must carry a valid EIP-55 checksum."""
    if value is None:
        return None
    text = value.strip()
    if not _HEX_ADDRESS.fullmatch(text):
        raise _refuse(f"{value!r} is not an Ethereum address (0x followed by 40 hex digits)")
    digits = text[2:]
    if digits != digits.lower() and digits != digits.upper() and not is_checksum_address(text):
        raise _refuse(f"{value!r} has a wrong EIP-55 checksum (a typo?); all lower-case is accepted too")
    return to_checksum_address(text)


def address_or_latest(value: str | None) -> str | None:
    """`latest`, or an address as `address` accepts it."""
    if value is not None and value.strip().lower() == LATEST:
        return LATEST
    if value is not None and not value.strip().startswith("0x"):
        raise _refuse(f"{value!r} is neither an Ethereum address (0x + 40 hex digits) nor 'latest'")
    return address(value)


def rpc_url(value: str | None) -> str | None:
    """A JSON-RPC endpoint rollnet can dial: http:// or https:// with a host (and a valid port, if any)."""
    if value is None:
        return None
    text = value.strip()
    parts = _split_url(text)
    if parts is not None and parts.scheme in ("ws", "wss"):
        raise _refuse(f"{value!r}: rollnet speaks JSON-RPC over HTTP; give the node's http:// or https:// URL")
    if parts is None or parts.scheme not in RPC_SCHEMES or not parts.hostname or parts.port == 0:
        raise _refuse(f"{value!r} is not an http(s) URL with a host (example: http://127.0.0.1:8545)")
    return text


def _split_url(text: str) -> SplitResult | None:
    """The URL's parts, or None when its port is not a number in 0..65535."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - parsing the port raises ValueError when it is malformed
    except ValueError:
        return None
    return parts


def log_level(value: str) -> str:
    """One of LOG_LEVELS, any case."""
    level = value.strip().lower()
    if level not in LOG_LEVELS:
        raise _refuse(f"{value!r} is not a log level: choose one of {', '.join(LOG_LEVELS)}")
    return level


def multiaddr(value: str | None) -> str | None:
    """A libp2p multiaddr such as /ip4/127.0.0.1/tcp/4001."""
    if value is None:
        return None
    text = value.strip()
    try:
        if not text:
            raise ValueError("empty")
        multiaddr_lib.Multiaddr(text)
    except (ValueError, multiaddr_lib.exceptions.Error):
        raise _refuse(f"{value!r} is not a multiaddr (example: /ip4/127.0.0.1/tcp/4001)") from None
    return text


def bootstrap(values: list[str] | None) -> list[str]:
    """Each a multiaddr, or @FILE naming a file of them (which may appear later)."""
    checked = []
    for value in values or []:
        if value.startswith("@"):
            if not value[1:].strip():
                raise _refuse("'@' must be followed by a file name (@FILE)")
            checked.append(value)
        else:
            checked.append(multiaddr(value) or "")
    return checked


# Keyword arguments for typer.Option / typer.Argument, one per kind of value: `typer.Option("1", **ETH)`.
ETH: dict[str, Any] = {"callback": eth_amount, "metavar": "ETH"}
ADDRESS: dict[str, Any] = {"callback": address, "metavar": "ADDRESS"}
JOB: dict[str, Any] = {"callback": address_or_latest, "metavar": "ADDRESS|latest"}
URL: dict[str, Any] = {"callback": rpc_url, "metavar": "URL"}
LEVEL: dict[str, Any] = {"callback": log_level, "metavar": "LEVEL"}
MULTIADDR: dict[str, Any] = {"callback": multiaddr, "metavar": "MULTIADDR"}
BOOTSTRAP: dict[str, Any] = {"callback": bootstrap, "metavar": "MULTIADDR|@FILE"}
PORT: dict[str, Any] = {"min": 1, "max": 65535, "metavar": "PORT"}
DEV_ACCOUNT: dict[str, Any] = {"min": 0, "max": 19, "metavar": "N"}  # anvil funds dev accounts 0-19

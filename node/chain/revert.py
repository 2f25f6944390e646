"""Turn revert data from our contracts into one readable line.

Invariant: any revert whose selector is one of our custom errors decodes to its name and arguments;
wei amounts print in ETH and timestamps in UTC; unknown data still yields a message, never a traceback.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from eth_abi import decode as abi_decode
from eth_abi.exceptions import DecodingError
from eth_utils import is_address, to_checksum_address
from rollnet.node.chain.artifacts import error_abis
from rollnet.node.errors import ContractRevert

WEI_ARGUMENTS = {"minimum", "provided", "available", "needed", "requested", "active", "expected", "budget",
                 "leaseCost", "locked"}
TIME_ARGUMENTS = {"readyAt", "deadline", "expiredAt"}
ROLE_NAMES = {1: "worker", 2: "validator", 3: "worker or validator", 4: "trainer"}

# Sentences for the errors a user meets most; the rest print as Name(arg=value, ...).
TEMPLATES = {
    "StakeBelowMinimum": "stake {provided} is below the minimum of {minimum} for this role",
    "AlreadyRegistered": "{node} is already registered (see `rollnet node status`; add stake with a new key)",
    "NotRegistered": "{node} is not registered: run `rollnet node join --stake ETH` first",
    "InsufficientActiveStake": "this needs {requested} of free stake, but only {active} is free (the rest is "
                               "locked as lease collateral or unbonding)",
    "UnbondingNotFinished": "unbonding stake is not withdrawable until {readyAt}",
    "NothingToWithdraw": "nothing to withdraw: request an unbond first (`rollnet node unbond AMOUNT`)",
    "PeerIdTaken": "this libp2p peer ID is already registered to {owner}",
    "NotActive": "{account} is not an active, staked {role}",
    "InsufficientEscrow": "the job's free escrow {available} does not cover a lease of {needed}",
    "StalePolicy": "policy version {version} is too stale: current is {current}, max staleness {maxStaleness}",
    "BudgetTooSmall": "budget {budget} is smaller than one lease's pay {leaseCost}",
    "InvalidSpec": "job spec field {field} is invalid",
    "TimelineTooLong": "job timeline {timeline}s must be shorter than the unbonding period {unbondingPeriod}s",
    "PeerSignatureInvalid": "the peer ID's key did not sign this binding (chain, registry and address)",
    "UnsupportedPeerId": "the peer ID is not a libp2p secp256k1 key (rollnet identities are secp256k1)",
    "UnpublishedPolicy": "policy version {version} is not published yet: current is {current}",
    "VersionNotNext": "the next policy version is {current} + 1, not {proposed}",
    "SeedNotDrawn": "lease {leaseId} has no prompt seed yet: draw it first (drawSeed)",
    "RandomnessNotReady": "the randomness of block {blockNumber} is not known yet: wait for the next block",
    "RandomnessExpired": "the randomness of block {blockNumber} is older than 256 blocks and can no longer be drawn",
    "NotInCommittee": "{validator} is not on the committee of lease {leaseId}, round {round}",
    "FinalRound": "lease {leaseId} is in its final round: it can no longer be appealed",
    "WrongBond": "an appeal here posts exactly {expected}, not {provided}",
}


def format_eth(wei: int) -> str:
    text = format(Decimal(wei) / Decimal(10**18), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} ETH"


def _format_value(name: str, value: object) -> str:
    if name in WEI_ARGUMENTS and isinstance(value, int):
        return format_eth(value)
    if name in TIME_ARGUMENTS and isinstance(value, int):
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if name == "role" and isinstance(value, int):
        return ROLE_NAMES.get(value, str(value))
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, str) and is_address(value):
        return to_checksum_address(value)
    return str(value)


def decode_revert(data: str | bytes | None) -> ContractRevert:
    """Decode revert data into a ContractRevert carrying a readable message."""
    if isinstance(data, str):
        data = bytes.fromhex(data.removeprefix("0x")) if data.startswith("0x") else data.encode()
    if not data or len(data) < 4:
        return ContractRevert("the transaction reverted without a reason")
    abi = error_abis().get(bytes(data[:4]))
    if abi is None:
        return ContractRevert(f"the transaction reverted (unknown error 0x{data[:4].hex()})")
    names = [item["name"] for item in abi["inputs"]]
    types = [item["type"] for item in abi["inputs"]]
    try:
        values = abi_decode(types, bytes(data[4:]))
    except DecodingError:
        return ContractRevert(f"the transaction reverted with {abi['name']} (undecodable arguments)", abi["name"])
    args = dict(zip(names, values, strict=True))
    shown = {name: _format_value(name, value) for name, value in args.items()}
    template = TEMPLATES.get(abi["name"])
    if template:
        message = template.format(**shown)
    else:
        inner = ", ".join(f"{k}={v}" for k, v in shown.items())
        message = f"the contract refused: {abi['name']}({inner})"
    return ContractRevert(message, abi["name"], args)

"""ETH amounts typed by users, converted exactly to wei.

Invariant: conversion goes through Decimal, never float, so "0.1" is exactly 10**17 wei.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from rollnet.node.chain.revert import format_eth
from rollnet.node.errors import ConfigError

WEI_PER_ETH = 10**18

__all__ = ["eth_to_wei", "format_eth"]


def eth_to_wei(amount: str | int | float | Decimal, what: str = "amount") -> int:
    try:
        value = Decimal(str(amount))
    except InvalidOperation:
        raise ConfigError(f"{what} {amount!r} is not a number of ETH") from None
    if not value.is_finite() or value < 0:
        raise ConfigError(f"{what} must be a non-negative number of ETH, got {amount}")
    wei = value * WEI_PER_ETH
    if wei != wei.to_integral_value():
        raise ConfigError(f"{what} {amount} has more than 18 decimal places")
    return int(wei)

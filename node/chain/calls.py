"""Contract reads (`eth_call`) without web3's per-call machinery, answering exactly as web3's `call()` does.

web3 spends about 1 ms of CPU on every contract read in ABI lookup, argument validation and its request
middleware, around a JSON-RPC request that costs half that; every participant polls the chain, so that was a
visible part of a market's CPU. `fast_call` encodes the arguments with the function ABI web3 already resolved
when the call was built (`fn.abi`), sends one raw `eth_call`, and decodes and normalizes the result with web3's
own codec and return normalizers (checksummed addresses; one output unwrapped, several as a tuple).

Transactions use the same encoder (`fast_estimate`): the calldata is built once, and gas is estimated with one raw
`eth_estimateGas`; a refused estimate goes back to web3, whose revert decoding names the custom error.

Invariant: the result equals `fn.call(block_identifier=block)`, or `fast_call` returns `FALLBACK`, so the caller
asks web3 itself: whenever the node answers with an error (a revert, whose decoding stays web3's and
`rpc_errors`'; a revert so costs two requests), the answer does not decode, the arguments do not encode, or the
call uses keyword arguments or has no address.
"""

from __future__ import annotations

from typing import Any, Final

from eth_utils import abi_to_signature, function_abi_to_4byte_selector
from eth_utils.abi import get_abi_input_types, get_abi_output_types
from web3 import Web3
from web3._utils.abi import map_abi_data
from web3._utils.normalizers import BASE_RETURN_NORMALIZERS
from web3.contract.contract import ContractFunction

FALLBACK: Final = object()


class _Codec:
    __slots__ = ("selector", "inputs", "outputs")

    def __init__(self, abi: dict):
        self.selector = function_abi_to_4byte_selector(abi)
        self.inputs = get_abi_input_types(abi)
        self.outputs = get_abi_output_types(abi)


_codecs: dict[str, _Codec] = {}  # by the function's canonical signature, tuples expanded (it fixes both encodings)


def _codec(abi: dict) -> _Codec:
    key = abi_to_signature(abi)
    codec = _codecs.get(key)
    if codec is None or codec.outputs != get_abi_output_types(abi):
        codec = _codecs[key] = _Codec(abi)
    return codec


def call_data(w3: Web3, fn: object) -> bytes | None:
    """The calldata of a contract function call (selector and encoded arguments), as web3 would encode it; None
    for what this module leaves to web3 (a constructor, keyword arguments)."""
    abi = getattr(fn, "abi", None)
    if (not isinstance(fn, ContractFunction) or not abi or abi.get("type") != "function" or getattr(fn, "kwargs", None)
            or not getattr(fn, "address", None) or getattr(fn, "args", None) is None):
        return None
    codec = _codec(abi)
    try:
        return codec.selector + w3.codec.encode(codec.inputs, list(fn.args))
    except Exception:  # noqa: BLE001 - arguments web3 would refuse: let web3 refuse them, in its words
        return None


def fast_estimate(w3: Web3, fn: object, sender: str, value: int, block: str) -> tuple[bytes, int] | None:
    """(calldata, gas estimate) of sending `fn` from `sender` with `value` wei at `block`, or None where web3
    must estimate (see `call_data`; and any error answer, so a revert is decoded by web3 as before)."""
    data = call_data(w3, fn)
    if data is None:
        return None
    response = w3.provider.make_request("eth_estimateGas", [
        {"from": sender, "to": fn.address, "data": "0x" + data.hex(), "value": hex(value)}, block])  # type: ignore[attr-defined]
    result = response.get("result") if isinstance(response, dict) else None
    if "error" in response or not isinstance(result, str):
        return None
    return data, int(result, 16)


def fast_call(w3: Web3, fn: ContractFunction, block: int | str) -> Any:
    """`fn`'s result at `block`, or FALLBACK where only web3 can answer as web3 would (see the module)."""
    data = call_data(w3, fn)
    if data is None:
        return FALLBACK
    codec = _codec(fn.abi)
    response = w3.provider.make_request("eth_call", [{"to": fn.address, "data": "0x" + data.hex()},
                                                     hex(block) if isinstance(block, int) else block])
    result = response.get("result") if isinstance(response, dict) else None
    if "error" in response or not isinstance(result, str) or not result.startswith("0x"):
        return FALLBACK
    try:
        decoded = w3.codec.decode(codec.outputs, bytes.fromhex(result[2:]))
    except Exception:  # noqa: BLE001 - web3 raises its own error for data that does not decode
        return FALLBACK
    normalized = map_abi_data(BASE_RETURN_NORMALIZERS, codec.outputs, decoded)
    return normalized[0] if len(normalized) == 1 else normalized

"""Decoding a contract's event logs, fast: each event's topic and argument types are worked out once from the
ABI, and a log is decoded with one `eth_abi.decode` of its data and one per indexed topic.

Invariants: a decoded log is what web3's `process_log` gives for the same raw log (`event`, `args` by name,
addresses checksummed, `bytesN` as bytes, `blockNumber`, `logIndex`, `blockHash`, `transactionHash`), so every
follower can use either; a log whose topic is not one of the decoder's events is skipped, never guessed. An
event with an indexed dynamic argument (string, bytes, an array or a tuple: its topic is only a hash of the
value) is refused when the decoder is built, never decoded into a wrong value. Web3's decoder
hashes the event signature again for every log, which made decoding the cost that grew with a market's size
when every participant followed every event (bench/scale.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from eth_abi import decode
from eth_utils import keccak
from web3 import Web3


@dataclass(frozen=True)
class EventShape:
    name: str
    indexed: tuple[tuple[str, str], ...]  # (argument, type) of the indexed arguments, in topic order
    data: tuple[tuple[str, str], ...]  # (argument, type) of the arguments in the data, in order


def event_topic(abi: dict) -> bytes:
    """keccak256 of the event's canonical signature, e.g. Voted(uint256,uint256,address,bool,uint256)."""
    return keccak(text=f"{abi['name']}({','.join(item['type'] for item in abi['inputs'])})")


@lru_cache(maxsize=4096)
def checksummed(address: str) -> str:
    return Web3.to_checksum_address(address)


class EventDecoder:
    """Decodes the logs of the named events of one contract ABI."""

    def __init__(self, abi: list[dict], events: list[str]):
        self.shapes: dict[bytes, EventShape] = {}
        wanted = set(events)
        for item in abi:  # every overload of a wanted name (a contract and a base may both declare `Initialized`)
            if item.get("type") != "event" or item["name"] not in wanted:
                continue
            name = item["name"]
            hashed = [i["name"] for i in item["inputs"] if i["indexed"] and _hashed_in_topic(i["type"])]
            if hashed:
                raise ValueError(f"event {name}: indexed {', '.join(hashed)} hashed in the topics, cannot be decoded")
            self.shapes[event_topic(item)] = EventShape(
                name,
                tuple((i["name"], i["type"]) for i in item["inputs"] if i["indexed"]),
                tuple((i["name"], i["type"]) for i in item["inputs"] if not i["indexed"]))

    @property
    def topics(self) -> list[str]:
        return ["0x" + topic.hex() for topic in self.shapes]

    def decode(self, log: Any) -> dict | None:
        topics = [bytes(topic) for topic in log["topics"]]
        shape = self.shapes.get(topics[0]) if topics else None
        if shape is None or len(topics) != len(shape.indexed) + 1:
            return None
        args: dict[str, Any] = {}
        for (name, kind), topic in zip(shape.indexed, topics[1:], strict=True):
            args[name] = _typed(kind, decode([kind], topic)[0])
        values = decode([kind for _, kind in shape.data], bytes(log["data"])) if shape.data else ()
        for (name, kind), value in zip(shape.data, values, strict=True):
            args[name] = _typed(kind, value)
        return {"event": shape.name, "args": args, "blockNumber": log["blockNumber"], "logIndex": log["logIndex"],
                "blockHash": log.get("blockHash"), "transactionHash": log["transactionHash"]}


def _hashed_in_topic(kind: str) -> bool:
    """Whether an indexed argument of this ABI type is stored as the keccak of its encoding, not its value."""
    return kind in ("string", "bytes") or kind.endswith("]") or kind.startswith("tuple")


def _typed(kind: str, value: Any) -> Any:
    return checksummed(value) if kind == "address" else value

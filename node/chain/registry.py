"""Typed access to NodeRegistry: join, stake, unbond, withdraw, and who a peer ID belongs to.

Invariant: amounts are wei ints; a refused call raises ContractRevert (decoded) before any gas is spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntFlag

from rollnet.node.chain.client import ChainClient
from rollnet.node.errors import RollnetError
from web3.types import TxReceipt


class Role(IntFlag):
    WORKER = 1
    VALIDATOR = 2

    @classmethod
    def parse(cls, name: str) -> Role:
        try:
            return cls[name.upper()]
        except KeyError:
            raise RollnetError(f"unknown role {name!r}: use worker or validator") from None


@dataclass(frozen=True)
class NodeInfo:
    address: str
    peer_id: bytes
    roles: Role
    active: int
    unbonding: int
    unbond_ready_at: int

    @property
    def registered(self) -> bool:
        return self.roles != 0


class RegistryClient:
    def __init__(self, client: ChainClient, address: str):
        self.client = client
        self.contract = client.contract("NodeRegistry", address)

    def min_stake(self, role: Role) -> int:
        return self.client.call(self.contract.functions.minStakeFor(int(role)))

    def unbonding_period(self) -> int:
        return self.client.call(self.contract.functions.unbondingPeriod())

    def info(self, address: str) -> NodeInfo:
        peer_id, roles, active, unbonding, ready_at = self.client.call(self.contract.functions.nodeInfo(address))
        return NodeInfo(address, bytes(peer_id), Role(roles), active, unbonding, ready_at)

    def is_active(self, address: str, role: Role) -> bool:
        return self.client.call(self.contract.functions.isActive(address, int(role)))

    def owner_of_peer(self, peer_id: bytes) -> str | None:
        owner = self.client.call(self.contract.functions.ownerOfPeer(peer_id))
        return None if int(owner, 16) == 0 else owner

    def join(self, peer_id: bytes, roles: Role, stake_wei: int) -> TxReceipt:
        return self.client.transact(self.contract.functions.join(peer_id, int(roles)), value=stake_wei)

    def add_stake(self, amount_wei: int) -> TxReceipt:
        return self.client.transact(self.contract.functions.addStake(), value=amount_wei)

    def request_unbond(self, amount_wei: int) -> TxReceipt:
        return self.client.transact(self.contract.functions.requestUnbond(amount_wei))

    def withdraw(self) -> TxReceipt:
        return self.client.transact(self.contract.functions.withdraw())

    def set_listen_addrs(self, addrs: list[str]) -> TxReceipt:
        """Publish where this node's libp2p host listens (multiaddrs without /p2p/)."""
        return self.client.transact(self.contract.functions.setAddrs("\n".join(addrs).encode()))

    def listen_addrs(self, address: str) -> list[str]:
        raw = self.client.call(self.contract.functions.listenAddrs(address))
        return [line for line in bytes(raw).decode(errors="replace").split("\n") if line]

    def registered_addresses(self, from_block: int = 0) -> list[str]:
        """Every address that ever joined, in join order (from NodeJoined events)."""
        events = self.client.events(self.contract, "NodeJoined", from_block)
        return list(dict.fromkeys(event["args"]["node"] for event in events))

    def totals(self) -> tuple[int, int]:
        return (
            self.client.call(self.contract.functions.totalActive()),
            self.client.call(self.contract.functions.totalUnbonding()),
        )

"""Typed access to NodeRegistry: join (proving the peer ID), stake, unbond, withdraw, who a peer ID belongs to,
and validator weights.

Invariants: amounts are wei ints; a refused call raises ContractRevert (decoded) before any gas is spent;
`join` and `set_peer_id` always carry the peer key's signature of the registry's own binding hash, so the
binding is exactly the one the contract verifies.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import IntFlag

from rollnet.node.chain.client import ChainClient
from rollnet.node.errors import RollnetError
from rollnet.node.p2p.identity import PeerIdentity
from web3.types import TxReceipt


class Role(IntFlag):
    WORKER = 1
    VALIDATOR = 2
    TRAINER = 4  # a job's trainer: a proven peer identity, no stake

    @classmethod
    def parse(cls, name: str) -> Role:
        if name.lower() not in ("worker", "validator"):
            raise RollnetError(f"unknown role {name!r}: use worker or validator")
        return cls[name.upper()]


STAKED_ROLES = (Role.WORKER, Role.VALIDATOR)


@dataclass(frozen=True)
class NodeInfo:
    address: str
    peer_id: bytes
    roles: Role
    active: int  # free stake
    locked: int  # lease collateral
    unbonding: int
    unbond_ready_at: int

    @property
    def registered(self) -> bool:
        return self.roles != 0


@dataclass(frozen=True)
class Join:
    """A registration as its NodeJoined event states it."""
    node: str
    roles: Role
    stake: int
    block: int

    @property
    def staked(self) -> bool:
        return bool(self.roles & (Role.WORKER | Role.VALIDATOR)) and self.stake > 0


class RegistryClient:
    def __init__(self, client: ChainClient, address: str):
        self.client = client
        self.contract = client.contract("NodeRegistry", address)
        self._joins_lock = threading.Lock()
        self._joins: dict[str, Join] = {}
        self._joins_from: int | None = None
        self._joins_read_to = -1

    def min_stake(self, role: Role) -> int:
        return self.client.call(self.contract.functions.minStakeFor(int(role)))

    def unbonding_period(self) -> int:
        return self.client.call(self.contract.functions.unbondingPeriod())

    def info(self, address: str) -> NodeInfo:
        peer_id, roles, active, locked, unbonding, ready_at = self.client.call(
            self.contract.functions.nodeInfo(address))
        return NodeInfo(address, bytes(peer_id), Role(roles), active, locked, unbonding, ready_at)

    def is_staked(self, address: str) -> bool:
        """Whether `address` is an active worker or validator (holds the minimum stake of a staked role)."""
        return any(self.is_active(address, role) for role in STAKED_ROLES)

    def is_active(self, address: str, role: Role) -> bool:
        return self.client.call(self.contract.functions.isActive(address, int(role)))

    def owner_of_peer(self, peer_id: bytes) -> str | None:
        owner = self.client.call(self.contract.functions.ownerOfPeer(peer_id))
        return None if int(owner, 16) == 0 else owner

    def binding_signature(self, peer: PeerIdentity, address: str | None = None) -> bytes:
        """`peer`'s signature binding its peer ID to `address` (default: this client's) in this registry."""
        binding = self.client.call(self.contract.functions.peerBindingHash(address or self.client.address))
        return peer.sign_binding(bytes(binding))

    def join(self, peer: PeerIdentity, roles: Role, stake_wei: int) -> TxReceipt:
        """Register this client's address with `peer`'s peer ID (proven by its signature) and stake."""
        signature = self.binding_signature(peer)
        return self.client.transact(self.contract.functions.join(peer.peer_id_bytes, signature, int(roles)),
                                    value=stake_wei)

    def set_peer_id(self, peer: PeerIdentity) -> TxReceipt:
        """Rotate this address's peer ID to `peer`'s (proven by its signature)."""
        signature = self.binding_signature(peer)
        return self.client.transact(self.contract.functions.setPeerId(peer.peer_id_bytes, signature))

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

    def joins(self, from_block: int = 0) -> list[Join]:
        """Every registration since `from_block`, in join order, one per address (its first NodeJoined event).
        The one reader of the registry's joins: read in bounded ranges (`ChainClient.log_ranges`), and
        incrementally, so listing again reads only the blocks the last listing did not."""
        with self._joins_lock:
            if self._joins_from is None or from_block < self._joins_from:
                self._joins, self._joins_from, self._joins_read_to = {}, from_block, from_block - 1
            head = self.client.block_number()
            for _, logs in self.client.log_ranges(self.contract, ["NodeJoined"], self._joins_read_to + 1, head):
                for log in logs:
                    args = log["args"]
                    self._joins.setdefault(args["node"], Join(args["node"], Role(args["roles"]), args["stake"],
                                                              log["blockNumber"]))
            self._joins_read_to = max(self._joins_read_to, head)
            return [join for join in self._joins.values() if join.block >= from_block]

    def registered_addresses(self, from_block: int = 0, staked_only: bool = False) -> list[str]:
        """Every address that ever joined, in join order; with `staked_only`, those that joined as a worker or
        validator with stake (what a join event says: no further reads)."""
        return [join.node for join in self.joins(from_block) if not staked_only or join.staked]

    def totals(self) -> tuple[int, int, int]:
        """(active, locked, unbonding) over every node."""
        return (
            self.client.call(self.contract.functions.totalActive()),
            self.client.call(self.contract.functions.totalLocked()),
            self.client.call(self.contract.functions.totalUnbonding()),
        )

    def weight_at(self, address: str, block: int) -> int:
        """`address`'s validator weight at the end of a past block (0 if none)."""
        return self.client.call(self.contract.functions.weightAt(address, block))

    def total_weight_at(self, block: int) -> int:
        """All validators' weight at the end of a past block."""
        return self.client.call(self.contract.functions.totalValidatorWeightAt(block))

    def current_weights(self, address: str) -> tuple[int, int]:
        """(this validator's weight, all validators' weight) now."""
        weight, total = self.client.call(self.contract.functions.currentWeights(address))
        return weight, total

"""One participant bootstrap shared by every role (worker, validator, trainer): the data directory's libp2p
identity checked against the peer ID the registry binds to this address, a libp2p host behind the stake
gate, its listen address published on chain, and its first connections.

Invariants: a participant starts only if the registry binds this address to exactly this data directory's
peer ID (registered with the key's own signature), so peers that look it up find the host they dial; its
host admits to protected protocols only peers staked as workers or validators, or the job's trainer; it
dials only configured addresses and registry-published addresses of staked nodes and of the job's trainer.
Every role that holds anchor checkpoints serves them to its peers the same way (`serve_anchors`): the trainer
its published anchors, a worker or validator the anchor it started from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollnet.node.chain.job import JobClient
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import RollnetError
from rollnet.node.p2p.anchors import AnchorServer, model_files
from rollnet.node.p2p.bootstrap import registry_bootstrap_addrs, resolve_bootstrap, transport_addr
from rollnet.node.p2p.gate import PeerGate
from rollnet.node.p2p.host import P2PNode
from rollnet.node.p2p.identity import PeerIdentity, b58encode, load_or_create_identity
from rollnet.node.p2p.objects import ObjectStore


@dataclass
class Participant:
    identity: PeerIdentity
    node: P2PNode
    gate: PeerGate
    address: str  # the dialable multiaddr, ending in /p2p/<peer id>


def require_registered_peer(registry: RegistryClient, identity: PeerIdentity) -> None:
    """Refuse to run unless this address is registered with this identity's peer ID."""
    address = registry.client.address
    info = registry.info(address)
    if not info.registered:
        raise RollnetError(f"{address} is not registered: run `rollnet node join --stake ETH` first")
    if info.peer_id != identity.peer_id_bytes:
        raise RollnetError(f"{address} is registered with peer {b58encode(info.peer_id)}, but this data directory's "
                           f"libp2p key is {identity.peer_id}: use the data directory you joined with, or bind "
                           "this key with `rollnet node rotate-peer`")


def register_trainer(registry: RegistryClient, identity: PeerIdentity) -> bool:
    """Register the trainer's peer ID (the trainer role carries no stake) unless already registered; True if it
    registered now."""
    if registry.info(registry.client.address).registered:
        return False
    registry.join(identity, Role.TRAINER, 0)
    return True


def start_participant(registry: RegistryClient, job: JobClient, data_dir: Path, objects_dir: Path, *,
                      listen: str, advertise: str | None = None, bootstrap: list[str] | None = None,
                      upload_rate: float | None = None, registry_peers: int = 64) -> Participant:
    """Start this address's host (see the module's invariants) and dial `bootstrap` plus up to `registry_peers`
    staked nodes the registry lists (0: none; a node that only serves may wait to be dialed)."""
    identity = load_or_create_identity(data_dir)
    require_registered_peer(registry, identity)
    trainer = job.spec().trainer
    gate = PeerGate(registry, trusted_owners={trainer})
    node = P2PNode(identity, ObjectStore(objects_dir), gate=gate, listen=listen, upload_rate=upload_rate).start()
    try:
        base = transport_addr(advertise or node.addr)
        registry.set_listen_addrs([base])
        node.connect(resolve_bootstrap(bootstrap or [])
                     + registry_bootstrap_addrs(registry, exclude={node.peer_id}, also={trainer},
                                                limit=registry_peers))
    except BaseException:
        node.stop()
        raise
    return Participant(identity, node, gate, f"{base}/p2p/{node.peer_id}")


def serve_anchors(node: P2PNode, job: str, store: PolicyStore, model: Any, tokenizer: Any) -> AnchorServer:
    """Offer the anchors in `store` to peers (p2p.anchors), with the config, generation config and tokenizer
    of the model this participant runs, so a late joiner can start from them."""
    server = AnchorServer(job, store, node.store, model_files(model, tokenizer))
    node.anchor_source = server.answer
    return server

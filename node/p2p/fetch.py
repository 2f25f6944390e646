"""Fetching a submitted batch over libp2p (validators and the trainer): from the worker's registered peer.

Invariant: the bytes returned are exactly those whose object root was requested (the transfer protocol
checks every chunk against the manifest of that root); a worker that cannot be reached or does not serve
the root within the deadline (no chunk for `timeout_s`, or slower on average than `min_rate` after that much
grace), or whose manifest declares more bytes than the job's batches can take, yields None, which the checks
turn into a rejection, never a hang.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rollnet.node.chain.job import ChainSpec
from rollnet.node.chain.registry import RegistryClient
from rollnet.node.p2p.host import P2PNode
from rollnet.node.p2p.identity import b58encode
from rollnet.node.rollout.submission import max_submission_bytes

log = logging.getLogger(__name__)

Fetcher = Callable[[bytes, str], bytes | None]  # (root, worker address) -> the bytes, or None if unavailable


BATCH_MIN_RATE = 16 * 1024  # bytes/s a worker must average serving its batch (after the timeout's grace)


def p2p_fetcher(node: P2PNode, registry: RegistryClient, timeout_s: float = 20.0,
                min_rate: float = BATCH_MIN_RATE, max_bytes: int | None = None) -> Fetcher:
    """Fetch batches from their workers' registered peers; a manifest declaring more than `max_bytes` (the most an
    honest batch of the job can take: `max_submission_bytes`) is refused before anything is stored."""
    def fetch(root: bytes, worker: str) -> bytes | None:
        if node.store.complete(root):
            return node.store.read(root)
        try:
            peer = b58encode(registry.info(worker).peer_id)
            if peer not in node.connected_peers():
                node.connect([addr if "/p2p/" in addr else f"{addr.rstrip('/')}/p2p/{peer}"
                              for addr in registry.listen_addrs(worker)])
            node.fetch(root, [peer], timeout=timeout_s, min_rate=min_rate, max_size=max_bytes)
            return node.store.read(root)
        except Exception as exc:  # noqa: BLE001 - any failure to obtain the data is "unavailable"
            log.info("could not fetch %s from %s: %s", root.hex()[:16], worker, exc)
            return None

    return fetch


def batch_fetcher(node: P2PNode, registry: RegistryClient, spec: ChainSpec) -> Fetcher:
    """The fetcher validators and the trainer use for a job's batches: `p2p_fetcher` bounded by the most bytes an
    honest batch of `spec` can take."""
    return p2p_fetcher(node, registry, max_bytes=max_submission_bytes(spec.rollouts_per_lease, spec.max_new_tokens))

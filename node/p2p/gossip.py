"""Gossip that survives any bytes: py-libp2p's Pubsub with its per-peer reader and forwarder contained.

py-libp2p 0.8.1 lets a protobuf DecodeError (e.g. `0a ff ff ff ff ff ff ff ff ff ff` on /meshsub/1.1.0)
escape `Pubsub.continuously_read_stream`, which ends the whole trio run, and with it every protocol of the
node. Invariant: whatever a remote peer sends on a gossip stream, the only consequences are that this one
stream is reset, the peer is dropped from the router's tables, and one fault is reported against the peer
(`on_fault`); the host and every other peer's streams keep running. Messages this node publishes itself are
not contained: a failure there is the caller's to see.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from libp2p.peer.id import ID
from libp2p.pubsub.pubsub import Pubsub

log = logging.getLogger(__name__)

FaultReporter = Callable[[ID, str], None]


class ContainedPubsub(Pubsub):
    """A Pubsub whose handling of remote input cannot raise past one peer's stream."""

    def __init__(self, host: Any, router: Any, *, on_fault: FaultReporter, **options: Any):
        super().__init__(host, router, **options)
        self._on_fault = on_fault

    async def continuously_read_stream(self, stream: Any) -> None:
        peer = stream.muxed_conn.peer_id
        try:
            await super().continuously_read_stream(stream)
        except Exception as exc:  # noqa: BLE001 - a malformed RPC is the sender's fault, never the host's
            log.info("gossip from %s dropped: %s: %s", peer, type(exc).__name__, exc)
            self._on_fault(peer, f"gossip:{type(exc).__name__}")
            await _reset_quietly(stream)
            try:
                self._handle_dead_peer(peer)
            except Exception:  # noqa: BLE001 - the peer may already be gone from the tables
                pass

    async def push_msg(self, msg_forwarder: ID, msg: Any) -> None:
        if msg_forwarder == self.my_id:
            await super().push_msg(msg_forwarder, msg)
            return
        try:
            await super().push_msg(msg_forwarder, msg)
        except Exception as exc:  # noqa: BLE001 - a forwarded message that breaks validation costs its sender
            log.info("gossip message from %s dropped: %s: %s", msg_forwarder, type(exc).__name__, exc)
            self._on_fault(msg_forwarder, f"gossip-message:{type(exc).__name__}")


async def _reset_quietly(stream: Any) -> None:
    try:
        await stream.reset()
    except Exception:  # noqa: BLE001 - the stream may already be closed
        pass

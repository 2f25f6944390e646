"""Yamux with bounded receive buffers: a peer that ignores flow control loses its connection, not our memory.

py-libp2p 0.8.1's yamux appends every DATA frame to the stream's buffer and only logs when a peer sends past
the receive window it was given, so a peer that ignores windows can park any amount of memory in us, on any
stream (identify, ping and gossip included, none of which the stake gate covers). Invariants: our advertised
window per stream is at most MAX_WINDOW (module constant of py-libp2p, lowered here); a stream's unread
buffer never holds more than BUFFER_LIMIT bytes: the frame that would exceed it is dropped, the connection
is closed, and the callback the host's trio run installed is told (the host counts a fault). A peer that
honours the windows we advertise never reaches the limit. Every yamux connection in the process is a
BoundedYamux, because py-libp2p constructs yamux connections itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.stream_muxer import muxer_multistream
from libp2p.stream_muxer.yamux import yamux as yamux_module
from libp2p.stream_muxer.yamux.yamux import Yamux

MAX_WINDOW = 2 * 1024 * 1024
BUFFER_LIMIT = 2 * MAX_WINDOW + 64 * 1024
# Read at call time by py-libp2p: caps the window we grow to (16 MiB otherwise) and the largest frame accepted.
yamux_module.MAX_WINDOW_SIZE = min(yamux_module.MAX_WINDOW_SIZE, MAX_WINDOW)
log = logging.getLogger(__name__)


class _BoundedBuffer(bytearray):
    """A stream's receive buffer that refuses to grow past BUFFER_LIMIT."""

    owner: BoundedYamux | None = None

    def extend(self, data: Any) -> None:
        if len(self) + len(data) > BUFFER_LIMIT:
            if self.owner is not None:
                self.owner.overflowed()
            return
        super().extend(data)


class _BoundedBuffers(dict):
    """Wraps every buffer yamux stores so its growth is checked."""

    def __init__(self, owner: BoundedYamux):
        super().__init__()
        self.owner = owner

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(value, _BoundedBuffer):
            bounded = _BoundedBuffer(value)
            bounded.owner = self.owner
            value = bounded
        super().__setitem__(key, value)


_ON_OVERFLOW: trio.lowlevel.RunVar = trio.lowlevel.RunVar("rollnet_yamux_on_overflow", default=None)


class BoundedYamux(Yamux):
    """Yamux whose per-stream buffers are bounded; overflows go to the callback its trio run installed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stream_buffers = _BoundedBuffers(self)
        self._overflowed = False

    def overflowed(self) -> None:
        if self._overflowed:
            return
        self._overflowed = True
        log.info("peer %s sent past its yamux window; closing the connection", self.peer_id)
        on_overflow = _ON_OVERFLOW.get()
        if on_overflow is not None:
            on_overflow(self.peer_id)
        trio.lowlevel.spawn_system_task(self._close_quietly)

    async def _close_quietly(self) -> None:
        with trio.move_on_after(3):
            try:
                await self.close()
            except Exception:  # noqa: BLE001 - the connection may already be going
                pass


def install(on_overflow: Callable[[ID], None]) -> None:
    """Route this trio run's overflows to `on_overflow` (each host runs in its own trio run)."""
    _ON_OVERFLOW.set(on_overflow)


# py-libp2p 0.8.1 ignores the muxer class it is given for yamux's protocol id and constructs
# `muxer_multistream.Yamux` itself: that name is where the bounded class has to go.
muxer_multistream.Yamux = BoundedYamux

"""Which peers hold which objects, learned from authorized `have` announcements.

Invariant: a peer is listed for a root only after a `have` envelope for it passed signature, replay and
authorization checks (its signer owns that peer ID on chain); lists are bounded per root.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from rollnet.node.p2p.envelopes import Have

MAX_PROVIDERS = 64


class ProviderDirectory:
    def __init__(self) -> None:
        self._providers: dict[str, OrderedDict[str, bool]] = {}
        self._lock = threading.Lock()

    def observe(self, body: Have) -> None:
        with self._lock:
            peers = self._providers.setdefault(body.root, OrderedDict())
            peers[body.peer_id] = body.complete
            peers.move_to_end(body.peer_id)
            while len(peers) > MAX_PROVIDERS:
                peers.popitem(last=False)

    def providers(self, root: bytes) -> list[str]:
        """Newest announcements first; complete holders before partial ones."""
        with self._lock:
            peers = self._providers.get(root.hex(), OrderedDict())
            ordered = list(reversed(peers.items()))
        return [peer for peer, complete in ordered if complete] + [peer for peer, complete in ordered if not complete]

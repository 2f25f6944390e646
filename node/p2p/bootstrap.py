"""Where to find peers: configured multiaddrs, or the chain's registry of staked nodes.

Invariant: a registry-derived address always ends in /p2p/<the peer ID registered on chain>, so dialing it
authenticates exactly the registered identity (Noise fails otherwise); nodes without active worker or
validator stake (unless named in `also`, like the job's trainer) or without published listen addresses
are skipped; only the listed transports are used, nothing is discovered on
the local network (no mDNS). Its chain reads are bounded however many nodes ever registered: at most
`CHECKED_PER_PEER` x `limit` registrations are looked at, the newest first (plus those in `also`).
"""

from __future__ import annotations

import time
from pathlib import Path

from rollnet.node.chain.registry import RegistryClient
from rollnet.node.errors import ConfigError
from rollnet.node.p2p.identity import b58encode

CHECKED_PER_PEER = 4  # registrations looked at per peer wanted: a market of thousands costs a fixed start-up


def registry_bootstrap_addrs(registry: RegistryClient, *, from_block: int = 0, exclude: set[str] | None = None,
                             also: set[str] | None = None, limit: int = 64) -> list[str]:
    """Dialable multiaddrs of up to `limit` staked nodes (and of the addresses in `also`) that published listen
    addresses, looking at the newest registrations first and at no more than `CHECKED_PER_PEER` x `limit`."""
    if limit <= 0:
        return []
    out: list[str] = []
    also = {a.lower() for a in also or ()}
    registered = registry.registered_addresses(from_block)[::-1]
    candidates = [a for a in registered if a.lower() in also] + [a for a in registered if a.lower() not in also]
    for address in candidates[:len(also) + CHECKED_PER_PEER * limit]:
        info = registry.info(address)
        if not info.registered or not (address.lower() in also or registry.is_staked(address)):
            continue
        peer_id = b58encode(info.peer_id)
        if exclude and peer_id in exclude:
            continue
        out += [f"{addr.rstrip('/')}/p2p/{peer_id}" for addr in registry.listen_addrs(address)
                if addr.startswith("/") and "/p2p/" not in addr]
        if len(out) >= limit:
            break
    return out[:limit]


def transport_addr(multiaddr_with_peer: str) -> str:
    """A host's listen address without its /p2p/ suffix (what goes on chain)."""
    return multiaddr_with_peer.split("/p2p/")[0]


def resolve_bootstrap(values: list[str], wait_s: float = 120.0) -> list[str]:
    """Multiaddrs from the command line; `@FILE` reads them from a file (one per line), waiting up to `wait_s`
    for it to appear (a trainer container writes its address there when it starts listening)."""
    out: list[str] = []
    for value in values:
        if not value.startswith("@"):
            out.append(value)
            continue
        path = Path(value[1:])
        deadline = time.monotonic() + wait_s
        while not path.exists():
            if time.monotonic() > deadline:
                raise ConfigError(f"bootstrap file {path} did not appear within {wait_s:.0f} s")
            time.sleep(0.5)
        out += [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return out

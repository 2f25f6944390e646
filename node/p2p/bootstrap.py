"""Where to find peers: configured multiaddrs, or the chain's registry of staked nodes.

Invariant: a registry-derived address always ends in /p2p/<the peer ID registered on chain>, so dialing it
authenticates exactly the registered identity (Noise fails otherwise); nodes without active worker or
validator stake (unless named in `also`, like the job's trainer) or without published listen addresses
are skipped; only the listed transports are used, nothing is discovered on
the local network (no mDNS). Its chain reads are bounded however many nodes ever registered: at most
`CHECKED_PER_PEER` x `limit` registrations with stake are looked at (plus those in `also`), half the newest and
half drawn from the rest, taken in turn (the peers found come from both halves), and a peer counts once however
many addresses it lists.
"""

from __future__ import annotations

import random
import time
from itertools import zip_longest
from pathlib import Path

from rollnet.node.chain.registry import RegistryClient
from rollnet.node.errors import ConfigError
from rollnet.node.p2p.identity import b58encode

CHECKED_PER_PEER = 4  # registrations looked at per peer wanted: a market of thousands costs a fixed start-up
ADDRS_PER_PEER = 2  # a peer's listen addresses dialed at most (a long list cannot fill the peers wanted)


def registry_bootstrap_addrs(registry: RegistryClient, *, from_block: int = 0, exclude: set[str] | None = None,
                             also: set[str] | None = None, limit: int = 64,
                             rng: random.Random | None = None) -> list[str]:
    """Dialable multiaddrs of up to `limit` peers: the addresses in `also`, then staked nodes that published
    listen addresses. It looks at no more than `CHECKED_PER_PEER` x `limit` registrations of nodes that joined
    with stake: half the newest, half drawn at random from the older ones, taken in turn, so neither a burst of
    fresh registrations nor an old majority decides whom a new node meets."""
    if limit <= 0:
        return []
    rng = rng or random.Random()
    also = {a.lower() for a in also or ()}
    joins = registry.joins(from_block)
    staked = [join.node for join in joins[::-1] if join.staked and join.node.lower() not in also]
    trusted = [join.node for join in joins if join.node.lower() in also]
    window = CHECKED_PER_PEER * limit
    newest, older = staked[:window // 2], staked[window // 2:]
    drawn = rng.sample(older, min(len(older), window - len(newest)))
    candidates = trusted + [a for pair in zip_longest(newest, drawn) for a in pair if a is not None]
    out: list[str] = []
    peers = 0
    for address in candidates:
        info = registry.info(address)
        if not info.registered or not (address.lower() in also or registry.is_staked(address)):
            continue
        peer_id = b58encode(info.peer_id)
        if exclude and peer_id in exclude:
            continue
        addrs = [f"{addr.rstrip('/')}/p2p/{peer_id}" for addr in registry.listen_addrs(address)
                 if addr.startswith("/") and "/p2p/" not in addr][:ADDRS_PER_PEER]
        if addrs:
            out += addrs
            peers += 1
        if peers >= limit:
            break
    return out


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

"""Fuzzing every protocol a host answers, from a real second libp2p host, against a victim in its own process.

Bounded by counts (fixed seeds), not by time. After each protocol's barrage the victim must still be up,
never restarted, and serve an honest fetch; across 1,000 malformed, oversized and half-sent requests its
RSS and open file descriptors stay flat (within 10%)."""

from __future__ import annotations

import json
import random
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from rollnet.node.p2p.host import P2PNode
from rollnet.node.p2p.objects import CHUNK_SIZE
from rollnet.node.p2p.standalone import send_raw
from test_p2p_robustness import KILLER, Peers, Victim

PER_PROTOCOL = 60
FLAT_REQUESTS = 1000


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def json_frame(value: object) -> bytes:
    return frame(json.dumps(value).encode())


def structured(rng: random.Random, root: str) -> list[tuple[bytes, bool]]:
    """Payloads that parse part of the way: (bytes, reset after sending)."""
    big = rng.choice([2 ** 31, 2 ** 32 - 1, 1 << 30])
    return [
        (json_frame({"op": "chunks", "root": root, "index": [0] * 64}), False),
        (json_frame({"op": "chunks", "root": root, "index": list(range(65))}), False),
        (json_frame({"op": "chunks", "root": root, "index": [-1, big, "x", None]}), False),
        (json_frame({"op": "chunks", "root": root, "index": "0"}), False),
        (json_frame({"op": "manifest", "root": 7}), False),
        (json_frame({"op": "have", "root": "zz" * 32}), False),
        (json_frame({"op": rng.choice(["", "launch", None, 1]), "root": root}), False),
        (json_frame({"from": -1}), False),
        (json_frame({"from": "0"}), False),
        (json_frame({"from": big ** 4}), False),
        (json_frame({"root": root}) + frame(b"\x00" * 11), False),  # a push with a malformed manifest
        (json_frame({"root": "ab" * 32}) + frame(struct.pack("<QI", 1 << 40, 1) + b"\x00" * 32), False),
        (json_frame([1, 2, 3]), False),
        (frame(b"\xff\xfe{not json"), False),
        (struct.pack(">I", big), False),  # a frame claiming gigabytes
        (struct.pack(">I", 1000) + b"x" * 10, True),  # half-sent, then reset
        (struct.pack(">I", 1000) + b"x" * 10, False),  # half-sent, then closed
        (b"", True),
        (varint(len(KILLER)) + KILLER, False),
        (varint(2 ** 40), False),  # a gossip RPC claiming a terabyte
        (varint(20) + bytes([0x12, 0x12]) + rng.randbytes(18), False),  # a publish field of random bytes
        (varint(6) + bytes([0x1A, 0x04, 0x0A, 0x02, 0xFF, 0xFF]), False),  # a control message, bad inside
    ]


def random_payload(rng: random.Random) -> tuple[bytes, bool]:
    body = rng.randbytes(rng.randrange(0, 300))
    kind = rng.randrange(3)
    if kind == 0:
        return body, rng.random() < 0.3
    if kind == 1:
        return frame(body), False
    return varint(len(body)) + body, rng.random() < 0.3


async def barrage(attacker: P2PNode, victim: str, protocol: str, payloads: list[tuple[bytes, bool]]) -> None:
    limit = trio.CapacityLimiter(6)  # under the victim's per-peer stream limit: each one is really handled

    async def one(payload: bytes, reset: bool) -> None:
        async with limit:
            await send_raw(attacker, victim, protocol, payload, reset=reset)

    async with trio.open_nursery() as nursery:
        for payload, reset in payloads:
            nursery.start_soon(one, payload, reset)


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[tuple[Victim, Peers]]:
    victim = Victim(tmp_path / "victim", ban_threshold=1_000_000)  # a ban would stop the barrage early
    peers = Peers(tmp_path)
    yield victim, peers
    peers.stop()
    victim.close()


def honest_fetch_works(honest: P2PNode, victim: Victim, root: bytes) -> bool:
    honest.store.discard(root)
    return honest.fetch(root, [victim.peer_id], timeout=10).chunks_fetched == 2


def test_every_protocol_survives_random_and_structured_garbage(arena: tuple[Victim, Peers]) -> None:
    victim, peers = arena
    attacker, honest = peers.node("attacker"), peers.node("honest")
    attacker.connect([victim.addr])
    honest.connect([victim.addr])
    root = victim.put(CHUNK_SIZE + 17, seed=3)
    protocols = victim.ask("protocols")["protocols"]
    assert {"/rollnet/object/1.0.0", "/rollnet/push/2.0.0", "/rollnet/policy/1.0.0", "/meshsub/1.1.0",
            "/meshsub/1.0.0"} <= set(protocols)
    rng = random.Random(14)
    for protocol in protocols:
        payloads = structured(rng, root.hex()) + [random_payload(rng) for _ in range(PER_PROTOCOL)]
        attacker.connect([victim.addr])  # a barrage may have ended the connection; real attackers redial
        attacker.call(barrage, attacker, victim.peer_id, protocol, payloads)
        stats = victim.stats()
        assert stats["alive"] and stats["restarts"] == 0, f"{protocol} stopped the host: {stats}"
        assert honest_fetch_works(honest, victim, root), f"honest fetch failed after fuzzing {protocol}"
    assert victim.stats()["faults"] > 0


def test_rss_and_file_descriptors_stay_flat_across_1000_bad_requests(arena: tuple[Victim, Peers]) -> None:
    victim, peers = arena
    attacker, honest = peers.node("attacker"), peers.node("honest")
    attacker.connect([victim.addr])
    honest.connect([victim.addr])
    root = victim.put(CHUNK_SIZE + 17, seed=4)
    rng = random.Random(1000)
    protocols = ["/rollnet/object/1.0.0", "/rollnet/push/2.0.0", "/rollnet/policy/1.0.0", "/meshsub/1.1.0"]

    def mixed(count: int) -> dict[str, list[tuple[bytes, bool]]]:
        shapes = structured(rng, root.hex())
        by_protocol: dict[str, list[tuple[bytes, bool]]] = {p: [] for p in protocols}
        for i in range(count):
            by_protocol[protocols[i % len(protocols)]].append(rng.choice(shapes))
        return by_protocol

    def run(count: int) -> None:
        for protocol, payloads in mixed(count).items():
            attacker.connect([victim.addr])
            attacker.call(barrage, attacker, victim.peer_id, protocol, payloads)

    run(200)  # warm-up: imports, thread pools and allocator arenas reach their working size
    time.sleep(1)
    before = victim.stats()
    run(FLAT_REQUESTS)
    time.sleep(1)
    after = victim.stats()
    assert after["alive"] and after["restarts"] == 0
    assert after["rss_kib"] <= before["rss_kib"] * 1.10, (before, after)
    assert after["fds"] <= before["fds"] * 1.10 + 1, (before, after)
    assert honest_fetch_works(honest, victim, root)

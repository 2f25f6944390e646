"""What a stranger's bytes cost a node: each attack of issue 14 against a host in its own process.

The victim is `rollnet.node.p2p.standalone` (a P2PNode with no stake gate: the worst case, as if the
attacker were staked); the attacker and an honest peer are real libp2p hosts on 127.0.0.1. For every attack
it reports how many requests were sent, whether the host stayed up (alive, never restarted), whether an
honest fetch succeeds afterwards, and the victim's RSS and open file descriptors (from /proc) before and
after. The baseline row is honest traffic of the same count.

Usage: python bench/robustness.py [--quick] [--json PATH]
Invariant: counts are fixed per attack (no time bounds), so two runs send the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import trio
from rich.table import Table
from rollnet.node.cli.context import make_console
from rollnet.node.p2p.framing import write_frame, write_json
from rollnet.node.p2p.host import P2PNode
from rollnet.node.p2p.identity import load_or_create_identity
from rollnet.node.p2p.objects import CHUNK_SIZE, Manifest, ObjectStore
from rollnet.node.p2p.standalone import StandaloneProcess, send_raw

OBJECT, PUSH, POLICY, GOSSIP = "/rollnet/object/1.0.0", "/rollnet/push/2.0.0", "/rollnet/policy/1.0.0", "/meshsub/1.1.0"
KILLER = b"\x0a" + b"\xff" * 10


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


class Arena:
    def __init__(self, folder: Path, ban_threshold: int):
        self.folder = folder
        self.victim = StandaloneProcess(folder / "victim", ban_threshold=ban_threshold)
        self.nodes: list[P2PNode] = []
        self.attacker, self.honest = self.node("attacker"), self.node("honest")
        self.attacker.connect([self.victim.addr])
        self.honest.connect([self.victim.addr])
        self.root = self.victim.put(2 * CHUNK_SIZE, seed=1)

    def node(self, name: str) -> P2PNode:
        folder = self.folder / name
        folder.mkdir(parents=True, exist_ok=True)
        node = P2PNode(load_or_create_identity(folder), ObjectStore(folder / "objects"), gate=None).start()
        self.nodes.append(node)
        return node

    def honest_fetch(self) -> bool:
        self.honest.store.discard(self.root)
        try:
            return self.honest.fetch(self.root, [self.victim.peer_id], timeout=10).chunks_fetched == 2
        except Exception:  # noqa: BLE001 - a failed fetch is the measurement
            return False

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
        self.victim.close()


def many(arena: Arena, protocol: str, payloads: list[tuple[bytes, bool]]) -> None:
    async def run() -> None:
        limit = trio.CapacityLimiter(6)

        async def one(payload: bytes, reset: bool) -> None:
            async with limit:
                await send_raw(arena.attacker, arena.victim.peer_id, protocol, payload, reset)

        async with trio.open_nursery() as nursery:
            for payload, reset in payloads:
                nursery.start_soon(one, payload, reset)

    arena.attacker.connect([arena.victim.addr])
    arena.attacker.call(run)


def honest_requests(arena: Arena, count: int) -> None:
    for _ in range(count):
        arena.honest_fetch()


def gossip_killer(arena: Arena, count: int) -> None:
    many(arena, GOSSIP, [(bytes([len(KILLER)]) + KILLER, False)] * count)


def malformed_frames(arena: Arena, count: int) -> None:
    rng = random.Random(14)
    protocols = [OBJECT, PUSH, POLICY, GOSSIP]
    for protocol in protocols:
        many(arena, protocol, [(rng.randbytes(rng.randrange(1, 300)), False) for _ in range(count // 4)])


def oversized_and_half_sent(arena: Arena, count: int) -> None:
    payloads = [(struct.pack(">I", 1 << 31), False), (struct.pack(">I", 4096) + b"x" * 100, True),
                (struct.pack(">I", 4096) + b"x" * 100, False)]
    for protocol in (OBJECT, PUSH, POLICY):
        many(arena, protocol, [payloads[i % 3] for i in range(count // 3)])


def amplification(arena: Arena, count: int) -> None:
    request = json.dumps({"op": "chunks", "root": arena.root.hex(), "index": [0] * 64}).encode()
    many(arena, OBJECT, [(frame(request), False)] * count)


def partial_push_flood(arena: Arena, count: int) -> None:
    chunk = os.urandom(CHUNK_SIZE)
    manifest = Manifest(48 * CHUNK_SIZE, CHUNK_SIZE, tuple(Manifest.of(chunk).chunk_hashes * 48))
    attacker, victim = arena.attacker, arena.victim.peer_id

    async def partial() -> None:
        try:
            stream = await attacker.open_stream(victim, PUSH)
        except Exception:  # noqa: BLE001
            return
        try:
            await write_json(stream, {"root": manifest.root().hex()})
            await write_frame(stream, manifest.pack())
            await stream.read(64)
            for _ in range(24):
                await write_frame(stream, chunk)
        except Exception:  # noqa: BLE001 - refusals and resets are expected
            pass
        finally:
            with trio.move_on_after(1):
                try:
                    await stream.reset()
                except Exception:  # noqa: BLE001
                    pass

    async def flood() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(partial)

    for _ in range(count // 8):
        attacker.connect([arena.victim.addr])
        attacker.call(flood)


def ignore_flow_control(arena: Arena, count: int) -> None:
    """Write `count` MiB on identify (no gate, nobody reads it) as if granted an endless yamux window."""
    block = os.urandom(1 << 20)

    async def flood() -> None:
        try:
            stream = await arena.attacker.open_stream(arena.victim.peer_id, "/ipfs/id/1.0.0")
            stream.muxed_stream.send_window = 1 << 40
            with trio.move_on_after(30):
                for _ in range(count):
                    await stream.write(block)
        except Exception:  # noqa: BLE001 - the victim closes the connection
            pass

    arena.attacker.call(flood)


def garbage_until_banned(arena: Arena, count: int) -> None:
    many(arena, OBJECT, [(frame(b"{nope"), False)] * count)


def connect_and_vanish(arena: Arena, count: int) -> None:
    peers = [arena.node(f"transient-{i}") for i in range(count)]
    for peer in peers:
        peer.connect([arena.victim.addr])
    threads = [threading.Thread(target=peer.stop) for peer in peers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    arena.nodes = [node for node in arena.nodes if node not in peers]


ATTACKS: list[tuple[str, Callable[[Arena, int], None], int, int, int]] = [
    # name, attack, count, quick count, ban threshold of the victim
    ("honest fetches (baseline)", honest_requests, 100, 20, 10),
    ("11-byte gossip RPC (DecodeError)", gossip_killer, 200, 40, 1_000_000),
    ("random bytes on every protocol", malformed_frames, 1000, 200, 1_000_000),
    ("oversized and half-sent frames", oversized_and_half_sent, 999, 201, 1_000_000),
    ("64 copies of one chunk per request", amplification, 200, 40, 1_000_000),
    ("partial 48 MiB pushes, then reset", partial_push_flood, 24, 8, 1_000_000),
    ("MiB written past the yamux window", ignore_flow_control, 256, 64, 1_000_000),
    ("garbage from one peer (default ban)", garbage_until_banned, 200, 40, 10),
    ("40 peers connect, then stop", connect_and_vanish, 40, 10, 10),
]


def run_attack(name: str, attack: Callable[[Arena, int], None], count: int, ban_threshold: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        arena = Arena(Path(folder), ban_threshold)
        try:
            arena.honest_fetch()
            before = arena.victim.stats()
            started = time.monotonic()
            attack(arena, count)
            seconds = time.monotonic() - started
            time.sleep(2)
            after = arena.victim.stats()
            honest_ok = arena.honest_fetch()
        finally:
            arena.close()
    return {"attack": name, "count": count, "host_up": bool(after["alive"] and after["restarts"] == 0),
            "honest_request_after": honest_ok, "rss_before_kib": before["rss_kib"], "rss_after_kib": after["rss_kib"],
            "rss_ratio": round(after["rss_kib"] / before["rss_kib"], 3), "fds_before": before["fds"],
            "fds_after": after["fds"], "connected_after": after["connected"], "faults": after["faults"],
            "refused": after["refused"], "seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    console = make_console()
    rows = []
    for name, attack, count, quick_count, threshold in ATTACKS:
        rows.append(run_attack(name, attack, quick_count if args.quick else count, threshold))
        console.print(f"{name}: done")
    table = Table(title="a stranger's bytes against one host")
    for column in ("attack", "count", "host up", "honest request after", "RSS before → after (MiB)", "ratio",
                   "fds before → after", "peers connected after", "faults counted"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["attack"], str(row["count"]), "yes" if row["host_up"] else "NO",
                      "yes" if row["honest_request_after"] else "NO",
                      f"{row['rss_before_kib'] / 1024:.0f} → {row['rss_after_kib'] / 1024:.0f}",
                      f"{row['rss_ratio']:.2f}×",
                      f"{row['fds_before']} → {row['fds_after']}", str(row["connected_after"]), str(row["faults"]))
    console.print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "robustness", "quick": args.quick, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

"""A stranger's bytes cannot stop or bloat a node: real libp2p hosts on 127.0.0.1, the victim in its own
process (rollnet.node.p2p.standalone) so its RSS and file descriptors are its own, read from /proc."""

from __future__ import annotations

import functools
import json
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from rollnet.node.keys import dev_account
from rollnet.node.p2p.discipline import PeerDiscipline
from rollnet.node.p2p.envelopes import Have, seal
from rollnet.node.p2p.framing import write_frame, write_json
from rollnet.node.p2p.host import P2PNode, topics
from rollnet.node.p2p.identity import load_or_create_identity
from rollnet.node.p2p.objects import CHUNK_SIZE, Manifest, ObjectError, ObjectStore
from rollnet.node.p2p.push import PROTOCOL as PUSH
from rollnet.node.p2p.push import PushQuota
from rollnet.node.p2p.ratelimit import PeerBuckets
from rollnet.node.p2p.standalone import StandaloneProcess, send_raw
from rollnet.node.p2p.transfer import PROTOCOL as OBJECT
from test_p2p import Swarm

Peers = Swarm  # the peers a test starts in-process (stopped at its end)

JOB = dev_account(19).address
TOPIC = topics(JOB)["have"]
KILLER = b"\x0a" + b"\xff" * 10  # the 11-byte RPC whose DecodeError used to end py-libp2p's trio run
GOSSIP = ("/meshsub/1.1.0", "/meshsub/1.0.0")


class Victim(StandaloneProcess):
    """The victim: a standalone host process subscribed to the test topic."""

    def __init__(self, folder: Path, *, ban_threshold: int = 10):
        super().__init__(folder, topics=[TOPIC], ban_threshold=ban_threshold)


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[Peers]:
    group = Swarm(tmp_path)
    yield group
    group.stop()


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[Victim]:
    process = Victim(tmp_path / "victim", ban_threshold=100_000)
    yield process
    process.close()


def honest_gossip(sender: P2PNode, nonce: int) -> bytes:
    body = Have(job=JOB, nonce=nonce, timestamp=time.time(), peer_id=sender.peer_id, root="ab" * 32, complete=True)
    return seal(body, dev_account(3))


def wait_for(condition, timeout: float = 15.0, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


def test_the_11_byte_gossip_message_no_longer_kills_a_node(victim: Victim, peers: Peers) -> None:
    attacker, honest = peers.node("attacker"), peers.node("honest")
    attacker.connect([victim.addr])
    honest.connect([victim.addr])
    honest.subscribe(TOPIC)
    root = victim.put(3 * CHUNK_SIZE + 7, seed=1)
    for protocol in GOSSIP:
        attacker.call(send_raw, attacker, victim.peer_id, protocol, bytes([len(KILLER)]) + KILLER)
    stats = victim.stats()
    assert stats["alive"] and stats["restarts"] == 0 and stats["faults"] >= 2
    report = honest.fetch(root, [victim.peer_id])
    assert report.chunks_fetched == 4
    # gossip still flows both ways through the victim's mesh
    time.sleep(1.5)
    before = victim.stats()["gossip"]
    honest.publish(TOPIC, honest_gossip(honest, nonce=1))
    assert wait_for(lambda: victim.stats()["gossip"] > before)


def test_a_peer_that_keeps_sending_garbage_is_disconnected_and_banned(tmp_path: Path, peers: Peers) -> None:
    server = peers.node("server", discipline=PeerDiscipline(threshold=5, ban_s=600))
    attacker, honest = peers.node("attacker"), peers.node("honest")
    attacker.connect([server.addr])
    honest.connect([server.addr])
    root = server.store.put(os.urandom(CHUNK_SIZE + 1))
    for _ in range(5):
        attacker.call(send_raw, attacker, server.peer_id, OBJECT, struct.pack(">I", 5) + b"{nope")
    assert wait_for(lambda: server.discipline.banned(attacker.peer_id))  # the server reads the garbage on its own time
    assert wait_for(lambda: attacker.peer_id not in server.connected_peers())
    # it dials again: its streams are refused unread, and the ban does not touch anyone else
    attacker.connect([server.addr])
    with pytest.raises(Exception):  # noqa: B017 - the fetch fails one way or another: nothing is served
        attacker.fetch(root, [server.peer_id], max_failures=1, timeout=3)
    assert server.stats.refused["object:banned"] + server.stats.refused["connection:banned"] >= 1
    assert honest.fetch(root, [server.peer_id]).chunks_fetched == 2
    assert not server.discipline.banned(honest.peer_id)


def test_discipline_counts_a_window_and_bans_for_a_term() -> None:
    now = [0.0]
    rules = PeerDiscipline(threshold=3, window_s=10, ban_s=100, max_peers=4, clock=lambda: now[0])
    assert not rules.fault("a", "x") and not rules.fault("a", "x")
    now[0] = 11  # the first two left the window
    assert not rules.fault("a", "x") and not rules.fault("a", "x")
    assert rules.fault("a", "x") and rules.banned("a")
    now[0] = 110
    assert rules.banned("a")
    now[0] = 112
    assert not rules.banned("a")
    for peer in "bcdefgh":  # fresh peer IDs cost bounded memory
        rules.fault(peer, "x")
    assert len(rules._peers) <= 4


def test_the_host_restarts_under_the_same_identity_after_its_run_ends(peers: Peers) -> None:
    node, other = peers.node("node"), peers.node("other")
    addr, peer_id = node.addr, node.peer_id
    node.subscribe(TOPIC)
    other.subscribe(TOPIC)
    other.connect([node.addr])
    root = node.store.put(os.urandom(1000))

    async def crash() -> None:
        async def boom() -> None:
            raise RuntimeError("injected failure")

        node.nursery.start_soon(boom)

    node.call(crash)
    assert wait_for(lambda: node.stats.restarts == 1 and node.alive)
    assert "injected failure" in node.stats.last_failure
    assert node.addr == addr and node.peer_id == peer_id
    assert other.fetch(root, [peer_id]).chunks_fetched == 1
    # its subscription came back with it: gossip from the other side is delivered again
    assert wait_for(lambda: peer_id in other.connected_peers())
    time.sleep(1.5)
    other.publish(TOPIC, honest_gossip(other, nonce=2))
    assert node.gossip_inbox.get(timeout=10).origin == other.peer_id


def test_partial_push_flood_streams_to_disk_within_quota(victim: Victim, peers: Peers) -> None:
    attacker, honest = peers.node("attacker"), peers.node("honest")
    attacker.connect([victim.addr])
    honest.connect([victim.addr])
    rss_before = victim.stats()["rss_kib"]
    size = 48 * CHUNK_SIZE
    chunk = os.urandom(CHUNK_SIZE)
    manifest = Manifest(size, CHUNK_SIZE, tuple(Manifest.of(chunk).chunk_hashes * 48))

    async def partial_push() -> None:
        stream = await attacker.open_stream(victim.peer_id, PUSH)
        try:
            await write_json(stream, {"root": manifest.root().hex()})
            await write_frame(stream, manifest.pack())
            await stream.read(64)  # {"send": true} or a refusal
            for _ in range(24):  # half of it, then vanish
                await write_frame(stream, chunk)
        except Exception:  # noqa: BLE001
            pass
        finally:
            with trio.move_on_after(1):
                await stream.reset()

    async def flood() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(partial_push)

    attacker.call(flood)
    stats = victim.stats()
    assert stats["alive"]
    assert stats["rss_kib"] - rss_before < 64 * 1024, "partial pushes must not be buffered in memory"
    objects = victim.data_dir / "objects"
    staged = objects / ".incoming" / manifest.root().hex()
    assert wait_for(lambda: not staged.exists()), "a failed push is deleted from staging"
    assert not (objects / manifest.root().hex()).exists(), "and never entered the store"
    honest_batch = os.urandom(2 * CHUNK_SIZE + 3)
    assert honest.push(victim.peer_id, honest_batch) == Manifest.of(honest_batch).root()


def test_push_quota_refuses_a_peer_beyond_its_share(peers: Peers) -> None:
    received: list[bytes] = []
    server = peers.node("server", push_quota=PushQuota(in_flight_bytes=4 * CHUNK_SIZE, stored_bytes=4 * CHUNK_SIZE),
                        on_push=lambda root, peer: received.append(root))
    pusher = peers.node("pusher")
    pusher.connect([server.addr])
    for _ in range(2):
        pusher.push(server.peer_id, os.urandom(2 * CHUNK_SIZE - 10))
    with pytest.raises(Exception, match="quota"):
        pusher.push(server.peer_id, os.urandom(CHUNK_SIZE))
    assert len(received) == 2 and server.push_quota.stored[pusher.peer_id] == 2 * (2 * CHUNK_SIZE - 10)
    # a corrupt chunk is refused and nothing of it is kept
    data = os.urandom(2 * CHUNK_SIZE)
    fake = Manifest.of(os.urandom(2 * CHUNK_SIZE))
    other = peers.node("other")
    other.connect([server.addr])

    async def lie() -> None:
        from rollnet.node.p2p import push

        stream = await other.open_stream(server.peer_id, PUSH)
        await push.send(stream, data, fake)

    with pytest.raises(Exception):  # noqa: B017 - refused mid-stream: the answer or the reset, whichever comes first
        other.call(lie)
    assert wait_for(lambda: server.stats.faults["push:ObjectError"] == 1)
    assert server.store.manifest(fake.root()) is None and not (server.store.folder / fake.root().hex()).exists()
    assert wait_for(lambda: not (server.store.folder / ".incoming" / fake.root().hex()).exists())


def test_a_chunk_request_names_each_chunk_once(peers: Peers) -> None:
    server, client = peers.node("server"), peers.node("client")
    client.connect([server.addr])
    root = server.store.put(os.urandom(CHUNK_SIZE))
    request = json.dumps({"op": "chunks", "root": root.hex(), "index": [0] * 64}).encode()
    client.call(send_raw, client, server.peer_id, OBJECT, struct.pack(">I", len(request)) + request)
    # the server records the fault on its own task, after the client's send returns: wait for it
    assert wait_for(lambda: server.stats.faults["object:FrameError"] == 1)
    assert server.object_server.chunks_served == 0


def test_per_peer_upload_buckets_cap_each_peer_on_a_virtual_clock() -> None:
    from trio.testing import MockClock

    rate, burst = 1_000_000, 100_000
    buckets = PeerBuckets(rate, burst=burst, max_peers=2)
    sent: dict[str, int] = {"a": 0, "b": 0}

    async def download(peer: str) -> None:
        for _ in range(50):
            await buckets.take(peer, 50_000)
            sent[peer] += 50_000

    async def run() -> float:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(download, "a")
            nursery.start_soon(download, "b")
        return trio.current_time()

    elapsed = trio.run(run, clock=MockClock(autojump_threshold=0))
    # each peer's 2.5 MB passed its own 1 MB/s bucket: no less than (2.5 MB - burst) / rate seconds
    assert elapsed >= (2_500_000 - burst) / rate
    assert sent == {"a": 2_500_000, "b": 2_500_000}


def test_stop_closes_every_connection(tmp_path: Path, peers: Peers) -> None:
    server = peers.node("server")
    fds_before = len(os.listdir("/proc/self/fd"))
    clients = []
    for i in range(40):
        folder = tmp_path / f"client-{i}"
        folder.mkdir()
        client = P2PNode(load_or_create_identity(folder), ObjectStore(folder / "objects"), gate=None).start()
        client.connect([server.addr])
        clients.append(client)
    assert wait_for(lambda: len(server.connected_peers()) == 40)
    threads = [threading.Thread(target=client.stop) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert wait_for(lambda: server.connected_peers() == [], timeout=20)
    assert wait_for(lambda: len(os.listdir("/proc/self/fd")) <= fds_before * 1.1 + 2, timeout=20)


def test_a_peer_ignoring_flow_control_loses_its_connection_not_our_memory(victim: Victim, peers: Peers) -> None:
    attacker, honest = peers.node("attacker"), peers.node("honest")
    attacker.connect([victim.addr])
    honest.connect([victim.addr])
    root = victim.put(2 * CHUNK_SIZE, seed=5)
    rss_before = victim.stats()["rss_kib"]
    block = os.urandom(1 << 20)

    async def flood() -> None:
        # identify is libp2p's own protocol: no stake gate and no rollnet handler reads it
        stream = await attacker.open_stream(victim.peer_id, "/ipfs/id/1.0.0")
        stream.muxed_stream.send_window = 1 << 40  # pretend the victim granted a terabyte
        with trio.move_on_after(20):
            try:
                for _ in range(64):
                    await stream.write(block)
            except Exception:  # noqa: BLE001 - the victim closes the connection
                pass

    attacker.call(flood)
    stats = victim.stats()
    assert stats["alive"] and stats["restarts"] == 0
    assert stats["rss_kib"] - rss_before < 32 * 1024, (rss_before, stats)
    assert stats["faults"] >= 1
    assert wait_for(lambda: attacker.peer_id not in honest_view(victim, attacker))
    honest.store.discard(root)
    assert honest.fetch(root, [victim.peer_id]).chunks_fetched == 2


def honest_view(victim: Victim, attacker: P2PNode) -> list[str]:
    """The attacker's own view: is it still connected to the victim?"""
    return [victim.peer_id] if victim.peer_id in attacker.connected_peers() else []


def test_an_honest_peer_whose_connection_drops_is_never_faulted(peers: Peers) -> None:
    server = peers.node("server", discipline=PeerDiscipline(threshold=3, ban_s=600))
    client = peers.node("client")
    client.connect([server.addr])
    root = server.store.put(os.urandom(CHUNK_SIZE))
    request = json.dumps({"op": "chunks", "root": root.hex(), "index": [0]}).encode()
    cut = struct.pack(">I", len(request)) + request[:5]
    for _ in range(6):  # a request cut short by a reset, a close, or nothing sent at all
        client.call(functools.partial(send_raw, client, server.peer_id, OBJECT, cut, reset=True))
        client.call(send_raw, client, server.peer_id, OBJECT, cut)
        client.call(functools.partial(send_raw, client, server.peer_id, OBJECT, b"", reset=True))
    assert sum(server.stats.faults.values()) == 0 and not server.discipline.banned(client.peer_id)
    assert client.fetch(root, [server.peer_id]).chunks_fetched == 1


def test_a_push_cannot_remove_an_object_the_store_holds(peers: Peers) -> None:
    victim, squatter, provider = peers.node("victim"), peers.node("squatter"), peers.node("provider")
    squatter.connect([victim.addr])
    victim.connect([provider.addr])
    data = os.urandom(3 * CHUNK_SIZE)
    root = provider.store.put(data)
    manifest = Manifest.of(data)
    held = trio.Event()

    async def squat() -> None:
        stream = await squatter.open_stream(victim.peer_id, PUSH)
        await write_json(stream, {"root": root.hex()})
        await write_frame(stream, manifest.pack())
        await stream.read(64)
        await write_frame(stream, data[:CHUNK_SIZE])  # one chunk, then wait while the victim fetches it
        held.set()
        await trio.sleep(3)
        await stream.reset()

    thread = threading.Thread(target=squatter.call, args=(squat,))
    thread.start()
    time.sleep(1)
    victim.fetch(root, [provider.peer_id])
    thread.join(30)
    time.sleep(1)
    assert victim.store.complete(root) and victim.store.read(root) == data


def test_a_failing_gossip_authorizer_drops_the_message_not_the_host(peers: Peers) -> None:
    def broken(envelope: object, body: object) -> bool:
        raise RuntimeError("the chain lookup blew up")

    node, sender = peers.node("node"), peers.node("sender")
    node.subscribe(TOPIC, broken)
    sender.subscribe(TOPIC)
    sender.connect([node.addr])
    time.sleep(1.5)
    sender.publish(TOPIC, honest_gossip(sender, nonce=9))
    assert wait_for(lambda: node.stats.gossip_dropped["error: RuntimeError"] == 1)
    assert node.alive and node.stats.restarts == 0


def test_a_fetch_from_a_provider_with_no_chunks_ends(peers: Peers) -> None:
    provider, fetcher = peers.node("provider"), peers.node("fetcher")
    fetcher.connect([provider.addr])
    data = os.urandom(2 * CHUNK_SIZE)
    manifest = Manifest.of(data)
    provider.store.begin(manifest.root(), manifest)  # the manifest, but not one chunk
    with pytest.raises(ObjectError, match="stalled"):
        fetcher.fetch(manifest.root(), [provider.peer_id], timeout=2)

"""rollnet.node.p2p with real libp2p hosts on 127.0.0.1 (Noise + yamux) and, for the gate, a real anvil."""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from conftest import ETH, client_for
from rollnet.node.chain.anvil import AnvilProcess
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.config import Deployment
from rollnet.node.keys import dev_account
from rollnet.node.p2p import transfer
from rollnet.node.p2p.envelopes import EnvelopeError, Have, ReplayGuard, open_envelope, seal
from rollnet.node.p2p.framing import write_json
from rollnet.node.p2p.gate import PeerGate
from rollnet.node.p2p.host import P2PNode, topics
from rollnet.node.p2p.identity import load_or_create_identity
from rollnet.node.p2p.objects import ObjectError, ObjectStore, object_root
from rollnet.node.p2p.transfer import PROTOCOL

JOB = dev_account(19).address


class Swarm:
    """Starts nodes in temporary data dirs and stops them all at the end."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.nodes: list[P2PNode] = []

    def node(self, name: str, **options: object) -> P2PNode:
        data_dir = self.folder / name
        data_dir.mkdir(parents=True, exist_ok=True)
        options.setdefault("gate", None)
        node = P2PNode(load_or_create_identity(data_dir), ObjectStore(data_dir / "objects"), **options).start()
        self.nodes.append(node)
        return node

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[Swarm]:
    group = Swarm(tmp_path)
    yield group
    group.stop()


def test_host_answers_as_the_registered_identity(swarm: Swarm) -> None:
    node = swarm.node("a")
    assert node.addr.startswith("/ip4/127.0.0.1/tcp/") and node.addr.endswith(f"/p2p/{node.peer_id}")
    assert node.host.get_id().to_base58() == node.peer_id == node.identity.peer_id
    assert (swarm.folder / "a" / "p2p-identity.key").stat().st_mode & 0o777 == 0o600


def test_fetch_from_several_providers_and_resume(swarm: Swarm) -> None:
    seed, helper, fetcher = swarm.node("seed"), swarm.node("helper"), swarm.node("fetcher")
    fetcher.connect([seed.addr, helper.addr])
    data = os.urandom(6 * (1 << 20) + 5)
    root = seed.store.put(data)
    helper.store.put(data)
    report = fetcher.fetch(root, [seed.peer_id, helper.peer_id])
    assert fetcher.store.read(root) == data and report.chunks_fetched == 7
    assert set(report.by_provider) == {seed.peer_id, helper.peer_id}
    # resume: a store that already holds some chunks fetches only the rest
    late = swarm.node("late")
    late.connect([seed.addr])
    manifest = seed.store.manifest(root)
    late.store.begin(root, manifest)
    for index in (0, 1, 2):
        late.store.write_chunk(root, index, seed.store.read_chunk(root, index))
    assert late.fetch(root, [seed.peer_id]).chunks_fetched == 4 and late.store.read(root) == data


def test_a_corrupt_provider_costs_a_retry_never_a_corrupt_object(swarm: Swarm) -> None:
    honest, liar, fetcher = swarm.node("honest"), swarm.node("liar"), swarm.node("fetcher")
    fetcher.connect([honest.addr, liar.addr])
    data = os.urandom(4 * (1 << 20))
    root = honest.store.put(data)
    liar.store.put(data)
    with open(liar.store.folder / root.hex() / "data", "r+b") as handle:  # corrupt every chunk behind its back,
        for chunk in range(4):  # so whichever chunks the random schedule gives the liar, each one fails its hash
            handle.seek(chunk << 20)
            handle.write(b"\xff" * 64)
    report = fetcher.fetch(root, [liar.peer_id, honest.peer_id])
    assert fetcher.store.read(root) == data
    assert report.retries >= 1


def test_a_provider_that_dies_mid_transfer_is_replaced(swarm: Swarm) -> None:
    slow = swarm.node("slow", upload_rate=2e6)
    backup, fetcher = swarm.node("backup"), swarm.node("fetcher")
    fetcher.connect([slow.addr, backup.addr])
    data = os.urandom(8 * (1 << 20))
    root = slow.store.put(data)
    def kill_after_two_chunks() -> None:
        deadline = time.monotonic() + 20
        while len(fetcher.store.have(root)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        slow.stop()

    threading.Thread(target=kill_after_two_chunks).start()
    with pytest.raises(ObjectError):
        fetcher.fetch(root, [slow.peer_id], timeout=5.0)
    fetched_before = len(fetcher.store.have(root))
    assert 0 < fetched_before < 8
    backup.store.put(data)
    report = fetcher.fetch(root, [slow.peer_id, backup.peer_id], timeout=5.0)
    assert fetcher.store.read(root) == data and report.chunks_fetched == 8 - fetched_before


def test_unregistered_peers_are_refused_until_they_stake(swarm: Swarm, market: Deployment, anvil: AnvilProcess,
                                                         tmp_path: Path) -> None:
    registry = RegistryClient(client_for(anvil, 0), market.registry)
    gate = PeerGate(registry, ttl=30.0, deny_ttl=0.0)
    server = swarm.node("server", gate=gate)
    stranger = swarm.node("stranger")
    stranger.connect([server.addr])
    root = server.store.put(b"policy delta bytes" * 1000)
    with pytest.raises(ObjectError, match="no provider served a valid manifest"):
        stranger.fetch(root, [server.peer_id])
    assert server.stats.refused["object:peer id not registered"] >= 1
    RegistryClient(client_for(anvil, 4), market.registry).join(stranger.identity, Role.WORKER, ETH)
    stranger.fetch(root, [server.peer_id])
    assert stranger.store.read(root) == b"policy delta bytes" * 1000
    lookups = gate.lookups
    for _ in range(5):
        stranger.fetch(root, [server.peer_id])
    assert gate.lookups == lookups  # admissions are cached


def test_rollout_push_reaches_trainer_and_validators(swarm: Swarm) -> None:
    received: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def on_push(root: bytes, sender: str) -> None:
        with lock:
            received.append((sender, root))

    trainer, validator = swarm.node("trainer", on_push=on_push), swarm.node("validator", on_push=on_push)
    worker = swarm.node("worker")
    worker.connect([trainer.addr, validator.addr])
    batch = json.dumps({"samples": list(range(5000))}).encode()
    roots = {worker.push(peer, batch) for peer in (trainer.peer_id, validator.peer_id)}
    assert roots == {object_root(batch)}
    assert sorted(received) == sorted([(worker.peer_id, object_root(batch))] * 2)
    assert trainer.store.read(object_root(batch)) == batch


async def _raw(node: P2PNode, peer: str, payload: bytes, protocol: str = PROTOCOL) -> None:
    stream = await node.open_stream(peer, protocol)
    try:
        await stream.write(payload)
        with trio.move_on_after(2):
            await stream.read(10)
    except Exception:  # noqa: BLE001 - the server is expected to reset us
        pass


def test_misbehaving_peers_are_refused_and_others_still_served(swarm: Swarm) -> None:
    server = swarm.node("server")
    bad, good = swarm.node("bad"), swarm.node("good")
    bad.connect([server.addr])
    good.connect([server.addr])
    root = server.store.put(os.urandom(3 * (1 << 20)))
    bad.call(_raw, bad, server.peer_id, struct.pack(">I", 1 << 30))  # a frame claiming 1 GiB
    bad.call(_raw, bad, server.peer_id, struct.pack(">I", 5) + b"{nope")  # malformed JSON
    launch = json.dumps({"op": "launch", "root": root.hex()}).encode()
    bad.call(_raw, bad, server.peer_id, struct.pack(">I", len(launch)) + launch)  # unknown op
    with pytest.raises(Exception):  # noqa: B017 - an unknown protocol is refused at negotiation
        bad.call(bad.open_stream, server.peer_id, "/rollnet/unknown/1.0.0")

    async def flood() -> None:
        async def one() -> None:
            try:
                stream = await bad.open_stream(server.peer_id)
                await write_json(stream, {"op": "manifest", "root": root.hex()})
                await stream.close()
            except Exception:  # noqa: BLE001 - refusals are the point
                pass

        for _ in range(10):
            async with trio.open_nursery() as nursery:
                for _ in range(100):
                    nursery.start_soon(one)

    bad.call(flood)  # 1,000 requests
    refused = sum(server.stats.refused.values())
    assert refused >= 3
    report = good.fetch(root, [server.peer_id])
    assert report.chunks_fetched == 3


def test_a_slow_reader_does_not_block_other_downloads(swarm: Swarm) -> None:
    server = swarm.node("server")
    slow, good = swarm.node("slow"), swarm.node("good")
    slow.connect([server.addr])
    good.connect([server.addr])
    data = os.urandom(16 * (1 << 20))
    root = server.store.put(data)

    async def request_and_never_read() -> None:
        stream = await slow.open_stream(server.peer_id)
        await write_json(stream, {"op": "chunks", "root": root.hex(), "index": list(range(16))})

    slow.call(request_and_never_read)
    started = time.monotonic()
    good.fetch(root, [server.peer_id])
    assert good.store.read(root) == data and time.monotonic() - started < 20


def test_gossip_delivers_signed_envelopes_and_drops_forgeries_and_replays(swarm: Swarm) -> None:
    a, b = swarm.node("a"), swarm.node("b")
    b.connect([a.addr])
    topic = topics(JOB)["have"]
    for node in (a, b):
        node.subscribe(topic)
    time.sleep(1.5)  # one heartbeat: the mesh forms
    signer = dev_account(3)
    body = Have(job=JOB, nonce=1, timestamp=time.time(), peer_id=a.peer_id, root="ab" * 32, complete=True)
    message = seal(body, signer)
    a.publish(topic, message)
    a.publish(topic, message)  # a replay: same signer, kind and nonce
    forged = json.loads(message)
    forged["body"]["complete"] = False
    a.publish(topic, json.dumps(forged).encode())
    received = b.gossip_inbox.get(timeout=5)
    assert received.origin == a.peer_id and open_envelope(received.data)[1] == body
    time.sleep(1.0)
    assert b.gossip_inbox.empty()


def test_envelope_checks() -> None:
    signer = dev_account(2)
    body = Have(job=JOB, nonce=7, timestamp=time.time(), peer_id="12D3KooWxyz1234", root="cd" * 32, complete=False)
    envelope, parsed = open_envelope(seal(body, signer))
    assert parsed == body and envelope.signer == signer.address
    with pytest.raises(EnvelopeError, match="exceeds"):
        open_envelope(b"{" + b" " * 20_000 + b"}")
    with pytest.raises(EnvelopeError, match="malformed"):
        open_envelope(b'{"kind": "have", "body": {}, "signer": "0x0", "signature": "0x00"}')
    guard = ReplayGuard(window=60)
    assert guard.admit(envelope, parsed) and not guard.admit(envelope, parsed)
    old = Have(job=JOB, nonce=8, timestamp=time.time() - 3600, peer_id="12D3KooWxyz1234", root="cd" * 32,
               complete=False)
    assert not guard.admit(*open_envelope(seal(old, signer)))


def test_job_authorizer_checks_trainer_registry_and_validators(market: Deployment, anvil: AnvilProcess) -> None:
    from rollnet.node.p2p.authorize import JobAuthorizer
    from rollnet.node.p2p.envelopes import PolicyAnnouncement, Verdict
    from rollnet.node.p2p.identity import PeerIdentity

    trainer, worker, validator = dev_account(0), dev_account(5), dev_account(6)
    worker_peer = PeerIdentity.generate()
    RegistryClient(client_for(anvil, 5), market.registry).join(worker_peer, Role.WORKER, ETH)
    RegistryClient(client_for(anvil, 6), market.registry).join(PeerIdentity.generate(), Role.VALIDATOR, 5 * ETH)
    authorize = JobAuthorizer(JOB, trainer.address, RegistryClient(client_for(anvil, 0), market.registry))
    now = time.time()
    policy = PolicyAnnouncement(job=JOB, nonce=1, timestamp=now, version=3, base_version=2, target_root="aa" * 32,
                                delta_root="bb" * 32, delta_size=100)
    assert authorize(*open_envelope(seal(policy, trainer)))
    assert not authorize(*open_envelope(seal(policy, worker)))  # only the trainer announces policies
    have = Have(job=JOB, nonce=2, timestamp=now, peer_id=worker_peer.peer_id, root="cc" * 32, complete=True)
    assert authorize(*open_envelope(seal(have, worker)))
    assert not authorize(*open_envelope(seal(have, validator)))  # cannot advertise someone else's peer
    verdict = Verdict(job=JOB, nonce=3, timestamp=now, lease_id=1, batch_root="dd" * 32, accept=True, reason="ok")
    assert authorize(*open_envelope(seal(verdict, validator)))
    assert not authorize(*open_envelope(seal(verdict, worker)))  # workers do not vote
    other_job = Verdict(job=dev_account(18).address, nonce=4, timestamp=now, lease_id=1, batch_root="dd" * 32,
                        accept=True, reason="ok")
    assert not authorize(*open_envelope(seal(other_job, validator)))


def test_policy_broadcast_over_gossip_uses_the_trainers_uplink_about_once(
    swarm: Swarm, market: Deployment, anvil: AnvilProcess
) -> None:
    """The trainer seeds a delta and announces it; workers learn providers from `have` gossip and fetch
    from each other, so the trainer uploads each chunk far fewer than once per worker."""
    from rollnet.node.p2p.authorize import JobAuthorizer
    from rollnet.node.p2p.directory import ProviderDirectory
    from rollnet.node.p2p.envelopes import PolicyAnnouncement

    trainer_key = dev_account(0)
    registry = RegistryClient(client_for(anvil, 0), market.registry)
    trainer = swarm.node("trainer", upload_rate=8e6)
    workers = [swarm.node(f"worker{i}", upload_rate=8e6) for i in range(3)]
    keys = [dev_account(10 + i) for i in range(3)]
    registry.join(trainer.identity, Role.WORKER, ETH)  # the trainer's own peer id, announced too
    for index, worker in enumerate(workers):
        RegistryClient(client_for(anvil, 10 + index), market.registry).join(worker.identity, Role.WORKER, ETH)
        worker.connect([trainer.addr] + [w.addr for w in workers[:index]])
    names = topics(JOB)
    authorize = JobAuthorizer(JOB, trainer_key.address, registry)
    for node in [trainer, *workers]:
        node.subscribe(names["policy"], authorize)
        node.subscribe(names["have"], authorize)
    time.sleep(1.5)

    delta = os.urandom(12 * (1 << 20))
    root = trainer.store.put(delta)
    nonce = iter(range(100, 1000))
    trainer.publish(names["have"], seal(Have(job=JOB, nonce=next(nonce), timestamp=time.time(),
                                             peer_id=trainer.peer_id, root=root.hex(), complete=True), trainer_key))
    trainer.publish(names["policy"], seal(PolicyAnnouncement(
        job=JOB, nonce=next(nonce), timestamp=time.time(), version=1, base_version=0, target_root="ee" * 32,
        delta_root=root.hex(), delta_size=len(delta)), trainer_key))

    def run_worker(worker: P2PNode, key: object) -> None:
        directory = ProviderDirectory()
        announced = None
        while announced is None:
            message = worker.gossip_inbox.get(timeout=10)
            _, body = open_envelope(message.data)
            if isinstance(body, Have):
                directory.observe(body)
            elif isinstance(body, PolicyAnnouncement):
                announced = bytes.fromhex(body.delta_root)
        # Announce the partial holding at once, so the others can fetch pieces from us while we fetch.
        worker.publish(names["have"], seal(Have(job=JOB, nonce=int(time.time() * 1000) % 10**9,
                                                timestamp=time.time(), peer_id=worker.peer_id,
                                                root=announced.hex(), complete=False), key))
        time.sleep(0.3)
        while not worker.gossip_inbox.empty():
            _, body = open_envelope(worker.gossip_inbox.get().data)
            if isinstance(body, Have):
                directory.observe(body)
        worker.fetch(announced, directory.providers(announced) + [trainer.peer_id])

    threads = [threading.Thread(target=run_worker, args=(w, k)) for w, k in zip(workers, keys, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(worker.store.read(root) == delta for worker in workers)
    served = trainer.object_server.chunks_served
    # Star would upload 36 chunks; measured 18-19 (about 1.5 copies of the delta for 3 workers).
    assert served < 30, f"the trainer uploaded {served} chunks for 3 workers x 12 chunks"


def test_bootstrap_from_the_registry_dials_only_staked_identities(
    swarm: Swarm, market: Deployment, anvil: AnvilProcess
) -> None:
    from rollnet.node.p2p.bootstrap import registry_bootstrap_addrs, transport_addr

    staked = [swarm.node(f"staked{i}") for i in range(2)]
    leaving = swarm.node("leaving")
    for index, node in enumerate([*staked, leaving]):
        registry = RegistryClient(client_for(anvil, 12 + index), market.registry)
        registry.join(node.identity, Role.WORKER, ETH)
        registry.set_listen_addrs([transport_addr(node.addr)])
        assert registry.listen_addrs(registry.client.address) == [transport_addr(node.addr)]
    RegistryClient(client_for(anvil, 14), market.registry).request_unbond(ETH)  # no longer active
    newcomer = swarm.node("newcomer")
    reader = RegistryClient(client_for(anvil, 0), market.registry)
    addrs = registry_bootstrap_addrs(reader, from_block=market.deployed_at_block)
    assert sorted(addrs) == sorted(node.addr for node in staked)
    assert sorted(newcomer.connect(addrs)) == sorted(node.peer_id for node in staked)


def test_bootstrap_looks_at_a_bounded_number_of_staked_registrations(
    swarm: Swarm, market: Deployment, anvil: AnvilProcess
) -> None:
    """A node starting in a market of thousands reads a fixed number of registrations: at most CHECKED_PER_PEER
    per peer it wants, only of nodes that joined with stake (registrations without stake cost only gas, and cannot
    crowd the window), half of them the newest; a peer counts once however many addresses it lists; asking for
    none reads nothing."""
    from rollnet.node.p2p.bootstrap import ADDRS_PER_PEER, CHECKED_PER_PEER, registry_bootstrap_addrs, transport_addr
    from rollnet.node.p2p.identity import PeerIdentity

    nodes = [swarm.node(f"registered{i}") for i in range(3)]
    for index, node in enumerate(nodes):
        registry = RegistryClient(client_for(anvil, 12 + index), market.registry)
        registry.join(node.identity, Role.WORKER, ETH)
        extra = [f"/ip4/127.0.0.1/tcp/{port}" for port in (1, 2, 3)] if index == 2 else []
        registry.set_listen_addrs([transport_addr(node.addr), *extra])
    for index in range(15, 15 + CHECKED_PER_PEER):  # newer, unstaked: they cost only gas
        RegistryClient(client_for(anvil, index), market.registry).join(PeerIdentity.generate(), Role.TRAINER, 0)
    reader = RegistryClient(client_for(anvil, 0), market.registry)
    calls = reader.client.requests
    before = calls["eth_call"]
    found = registry_bootstrap_addrs(reader, from_block=market.deployed_at_block, limit=1)
    assert calls["eth_call"] - before <= 3 * CHECKED_PER_PEER  # info, stake and addresses of at most 4 nodes
    assert len(found) == ADDRS_PER_PEER and found[0] == nodes[2].addr  # the newest staked node, 2 of its 4
    found = registry_bootstrap_addrs(reader, from_block=market.deployed_at_block, limit=1,
                                     exclude={str(nodes[2].peer_id)})
    assert found == [nodes[0].addr]  # the window's halves are taken in turn: after the newest comes the one
    # drawn from the older half (here the only one there), not the second newest
    found = registry_bootstrap_addrs(reader, from_block=market.deployed_at_block, limit=3)
    assert sorted(found[ADDRS_PER_PEER:]) == sorted(node.addr for node in nodes[:2])
    before = dict(calls)
    assert registry_bootstrap_addrs(reader, from_block=market.deployed_at_block, limit=0) == []
    assert dict(calls) == before


def test_a_registration_without_stake_passes_the_gate_only_for_the_jobs_trainer(
    swarm: Swarm, market: Deployment, anvil: AnvilProcess
) -> None:
    """The trainer role proves a peer ID but carries no stake: anyone can register one, so the gate admits it
    only for the address it was told to trust (the job's trainer)."""
    trainer_key, impostor_key = dev_account(7), dev_account(8)
    reader = RegistryClient(client_for(anvil, 0), market.registry)
    server = swarm.node("server", gate=PeerGate(reader, trusted_owners={trainer_key.address}, deny_ttl=0.0))
    trainer, impostor = swarm.node("trainer"), swarm.node("impostor")
    for node, index in ((trainer, 7), (impostor, 8)):
        RegistryClient(client_for(anvil, index), market.registry).join(node.identity, Role.TRAINER, 0)
        node.connect([server.addr])
    root = server.store.put(b"a rollout batch" * 500)
    trainer.fetch(root, [server.peer_id])
    assert trainer.store.read(root) == b"a rollout batch" * 500
    with pytest.raises(ObjectError, match="no provider served a valid manifest"):
        impostor.fetch(root, [server.peer_id])
    assert server.stats.refused["object:stake not active"] >= 1
    assert not reader.is_staked(impostor_key.address) and reader.is_active(impostor_key.address, Role.TRAINER)


def test_the_registry_join_reader_lists_again_from_where_it_stopped(market: Deployment, anvil: AnvilProcess) -> None:
    """One reader of the registry's joins serves bootstrap, validator listings and staked filters: a later join
    shows up in the next listing, which reads only the blocks mined since the last one; a later `from_block`
    leaves out earlier joins without reading anything again."""
    from rollnet.node.p2p.identity import PeerIdentity

    reader = RegistryClient(client_for(anvil, 0), market.registry)
    first = reader.joins(market.deployed_at_block)
    RegistryClient(client_for(anvil, 18), market.registry).join(PeerIdentity.generate(), Role.VALIDATOR, 5 * ETH)
    RegistryClient(client_for(anvil, 19), market.registry).join(PeerIdentity.generate(), Role.TRAINER, 0)
    calls = reader.client.requests
    before = dict(calls)
    second = reader.joins(market.deployed_at_block)
    assert calls["eth_getLogs"] - before.get("eth_getLogs", 0) == 1  # two new blocks: one range
    assert second[:len(first)] == first
    new = second[len(first):]
    assert [(join.node, join.roles, join.stake) for join in new] == [
        (dev_account(18).address, Role.VALIDATOR, 5 * ETH), (dev_account(19).address, Role.TRAINER, 0)]
    staked = reader.registered_addresses(market.deployed_at_block, staked_only=True)
    assert dev_account(18).address in staked and dev_account(19).address not in staked
    later = reader.joins(new[1].block)
    assert later == [new[1]]


def test_a_prefetched_batch_is_fetched_once_in_the_background_and_never_waited_for(swarm: Swarm) -> None:
    """The trainer's and the validators' prefetching: a fetch started ahead runs once per root however often it
    is asked for, `take` never waits for a transfer in flight, and a fetch that gave up starts anew when asked
    again."""
    import time

    from rollnet.node.p2p.prefetch import Prefetcher

    worker, trainer = swarm.node("worker", upload_rate=2e6), swarm.node("trainer")  # 4 MiB take about 2 s
    trainer.connect([worker.addr])
    data = os.urandom(4 * (1 << 20))
    root = worker.store.put(data)
    asked: list[bytes] = []

    def fetch(wanted: bytes, _worker: str) -> bytes | None:  # as `p2p_fetcher`, with the worker's peer known
        asked.append(wanted)
        if not trainer.store.complete(wanted):
            try:
                trainer.fetch(wanted, [worker.peer_id], timeout=10)
            except Exception:  # noqa: BLE001 - unavailable
                return None
        return trainer.store.read(wanted)

    prefetcher = Prefetcher(fetch)
    try:
        prefetcher.start(root, "0xworker")
        assert not prefetcher.ready(root, "0xworker")  # still arriving...
        started = time.monotonic()
        assert prefetcher.take(root, "0xworker") is None  # ...and taking it does not wait
        assert time.monotonic() - started < 0.5
        deadline = time.monotonic() + 60
        while not prefetcher.ready(root, "0xworker"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert asked == [root]  # one transfer, however often it was asked for
        assert prefetcher.take(root, "0xworker") == data  # read back from the store
        missing = bytes(32)  # nobody has it: the fetch gives up, and asked again, starts anew
        while not prefetcher.ready(missing, "0xworker"):
            time.sleep(0.05)
        assert prefetcher.take(missing, "0xworker") is None
        prefetcher.start(missing, "0xworker").result(timeout=60)
        assert asked.count(missing) == 2
    finally:
        prefetcher.close()


def test_a_provider_that_trickles_chunks_inside_the_timeout_is_dropped_at_the_minimum_rate(swarm: Swarm) -> None:
    """A worker that sends each chunk just inside the fetcher's timeout would hold a validator's or the trainer's
    fetch for chunks x timeout. With a minimum rate the fetch ends once timeout + size / rate has passed, having
    stored only part of the object; at a rate the provider does keep up with, the same transfer completes."""
    data = os.urandom(6 * (1 << 20))
    # Two providers as slow as each other (one per fetcher, so the transfers do not share an uplink): two streams
    # of 1 MiB chunks, each chunk arriving in about 2 s, inside a 3 s timeout; the whole object in about 6 s.
    slow = [swarm.node(f"slow{i}", upload_rate=1e6) for i in range(2)]
    root = {provider.store.put(data) for provider in slow}.pop()
    strict, lenient = swarm.node("strict"), swarm.node("lenient")
    strict.connect([slow[0].addr])
    lenient.connect([slow[1].addr])
    with pytest.raises(ObjectError, match="every provider failed or stalled"):
        strict.fetch(root, [slow[0].peer_id], timeout=3, min_rate=1e8)  # gives up about 3 s after the manifest
    assert not strict.store.complete(root)  # the transfer was cut, not waited out
    assert lenient.fetch(root, [slow[1].peer_id], timeout=3, min_rate=5e5).chunks_fetched == 6  # 3 + 12.6 s allowed
    assert lenient.store.read(root) == data


def test_a_one_chunk_object_is_asked_for_outright_and_a_provider_without_it_costs_one_reply(
        swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Policy deltas and lease batches are usually one chunk: the fetcher asks for it without a "have" query
    first (a stream to learn one bit). A provider that holds the manifest but not the chunk answers MISSING,
    and the fetch completes from another provider, with the bytes verified as ever."""
    asked: list[str] = []
    have = transfer.ObjectFetcher._have

    async def counted(self: transfer.ObjectFetcher, state: transfer.ProviderState, root: bytes, count: int) -> None:
        asked.append(state.peer)
        await have(self, state, root, count)

    monkeypatch.setattr(transfer.ObjectFetcher, "_have", counted)
    partial, full, fetcher = swarm.node("partial"), swarm.node("full"), swarm.node("fetcher")
    fetcher.connect([partial.addr, full.addr])
    data = os.urandom(80_000)
    root = full.store.put(data)
    partial.store.begin(root, full.store.manifest(root))  # it knows the object, but holds none of its bytes
    report = fetcher.fetch(root, [partial.peer_id, full.peer_id])
    assert fetcher.store.read(root) == data and report.by_provider == {full.peer_id: 1}
    assert full.peer_id not in asked  # (the partial provider may be asked again once its MISSING is heard)

    # A provider that does not know the object at all (a peer the delta has not reached yet) answers MISSING
    # too: no fault against it, so it stays a provider the fetch asks again once it has the object.
    empty, late = swarm.node("empty"), swarm.node("late")
    late.connect([empty.addr, full.addr])
    quiet = late.fetch(root, [empty.peer_id, full.peer_id])
    assert late.store.read(root) == data and quiet.retries == 0 and quiet.by_provider == {full.peer_id: 1}

    lone = swarm.node("lone")
    lone.connect([partial.addr])
    with pytest.raises(ObjectError):
        lone.fetch(root, [partial.peer_id], timeout=1.0)
    assert asked.count(partial.peer_id) >= 1  # after the MISSING answer, the usual queries found nothing
    assert not lone.store.complete(root)


def test_a_one_chunk_object_comes_with_its_manifest_in_one_stream_and_a_bad_inline_chunk_costs_a_retry(
        swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-chunk object's chunk rides on the manifest reply: one stream per fetch, not two. A provider whose
    inline chunk fails the manifest's hash counts a fault, and the object comes whole from another provider; a
    provider that answers the manifest alone (as one without the inline reply would) costs the usual chunk
    request, at no fault."""
    requests: list[tuple[str, str, bool]] = []
    request = transfer.ObjectFetcher._request

    async def counted(self: transfer.ObjectFetcher, peer: str, body: dict) -> object:
        requests.append((peer, body["op"], bool(body.get("inline"))))
        return await request(self, peer, body)

    monkeypatch.setattr(transfer.ObjectFetcher, "_request", counted)
    honest, liar, fetcher = swarm.node("honest"), swarm.node("liar"), swarm.node("fetcher")
    fetcher.connect([honest.addr, liar.addr])
    data = os.urandom(80_000)
    root = honest.store.put(data)
    report = fetcher.fetch(root, [honest.peer_id])
    assert fetcher.store.read(root) == data and report.by_provider == {honest.peer_id: 1} and report.retries == 0
    assert requests == [(honest.peer_id, "manifest", True)]

    liar.store.put(data)
    with open(liar.store.folder / root.hex() / "data", "r+b") as handle:
        handle.write(b"\xff" * 64)
    second = swarm.node("second")
    second.connect([liar.addr, honest.addr])
    requests.clear()
    report = second.fetch(root, [liar.peer_id, honest.peer_id])
    assert second.store.read(root) == data and report.retries >= 1 and report.by_provider == {honest.peer_id: 1}
    assert requests[0] == (liar.peer_id, "manifest", True)

    send_chunks = transfer.ObjectServer._send_chunks

    async def manifest_only(self: transfer.ObjectServer, stream: object, root_: bytes, count: int, indices: object,
                            remote: str) -> None:
        if requests and requests[-1][1] == "manifest":
            return  # the reply ends after the manifest
        await send_chunks(self, stream, root_, count, indices, remote)

    monkeypatch.setattr(transfer.ObjectServer, "_send_chunks", manifest_only)
    third = swarm.node("third")
    third.connect([honest.addr])
    requests.clear()
    report = third.fetch(root, [honest.peer_id])
    assert third.store.read(root) == data and report.retries == 0
    assert requests == [(honest.peer_id, "manifest", True), (honest.peer_id, "chunks", False)]


def test_a_manifest_declaring_more_than_the_fetch_allows_is_refused_before_a_byte_is_stored(swarm: Swarm) -> None:
    """A worker chooses the size its batch's manifest declares (up to 64 GiB). Validators and the trainer fetch with
    the most an honest batch of the job can take (`batch_fetcher`): a liar's 1 GiB manifest is refused at once,
    and the fetcher's disk holds nothing of it; an object within the bound is fetched as ever."""
    from rollnet.node.p2p.objects import CHUNK_SIZE, Manifest

    liar, fetcher = swarm.node("liar"), swarm.node("fetcher")
    fetcher.connect([liar.addr])
    chunks = (1 << 30) // CHUNK_SIZE
    declared = Manifest(1 << 30, CHUNK_SIZE, tuple(os.urandom(32) for _ in range(chunks)))
    huge = declared.root()
    liar.store.begin(huge, declared)  # it serves the manifest (and would trickle junk for the chunks)
    started = time.monotonic()
    with pytest.raises(ObjectError, match="declares 1073741824 bytes"):
        fetcher.fetch(huge, [liar.peer_id], max_size=8 << 20)
    assert time.monotonic() - started < 10 and fetcher.store.manifest(huge) is None
    assert not (fetcher.store.folder / huge.hex()).exists()
    # Frames are read whole: a manifest with chunks larger than a store cuts objects into is refused as well
    # (one 4 GiB "chunk" would otherwise be buffered in memory before its length is checked).
    wide = Manifest(1000, 0xFFFFFFFF, (os.urandom(32),))
    liar.store.begin(wide.root(), wide)
    with pytest.raises(ObjectError, match="declares chunks of"):
        fetcher.fetch(wide.root(), [liar.peer_id], max_size=8 << 20)
    data = os.urandom(100_000)
    fine = liar.store.put(data)
    assert fetcher.fetch(fine, [liar.peer_id], max_size=len(data)) and fetcher.store.read(fine) == data

"""A node's libp2p host, run in its own trio thread, with a small blocking API for the rest of the node.

Invariants:
- Noise + yamux only, listening on loopback unless configured otherwise; the identity is the data
  directory's secp256k1 key, so the peer ID is the one `rollnet node join` registered (and proved).
- Protected protocols (object transfer, rollout push, policy pull) first ask the PeerGate about the peer ID the Noise
  handshake authenticated; a refused peer's stream is reset before anything is read.
- No handler exception ever escapes (py-libp2p would tear the host down): every handler ends in a logged
  refusal and a reset stream. Each peer may run at most `per_peer_streams` handlers at once; reads have
  deadlines and frames size limits, so a flooding, slow or vanished peer costs itself, not the node.
- Nothing blocking runs on the trio thread: chain lookups and disk work go to worker threads.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.secp256k1 import create_new_key_pair as create_secp256k1_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID as GOSSIP_V10
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11 as GOSSIP_V11
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.tools.anyio_service import background_trio_service
from rollnet.node.p2p import transfer
from rollnet.node.p2p.envelopes import EnvelopeError, ReplayGuard, open_envelope
from rollnet.node.p2p.framing import FrameError, read_frame, read_json, write_frame, write_json
from rollnet.node.p2p.gate import PeerGate
from rollnet.node.p2p.identity import PeerIdentity
from rollnet.node.p2p.objects import CHUNK_SIZE, ObjectError, ObjectStore, object_root
from rollnet.node.p2p.ratelimit import TokenBucket

PUSH_PROTOCOL = "/rollnet/push/1.0.0"
POLICY_PROTOCOL = "/rollnet/policy/1.0.0"  # pull signed policy announcements: gossip can miss a restarted peer
MAX_ANNOUNCEMENTS = 16
MAX_PUSH = 256 * 1024 * 1024
logging.getLogger("libp2p").setLevel(logging.CRITICAL)
log = logging.getLogger(__name__)


@dataclass
class NodeStats:
    refused: Counter = field(default_factory=Counter)
    served: Counter = field(default_factory=Counter)
    gossip_dropped: Counter = field(default_factory=Counter)


@dataclass(frozen=True)
class GossipMessage:
    topic: str
    origin: str
    data: bytes


def _key_pair(identity: PeerIdentity) -> KeyPair:
    return create_secp256k1_key_pair(identity.secret)


class P2PNode:
    """One libp2p host in a background trio thread."""

    def __init__(
        self,
        identity: PeerIdentity,
        store: ObjectStore,
        *,
        gate: PeerGate | None,
        listen: str = "/ip4/127.0.0.1/tcp/0",
        upload_rate: float | None = None,
        max_uploads: int = 4,
        per_peer_streams: int = 8,
        on_push: Callable[[bytes, bytes, str], None] | None = None,
    ):
        self.identity = identity
        self.store = store
        self.gate = gate
        self.listen = listen
        self.upload_rate = upload_rate
        self.max_uploads = max_uploads
        self.per_peer_streams = per_peer_streams
        self.on_push = on_push
        self.policy_source: Callable[[int], list[bytes]] | None = None  # version -> sealed announcements from it
        self.stats = NodeStats()
        self.gossip_inbox: queue.Queue[GossipMessage] = queue.Queue(maxsize=10_000)
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._handlers_per_peer: Counter = Counter()
        self._replay = ReplayGuard()

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 15.0) -> P2PNode:
        self._thread = threading.Thread(target=self._thread_main, name=f"p2p-{self.identity.peer_id[-6:]}",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._failure:
            raise RuntimeError(f"libp2p host did not start: {self._failure}")
        return self

    def stop(self) -> None:
        if self._thread and self._thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            self._thread.join(10)

    def __enter__(self) -> P2PNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - reported to start() / logged
            self._failure = exc
            log.exception("libp2p host stopped with an error")
            self._ready.set()

    async def _main(self) -> None:
        key_pair = _key_pair(self.identity)
        self.host = new_host(
            key_pair=key_pair,
            sec_opt={NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)},
            muxer_opt={YAMUX_PROTOCOL_ID: Yamux},
            enable_mDNS=False,
            connection_config=ConnectionConfig(max_connections_per_peer=1),
        )
        self.router = GossipSub(protocols=[GOSSIP_V11, GOSSIP_V10], degree=6, degree_low=4, degree_high=12,
                                heartbeat_interval=1, heartbeat_initial_delay=0.1,
                                max_messages_per_topic_per_second=100.0)
        self.pubsub = Pubsub(self.host, self.router)
        self.bucket = TokenBucket(self.upload_rate)
        self.object_server = transfer.ObjectServer(self.store, self.bucket, self.max_uploads)
        self.host.set_stream_handler(TProtocol(transfer.PROTOCOL), self._guarded("object", self._serve_object))
        self.host.set_stream_handler(TProtocol(PUSH_PROTOCOL), self._guarded("push", self._receive_push))
        self.host.set_stream_handler(TProtocol(POLICY_PROTOCOL), self._guarded("policy", self._serve_policy))
        self._stop = trio.Event()
        try:
            async with (
                self.host.run(listen_addrs=[multiaddr.Multiaddr(self.listen)]),
                background_trio_service(self.pubsub),
                background_trio_service(self.router),
                trio.open_nursery() as nursery,
            ):
                await self.pubsub.wait_until_ready()
                self.nursery = nursery
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.pubsub.seen_messages.stop()

    # ------------------------------------------------------------------ identity and addresses

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @property
    def addr(self) -> str:
        return str(self.host.get_addrs()[0])

    def call(self, function: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run a coroutine function on the host's trio thread and wait for its result."""
        return trio.from_thread.run(function, *args, trio_token=self._token)

    # ------------------------------------------------------------------ guarded handlers

    def _guarded(self, name: str, handler: Callable[[Any, str], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        async def wrapper(stream: Any) -> None:
            peer = stream.muxed_conn.peer_id.to_base58()
            if self._handlers_per_peer[peer] >= self.per_peer_streams:
                self.stats.refused[f"{name}:flood"] += 1
                await _reset(stream)
                return
            self._handlers_per_peer[peer] += 1
            try:
                if self.gate is not None:
                    admission = await trio.to_thread.run_sync(self.gate.check, peer)
                    if not admission.allowed:
                        self.stats.refused[f"{name}:{admission.reason}"] += 1
                        log.info("refused %s from %s: %s", name, peer, admission.reason)
                        await _reset(stream)
                        return
                await handler(stream, peer)
                self.stats.served[name] += 1
                with trio.move_on_after(2):
                    await stream.close()
            except Exception as exc:  # noqa: BLE001 - a bad peer costs itself, never the host
                self.stats.refused[f"{name}:{type(exc).__name__}"] += 1
                log.info("%s from %s ended: %s", name, peer, exc)
                await _reset(stream)
            finally:
                self._handlers_per_peer[peer] -= 1
                if not self._handlers_per_peer[peer]:
                    del self._handlers_per_peer[peer]

        return wrapper

    async def _serve_object(self, stream: Any, peer: str) -> None:
        await self.object_server.handle(stream, peer)

    async def _receive_push(self, stream: Any, peer: str) -> None:
        header = await read_json(stream, timeout=10.0)
        root_hex, size = header.get("root"), header.get("size")
        if not isinstance(root_hex, str) or not isinstance(size, int) or not 0 < size <= MAX_PUSH:
            raise FrameError("push header needs a hex root and a size up to 256 MiB")
        data = bytearray()
        while len(data) < size:
            data += await read_frame(stream, min(CHUNK_SIZE, size - len(data)), timeout=30.0)
        if len(data) != size:
            raise FrameError("push body is longer than announced")
        root = bytes.fromhex(root_hex)
        if await trio.to_thread.run_sync(object_root, bytes(data)) != root:
            await write_json(stream, {"ok": False, "error": "root mismatch"})
            raise ObjectError("pushed bytes do not match their root")
        await trio.to_thread.run_sync(self.store.put, bytes(data))
        await write_json(stream, {"ok": True})
        if self.on_push is not None:
            await trio.to_thread.run_sync(self.on_push, root, bytes(data), peer)

    async def _serve_policy(self, stream: Any, peer: str) -> None:
        request = await read_json(stream, max_size=256, timeout=10.0)
        start = request.get("from")
        if not isinstance(start, int) or start < 0:
            raise FrameError("a policy request needs a non-negative integer 'from'")
        found = await trio.to_thread.run_sync(self.policy_source, start) if self.policy_source else []
        await write_json(stream, {"announcements": [item.decode() for item in found[:MAX_ANNOUNCEMENTS]]})

    # ------------------------------------------------------------------ blocking API

    def ask_policy(self, peer: str, from_version: int) -> list[bytes]:
        """The signed policy announcements `peer` holds for versions from `from_version` (unverified: the
        caller opens and authorizes each like a gossiped one)."""

        async def ask() -> list[bytes]:
            stream = await self.open_stream(peer, POLICY_PROTOCOL)
            try:
                await write_json(stream, {"from": from_version})
                answer = await read_json(stream, timeout=10.0)
            finally:
                with trio.move_on_after(2):
                    await stream.close()
            items = answer.get("announcements")
            if not isinstance(items, list):
                return []
            return [item.encode() for item in items[:MAX_ANNOUNCEMENTS] if isinstance(item, str)]

        return self.call(ask)

    def connect(self, addrs: list[str]) -> list[str]:
        """Connect to peers in parallel; returns the peer IDs that answered."""

        async def connect_all() -> list[str]:
            connected: list[str] = []

            async def one(addr: str) -> None:
                try:
                    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
                    with trio.fail_after(10):
                        await self.host.connect(info)
                    connected.append(info.peer_id.to_base58())
                except Exception as exc:  # noqa: BLE001 - an unreachable bootstrap peer is skipped
                    log.info("connect to %s failed: %s", addr, exc)

            async with trio.open_nursery() as nursery:
                for addr in addrs:
                    nursery.start_soon(one, addr)
            return connected

        return self.call(connect_all)

    async def open_stream(self, peer: str, protocol: str = transfer.PROTOCOL) -> Any:
        with trio.fail_after(10):
            return await self.host.new_stream(ID.from_base58(peer), [TProtocol(protocol)])

    def fetch(self, root: bytes, providers: list[str], **options: Any) -> transfer.FetchReport:
        fetcher = transfer.ObjectFetcher(self.store, self.open_stream, **options)
        return self.call(fetcher.fetch, root, providers)

    def push(self, peer: str, data: bytes) -> bytes:
        """Send an object to `peer` (e.g. a rollout batch to the trainer); returns its root once stored there."""
        root = object_root(data)

        async def send() -> None:
            stream = await self.open_stream(peer, PUSH_PROTOCOL)
            try:
                await write_json(stream, {"root": root.hex(), "size": len(data)})
                for offset in range(0, len(data), CHUNK_SIZE):
                    await write_frame(stream, data[offset:offset + CHUNK_SIZE])
                answer = await read_json(stream, timeout=30.0)
            finally:
                with trio.move_on_after(2):
                    await stream.close()
            if not answer.get("ok"):
                raise ObjectError(f"{peer} refused the push: {answer.get('error')}")

        self.call(send)
        return root

    def subscribe(self, topic: str, authorize: Callable[[Any, Any], bool] | None = None) -> None:
        """Receive verified, de-duplicated envelopes of `topic` into `gossip_inbox`; with `authorize`
        (see authorize.JobAuthorizer) only those whose signer may say that."""

        async def run() -> None:
            self.pubsub.set_topic_validator(topic, self._validate, False)
            subscription = await self.pubsub.subscribe(topic)
            self.nursery.start_soon(self._drain, topic, subscription, authorize)

        self.call(run)

    def _validate(self, forwarder: ID, message: Any) -> bool:
        try:
            open_envelope(message.data)
            return True
        except EnvelopeError as exc:
            self.stats.gossip_dropped[str(exc)[:40]] += 1
            return False

    async def _drain(self, topic: str, subscription: Any, authorize: Callable[[Any, Any], bool] | None) -> None:
        while True:
            message = await subscription.get()
            try:
                envelope, body = open_envelope(message.data)
            except EnvelopeError:
                self.stats.gossip_dropped["invalid"] += 1
                continue
            if authorize is not None and not await trio.to_thread.run_sync(authorize, envelope, body):
                self.stats.gossip_dropped["unauthorized"] += 1
                continue
            if not self._replay.admit(envelope, body):
                self.stats.gossip_dropped["replay"] += 1
                continue
            try:
                self.gossip_inbox.put_nowait(GossipMessage(topic, ID(message.from_id).to_base58(), message.data))
            except queue.Full:
                self.stats.gossip_dropped["inbox full"] += 1

    def publish(self, topic: str, data: bytes) -> None:
        self.call(self.pubsub.publish, topic, data)

    def connected_peers(self) -> list[str]:
        return [peer.to_base58() for peer in self.host.get_connected_peers()]


async def _reset(stream: Any) -> None:
    with trio.move_on_after(1):
        try:
            await stream.reset()
        except Exception:  # noqa: BLE001 - the stream may already be gone
            pass


def topics(job: str) -> dict[str, str]:
    """The gossip topics of one job."""
    return {kind: f"/rollnet/{job}/{kind}" for kind in ("policy", "have", "verdict")}

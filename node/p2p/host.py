"""A node's libp2p host, run in its own trio thread, with a small blocking API for the rest of the node.

Invariants:
- Noise + yamux only, listening on loopback unless configured otherwise; the identity is the data
  directory's secp256k1 key, so the peer ID is the one `rollnet node join` registered (and proved).
- Protected protocols (object transfer, rollout push, policy pull, anchor offers) first ask the PeerGate
  about the peer ID the Noise handshake authenticated; a refused peer's stream is reset before anything is
  read.
- No bytes a peer sends can stop the host: no handler exception escapes (each ends in a logged refusal and
  a reset stream), gossip runs through ContainedPubsub, and malformed input is a fault against the sender
  (PeerDiscipline): a peer with too many is disconnected and banned for a while. Each peer may run at most
  `per_peer_streams` handlers at once; reads have deadlines and frames size limits; pushes go to disk within
  quotas; uploads pass a node-wide and a per-peer token bucket.
- The host is supervised: if its trio run ends for any reason but `stop()`, it is logged and restarted
  under the same identity on the same port, with its subscriptions and dialled peers, and blocking calls
  wait for it (or fail with HostDown); the process never keeps running with a dead host.
- `stop()` closes every connection, stream and listener before the thread ends.
- Nothing blocking runs on the trio thread: chain lookups and disk work go to worker threads.
"""

from __future__ import annotations

import logging
import queue
import struct
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import INotifee
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
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.tools.anyio_service import background_trio_service
from rollnet.node.errors import RollnetError
from rollnet.node.p2p import muxer, transfer
from rollnet.node.p2p import push as push_protocol
from rollnet.node.p2p.discipline import PeerDiscipline
from rollnet.node.p2p.envelopes import EnvelopeError, ReplayGuard, open_envelope
from rollnet.node.p2p.framing import FrameError, read_json, write_json
from rollnet.node.p2p.gate import PeerGate
from rollnet.node.p2p.gossip import ContainedPubsub
from rollnet.node.p2p.identity import PeerIdentity
from rollnet.node.p2p.muxer import BoundedYamux
from rollnet.node.p2p.objects import Manifest, ObjectError, ObjectStore
from rollnet.node.p2p.push import PushQuota, PushReceiver
from rollnet.node.p2p.ratelimit import TokenBucket

PUSH_PROTOCOL = push_protocol.PROTOCOL
POLICY_PROTOCOL = "/rollnet/policy/1.0.0"  # pull signed policy announcements: gossip can miss a restarted peer
MAX_ANNOUNCEMENTS = 16
ANCHOR_PROTOCOL = "/rollnet/anchor/1.0.0"  # "which anchor do you hold at or below version v?" (see p2p.anchors)
MAX_ANCHOR_REQUEST = 1024
MAX_ANCHOR_ANSWER = 8 * 1024 * 1024  # a bundle lists every tensor's hash
MAX_PUSH = push_protocol.MAX_PUSH
DEFAULT_PEER_UPLOAD_RATE = 32 * 1024 * 1024  # bytes/s one peer may download from us
# What a peer's own bytes can cause; any of these is a fault against it (timeouts and resets are not).
MALFORMED = (FrameError, ObjectError, ValueError, TypeError, KeyError, IndexError, UnicodeError, OverflowError,
             struct.error)
logging.getLogger("libp2p").setLevel(logging.CRITICAL)
log = logging.getLogger(__name__)


class HostDown(RollnetError):
    """The libp2p host is not running and did not come back in time."""


@dataclass
class NodeStats:
    refused: Counter = field(default_factory=Counter)
    served: Counter = field(default_factory=Counter)
    gossip_dropped: Counter = field(default_factory=Counter)
    faults: Counter = field(default_factory=Counter)
    restarts: int = 0
    last_failure: str = ""


@dataclass(frozen=True)
class GossipMessage:
    topic: str
    origin: str
    data: bytes


def _key_pair(identity: PeerIdentity) -> KeyPair:
    return create_secp256k1_key_pair(identity.secret)


class _BanNotifee(INotifee):
    """Closes connections from banned peers as soon as they are made."""

    def __init__(self, node: P2PNode):
        self.node = node

    async def connected(self, network: Any, conn: Any) -> None:
        peer = conn.muxed_conn.peer_id
        if self.node.discipline.banned(peer.to_base58()):
            self.node.stats.refused["connection:banned"] += 1
            trio.lowlevel.spawn_system_task(self.node._disconnect, peer)

    async def disconnected(self, network: Any, conn: Any) -> None:
        return None

    async def opened_stream(self, network: Any, stream: Any) -> None:
        return None

    async def closed_stream(self, network: Any, stream: Any) -> None:
        return None

    async def listen(self, network: Any, address: Any) -> None:
        return None

    async def listen_close(self, network: Any, address: Any) -> None:
        return None


class P2PNode:
    """One supervised libp2p host in a background trio thread."""

    def __init__(
        self,
        identity: PeerIdentity,
        store: ObjectStore,
        *,
        gate: PeerGate | None,
        listen: str = "/ip4/127.0.0.1/tcp/0",
        upload_rate: float | None = None,
        peer_upload_rate: float | None = DEFAULT_PEER_UPLOAD_RATE,
        max_uploads: int = 4,
        per_peer_streams: int = 8,
        on_push: Callable[[bytes, str], None] | None = None,
        push_quota: PushQuota | None = None,
        discipline: PeerDiscipline | None = None,
        restart_timeout: float = 30.0,
    ):
        self.identity = identity
        self.store = store
        self.gate = gate
        self.listen = listen
        self.upload_rate = upload_rate
        self.peer_upload_rate = peer_upload_rate
        self.max_uploads = max_uploads
        self.per_peer_streams = per_peer_streams
        self.on_push = on_push
        self.push_quota = push_quota or PushQuota()
        self.discipline = discipline or PeerDiscipline()
        self.restart_timeout = restart_timeout
        self.policy_source: Callable[[int], list[bytes]] | None = None  # version -> sealed announcements from it
        self.anchor_source: Callable[[dict], dict] | None = None  # anchor request -> answer (p2p.anchors)
        self.stats = NodeStats()
        self.gossip_inbox: queue.Queue[GossipMessage] = queue.Queue(maxsize=10_000)
        self._running = threading.Condition()
        self._token: Any = None  # the running trio loop's token; None while (re)starting
        self._started_once = False
        self._stopping = threading.Event()
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._handlers_per_peer: Counter = Counter()
        self._replay = ReplayGuard()
        self._subscriptions: dict[str, Callable[[Any, Any], bool] | None] = {}
        self._dialled: dict[str, str] = {}  # peer id -> the address we dialled it at

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 15.0) -> P2PNode:
        self._thread = threading.Thread(target=self._supervise, name=f"p2p-{self.identity.peer_id[-6:]}",
                                        daemon=True)
        self._thread.start()
        with self._running:
            self._running.wait_for(lambda: self._token is not None or self._failure is not None, timeout)
        if self._token is None:
            self._stopping.set()
            raise RuntimeError(f"libp2p host did not start: {self._failure}")
        return self

    def stop(self) -> None:
        """Close every connection and listener, then end the host's thread (no restart)."""
        self._stopping.set()
        with self._running:
            self._running.notify_all()
        token = self._token
        if token is not None:
            try:
                trio.from_thread.run(self._shutdown, trio_token=token)
            except (trio.RunFinishedError, trio.Cancelled, RuntimeError):
                pass
        if self._thread is not None:
            self._thread.join(15)

    def __enter__(self) -> P2PNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        return self._token is not None and self._thread is not None and self._thread.is_alive()

    def _supervise(self) -> None:
        """Run the host; whenever its trio run ends unasked, log why and run it again (same key, same port)."""
        while not self._stopping.is_set():
            try:
                trio.run(self._main)
                failure: BaseException | None = None
            except BaseException as exc:  # noqa: BLE001 - any end of the run is reported and survived
                failure = exc
            with self._running:
                self._token = None
                if not self._started_once:
                    self._failure = failure or RuntimeError("the host ended during start-up")
                    self._running.notify_all()
                    return
            if self._stopping.is_set():
                return
            self.stats.restarts += 1
            self.stats.last_failure = _describe(failure)
            log.error("libp2p host stopped (%s); restarting it as %s (restart %d)", self.stats.last_failure,
                      self.identity.peer_id, self.stats.restarts)
            time.sleep(min(5.0, 0.1 * 2 ** min(self.stats.restarts, 6)))

    async def _main(self) -> None:
        muxer.install(self._gossip_fault_overflow)
        key_pair = _key_pair(self.identity)
        self.host = new_host(
            key_pair=key_pair,
            sec_opt={NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)},
            muxer_opt={YAMUX_PROTOCOL_ID: BoundedYamux},
            enable_mDNS=False,
            connection_config=ConnectionConfig(max_connections_per_peer=1),
        )
        self.router = GossipSub(protocols=[GOSSIP_V11, GOSSIP_V10], degree=6, degree_low=4, degree_high=12,
                                heartbeat_interval=1, heartbeat_initial_delay=0.1,
                                max_messages_per_topic_per_second=100.0)
        self.pubsub = ContainedPubsub(self.host, self.router, on_fault=self._gossip_fault)
        self.host.get_network().register_notifee(_BanNotifee(self))
        # Per run: a run that died may have left locks held and counters raised by tasks that no longer exist.
        self._handlers_per_peer = Counter()
        self.push_quota.in_flight.clear()
        self.bucket = TokenBucket(self.upload_rate)
        self.object_server = transfer.ObjectServer(self.store, self.bucket, self.max_uploads, self.peer_upload_rate)
        self.pushes = PushReceiver(self.store, self.push_quota, on_push=self.on_push)
        self.host.set_stream_handler(TProtocol(transfer.PROTOCOL), self._guarded("object", self._serve_object))
        self.host.set_stream_handler(TProtocol(PUSH_PROTOCOL), self._guarded("push", self.pushes.handle))
        self.host.set_stream_handler(TProtocol(POLICY_PROTOCOL), self._guarded("policy", self._serve_policy))
        self.host.set_stream_handler(TProtocol(ANCHOR_PROTOCOL), self._guarded("anchor", self._serve_anchor))
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
                self._pin_listen_port()
                for topic, authorize in list(self._subscriptions.items()):
                    await self._subscribe(topic, authorize)
                if self._dialled:
                    nursery.start_soon(self._redial)
                with self._running:
                    self._token = trio.lowlevel.current_trio_token()
                    self._started_once = True
                    self._running.notify_all()
                if self._stopping.is_set():  # stop() came while this run was starting
                    self._stop.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            with self._running:  # from here on, callers wait for the next run instead of using this one
                self._token = None
                self._running.notify_all()
            self.pubsub.seen_messages.stop()
            with trio.CancelScope(shield=True), trio.move_on_after(3):
                try:
                    await self.host.get_network().close()
                except Exception:  # noqa: BLE001 - best effort: the run is ending anyway
                    pass

    def _pin_listen_port(self) -> None:
        """After the first start, listen on the port we got, so the registered address stays right."""
        if self._started_once:
            return
        bound = multiaddr.Multiaddr(str(self.host.get_addrs()[0]).split("/p2p/")[0])
        self.listen = str(bound)

    async def _shutdown(self) -> None:
        with trio.move_on_after(5):
            try:
                await self.host.get_network().close()
            except Exception:  # noqa: BLE001 - closing is best effort; the run ends regardless
                log.info("closing the libp2p network failed", exc_info=True)
        self._stop.set()

    async def _redial(self) -> None:
        await trio.sleep(0.2)
        await self._connect_all(list(self._dialled.values()))

    async def _disconnect(self, peer: ID) -> None:
        with trio.move_on_after(3):
            try:
                await self.host.disconnect(peer)
            except Exception:  # noqa: BLE001 - the connection may already be gone
                pass

    # ------------------------------------------------------------------ identity and addresses

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @property
    def addr(self) -> str:
        return str(self.host.get_addrs()[0])

    def call(self, function: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run a coroutine function on the host's trio thread and wait for its result; while the host
        restarts, wait for it (up to `restart_timeout`), then raise HostDown."""
        deadline = time.monotonic() + self.restart_timeout
        stale = None
        while True:
            with self._running:
                self._running.wait_for(lambda stale=stale: self._stopping.is_set()
                                       or (self._token is not None and self._token is not stale),
                                       max(0.0, deadline - time.monotonic()))
                token = self._token
            if self._stopping.is_set():
                raise HostDown("the libp2p host was stopped")
            if token is None or token is stale:
                raise HostDown(f"the libp2p host is down and did not restart within {self.restart_timeout:g} s "
                               f"(last failure: {self.stats.last_failure or 'none'})")
            try:
                return trio.from_thread.run(function, *args, trio_token=token)
            except (trio.RunFinishedError, trio.Cancelled):
                stale = token  # it ended under us: wait for the next run
            except (RuntimeError, OSError):
                if self._token is token:
                    raise  # the run is healthy: the failure is the function's own
                stale = token  # a dying run's nursery or sockets refused it

    # ------------------------------------------------------------------ guarded handlers

    def _guarded(self, name: str, handler: Callable[[Any, str], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        async def wrapper(stream: Any) -> None:
            peer = stream.muxed_conn.peer_id.to_base58()
            if self.discipline.banned(peer):
                self.stats.refused[f"{name}:banned"] += 1
                await _reset(stream)
                return
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
                await _linger(stream)
            except Exception as exc:  # noqa: BLE001 - a bad peer costs itself, never the host
                self.stats.refused[f"{name}:{type(exc).__name__}"] += 1
                log.info("%s from %s ended: %s", name, peer, exc)
                await _reset(stream)
                if isinstance(exc, MALFORMED):
                    self._fault(peer, f"{name}:{type(exc).__name__}")
            finally:
                await _release(stream)
                self._handlers_per_peer[peer] -= 1
                if not self._handlers_per_peer[peer]:
                    del self._handlers_per_peer[peer]

        return wrapper

    def _fault(self, peer: str, kind: str) -> None:
        """Count malformed input against `peer`; on its ban, drop its connection."""
        self.stats.faults[kind] += 1
        if self.discipline.fault(peer, kind):
            log.warning("banning %s for %g s after repeated malformed input (%s)", peer, self.discipline.ban_s, kind)
            trio.lowlevel.spawn_system_task(self._disconnect, ID.from_base58(peer))

    def _gossip_fault(self, peer: ID, kind: str) -> None:
        self._fault(peer.to_base58(), kind)

    def _gossip_fault_overflow(self, peer: ID) -> None:
        self._fault(peer.to_base58(), "yamux:window ignored")

    async def _serve_object(self, stream: Any, peer: str) -> None:
        await self.object_server.handle(stream, peer)

    async def _serve_policy(self, stream: Any, peer: str) -> None:
        request = await read_json(stream, max_size=256, timeout=10.0)
        start = request.get("from")
        if not isinstance(start, int) or start < 0:
            raise FrameError("a policy request needs a non-negative integer 'from'")
        found = await trio.to_thread.run_sync(self.policy_source, start) if self.policy_source else []
        await write_json(stream, {"announcements": [item.decode() for item in found[:MAX_ANNOUNCEMENTS]]})

    async def _serve_anchor(self, stream: Any, peer: str) -> None:
        request = await read_json(stream, max_size=MAX_ANCHOR_REQUEST, timeout=10.0)
        # The source schema-checks the request: a malformed one raises ValueError, a fault against the asker.
        answer = await trio.to_thread.run_sync(self.anchor_source, request) if self.anchor_source else {}
        await write_json(stream, answer)

    # ------------------------------------------------------------------ blocking API

    def report_fault(self, peer: str, kind: str) -> None:
        """Count a fault found outside a handler against `peer` (an answer of its that failed verification,
        e.g. an anchor whose tensors are not the chain's), under the same discipline as malformed input."""

        async def count() -> None:
            self._fault(peer, kind)

        self.call(count)

    def ask_anchor(self, peer: str, request: dict, timeout: float = 60.0) -> dict:
        """`peer`'s answer to an anchor request (unverified JSON: the caller schema-checks it). The timeout
        is generous because a peer prepares a bundle (hashes its checkpoint) on its first request."""

        async def ask() -> dict:
            stream = await self.open_stream(peer, ANCHOR_PROTOCOL)
            try:
                await write_json(stream, request)
                return await read_json(stream, max_size=MAX_ANCHOR_ANSWER, timeout=timeout)
            finally:
                with trio.move_on_after(2):
                    await stream.close()

        return self.call(ask)

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

        return self.call(self._connect_all, addrs)

    async def _connect_all(self, addrs: list[str]) -> list[str]:
        connected: list[str] = []

        async def one(addr: str) -> None:
            try:
                info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
                with trio.fail_after(10):
                    await self.host.connect(info)
                peer = info.peer_id.to_base58()
                self._dialled[peer] = addr
                connected.append(peer)
            except Exception as exc:  # noqa: BLE001 - an unreachable bootstrap peer is skipped
                log.info("connect to %s failed: %s", addr, exc)

        async with trio.open_nursery() as nursery:
            for addr in addrs:
                nursery.start_soon(one, addr)
        return connected

    async def open_stream(self, peer: str, protocol: str = transfer.PROTOCOL) -> Any:
        with trio.fail_after(10):
            return await self.host.new_stream(ID.from_base58(peer), [TProtocol(protocol)])

    def fetch(self, root: bytes, providers: list[str], **options: Any) -> transfer.FetchReport:
        fetcher = transfer.ObjectFetcher(self.store, self.open_stream, **options)
        return self.call(fetcher.fetch, root, providers)

    def push(self, peer: str, data: bytes) -> bytes:
        """Send an object to `peer` (e.g. a rollout batch to the trainer); returns its root once stored there."""
        manifest = Manifest.of(data)

        async def send() -> None:
            stream = await self.open_stream(peer, PUSH_PROTOCOL)
            try:
                await push_protocol.send(stream, data, manifest)
            finally:
                with trio.move_on_after(2):
                    await stream.close()

        self.call(send)
        return manifest.root()

    def subscribe(self, topic: str, authorize: Callable[[Any, Any], bool] | None = None) -> None:
        """Receive verified, de-duplicated envelopes of `topic` into `gossip_inbox`; with `authorize`
        (see authorize.JobAuthorizer) only those whose signer may say that."""

        self._subscriptions[topic] = authorize
        self.call(self._subscribe, topic, authorize)

    async def _subscribe(self, topic: str, authorize: Callable[[Any, Any], bool] | None) -> None:
        self.pubsub.set_topic_validator(topic, self._validate, False)
        subscription = await self.pubsub.subscribe(topic)
        self.nursery.start_soon(self._drain, topic, subscription, authorize)

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
                await self._deliver(topic, message, authorize)
            except Exception as exc:  # noqa: BLE001 - one message (or a chain lookup for it) never ends the host
                self.stats.gossip_dropped[f"error: {type(exc).__name__}"] += 1
                log.info("gossip message on %s dropped: %s: %s", topic, type(exc).__name__, exc)

    async def _deliver(self, topic: str, message: Any, authorize: Callable[[Any, Any], bool] | None) -> None:
        try:
            envelope, body = open_envelope(message.data)
        except EnvelopeError:
            self.stats.gossip_dropped["invalid"] += 1
            return
        if authorize is not None and not await trio.to_thread.run_sync(authorize, envelope, body):
            self.stats.gossip_dropped["unauthorized"] += 1
            return
        if not self._replay.admit(envelope, body):
            self.stats.gossip_dropped["replay"] += 1
            return
        try:
            self.gossip_inbox.put_nowait(GossipMessage(topic, ID(message.from_id).to_base58(), message.data))
        except queue.Full:
            self.stats.gossip_dropped["inbox full"] += 1

    def publish(self, topic: str, data: bytes) -> None:
        self.call(self.pubsub.publish, topic, data)

    def protocols(self) -> list[str]:
        """Every protocol id this host answers (ours, gossip's and libp2p's own)."""
        return sorted(str(protocol) for protocol in self.host.get_mux().get_protocols() if protocol)

    def connected_peers(self) -> list[str]:
        return [peer.to_base58() for peer in self.host.get_connected_peers()]


def _describe(failure: BaseException | None) -> str:
    if failure is None:
        return "its run returned"
    while isinstance(failure, BaseExceptionGroup) and len(failure.exceptions) == 1:
        failure = failure.exceptions[0]
    return f"{type(failure).__name__}: {failure}"[:200]


LINGER_S, LINGER_BYTES = 1.0, 64 * 1024


async def _linger(stream: Any) -> None:
    """After our answer, give the peer a moment to close its side (reading and discarding a little)."""
    drained = 0
    with trio.move_on_after(LINGER_S):
        try:
            while drained < LINGER_BYTES:
                piece = await stream.read(16 * 1024)
                if not piece:
                    return
                drained += len(piece)
        except Exception:  # noqa: BLE001 - EOF or reset: the peer is done
            return


async def _release(stream: Any) -> None:
    """Forget whatever the peer sent past its request, then reset the stream. Every protocol here is one
    request and one answer, so those bytes are junk; py-libp2p's yamux would otherwise keep a dead stream's
    unread bytes for a minute, and keep accepting more for a stream whose buffer is not empty."""
    muxed = getattr(stream, "muxed_stream", None)
    conn = getattr(muxed, "conn", None)
    buffers = getattr(conn, "stream_buffers", None)
    if isinstance(buffers, dict) and muxed.stream_id in buffers:
        buffers[muxed.stream_id] = bytearray()
    await _reset(stream)
    if isinstance(buffers, dict) and hasattr(conn, "streams_lock"):
        with trio.move_on_after(1):
            async with conn.streams_lock:  # frames that arrive later find no stream and are dropped
                conn.streams.pop(muxed.stream_id, None)
                buffers.pop(muxed.stream_id, None)
                conn.stream_events.pop(muxed.stream_id, None)


async def _reset(stream: Any) -> None:
    with trio.move_on_after(1):
        try:
            await stream.reset()
        except Exception:  # noqa: BLE001 - the stream may already be gone
            pass


def topics(job: str) -> dict[str, str]:
    """The gossip topics of one job."""
    return {kind: f"/rollnet/{job}/{kind}" for kind in ("policy", "have", "verdict")}

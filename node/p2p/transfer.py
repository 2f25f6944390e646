"""The content-addressed transfer protocol: serve objects by root, fetch them from many providers.

Protocol `/rollnet/object/1.0.0`, one request per stream, JSON request frame then binary response frames:
  {"op": "manifest", "root": hex}         -> frame: status byte (0 ok, 1 missing, 2 busy) + manifest
  {"op": "manifest", "root": hex, "inline": true} -> the same frame; then, for a one-chunk object, the frame a
                                             "chunks" request for chunk 0 would get (same upload limits)
  {"op": "have", "root": hex}             -> frame: status byte + bitmap of verified chunks (bit i of byte i//8)
  {"op": "chunks", "root": hex, "index": [i, ...]} -> per index a frame: status byte + u32 index + chunk
Invariants: a server sends at most `max_uploads` chunk streams at once, at most half of them to one peer
(the rest get "busy" and try elsewhere); all its chunk bytes pass one token bucket, and each peer's also
pass that peer's own bucket (`peer_rate`), so one peer cannot take the whole uplink; a request names each
of the object's chunks at most once and at most 64 of them, so a small request cannot ask for more than 64
chunks' worth of bytes; a fetcher writes only chunks that match the verified manifest, so a bad provider
costs a retry elsewhere, never a corrupt object; a fetch that gets no chunk for a whole `timeout` ends, and
so does one (given `min_rate`) still unfinished `timeout` + min(size, `RATE_SIZE_CAP`) / `min_rate` seconds after
its manifest came, so a provider that trickles chunks just inside `timeout` cannot hold a fetcher for chunks x
`timeout`, however large a size its manifest declares (an object above the cap must come faster);
chunks already on disk are never fetched again (resume); a peer holding part of an object serves that part
(pipelining); a one-chunk object's chunk comes with its manifest (one stream per small fetch, not two), and
is stored only once that manifest passed the fetch's size bounds and the chunk matches it.
"""

from __future__ import annotations

import logging
import random
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio
from rollnet.node.p2p.framing import ByteStream, FrameError, read_frame, read_json, write_frame, write_json
from rollnet.node.p2p.objects import CHUNK_SIZE, Manifest, ObjectError, ObjectStore
from rollnet.node.p2p.ratelimit import PeerBuckets, TokenBucket

PROTOCOL = "/rollnet/object/1.0.0"
OK, MISSING, BUSY = 0, 1, 2
MAX_INDICES = 64
MAX_MANIFEST = 12 + 32 * (1 << 16)
RATE_SIZE_CAP = 8 * (1 << 20)  # the most of an object's declared size that lengthens a `min_rate` deadline
log = logging.getLogger(__name__)

OpenStream = Callable[[str], Awaitable[ByteStream]]


def bitmap(indices: set[int], count: int) -> bytes:
    out = bytearray((count + 7) // 8)
    for i in indices:
        out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def from_bitmap(data: bytes, count: int) -> set[int]:
    return {i for i in range(min(count, len(data) * 8)) if data[i // 8] >> (i % 8) & 1}


class ObjectServer:
    """Serves the objects (whole or partial) in a store."""

    def __init__(self, store: ObjectStore, bucket: TokenBucket, max_uploads: int = 4,
                 peer_rate: float | None = None):
        self.store = store
        self.bucket = bucket
        self.max_uploads = max_uploads
        self.max_uploads_per_peer = max(1, max_uploads // 2)  # one peer never holds every upload slot
        self.uploads_of: Counter = Counter()
        self.peer_buckets = PeerBuckets(peer_rate)
        self.active_uploads = 0
        self.refused_busy = 0
        self.chunks_served = 0

    async def handle(self, stream: ByteStream, remote: str) -> None:
        request = await read_json(stream, timeout=10.0)
        op, root_hex = request.get("op"), request.get("root")
        try:
            root = bytes.fromhex(root_hex) if isinstance(root_hex, str) else b""
        except ValueError:
            root = b""
        manifest = self.store.manifest(root) if len(root) == 32 else None
        if op not in ("manifest", "have", "chunks"):
            raise FrameError(f"unknown op {op!r}")
        if manifest is None:
            await write_frame(stream, bytes([MISSING]))
            return
        if op == "manifest":
            await write_frame(stream, bytes([OK]) + manifest.pack())
            if request.get("inline") is True and manifest.chunk_count == 1:
                await self._send_chunks(stream, root, 1, [0], remote)  # a small object in one stream, not two
        elif op == "have":
            await write_frame(stream, bytes([OK]) + bitmap(self.store.have(root), manifest.chunk_count))
        else:
            await self._send_chunks(stream, root, manifest.chunk_count, request.get("index"), remote)

    async def _send_chunks(self, stream: ByteStream, root: bytes, count: int, indices: object, remote: str) -> None:
        if (not isinstance(indices, list) or len(indices) > MAX_INDICES
                or not all(type(i) is int and 0 <= i < count for i in indices)):
            raise FrameError(f"chunk request needs a list of at most {MAX_INDICES} indices of the object's chunks")
        if len(set(indices)) != len(indices):
            raise FrameError("chunk request names a chunk more than once")
        if self.active_uploads >= self.max_uploads or self.uploads_of[remote] >= self.max_uploads_per_peer:
            self.refused_busy += 1
            await write_frame(stream, bytes([BUSY]))
            return
        self.active_uploads += 1
        self.uploads_of[remote] += 1
        try:
            for index in indices:
                data = await trio.to_thread.run_sync(self.store.read_chunk, root, index)
                if data is None:
                    await write_frame(stream, bytes([MISSING]) + struct.pack(">I", index))
                    continue
                await self.peer_buckets.take(remote, len(data))
                await self.bucket.take(len(data))
                await write_frame(stream, bytes([OK]) + struct.pack(">I", index) + data)
                self.chunks_served += 1
        finally:
            self.active_uploads -= 1
            self.uploads_of[remote] -= 1
            if not self.uploads_of[remote]:
                del self.uploads_of[remote]


@dataclass
class ProviderState:
    peer: str
    have: set[int] = field(default_factory=set)
    failures: int = 0
    busy_until: float = 0.0


@dataclass(frozen=True)
class Inline:
    """What a provider sent along with a one-chunk object's manifest: a status byte and, when OK, chunk 0."""
    peer: str
    status: bytes
    data: bytes


@dataclass
class FetchReport:
    root: bytes
    chunks_fetched: int
    bytes_fetched: int
    retries: int
    by_provider: dict[str, int]


class ObjectFetcher:
    """Fetches an object by root from several providers at once into an ObjectStore."""

    def __init__(self, store: ObjectStore, open_stream: OpenStream, *, per_provider: int = 2,
                 batch: int = 4, max_failures: int = 3, timeout: float = 30.0, refresh: float = 0.2,
                 min_rate: float | None = None, max_size: int | None = None):
        self.store = store
        self.max_size = max_size  # bytes an object may declare, or None (refused before a byte is stored)
        self.min_rate = min_rate  # bytes/s a fetch must average (after `timeout` of grace), or None
        self.open_stream = open_stream
        self.per_provider = per_provider
        self.batch = batch
        self.max_failures = max_failures
        self.timeout = timeout
        self.refresh = refresh

    async def _request(self, peer: str, request: dict) -> ByteStream:
        stream = await self.open_stream(peer)
        await write_json(stream, request)
        return stream

    @staticmethod
    async def _close(stream: ByteStream | None) -> None:
        if stream is not None:
            with trio.move_on_after(1):
                try:
                    await stream.close()
                except Exception:  # noqa: BLE001 - closing a dead stream is fine
                    pass

    async def manifest(self, root: bytes, providers: list[str]) -> Manifest:
        manifest, _ = await self._manifest(root, providers, inline=False)
        return manifest

    def _check_bounds(self, root: bytes, manifest: Manifest) -> None:
        if self.max_size is not None and manifest.size > self.max_size:
            raise ObjectError(f"object {root.hex()[:16]} declares {manifest.size} bytes, more than the "
                              f"{self.max_size} this fetch allows")
        if manifest.chunk_size > CHUNK_SIZE:  # a provider's frames are read whole: never more than a store's chunk
            raise ObjectError(f"object {root.hex()[:16]} declares chunks of {manifest.chunk_size} bytes, more than "
                              f"the {CHUNK_SIZE} objects are cut into")

    async def _manifest(self, root: bytes, providers: list[str], inline: bool) -> tuple[Manifest, Inline | None]:
        """The object's manifest, from the store or the first provider that serves a valid one; with `inline`, also
        what that provider sent along for a one-chunk object (its reply to a chunk request, unverified yet). A
        manifest beyond this fetch's bounds raises before any chunk is read."""
        known = self.store.manifest(root)
        if known is not None:
            return known, None
        request = {"op": "manifest", "root": root.hex(), **({"inline": True} if inline else {})}
        for peer in providers:
            stream = None
            try:
                stream = await self._request(peer, request)
                body = await read_frame(stream, MAX_MANIFEST + 1, self.timeout)
                manifest = Manifest.unpack(body[1:], root) if body[:1] == bytes([OK]) else None
            except Exception as exc:  # noqa: BLE001 - any provider failure means: ask the next one
                log.info("manifest of %s from %s failed: %s", root.hex()[:12], peer, exc)
                manifest = None
            try:
                if manifest is None:
                    continue
                if not inline:
                    return manifest, None
                self._check_bounds(root, manifest)
                if manifest.chunk_count != 1:
                    return manifest, None
                try:
                    frame = await read_frame(stream, 5 + min(manifest.chunk_size, manifest.size), self.timeout)
                except Exception as exc:  # noqa: BLE001 - nothing came along: fetched the usual way, at no fault
                    log.info("chunk of %s did not come with its manifest from %s: %s", root.hex()[:12], peer, exc)
                    return manifest, None
                return manifest, Inline(peer, frame[:1], frame[5:] if frame[1:5] == struct.pack(">I", 0) else b"")
            finally:
                await self._close(stream)
        raise ObjectError(f"no provider served a valid manifest for {root.hex()[:16]}")

    async def _have(self, state: ProviderState, root: bytes, count: int) -> None:
        stream = None
        try:
            stream = await self._request(state.peer, {"op": "have", "root": root.hex()})
            body = await read_frame(stream, 1 + (count + 7) // 8, self.timeout)
            state.have = from_bitmap(body[1:], count) if body[:1] == bytes([OK]) else set()
        except Exception as exc:  # noqa: BLE001 - any provider failure is a retry elsewhere
            state.failures += 1
            log.info("have-query to %s failed: %s", state.peer, exc)
        finally:
            await self._close(stream)

    async def fetch(self, root: bytes, providers: list[str],
                    progress: Callable[[int], None] | None = None) -> FetchReport:
        """Fetch until the object is complete; raises ObjectError when every provider has failed."""
        manifest, first = await self._manifest(root, providers, inline=True)
        self._check_bounds(root, manifest)  # (again: a manifest already in the store was never checked by this fetch)
        largest_chunk = min(manifest.chunk_size, manifest.size)
        self.store.begin(root, manifest)
        report = FetchReport(root, 0, 0, 0, {})
        if first is not None and first.status == bytes([OK]):
            try:
                await trio.to_thread.run_sync(self.store.write_chunk, root, 0, first.data)
                report.chunks_fetched, report.bytes_fetched, report.by_provider[first.peer] = 1, len(first.data), 1
                if progress:
                    progress(0)
            except ObjectError as exc:  # a bad chunk: that provider counts a fault, and the usual fetch follows
                report.retries += 1
                log.info("chunk 0 of %s from %s refused: %s", root.hex()[:12], first.peer, exc)
            if self.store.complete(root):
                return report
        # A one-chunk object is asked for outright: a "have" query would cost a stream to learn one bit. A provider
        # without the chunk (or without the object) answers MISSING, which drops it from `have`, at no fault, and
        # the usual queries follow.
        assumed = {0} if manifest.chunk_count == 1 else set()
        states = [ProviderState(peer, set(assumed)) for peer in dict.fromkeys(providers)]
        for state in states:
            if first is not None and state.peer == first.peer:
                if report.retries:
                    state.failures += 1
                elif first.status == bytes([MISSING]):
                    state.have = set()  # it holds the manifest only: asked "have" later, not chunk 0 again
        in_flight: set[int] = set()
        wake = trio.Event()

        async def worker(state: ProviderState, indices: list[int]) -> None:
            stream = None
            try:
                stream = await self._request(state.peer, {"op": "chunks", "root": root.hex(), "index": indices})
                for _ in indices:
                    body = await read_frame(stream, 5 + largest_chunk, self.timeout)
                    if body[:1] == bytes([BUSY]):
                        state.busy_until = trio.current_time() + 0.05 * random.uniform(1, 3)
                        return
                    if body == bytes([MISSING]):  # it does not know the object (yet): no fault, ask "have" later
                        state.have.difference_update(indices)
                        return
                    (index,) = struct.unpack(">I", body[1:5])
                    if body[:1] != bytes([OK]) or index not in indices:
                        state.have.discard(index)
                        continue
                    await trio.to_thread.run_sync(self.store.write_chunk, root, index, body[5:])
                    report.chunks_fetched += 1
                    report.bytes_fetched += len(body) - 5
                    report.by_provider[state.peer] = report.by_provider.get(state.peer, 0) + 1
                    in_flight.discard(index)
                    if progress:
                        progress(index)
            except Exception as exc:  # noqa: BLE001 - a bad provider costs a retry, never the fetch
                state.failures += 1
                report.retries += 1
                log.info("chunks from %s failed (%s); retrying elsewhere", state.peer, exc)
            finally:
                await self._close(stream)
                in_flight.difference_update(indices)
                active[state.peer] -= 1
                wake.set()

        active = {s.peer: 0 for s in states}
        failed = False
        give_up_at = (trio.current_time() + self.timeout + min(manifest.size, RATE_SIZE_CAP) / self.min_rate
                      if self.min_rate else float("inf"))
        async with trio.open_nursery() as nursery:
            last_refresh = -1.0
            moved = (report.chunks_fetched, trio.current_time())  # (chunks fetched, when that last changed)
            while not self.store.complete(root):
                usable = [s for s in states if s.failures < self.max_failures]
                now = trio.current_time()
                if report.chunks_fetched != moved[0] or in_flight:
                    moved = (report.chunks_fetched, now)
                # every provider failed, none has had a chunk for us for a whole timeout, or all are too slow
                if not usable or now - moved[1] > self.timeout or now > give_up_at:
                    failed = True
                    nursery.cancel_scope.cancel()
                    break
                if now - last_refresh > self.refresh:
                    async with trio.open_nursery() as queries:
                        for state in usable:
                            if len(state.have) < manifest.chunk_count:  # a complete provider stays complete
                                queries.start_soon(self._have, state, root, manifest.chunk_count)
                    last_refresh = trio.current_time()
                missing = [i for i in range(manifest.chunk_count) if i not in self.store.have(root)
                           and i not in in_flight]
                # Rarest chunks first, so providers' holdings diverge and everyone has something to serve.
                rarity = {i: sum(i in s.have for s in usable) for i in missing}
                random.shuffle(missing)
                missing.sort(key=lambda i: rarity[i])
                # Round-robin over providers with free slots, in batches small enough to spread the work.
                share = max(1, -(-len(missing) // max(1, len(usable))))
                assigned = True
                while assigned:
                    assigned = False
                    for state in sorted(usable, key=lambda s: active[s.peer]):
                        if active[state.peer] >= self.per_provider or state.busy_until > now:
                            continue
                        pick = [i for i in missing if i in state.have and i not in in_flight][: min(self.batch, share)]
                        if pick:
                            in_flight.update(pick)
                            active[state.peer] += 1
                            nursery.start_soon(worker, state, pick)
                            assigned = True
                wake = trio.Event()
                with trio.move_on_after(0.05):
                    await wake.wait()
        if failed:
            raise ObjectError(f"every provider failed or stalled for {root.hex()[:16]}")
        return report

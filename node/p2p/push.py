"""The push protocol: a peer hands us an object (e.g. a rollout batch), streamed to disk and verified chunk by
chunk, within per-peer quotas.

Protocol `/rollnet/push/2.0.0`, one object per stream:
  pusher -> {"root": hex}                       JSON frame
  pusher -> packed manifest                     one frame (size, chunk size, chunk hashes), checked against root
  server -> {"send": bool} | {"ok": false, "error": str}   send=false: we already hold the object
  pusher -> chunk 0, chunk 1, ...               one frame each, exactly the manifest's lengths
  server -> {"ok": true} | {"ok": false, "error": str}
Invariants: nothing of a push is held in memory beyond one chunk; a chunk is written (to a staging area)
only after it matched its manifest hash, and an object enters the store only whole, so a stored object is
exactly its root or nothing, a failed push is deleted from staging, and no push can remove or corrupt an
object the store holds (whole, or partly fetched);
a peer's bytes in flight and bytes stored by its pushes never exceed its quotas, checked before the first
chunk is read (the stored quota counts every push the process took in; `PushQuota.release` gives it back);
an object is never received by two pushes at once.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from rollnet.node.p2p.framing import FrameError, read_frame, read_json, write_frame, write_json
from rollnet.node.p2p.objects import CHUNK_SIZE, Manifest, ObjectError, ObjectStore

PROTOCOL = "/rollnet/push/2.0.0"
MAX_PUSH = 64 * 1024 * 1024
MAX_MANIFEST = 12 + 32 * -(-MAX_PUSH // 1024)
STAGING = ".incoming"


class PushRefused(ObjectError):
    """A well-formed push we will not take (quota, busy): the peer's answer says why."""


@dataclass
class PushQuota:
    """Bytes each peer may have in flight and stored through pushes."""

    in_flight_bytes: int = 2 * MAX_PUSH
    stored_bytes: int = 8 * MAX_PUSH
    in_flight: Counter = field(default_factory=Counter)
    stored: Counter = field(default_factory=Counter)

    def reserve(self, peer: str, size: int) -> None:
        if self.in_flight[peer] + size > self.in_flight_bytes:
            raise PushRefused(f"in-flight quota: {self.in_flight[peer]} + {size} B exceeds {self.in_flight_bytes} B")
        if self.stored[peer] + self.in_flight[peer] + size > self.stored_bytes:
            raise PushRefused(f"storage quota: {self.stored[peer]} B stored, {size} B more exceeds "
                              f"{self.stored_bytes} B")
        self.in_flight[peer] += size

    def release(self, peer: str, size: int) -> None:
        """A consumer deleted `size` bytes `peer` pushed: they no longer count against its storage quota."""
        self.stored[peer] = max(0, self.stored[peer] - size)
        if not self.stored[peer]:
            del self.stored[peer]

    def settle(self, peer: str, size: int, stored: bool) -> None:
        self.in_flight[peer] -= size
        if not self.in_flight[peer]:
            del self.in_flight[peer]
        if stored:
            self.stored[peer] += size


class PushReceiver:
    """Serves the push protocol into an ObjectStore, staging each push in `<store>/.incoming/` until it is
    whole and verified (a staged push that fails is deleted there; objects in the store are never touched)."""

    def __init__(self, store: ObjectStore, quota: PushQuota | None = None, *, max_push: int = MAX_PUSH,
                 on_push: Callable[[bytes, str], None] | None = None):
        self.store = store
        self.quota = quota or PushQuota()
        self.max_push = max_push
        self.on_push = on_push
        staging = store.folder / STAGING
        shutil.rmtree(staging, ignore_errors=True)  # what a stopped or crashed run left half-received
        self.staging = ObjectStore(staging)
        self._receiving: set[bytes] = set()

    async def handle(self, stream: Any, peer: str) -> None:
        header = await read_json(stream, max_size=256, timeout=10.0)
        root_hex = header.get("root")
        try:
            root = bytes.fromhex(root_hex) if isinstance(root_hex, str) else b""
        except ValueError:
            root = b""
        if len(root) != 32:
            raise FrameError("a push header needs a 32-byte hex root")
        manifest = Manifest.unpack(await read_frame(stream, MAX_MANIFEST, timeout=10.0), root)
        if manifest.size > self.max_push or not 0 < manifest.chunk_size <= CHUNK_SIZE:
            raise FrameError(f"a push may carry up to {self.max_push} B in chunks up to {CHUNK_SIZE} B")
        if self.store.complete(root):
            await write_json(stream, {"send": False})
            return
        if root in self._receiving:
            await _refuse(stream, "busy: this object is already being pushed")
            return
        try:
            self.quota.reserve(peer, manifest.size)
        except PushRefused as exc:
            await _refuse(stream, str(exc))
            return
        self._receiving.add(root)
        stored = False
        try:
            await trio.to_thread.run_sync(self.staging.begin, root, manifest)
            await write_json(stream, {"send": True})
            for index in range(manifest.chunk_count):
                chunk = await read_frame(stream, manifest.chunk_length(index), timeout=30.0)
                try:
                    await trio.to_thread.run_sync(self.staging.write_chunk, root, index, chunk)
                except ObjectError:
                    await _refuse(stream, f"chunk {index} does not match the manifest")
                    raise
            await trio.to_thread.run_sync(self._adopt, root, manifest)
            stored = True
        finally:
            with trio.CancelScope(shield=True):  # even when the host is stopping: leave nothing half-done
                await trio.to_thread.run_sync(self.staging.discard, root)
                self._receiving.discard(root)
                self.quota.settle(peer, manifest.size, stored)
        if self.on_push is not None:  # before the answer: a pusher that hears "ok" knows we have taken it in
            await trio.to_thread.run_sync(self.on_push, root, peer)
        await write_json(stream, {"ok": True})

    def _adopt(self, root: bytes, manifest: Manifest) -> None:
        """Move a verified staged object into the store, or fill in what a fetch of it has not written yet."""
        if self.store.complete(root):
            return
        if self.store.manifest(root) is None:
            self.store.adopt(root, manifest, self.staging.data_path(root))
            return
        for index in set(range(manifest.chunk_count)) - self.store.have(root):
            self.store.write_chunk(root, index, self.staging.read_chunk(root, index))


async def send(stream: Any, data: bytes, manifest: Manifest) -> None:
    """Push `data` (whose manifest is `manifest`) over an open stream; raises ObjectError if refused."""
    await write_json(stream, {"root": manifest.root().hex()})
    await write_frame(stream, manifest.pack())
    answer = await read_json(stream, timeout=30.0)
    if answer.get("send") is False:
        return
    if answer.get("send") is not True:
        raise PushRefused(f"the peer refused the push: {answer.get('error')}")
    for offset in range(0, len(data), manifest.chunk_size):
        await write_frame(stream, data[offset:offset + manifest.chunk_size])
    answer = await read_json(stream, timeout=30.0)
    if not answer.get("ok"):
        raise PushRefused(f"the peer refused the push: {answer.get('error')}")


async def _refuse(stream: Any, reason: str) -> None:
    with trio.move_on_after(2):
        await write_json(stream, {"ok": False, "error": reason})

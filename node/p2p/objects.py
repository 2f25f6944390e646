"""Content-addressed objects (policy deltas, rollout batches) cut into verifiable chunks.

An object of `size` bytes is cut into chunks of `chunk_size` bytes (the last may be shorter). Its manifest
lists each chunk's blake3 hash; its root is blake3("rollnet-object-v1" | u64 size | u32 chunk_size |
Merkle root of the chunk hashes). Invariants: a manifest is accepted only if it hashes to the root asked
for, and a chunk only if it hashes to its manifest entry, so a fetched object is the object asked for or
nothing; a partial object on disk records which chunks are verified, so a transfer resumes from there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import blake3
from rollnet.node.merkle import merkle_root

CHUNK_SIZE = 1 << 20
ROOT_DOMAIN = b"rollnet-object-v1"
MAX_OBJECT = 1 << 36  # 64 GiB


class ObjectError(ValueError):
    """A manifest or chunk does not match the root it claims."""


def chunk_hash(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


@dataclass(frozen=True)
class Manifest:
    size: int
    chunk_size: int
    chunk_hashes: tuple[bytes, ...]

    @property
    def chunk_count(self) -> int:
        return len(self.chunk_hashes)

    def root(self) -> bytes:
        return blake3.blake3(
            ROOT_DOMAIN + struct.pack("<QI", self.size, self.chunk_size) + merkle_root(self.chunk_hashes)
        ).digest()

    def chunk_length(self, index: int) -> int:
        return min(self.chunk_size, self.size - index * self.chunk_size)

    def pack(self) -> bytes:
        return struct.pack("<QI", self.size, self.chunk_size) + b"".join(self.chunk_hashes)

    @classmethod
    def unpack(cls, data: bytes, expected_root: bytes) -> Manifest:
        if len(data) < 12 or (len(data) - 12) % 32:
            raise ObjectError("malformed manifest")
        size, chunk_size = struct.unpack_from("<QI", data, 0)
        hashes = tuple(data[12 + 32 * i:44 + 32 * i] for i in range((len(data) - 12) // 32))
        if size > MAX_OBJECT or chunk_size == 0 or len(hashes) != -(-size // chunk_size):
            raise ObjectError("manifest sizes are inconsistent")
        manifest = cls(size, chunk_size, hashes)
        if manifest.root() != expected_root:
            raise ObjectError("manifest does not match the requested root")
        return manifest

    @classmethod
    def of(cls, data: bytes, chunk_size: int = CHUNK_SIZE) -> Manifest:
        hashes = tuple(chunk_hash(data[i:i + chunk_size]) for i in range(0, len(data), chunk_size))
        return cls(len(data), chunk_size, hashes)


def object_root(data: bytes, chunk_size: int = CHUNK_SIZE) -> bytes:
    """The content address of `data`."""
    return Manifest.of(data, chunk_size).root()


class ObjectStore:
    """Objects on disk under `folder/<root hex>`: `data` (preallocated), `manifest`, `have.json` (verified
    chunk indices). Complete objects are served whole; partial ones serve the chunks they have."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._manifests: dict[bytes, Manifest] = {}
        self._have: dict[bytes, set[int]] = {}
        self._lock = threading.Lock()  # fetch workers write chunks from several threads
        for entry in folder.iterdir():
            if entry.is_dir() and (entry / "manifest").exists():
                root = bytes.fromhex(entry.name)
                self._manifests[root] = Manifest.unpack((entry / "manifest").read_bytes(), root)
                self._have[root] = set(json.loads((entry / "have.json").read_text()))

    def _dir(self, root: bytes) -> Path:
        return self.folder / root.hex()

    def put(self, data: bytes, chunk_size: int = CHUNK_SIZE) -> bytes:
        """Store a whole object we made ourselves; returns its root."""
        manifest = Manifest.of(data, chunk_size)
        root = manifest.root()
        self.begin(root, manifest)
        path = self._dir(root) / "data"
        path.write_bytes(data)
        self._have[root] = set(range(manifest.chunk_count))
        self._save_have(root)
        return root

    def put_file(self, path: Path, chunk_size: int = CHUNK_SIZE) -> bytes:
        """Store a whole object from a file we made ourselves (an anchor checkpoint), never holding more than
        one chunk in memory: the file is hard-linked in where the filesystem allows (else copied), then the
        linked copy is hashed, so the object is exactly the bytes its manifest names. Returns its root."""
        staged = self.folder / f".{os.getpid()}-{threading.get_ident()}-{path.name}.tmp"
        staged.unlink(missing_ok=True)
        try:
            os.link(path, staged)
        except OSError:
            shutil.copyfile(path, staged)
        hashes: list[bytes] = []
        size = 0
        with open(staged, "rb") as handle:
            while chunk := handle.read(chunk_size):
                hashes.append(chunk_hash(chunk))
                size += len(chunk)
        manifest = Manifest(size, chunk_size, tuple(hashes))
        root = manifest.root()
        if self.complete(root):
            staged.unlink()
        else:
            self.adopt(root, manifest, staged)
        return root

    def begin(self, root: bytes, manifest: Manifest) -> None:
        """Start (or resume) receiving an object whose manifest was verified against `root`."""
        if root in self._manifests:
            return
        folder = self._dir(root)
        folder.mkdir(exist_ok=True)
        with open(folder / "data", "wb") as handle:
            handle.truncate(manifest.size)
        (folder / "manifest").write_bytes(manifest.pack())
        self._manifests[root] = manifest
        self._have[root] = set()
        self._save_have(root)

    def _save_have(self, root: bytes) -> None:
        with self._lock:
            path = self._dir(root) / "have.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(sorted(self._have[root])))
            os.replace(tmp, path)

    def manifest(self, root: bytes) -> Manifest | None:
        return self._manifests.get(root)

    def have(self, root: bytes) -> set[int]:
        with self._lock:
            return set(self._have.get(root, ()))

    def complete(self, root: bytes) -> bool:
        manifest = self._manifests.get(root)
        with self._lock:
            return manifest is not None and len(self._have[root]) == manifest.chunk_count

    def write_chunk(self, root: bytes, index: int, data: bytes) -> None:
        """Verify and store one chunk; raises ObjectError on a bad chunk (nothing is written)."""
        manifest = self._manifests[root]
        if not 0 <= index < manifest.chunk_count:
            raise ObjectError(f"chunk {index} is outside the object")
        if len(data) != manifest.chunk_length(index) or chunk_hash(data) != manifest.chunk_hashes[index]:
            raise ObjectError(f"chunk {index} does not match the manifest")
        with open(self._dir(root) / "data", "r+b") as handle:
            handle.seek(index * manifest.chunk_size)
            handle.write(data)
        with self._lock:
            self._have[root].add(index)
        self._save_have(root)

    def data_path(self, root: bytes) -> Path:
        return self._dir(root) / "data"

    def adopt(self, root: bytes, manifest: Manifest, data_file: Path) -> None:
        """Take in a whole object whose every chunk was verified against `manifest` elsewhere (a staged
        push), moving `data_file` into place."""
        folder = self._dir(root)
        folder.mkdir(exist_ok=True)
        os.replace(data_file, folder / "data")
        (folder / "manifest").write_bytes(manifest.pack())
        with self._lock:
            self._manifests[root] = manifest
            self._have[root] = set(range(manifest.chunk_count))
        self._save_have(root)

    def discard(self, root: bytes) -> None:
        """Forget an object and delete its files (a staged push that failed, or one already adopted)."""
        with self._lock:
            self._manifests.pop(root, None)
            self._have.pop(root, None)
        folder = self._dir(root)
        for name in ("data", "manifest", "have.json", "have.tmp"):
            (folder / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()

    def read_chunk(self, root: bytes, index: int) -> bytes | None:
        if index not in self._have.get(root, ()):
            return None
        manifest = self._manifests[root]
        with open(self._dir(root) / "data", "rb") as handle:
            handle.seek(index * manifest.chunk_size)
            return handle.read(manifest.chunk_length(index))

    def read(self, root: bytes) -> bytes:
        if not self.complete(root):
            raise ObjectError(f"object {root.hex()[:16]} is not complete")
        return (self._dir(root) / "data").read_bytes()

    def roots(self) -> list[bytes]:
        return list(self._manifests)

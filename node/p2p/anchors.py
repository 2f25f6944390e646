"""Anchor checkpoints served over libp2p: whoever holds an anchor in its policy store (the trainer, and every
worker or validator that holds one) offers it, with the model's config and tokenizer, as a bundle of
content-addressed objects.

Protocol `/rollnet/anchor/1.0.0` (`host.ANCHOR_PROTOCOL`), one request per stream, behind the stake gate:
  {"job": address, "at_most": v}  ->  {"bundle": AnchorBundle}, or {"bundle": null} when it holds none
The bundle names the newest anchor the server holds at or below `at_most`: its version, the hash of every
tensor (`checkpoint.tensor_hash`, so the hashes' Merkle root is that version's content root, the chain's
policyRoot[version]), and the checkpoint file and the config, generation config and tokenizer files as
object roots and sizes (their identity is the chain's `modelFilesHash`, checked by the fetcher).
The files travel over the object protocol (transfer.py: chunked, each chunk verified against its object's
root, resumable, from every peer that offers the same object).

Invariants: requests and bundles are schema-checked with hard bounds (at most MAX_TENSORS tensors with
names of at most MAX_NAME bytes; only the file names in FILE_LIMITS, each within its byte limit, config and
tokenizer required; a checkpoint of at most MAX_CHECKPOINT bytes), so what a bundle can make a fetcher
download is bounded before anything is downloaded; a malformed request or answer is a fault against its
sender. A server offers only an anchor whose tensors hash to the root its store recorded for that version,
and stops offering an anchor its store pruned (deleting that checkpoint's object). Nothing here decides
that a bundle is the job's model: the fetcher (`model.peer_source`) checks the hashes' root against the
chain before it downloads the checkpoint, and the checkpoint against the hashes after.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from rollnet.node.delta.checkpoint import LazyCheckpoint, root_of_hashes, tensor_hash
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import ConfigError
from rollnet.node.p2p.envelopes import JobAddress
from rollnet.node.p2p.framing import FrameError
from rollnet.node.p2p.objects import MAX_OBJECT, ObjectStore

if TYPE_CHECKING:
    from rollnet.node.p2p.host import P2PNode

log = logging.getLogger(__name__)
Hex32 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
CHECKPOINT = "model.safetensors"
MIB = 1024 * 1024
# The model files a bundle may carry besides the checkpoint, with their size limits.
FILE_LIMITS: dict[str, int] = {
    "config.json": 1 * MIB,
    "tokenizer.json": 64 * MIB,
    "tokenizer_config.json": 4 * MIB,
    "special_tokens_map.json": 1 * MIB,
    "chat_template.jinja": 1 * MIB,
    "generation_config.json": 1 * MIB,
}
REQUIRED_FILES = ("config.json", "tokenizer.json")
MAX_CHECKPOINT = MAX_OBJECT
MAX_TENSORS = 16_384
MAX_NAME = 256
ASK_PEERS = 16


class _ForJob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    job: JobAddress


class BundleFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(max_length=64)
    root: Hex32
    size: int = Field(ge=1, le=MAX_CHECKPOINT)


class AnchorBundle(_ForJob):
    """One anchor as a server offers it (unverified until the fetcher checks it against the chain)."""

    version: int = Field(ge=0)
    tensors: dict[str, Hex32]  # name -> tensor hash
    checkpoint: BundleFile
    files: tuple[BundleFile, ...] = Field(max_length=len(FILE_LIMITS))

    @field_validator("tensors")
    @classmethod
    def _bounded_tensors(cls, value: dict[str, str]) -> dict[str, str]:
        if not 1 <= len(value) <= MAX_TENSORS:
            raise ValueError(f"a bundle lists 1 to {MAX_TENSORS} tensors")
        if any(not 1 <= len(name.encode()) <= MAX_NAME for name in value):
            raise ValueError(f"tensor names have 1 to {MAX_NAME} bytes")
        return value

    @model_validator(mode="after")
    def _known_files(self) -> AnchorBundle:
        if self.checkpoint.name != CHECKPOINT:
            raise ValueError(f"the checkpoint is named {CHECKPOINT!r}")
        names = [f.name for f in self.files]
        if len(set(names)) != len(names):
            raise ValueError("a bundle names each file once")
        for entry in self.files:
            limit = FILE_LIMITS.get(entry.name)
            if limit is None:
                raise ValueError(f"{entry.name!r} is not a model file a bundle may carry")
            if entry.size > limit:
                raise ValueError(f"{entry.name} of {entry.size} bytes is over its limit of {limit}")
        missing = [name for name in REQUIRED_FILES if name not in names]
        if missing:
            raise ValueError(f"a bundle carries {', '.join(missing)}")
        return self

    def tensor_root(self) -> bytes:
        """The content root these tensor hashes make (what the chain must hold for `version`)."""
        return root_of_hashes({name: bytes.fromhex(digest) for name, digest in self.tensors.items()})

    def key(self) -> str:
        """Identical bundles from several peers share this key (and can be fetched from all of them)."""
        return self.model_dump_json()


class AnchorRequest(_ForJob):
    at_most: int = Field(ge=0)


class AnchorAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    bundle: AnchorBundle | None = None


def model_files(model: Any, tokenizer: Any) -> dict[str, bytes]:
    """The config, generation config and tokenizer files of a loaded model, as `save_pretrained` writes them
    (only the names a bundle may carry): loaded back, they have the model's `model_files_hash`."""
    with tempfile.TemporaryDirectory() as tmp:
        model.config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return {path.name: path.read_bytes() for path in sorted(Path(tmp).iterdir()) if path.name in FILE_LIMITS}


class AnchorServer:
    """Offers the anchors of one job's policy store (see the module invariants). `answer` runs off the trio
    thread; a bundle is prepared (its tensors hashed, its checkpoint hard-linked into the object store) on
    its first request and kept until the store prunes that anchor."""

    def __init__(self, job: str, store: PolicyStore, objects: ObjectStore, files: Mapping[str, bytes]):
        for name in REQUIRED_FILES:
            if name not in files:
                raise ConfigError(f"cannot serve anchors without the model's {name}")
        entries = []
        for name, data in sorted(files.items()):
            if name not in FILE_LIMITS or not 0 < len(data) <= FILE_LIMITS[name]:
                raise ConfigError(f"cannot serve {name} of {len(data)} bytes in an anchor bundle")
            entries.append(BundleFile(name=name, root=objects.put(data).hex(), size=len(data)))
        self.job = job
        self.store = store
        self.objects = objects
        self.files = tuple(entries)
        self._bundles: dict[int, AnchorBundle] = {}
        self._lock = threading.Lock()

    def answer(self, request: dict) -> dict:
        """The answer to a peer's request; a malformed request raises ValueError (the asker's fault)."""
        asked = AnchorRequest.model_validate(request)
        if asked.job.lower() != self.job.lower():
            return {"bundle": None}
        with self._lock:
            self._forget_pruned()
            for version in sorted(self.store.anchors, reverse=True):
                if version > asked.at_most:
                    continue
                bundle = self._bundle(version)
                if bundle is not None:
                    return {"bundle": bundle.model_dump(mode="json")}
        return {"bundle": None}

    def _forget_pruned(self) -> None:
        anchors = set(self.store.anchors)
        for version in [v for v in self._bundles if v not in anchors]:
            self.objects.discard(bytes.fromhex(self._bundles.pop(version).checkpoint.root))

    def _bundle(self, version: int) -> AnchorBundle | None:
        if version in self._bundles:
            return self._bundles[version]
        path = self.store.anchor_path(version)
        try:
            checkpoint = LazyCheckpoint(path)
            hashes = {name: tensor_hash(name, checkpoint[name]) for name in checkpoint}
            if root_of_hashes(hashes) != self.store.roots.get(version):
                log.warning("not serving anchor %d: %s does not match the root the store recorded", version, path)
                return None
            root = self.objects.put_file(path)
        except Exception as exc:  # noqa: BLE001 - a pruned or unreadable anchor is simply not offered
            log.warning("not serving anchor %d: %s", version, exc)
            return None
        manifest = self.objects.manifest(root)
        assert manifest is not None
        bundle = AnchorBundle(job=self.job, version=version, tensors={n: h.hex() for n, h in hashes.items()},
                              checkpoint=BundleFile(name=CHECKPOINT, root=root.hex(), size=manifest.size),
                              files=self.files)
        self._bundles[version] = bundle
        return bundle


@dataclass(frozen=True)
class Offer:
    peer: str
    bundle: AnchorBundle


def ask_anchors(node: P2PNode, job: str, at_most: int, peers: list[str]) -> list[Offer]:
    """The anchor each of `peers` offers at or below `at_most` (asked in parallel). A malformed answer, or one
    for another job or above `at_most`, is a fault against its peer; a peer that cannot answer is skipped."""
    request = AnchorRequest(job=job, at_most=at_most).model_dump()

    def ask(peer: str) -> Offer | None:
        try:
            answer = AnchorAnswer.model_validate(node.ask_anchor(peer, request))
        except (FrameError, ValidationError, json.JSONDecodeError) as exc:
            node.report_fault(peer, "anchor:malformed answer")
            log.info("anchor answer from %s is malformed: %s", peer, str(exc).splitlines()[0])
            return None
        except Exception as exc:  # noqa: BLE001 - unreachable, reset, slow or without the protocol: skipped
            log.info("anchor request to %s failed: %s", peer, exc)
            return None
        bundle = answer.bundle
        if bundle is None:
            return None
        if bundle.job.lower() != job.lower() or bundle.version > at_most:
            node.report_fault(peer, "anchor:unasked offer")
            log.info("%s offered anchor %d of %s when asked for %s at or below %d", peer, bundle.version,
                     bundle.job, job, at_most)
            return None
        return Offer(peer, bundle)

    peers = peers[:ASK_PEERS]
    if not peers:
        return []
    with ThreadPoolExecutor(max_workers=len(peers)) as pool:
        return [offer for offer in pool.map(ask, peers) if offer is not None]

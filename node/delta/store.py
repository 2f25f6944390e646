"""A node's policy versions on disk: full anchors every N versions and the signed deltas between them.

Layout under the store's folder: `index.json` (version -> content root, anchors, deltas),
`anchors/v<version>.safetensors`, `deltas/v<base>-v<version>.rnd`.
Invariants: every recorded root is either computed from weights or signed by the job's trainer; a node
holding version v reaches v+k by applying the k deltas in order; `materialize(v)` starts from the newest
anchor at or below v; pruning keeps the newest `keep_anchors` anchors and every delta after the oldest of
them, so every version from that anchor to the latest stays reachable; a version that cannot be encoded
leaves the store (index and files) as it was.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

import torch
from eth_account.signers.local import LocalAccount
from rollnet.node.delta.bitcast import TORCH_SIGNED
from rollnet.node.delta.checkpoint import content_root, load_checkpoint, save_checkpoint
from rollnet.node.delta.codec import apply, encode_stream, parse, verify_header
from rollnet.node.delta.container import Trailer
from rollnet.node.errors import ConfigError, DeltaError


@dataclass(frozen=True)
class Published:
    version: int
    root: bytes
    delta_bytes: int | None
    anchored: bool
    changed_fraction: float | None = None  # of the elements, against the previous version


def changed_fraction(before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor]) -> float:
    """The fraction of elements whose bit pattern differs between two versions (a new, retyped or reshaped
    tensor counts as changed throughout)."""
    changed = total = 0
    for name, tensor in after.items():
        changed += _differing(before.get(name), tensor)
        total += tensor.numel()
    return changed / max(1, total)


def _differing(old: torch.Tensor | None, new: torch.Tensor) -> int:
    if old is None or old.dtype != new.dtype or old.shape != new.shape:
        return new.numel()
    width = new.element_size()
    if width in TORCH_SIGNED:
        return int((old.view(TORCH_SIGNED[width]) != new.view(TORCH_SIGNED[width])).sum())
    return int((old != new).sum())


def _write_stream(stream: Generator[bytes, None, Trailer], path: Path) -> bytes:
    """Write an encoded delta's records to `path`; returns its target root."""
    with path.open("wb") as handle:
        while True:
            try:
                handle.write(next(stream))
            except StopIteration as done:
                return done.value.target_root


class PolicyStore:
    def __init__(self, folder: Path, *, trainer: str, anchor_every: int = 10, keep_anchors: int = 2):
        if anchor_every < 1 or keep_anchors < 1:
            raise ConfigError("anchor_every and keep_anchors must be at least 1")
        self.folder = folder
        self.trainer = trainer
        self.anchor_every = anchor_every
        self.keep_anchors = keep_anchors
        (folder / "anchors").mkdir(parents=True, exist_ok=True)
        (folder / "deltas").mkdir(parents=True, exist_ok=True)
        self._index_path = folder / "index.json"
        self.roots: dict[int, bytes] = {}
        self.anchors: list[int] = []
        self.deltas: dict[int, int] = {}  # version -> base version
        if self._index_path.exists():
            self._load_index()

    # ------------------------------------------------------------------ index

    def _load_index(self) -> None:
        try:
            data = json.loads(self._index_path.read_text())
            self.roots = {int(v): bytes.fromhex(r) for v, r in data["roots"].items()}
            self.anchors = sorted(int(v) for v in data["anchors"])
            self.deltas = {int(v): int(b) for v, b in data["deltas"].items()}
        except (json.JSONDecodeError, KeyError, ValueError) as exc:
            raise ConfigError(f"{self._index_path} is corrupt ({exc})") from None

    def _save_index(self) -> None:
        data = {
            "roots": {str(v): r.hex() for v, r in sorted(self.roots.items())},
            "anchors": self.anchors,
            "deltas": {str(v): b for v, b in sorted(self.deltas.items())},
        }
        tmp = self._index_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self._index_path)

    @property
    def latest(self) -> int | None:
        return max(self.roots) if self.roots else None

    def anchor_path(self, version: int) -> Path:
        return self.folder / "anchors" / f"v{version:08d}.safetensors"

    def delta_path(self, version: int) -> Path:
        return self.folder / "deltas" / f"v{self.deltas[version]:08d}-v{version:08d}.rnd"

    # ------------------------------------------------------------------ adding versions

    def add_anchor(self, version: int, tensors: Mapping[str, torch.Tensor], root: bytes | None = None) -> bytes:
        """Store a full checkpoint; its root is computed here and must equal `root` when given."""
        computed = content_root(tensors)
        if root is not None and computed != root:
            raise DeltaError(f"anchor {version} does not match its announced root")
        known = self.roots.get(version)
        if known is not None and known != computed:
            raise DeltaError(f"anchor {version} differs from the recorded root of that version")
        save_checkpoint(self.anchor_path(version), tensors, metadata={"version": str(version)})
        self.roots[version] = computed
        if version not in self.anchors:
            self.anchors = sorted([*self.anchors, version])
        self._save_index()
        return computed

    def add_delta(self, data: bytes) -> int:
        """Store a received delta after checking its signature and that it extends a known version."""
        delta = parse(data)
        base = delta.base_version
        if base not in self.roots:
            raise DeltaError(f"delta {base}->{delta.version} extends version {base}, which this store lacks")
        verify_header(delta, trainer=self.trainer, base_version=base, base_root=self.roots[base])
        self.deltas[delta.version] = base
        self.delta_path(delta.version).write_bytes(data if isinstance(data, bytes) else delta.to_bytes())
        self.roots[delta.version] = delta.trailer.target_root
        self._save_index()
        return delta.version

    def publish(
        self, version: int, tensors: Mapping[str, torch.Tensor], signer: LocalAccount,
        previous: Mapping[str, torch.Tensor] | None = None,
    ) -> Published:
        """Trainer side: record `version`, as a delta from the latest version and, when due, as an anchor."""
        latest = self.latest
        if latest is not None and version <= latest:
            raise DeltaError(f"version {version} is not newer than the latest stored version {latest}")
        delta_bytes = None
        root = None
        changed = None
        if latest is not None:
            base = previous if previous is not None else self.materialize(latest)
            changed = changed_fraction(base, tensors)
            stream = encode_stream(base, tensors, base_version=latest, version=version, signer=signer,
                                   base_root=self.roots[latest])
            self.deltas[version] = latest
            path = self.delta_path(version)
            tmp = path.with_suffix(".tmp")
            try:
                root = _write_stream(stream, tmp)
            except BaseException:  # e.g. a tensor the format cannot carry: the store stays as it was
                del self.deltas[version]
                tmp.unlink(missing_ok=True)
                raise
            tmp.replace(path)
            delta_bytes = path.stat().st_size
            self.roots[version] = root
        anchored = latest is None or version % self.anchor_every == 0
        if anchored:
            root = self.add_anchor(version, tensors, root)
        self._save_index()
        self.prune()
        assert root is not None
        return Published(version, root, delta_bytes, anchored, changed)

    # ------------------------------------------------------------------ reaching versions

    def materialize(self, version: int) -> dict[str, torch.Tensor]:
        """The weights of `version`: the newest anchor at or below it plus the deltas after it."""
        anchors = [a for a in self.anchors if a <= version]
        if not anchors:
            raise DeltaError(f"no anchor at or below version {version} (anchors: {self.anchors})")
        start = anchors[-1]
        tensors = load_checkpoint(self.anchor_path(start))
        if start != version:
            self.advance(tensors, start, version)
        return tensors

    def chain(self, from_version: int, to_version: int) -> list[int]:
        """The versions whose deltas lead from `from_version` to `to_version`, in order."""
        path = []
        version = to_version
        while version != from_version:
            if version not in self.deltas:
                raise DeltaError(f"no delta chain from version {from_version} to {to_version} (missing {version})")
            path.append(version)
            version = self.deltas[version]
        return path[::-1]

    def reaches(self, from_version: int, to_version: int) -> bool:
        """Whether this store's deltas lead from `from_version` to `to_version`."""
        try:
            self.chain(from_version, to_version)
        except DeltaError:
            return False
        return True

    def advance(self, tensors: MutableMapping[str, torch.Tensor], from_version: int, to_version: int) -> bytes:
        """Apply the deltas from `from_version` to `to_version` in place; returns the new root."""
        root = self.roots[from_version]
        for version in self.chain(from_version, to_version):
            applied = apply(tensors, self.delta_path(version).read_bytes(), trainer=self.trainer,
                            base_version=self.deltas[version], base_root=root)
            root = applied.root
        return root

    # ------------------------------------------------------------------ pruning

    def prune(self) -> list[Path]:
        """Drop anchors beyond the newest `keep_anchors` and deltas at or before the oldest kept anchor."""
        removed: list[Path] = []
        if len(self.anchors) <= self.keep_anchors:
            return removed
        drop, keep = self.anchors[:-self.keep_anchors], self.anchors[-self.keep_anchors:]
        for version in drop:
            path = self.anchor_path(version)
            path.unlink(missing_ok=True)
            removed.append(path)
        for version in [v for v in self.deltas if v <= keep[0]]:
            path = self.delta_path(version)
            path.unlink(missing_ok=True)
            removed.append(path)
            del self.deltas[version]
        self.anchors = keep
        self.roots = {v: r for v, r in self.roots.items() if v >= keep[0]}
        self._save_index()
        return removed

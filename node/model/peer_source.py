"""Where a participant's copy of the job's model comes from: its own disk when that is the job's base model,
else its peers, by the content roots on chain (`job_model`, used by workers and validators alike).

A participant whose model cache is empty, whose local model is not the job's (a local build whose root
differs from the chain's `policyRoot[0]`: it says so and goes to its peers), or that joins at version N
holding an older version (the deltas between may be gone from every peer: they keep only recent
announcements), asks its connected peers for the newest anchor at or below N (`p2p.anchors`) and adopts
one only after, in this order:
  1. the bundle's tensor hashes root to the chain's `policyRoot[version]`, checked before any download;
  2. its config, tokenizer and generation config, fetched first with their declared sizes as hard limits,
     have the chain's `model_files_hash` (`model.identity`: architecture settings, the tokenizer's whole
     definition, special tokens, chat template, EOS set), pass the sanity checks below, and the checkpoint's
     declared size is the one the config's architecture implies;
  3. the checkpoint, fetched only if its object's manifest has exactly the declared size (a larger one is
     refused before any chunk is asked for), holds exactly the bundle's tensors, each with the shape the
     config implies and the hash the bundle lists, so its content root is the chain's;
  4. the model folder built from it loads through `load_policy` (the one load path) in fp32, into weights
     whose bf16 content root is still the chain's (a config that ties, drops or retypes tensors changes it),
     with config and tokenizer whose `model_files_hash` is still the chain's.
A bundle that fails a check is a fault against every peer that offered it (the host's PeerDiscipline), a
checkpoint that failed its own check is deleted, and the next offer is tried; newest versions first. The
adopted anchor enters the policy store as an anchor (never version 0), the follower then applies the
signed deltas after it (policy_sync), and the participant serves that anchor on (`serve_anchors`).
Failures end in one line: no peer offers an anchor, or every offer failed (each reason named).

A local model is the job's only if both its weights' root and its `model_files_hash` are the chain's: a
local build or folder that differs in either is named with the difference, and the node fetches from
peers. The sanity checks after the hash (a native transformers architecture, no remote code, parameter
names exactly the anchor's with the checkpoint's shapes, a vocabulary that covers the tokenizer and its
EOS, fp32 loading) bound what a download can cost before the checkpoint is fetched.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from rollnet.node.delta.checkpoint import LazyCheckpoint, content_root, save_checkpoint, tensor_hash
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import ConfigError, RollnetError
from rollnet.node.model.identity import folder_model_files_hash, loaded_model_files_hash
from rollnet.node.model.loading import cached_model, load_policy, preset_of, resolve_model
from rollnet.node.model.pinned import EMBEDDED_MODEL
from rollnet.node.model.policies import bf16_policy
from rollnet.node.p2p.anchors import CHECKPOINT, AnchorBundle, BundleFile, Offer, ask_anchors
from rollnet.node.p2p.transfer import ObjectFetcher
from rollnet.node.participant import serve_anchors
from rollnet.node.policy_sync import PolicyFollower
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

log = logging.getLogger(__name__)
ANCHOR_METADATA = "rollnet-anchor.json"
BF16_BYTES = 2
HEADER_SLACK = 4096  # a safetensors header: 8 bytes of length, JSON per tensor, metadata, padding
HEADER_PER_TENSOR = 128


class NoAnchor(RollnetError):
    """No peer offers an anchor of the job's model that would help."""


class AnchorsRefused(RollnetError):
    """Peers offered anchors, and every one failed verification (or could not be fetched)."""


class BundleRefused(Exception):
    """A bundle failed verification: the peers that offered it are at fault."""


@dataclass
class JobModel:
    folder: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    source: str  # one line: where the model came from


@dataclass
class _Local:
    folder: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    root: bytes
    files_hash: bytes

    def mismatch(self, root: bytes, files_hash: bytes) -> str | None:
        """Why this model is not the one with `root` and `files_hash` (None when it is)."""
        if self.root != root:
            return f"content root {self.root.hex()[:16]}…, the job's {root.hex()[:16]}…"
        if self.files_hash != files_hash:
            return (f"config and tokenizer {self.files_hash.hex()[:16]}…, the job's {files_hash.hex()[:16]}… (same "
                    "weights, but another tokenizer, chat template, EOS set or architecture setting)")
        return None


def _load(folder: Path) -> _Local:
    model, tokenizer = load_policy(folder)
    return _Local(folder, model, tokenizer, content_root(bf16_policy(model)), loaded_model_files_hash(model, tokenizer))


def job_model(follower: PolicyFollower, data_dir: Path, model: Path | None, task: str, *, strict: bool = True,
              fetch_timeout: float = 30.0) -> JobModel:
    """The job's model for this participant, with its policy store holding a version the chain pins (see the
    module docstring); then its anchors are served to peers. `model` is the --model folder or preset (None:
    the job's preset when its spec names one, else the embedded default, built here only when no peer offers
    an anchor). A validator (`strict=False`) keeps a
    local model whose weights are not the job's when nothing better is offered, as before (it can then check
    only versions it can reconstruct), but never one whose config and tokenizer are not the job's: it would
    judge every batch by another tokenizer, EOS set or template."""
    job, store, node = follower.job, follower.store, follower.node
    cache = data_dir / "models"
    spec = job.spec()
    base_root, files_hash = job.policy_root(0), spec.model_files_hash
    folder = cached_model(data_dir, model, task, spec.model_name)
    local = _load(folder) if folder is not None else None
    local_problem = local.mismatch(base_root, files_hash) if local is not None else None
    if local is not None and local_problem:
        log.warning("the local model %s is not the job's base model (%s): fetching the model from peers instead",
                    local.folder, local_problem)
    usable = local if local is not None and not local_problem else None
    source = f"local model {usable.folder} (version 0, checked against the chain)" if usable else ""
    if usable is not None:
        follower.ensure_base(usable.model)
    template = usable or _fetched_template(store, cache, files_hash)
    current = job.current_version()
    problem: RollnetError | None = None
    if store.latest is None or store.latest < current or template is None:
        floor = store.latest if store.latest is not None and template is not None else -1
        try:
            fetched, offers = fetch_anchor(follower, cache, at_most=current, above=floor, timeout=fetch_timeout)
            source = (f"anchor version {fetched.version} (root {store.roots[fetched.version].hex()[:16]}…) "
                      f"from {offers} peer(s)")
            template = template or fetched.local
        except RollnetError as exc:
            problem = exc
            if template is not None:
                log.info("%s; following deltas from version %s", exc, store.latest)
    preset = preset_of(model, spec.model_name)
    if (template is None and model is None and local is None and isinstance(problem, NoAnchor)
            and spec.model_name == EMBEDDED_MODEL):
        log.warning("%s: making the embedded model here", problem)
        local = _load(resolve_model(data_dir, None, task))
        if not local.mismatch(base_root, files_hash):
            follower.ensure_base(local.model)
            template, source = local, f"embedded model built here {local.folder} (version 0)"
    if template is None:
        if not strict and local is not None and local.files_hash == files_hash:  # same tokenizer, other weights
            follower.ensure_base(local.model, strict=False)
            template, source = local, f"local model {local.folder} (not the job's base model)"
        else:
            reason = str(problem or "the job's model is neither on this machine nor offered by a peer")
            if local is not None and (local_problem := local.mismatch(base_root, files_hash)):
                reason += f"; the local model {local.folder} is not the job's base model ({local_problem})"
            if preset is not None and folder is None:
                reason += f"; the {preset} preset cannot be converted here without the `real` extra"
            raise (type(problem) if problem else RollnetError)(reason)
    serve_anchors(node, job.address, store, template.model, template.tokenizer)
    return JobModel(template.folder, template.model, template.tokenizer, source or f"{template.folder}")


def _fetched_template(store: PolicyStore, cache: Path, files_hash: bytes) -> _Local | None:
    """The model folder an earlier run built from an anchor this store still holds (its weights re-checked)."""
    for version in reversed(store.anchors):
        root = store.roots[version]
        folder = cache / _folder_name(root)
        if not (folder / ANCHOR_METADATA).is_file():
            continue
        try:
            found = _load(folder)
        except ConfigError as exc:
            log.warning("ignoring %s: %s", folder, exc)
            continue
        if not found.mismatch(root, files_hash):
            return found
    return None


def _folder_name(root: bytes) -> str:
    return f"anchor-{root.hex()[:16]}"


@dataclass
class Fetched:
    version: int
    local: _Local


def fetch_anchor(follower: PolicyFollower, cache: Path, *, at_most: int, above: int = -1,
                 timeout: float = 30.0) -> tuple[Fetched, int]:
    """Ask the connected peers for their newest anchor in (above, at_most], verify one (module docstring)
    and adopt it into the follower's store; returns it and how many peers offered it. Raises NoAnchor or
    AnchorsRefused (one line each)."""
    node, job = follower.node, follower.job
    peers = node.connected_peers()
    offers = ask_anchors(node, job.address, at_most, peers)
    useful = [offer for offer in offers if offer.bundle.version > above]
    if not useful:
        older = f"; {len(offers)} offered only versions at or below {above}" if offers else ""
        raise NoAnchor(f"no peer offers an anchor of job {job.address} at or below version {at_most} (asked "
                       f"{len(peers)} connected peer(s){older})")
    groups: dict[str, list[Offer]] = {}
    for offer in useful:
        groups.setdefault(offer.bundle.key(), []).append(offer)
    ordered = sorted(groups.values(), key=lambda group: (-group[0].bundle.version, -len(group)))
    failures = []
    for group in ordered:
        bundle, providers = group[0].bundle, [offer.peer for offer in group]
        try:
            return _adopt(follower, cache, bundle, providers, timeout), len(providers)
        except BundleRefused as exc:
            for peer in providers:
                node.report_fault(peer, "anchor:refused")
            log.warning("refused anchor %d offered by %s: %s", bundle.version, ", ".join(providers), exc)
            failures.append(f"version {bundle.version} from {providers[0]}: {exc}")
        except Exception as exc:  # noqa: BLE001 - not served after all (a peer gone, a stalled transfer): next
            log.warning("could not fetch anchor %d from %s: %s", bundle.version, ", ".join(providers), exc)
            failures.append(f"version {bundle.version} from {providers[0]}: not fetched ({exc})")
    raise AnchorsRefused(f"every anchor peers offered failed verification or could not be fetched: "
                         f"{'; '.join(failures)}")


def _fetch_file(follower: PolicyFollower, entry: BundleFile, providers: list[str], timeout: float) -> Path:
    """The object `entry` names, fetched only if its verified manifest has exactly the declared size."""
    node = follower.node
    root = bytes.fromhex(entry.root)
    if not node.store.complete(root):
        manifest = node.call(ObjectFetcher(node.store, node.open_stream, timeout=timeout).manifest, root, providers)
        if manifest.size != entry.size:
            raise BundleRefused(f"{entry.name} is declared as {entry.size} bytes but its object has "
                                f"{manifest.size}")
        node.store.begin(root, manifest)
        node.fetch(root, providers, timeout=timeout)
    return node.store.data_path(root)


def _adopt(follower: PolicyFollower, cache: Path, bundle: AnchorBundle, providers: list[str],
           timeout: float) -> Fetched:
    job, store, node = follower.job, follower.store, follower.node
    chain_root, files_hash = job.policy_root(bundle.version), job.spec().model_files_hash
    if bundle.tensor_root() != chain_root:
        raise BundleRefused(f"its tensor hashes do not make the chain's root of version {bundle.version}")
    cache.mkdir(parents=True, exist_ok=True)
    staged = cache / f".{_folder_name(chain_root)}.tmp"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    try:
        for entry in bundle.files:
            shutil.copyfile(_fetch_file(follower, entry, providers, timeout), staged / entry.name)
        shapes = _check_model_files(staged, bundle, files_hash)
        checkpoint_root = bytes.fromhex(bundle.checkpoint.root)
        path = _fetch_file(follower, bundle.checkpoint, providers, timeout)
        try:
            weights = _check_checkpoint(path, bundle, shapes)
        except BundleRefused:
            node.store.discard(checkpoint_root)
            raise
        save_checkpoint(staged / CHECKPOINT, weights, metadata={"format": "pt"})
        loaded = _check_loaded(staged, chain_root, files_hash)
        store.add_anchor(bundle.version, weights, root=chain_root)
        (staged / ANCHOR_METADATA).write_text(json.dumps(
            {"job": job.address, "version": bundle.version, "content_root": chain_root.hex(), "peers": providers},
            indent=1))
        final = cache / _folder_name(chain_root)
        shutil.rmtree(final, ignore_errors=True)
        staged.rename(final)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    node.store.discard(checkpoint_root)  # the store holds the anchor now, and serves it from there
    return Fetched(bundle.version, _Local(final, loaded.model, loaded.tokenizer, loaded.root, loaded.files_hash))


def _check_model_files(folder: Path, bundle: AnchorBundle, files_hash: bytes) -> dict[str, tuple[int, ...]]:
    """The config and tokenizer are the chain's (`model_files_hash`) and sane; returns the tensor shapes the
    config implies, after checking its names are exactly the bundle's and the declared checkpoint size is the
    one those shapes need."""
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleRefused(f"config.json does not parse ({exc})") from None
    if not isinstance(raw, dict) or "auto_map" in raw:
        raise BundleRefused("config.json is not a plain transformers config (remote code is never run)")
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a bad config
        raise BundleRefused(f"config.json is not a config transformers knows ({str(exc)[:120]})") from None
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    except Exception as exc:  # noqa: BLE001 - a tokenizer file that does not load
        raise BundleRefused(f"the tokenizer does not load ({str(exc)[:120]})") from None
    try:
        offered = folder_model_files_hash(folder, config, tokenizer)
    except Exception as exc:  # noqa: BLE001 - a generation config or tokenizer that cannot be read whole
        raise BundleRefused(f"the config and tokenizer cannot be identified ({str(exc)[:120]})") from None
    if offered != files_hash:
        raise BundleRefused(f"its config and tokenizer are not the job's (model_files_hash {offered.hex()[:16]}…, "
                            f"the chain's {files_hash.hex()[:16]}…)")
    layers = getattr(config, "num_hidden_layers", 0)
    if not isinstance(layers, int) or not 0 <= layers <= len(bundle.tensors):
        raise BundleRefused(f"config.json has {layers} layers for {len(bundle.tensors)} tensors")
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001 - an architecture that cannot be built from this config
        raise BundleRefused(f"config.json does not build a causal LM ({str(exc)[:120]})") from None
    shapes = {name: tuple(tensor.shape) for name, tensor in skeleton.state_dict().items()}
    if set(shapes) != set(bundle.tensors):
        extra, missing = sorted(set(bundle.tensors) - set(shapes)), sorted(set(shapes) - set(bundle.tensors))
        raise BundleRefused(f"the config's architecture does not have the anchor's tensors (anchor only: "
                            f"{extra[:3]}, config only: {missing[:3]})")
    data = sum(BF16_BYTES * _numel(shape) for shape in shapes.values())
    header = HEADER_SLACK + sum(len(name.encode()) + HEADER_PER_TENSOR for name in shapes)
    if not data + 8 <= bundle.checkpoint.size <= data + 8 + header:
        raise BundleRefused(f"the checkpoint is declared as {bundle.checkpoint.size} bytes, but the config's "
                            f"architecture needs {data + 8} to {data + 8 + header}")
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or len(tokenizer) > vocab:
        raise BundleRefused(f"the tokenizer has {len(tokenizer)} tokens, more than the config's vocabulary {vocab}")
    if tokenizer.eos_token_id is None or not 0 <= tokenizer.eos_token_id < vocab:
        raise BundleRefused("the tokenizer has no end-of-sequence token inside the vocabulary")
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _check_checkpoint(path: Path, bundle: AnchorBundle, shapes: dict[str, tuple[int, ...]]) -> LazyCheckpoint:
    """The fetched checkpoint holds exactly the bundle's tensors, shaped as the config says, with the hashes the
    bundle lists (whose root the chain holds): one tensor in memory at a time."""
    try:
        checkpoint = LazyCheckpoint(path)
        if set(checkpoint) != set(bundle.tensors):
            raise BundleRefused("the checkpoint's tensors are not the ones the bundle lists")
        for name in checkpoint:
            tensor = checkpoint[name]
            if tuple(tensor.shape) != shapes[name]:
                raise BundleRefused(f"tensor {name} has shape {tuple(tensor.shape)}, the config says {shapes[name]}")
            if tensor_hash(name, tensor).hex() != bundle.tensors[name]:
                raise BundleRefused(f"tensor {name} does not hash to the chain's root")
    except BundleRefused:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors refuses a malformed file in several ways
        raise BundleRefused(f"the checkpoint is not a readable safetensors file ({str(exc)[:120]})") from None
    return checkpoint


def _check_loaded(folder: Path, root: bytes, files_hash: bytes) -> _Local:
    try:
        loaded = _load(folder)
    except ConfigError as exc:
        raise BundleRefused(str(exc)) from None
    dtypes = {parameter.dtype for parameter in loaded.model.parameters()}
    if dtypes != {torch.float32}:
        raise BundleRefused(f"the model loads as {sorted(map(str, dtypes))}, not fp32")
    if loaded.root != root:
        raise BundleRefused("loaded with its config, the checkpoint's weights no longer have the chain's root")
    if loaded.files_hash != files_hash:
        raise BundleRefused("loaded, its config and tokenizer no longer have the chain's model_files_hash")
    return loaded

"""A trained policy version out of rollnet: an ordinary Hugging Face folder (config, generation config,
tokenizer, bf16 `model.safetensors`) that `from_pretrained` and vLLM load like any other checkpoint.

Invariant: `export_version` writes a folder only if the version's weights, rebuilt from the run's policy
store (its newest anchor at or below the version plus the signed deltas after it), have the content root
the caller expects (the chain's `policyRoot[version]` when a job is given, else the store's own record),
and only if the folder, loaded back through `load_policy` (the one load path), still has that root and the
run's `model_files_hash` (the chain's, with a job). The folder appears whole or not at all (written into a
fresh hidden sibling, then renamed), and an existing non-empty folder, file or link is never overwritten.
The run directory carries what export needs besides the store (`record_run`): the trainer's address (the
deltas' signer) and the base model's config and tokenizer files, written once when the run starts, and
refused for another trainer address later.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rollnet.node.delta.checkpoint import content_root, save_checkpoint
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import ConfigError
from rollnet.node.model.identity import loaded_model_files_hash
from rollnet.node.model.loading import load_policy
from rollnet.node.model.policies import bf16_policy
from rollnet.node.p2p.anchors import CHECKPOINT

RUN_RECORD = "run.json"
MODEL_FILES = "model-files"


@dataclass(frozen=True)
class Exported:
    folder: Path
    version: int
    root: bytes
    files_hash: bytes


def record_run(run_dir: Path, trainer: str, files: Mapping[str, bytes], files_hash: bytes) -> None:
    """Write, once per run directory, the trainer address and the base model's config and tokenizer files; a
    run directory recorded for another trainer address is refused (its deltas carry that address's signatures)."""
    record = run_dir / RUN_RECORD
    if record.exists():
        recorded, _ = read_run(run_dir)
        if recorded.lower() != trainer.lower():
            raise ConfigError(f"{run_dir} is the run of trainer {recorded}, not {trainer}: use another --run-dir")
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=run_dir, prefix=f".{MODEL_FILES}."))
    try:
        for name, data in files.items():
            (staged / name).write_bytes(data)
        shutil.rmtree(run_dir / MODEL_FILES, ignore_errors=True)  # a start that died before its record
        staged.rename(run_dir / MODEL_FILES)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    record.write_text(json.dumps({"trainer": trainer, "model_files_hash": files_hash.hex()}, indent=1))


def read_run(run_dir: Path) -> tuple[str, bytes]:
    """The trainer address and base `model_files_hash` that `record_run` wrote for `run_dir`."""
    try:
        record = json.loads((run_dir / RUN_RECORD).read_text())
        return str(record["trainer"]), bytes.fromhex(record["model_files_hash"])
    except FileNotFoundError:
        raise ConfigError(f"{run_dir} is not a trainer run directory (no {RUN_RECORD}; runs started before export "
                          "existed lack it): pass the --run-dir that `rollnet trainer run` trained in") from None
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{run_dir / RUN_RECORD} is unreadable or corrupt ({type(exc).__name__})") from None


def export_version(run_dir: Path, version: int, out: Path, expected_root: bytes | None = None,
                   expected_files_hash: bytes | None = None) -> Exported:
    """Write policy `version` of the run in `run_dir` to `out` (see the module invariant). `expected_root`
    and `expected_files_hash` are the chain's; without them the run's own records are the reference."""
    trainer, files_hash = read_run(run_dir)
    if expected_files_hash is not None and files_hash != expected_files_hash:
        raise ConfigError(f"the run in {run_dir} trained a model whose config and tokenizer "
                          f"({files_hash.hex()[:16]}…) are not the job's ({expected_files_hash.hex()[:16]}…)")
    if not out.name or out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise ConfigError(f"{out} exists (or is a link) and is not an empty folder: choose a new --out")
    store = PolicyStore(run_dir / "policies", trainer=trainer)
    if version not in store.roots:
        known = f"{min(store.roots)}..{max(store.roots)}" if store.roots else "none"
        raise ConfigError(f"the run in {run_dir} has no version {version} (versions: {known})")
    recorded = store.roots[version]
    if expected_root is not None and recorded != expected_root:
        raise ConfigError(f"version {version} of this run has root {recorded.hex()[:16]}…, the chain's is "
                          f"{expected_root.hex()[:16]}…: this run directory is not the job's trainer")
    try:
        tensors = store.materialize(version)
    except Exception as exc:  # noqa: BLE001 - a damaged anchor or delta fails in safetensors, zstd or the codec
        raise ConfigError(f"cannot rebuild version {version} from {run_dir / 'policies'}: {_first_line(exc)}") from None
    root = content_root(tensors)
    if root != recorded:
        raise ConfigError(f"version {version} rebuilt from the store has root {root.hex()[:16]}…, not the "
                          f"recorded {recorded.hex()[:16]}…: the store is corrupt")
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        try:
            for source in sorted((run_dir / MODEL_FILES).iterdir()):
                shutil.copyfile(source, staged / source.name)
            _declare_bf16(staged / "config.json")
            save_checkpoint(staged / CHECKPOINT, tensors, metadata={"format": "pt", "version": str(version)})
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot write the export beside {out}: {_first_line(exc)}") from None
        model, tokenizer = load_policy(staged)
        if content_root(bf16_policy(model)) != root:
            raise ConfigError(f"the exported folder loads into weights whose root is not version {version}'s")
        if loaded_model_files_hash(model, tokenizer) != files_hash:
            raise ConfigError(f"the run's {MODEL_FILES} are not its base model's config and tokenizer")
        if out.exists():
            out.rmdir()
        staged.rename(out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return Exported(out, version, root, files_hash)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _declare_bf16(config: Path) -> None:
    """The checkpoint holds bf16 tensors: say so, so loaders that follow the config load bf16 (a run-time key,
    outside `model_files_hash`)."""
    data = json.loads(config.read_text())
    data["dtype"] = "bfloat16"
    data.pop("torch_dtype", None)
    config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

"""Rollout backends side by side: tokens/s of the vLLM and transformers backends (both doing a worker's whole
job: seeded Gumbel-max sampling, per-token log-probs and TOPLOC proofs) at batch 1, 8 and 64, and the time to
bring the vLLM engine to the next policy version by a delta applied in place against a full reload.

Also: vLLM's honest rollouts on this model verified by the validator's transformers prefill (cross-engine: the
sampling check and TOPLOC with the CPU thresholds, and the public ones), with the largest honest statistics.

Both backends ignore EOS, so every sequence makes exactly --new-tokens tokens; each batch size runs the two
alternately (machine noise hits both alike) and reports the median of the repeats after one warm-up.
The policy versions are sparse changes of the served model (--changed of each tensor, like an optimizer
step seen in bf16), published in a real PolicyStore as signed deltas.

Usage: python bench/generate.py [--model PATH | --tiny] [--quick] [--json PATH]
(default model: SmolLM2-135M-Instruct from the `real` extra, converted once into the data directory)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.table import Table
from rollnet.node import toploc
from rollnet.node.cli.context import make_console
from rollnet.node.config import resolve_data_dir
from rollnet.node.delta.checkpoint import content_root
from rollnet.node.delta.store import PolicyStore
from rollnet.node.keys import dev_account
from rollnet.node.model.builder import build_default_model
from rollnet.node.model.loading import load_policy
from rollnet.node.model.policies import bf16_policy
from rollnet.node.model.smollm2 import materialize_smollm2
from rollnet.node.rollout.backend import TransformersBackend
from rollnet.node.rollout.verify import CPU_THRESHOLDS, verify_rollouts
from rollnet.node.tasks import load_task
from toploc import chunk_statistics  # bench/toploc.py, beside this script

TASK = load_task("addition-2digit")


def timed(run) -> float:  # noqa: ANN001 - a zero-argument callable
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def throughput(vllm, hf, batches: list[int], new_tokens: int, repeats: int) -> list[dict]:  # noqa: ANN001
    rows = []
    for batch in batches:
        group = min(batch, 8)
        instances = TASK.examples(range(batch // group))

        def make(backend, instances: list = instances, group: int = group) -> None:  # noqa: ANN001
            backend.generate(instances, group, max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)

        make(vllm), make(hf)
        times: dict[str, list[float]] = {"vllm": [], "transformers": []}
        for _ in range(repeats):
            times["vllm"].append(timed(lambda: make(vllm)))
            times["transformers"].append(timed(lambda: make(hf)))
        tokens = batch * new_tokens
        vllm_rate = tokens / statistics.median(times["vllm"])
        hf_rate = tokens / statistics.median(times["transformers"])
        rows.append({"batch": batch, "new_tokens": new_tokens, "vllm_tokens_per_s": round(vllm_rate, 1),
                     "transformers_tokens_per_s": round(hf_rate, 1),
                     "vllm_over_transformers": round(vllm_rate / hf_rate, 2)})
    return rows


def cross_engine(vllm, hf, new_tokens: int) -> dict:  # noqa: ANN001
    """vLLM's honest rollouts, checked by the transformers prefill as a validator does."""
    rollouts = vllm.generate(TASK.examples(range(500, 508)), 8, max_new_tokens=new_tokens, ignore_eos=True)
    flagged = {name: sum(not v.ok for v in verify_rollouts(hf.model, hf.tokenizer, TASK, rollouts,
                                                             thresholds=thresholds, logprob_tolerance=None))
               for name, thresholds in (("cpu", CPU_THRESHOLDS), ("public", toploc.PUBLIC_THRESHOLDS))}
    stats = chunk_statistics(hf.model, rollouts)
    return {"rollouts": len(rollouts), "new_tokens": new_tokens, "flagged_cpu_thresholds": flagged["cpu"],
            "flagged_public_thresholds": flagged["public"], "honest_max_exponent_mismatches": int(stats[:, 0].max()),
            "honest_max_mean_mantissa_diff": float(stats[:, 1].max())}


def policy_versions(folder: Path, count: int, changed: float, trainer) -> tuple[PolicyStore, dict[int, bytes]]:  # noqa: ANN001
    base, _ = load_policy(folder)
    store = PolicyStore(Path(tempfile.mkdtemp(prefix="rollnet-bench-policies-")), trainer=trainer.address)
    generator = torch.Generator().manual_seed(0)
    previous = None
    roots = {}
    for version in range(count):
        if version:
            with torch.no_grad():
                for tensor in base.state_dict().values():
                    mask = torch.rand(tensor.shape, generator=generator) < changed
                    tensor.add_(mask * tensor.abs().clamp(min=1e-3) * 0.05)
        tensors = bf16_policy(base)
        store.publish(version, tensors, trainer, previous=previous)
        roots[version] = content_root(tensors)
        previous = tensors
    return store, roots


def updates(vllm, folder: Path, versions: int, changed: float, repeats: int, engine_start_s: float) -> dict:  # noqa: ANN001
    from rollnet.node.rollout.vllm_backend import VllmEngine

    store, roots = policy_versions(folder, versions, changed, dev_account(3))
    engine = VllmEngine(vllm, store, roots.__getitem__)
    full_write = timed(lambda: engine.at(0))  # the first version is written whole (no delta from the folder)
    delta_times = [timed(lambda v=v: engine.at(v)) for v in range(1, versions)]
    root_times = [timed(vllm.weights_root) for _ in range(repeats)]
    delta_bytes = [store.delta_path(v).stat().st_size for v in range(1, versions)]
    # The baseline: stop the engine and start a new one on the new version's weights (what a backend without
    # in-place updates does): write the version as a model folder, then an engine start (measured in main).
    with tempfile.TemporaryDirectory(prefix="rollnet-bench-reload-") as scratch:
        model, tokenizer = load_policy(folder)
        started = time.perf_counter()
        with torch.no_grad():
            for name, tensor in store.materialize(versions - 1).items():
                model.state_dict()[name].copy_(tensor)
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        folder_write_s = time.perf_counter() - started
    delta_s = statistics.median(delta_times)
    reload_s = folder_write_s + engine_start_s
    return {"versions": versions, "changed_fraction": changed,
            "delta_bytes_median": int(statistics.median(delta_bytes)),
            "delta_apply_and_root_check_s": round(delta_s, 3), "root_check_s": round(statistics.median(root_times), 3),
            "full_write_in_place_s": round(full_write, 3), "folder_write_s": round(folder_write_s, 2),
            "full_reload_s": round(reload_s, 2),
            "reload_over_delta": round(reload_s / delta_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description="vLLM against transformers rollout generation; delta apply.")
    parser.add_argument("--model", type=Path, help="model folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--tiny", action="store_true", help="the embedded 0.5M-parameter model instead")
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats")
    parser.add_argument("--new-tokens", type=int, default=0)
    parser.add_argument("--changed", type=float, default=0.01, help="fraction of each tensor a version changes")
    parser.add_argument("--json", type=Path, default=Path("bench/results/generate.json"))
    args = parser.parse_args()
    console = make_console()
    threads = int(os.environ.get("ROLLNET_BENCH_THREADS", os.cpu_count() or 1))
    torch.set_num_threads(threads)
    models = resolve_data_dir(None) / "models"
    folder = args.model or (build_default_model(models) if args.tiny else materialize_smollm2(models))
    new_tokens = args.new_tokens or (16 if args.quick else 32)
    repeats = 2 if args.quick else 3
    from rollnet.node.rollout.vllm_backend import VllmBackend  # imports vLLM: not part of the engine start

    started = time.perf_counter()
    vllm = VllmBackend(folder)
    engine_start_s = time.perf_counter() - started
    torch.set_num_threads(threads)  # the in-process engine may have set its own: both backends get the same
    hf = TransformersBackend.from_folder(folder)
    params = sum(t.numel() for t in hf.model.parameters())
    rows = throughput(vllm, hf, [1, 8, 64], new_tokens, repeats)
    crossed = cross_engine(vllm, hf, new_tokens)
    update = updates(vllm, folder, 4 if args.quick else 6, args.changed, repeats, engine_start_s)

    table = Table(title=f"rollout backends on {folder.name} ({params / 1e6:.1f}M params, {threads} threads, "
                        f"{'cuda' if torch.cuda.is_available() else 'cpu'})")
    for column in ("batch", "vLLM tok/s", "transformers tok/s", "vLLM / transformers"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row["batch"]), f"{row['vllm_tokens_per_s']:.0f}", f"{row['transformers_tokens_per_s']:.0f}",
                      f"{row['vllm_over_transformers']:.2f}x")
    console.print(table)
    console.print(f"cross-engine: {crossed['rollouts']} vLLM rollouts verified by the transformers prefill: "
                  f"{crossed['flagged_cpu_thresholds']} flagged with the CPU thresholds, "
                  f"{crossed['flagged_public_thresholds']} with the public ones; honest max exponent mismatches "
                  f"{crossed['honest_max_exponent_mismatches']}, max mean mantissa diff "
                  f"{crossed['honest_max_mean_mantissa_diff']:.4f} (CPU threshold "
                  f"{CPU_THRESHOLDS.max_mean_mantissa_diff})")
    console.print(f"engine start {engine_start_s:.1f} s; next policy version: delta in place + root check "
                  f"{update['delta_apply_and_root_check_s']:.3f} s (root alone {update['root_check_s']:.3f} s, "
                  f"{update['delta_bytes_median']:,} delta bytes) against a full reload (folder write + engine "
                  f"start) {update['full_reload_s']:.1f} s: "
                  f"{update['reload_over_delta']:.0f}x")
    result = {"benchmark": "generate", "model": folder.name, "params": params, "threads": threads,
              "machine": platform.processor() or platform.machine(), "cuda": torch.cuda.is_available(),
              "quick": args.quick, "engine_start_s": round(engine_start_s, 1), "throughput": rows,
              "cross_engine": crossed, "update": update}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

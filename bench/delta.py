"""How small policy deltas get, side by side with the alternatives, and how fast they encode and apply.

For each input it prints the payload as a ratio of full bf16 weights (bigger is better): zstd of the full
weights, naive sparse (int32 index + raw bf16 value per changed element), ours (rollnet.node.delta), and the
entropy bound (log2 C(n, k) bits for the positions plus k times the empirical order-0 entropy of the value
changes). Inputs:
  grpo-lr*: consecutive bf16 policy versions of a small Qwen2 trained by GRPO steps (fp32 master weights,
            AdamW) at lr 1e-6 and 1e-5 - the change fraction is measured, not assumed;
  synthetic-*: bf16 weights (N(0, 0.02)) with 0.1%, 1% and 5% of elements moved by 1-3 ULPs.
Throughput is GB of bf16 weights per second for encode (incl. hashing the target and signing) and apply
(incl. signature, section hashes and verifying every tensor against the signed root), on the 1% input.

Usage: python bench/delta.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import zstandard
from rollnet.node.cli.context import make_console
from rollnet.node.delta import apply, content_root, encode
from rollnet.node.delta.bitcast import bits_of, from_ordered, to_ordered
from rollnet.node.keys import dev_account

SIGNER = dev_account(0)
torch.set_num_threads(max(1, os.cpu_count() or 1))


# ---------------------------------------------------------------------------------------------- inputs

MODELS = {  # name: (hidden, layers, heads, kv heads, feed-forward)
    "0.5M": (128, 2, 4, 2, 512),
    "4M": (256, 4, 8, 4, 1024),
}


def grpo_versions(lr: float, steps: int, model_size: str, warmup: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """bf16 snapshots of a small Qwen2 after each of `steps` GRPO updates (group-normalised advantages),
    after `warmup` unmeasured updates (Adam's first steps move every weight by about lr)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    vocab, prompt_len, completion_len, prompts, group = 32, 6, 12, 16, 8
    hidden, layers, heads, kv_heads, feed_forward = MODELS[model_size]
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=feed_forward,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=64,
                         tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    model = Qwen2ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    snapshots = []
    for step in range(warmup + steps + 1):
        if step >= warmup:
            snapshots.append(_bf16_policy(model))
        if step == warmup + steps:
            break
        prompt = torch.randint(2, vocab, (prompts, prompt_len)).repeat_interleave(group, dim=0)
        with torch.no_grad():
            sequences = _sample(model, prompt, completion_len)
        completion = sequences[:, prompt_len:]
        # Verifiable reward: how often the completion repeats the prompt's first token.
        rewards = (completion == prompt[:, :1]).float().mean(dim=1).view(prompts, group)
        advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).view(-1, 1)
        logits = model(sequences).logits[:, prompt_len - 1:-1]
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
        loss = -(advantages * logprobs).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return snapshots


def _sample(model: torch.nn.Module, prompt: torch.Tensor, length: int) -> torch.Tensor:
    sequences = prompt
    for _ in range(length):
        logits = model(sequences).logits[:, -1].float()
        sequences = torch.cat([sequences, torch.multinomial(torch.softmax(logits, -1), 1)], dim=1)
    return sequences


def _bf16_policy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().to(torch.bfloat16).clone() for name, p in model.state_dict().items()}


def synthetic(parameters: int, fraction: float, base: dict[str, torch.Tensor] | None, seed: int) -> tuple[dict, dict]:
    """Base weights (reused if given) and a target with `fraction` of elements moved by 1-3 ULPs."""
    tensor_elements = min(parameters, 1 << 24)
    if base is None:
        generator = torch.Generator().manual_seed(seed)
        base = {f"layer{i:03d}.weight": (torch.randn(tensor_elements, generator=generator) * 0.02).to(torch.bfloat16)
                for i in range(parameters // tensor_elements)}
    rng = np.random.default_rng(seed + 1)
    target = {}
    for name, tensor in base.items():
        moved = tensor.clone()
        bits = bits_of(moved)
        positions = np.sort(rng.choice(len(bits), int(round(fraction * len(bits))), replace=False))
        steps = rng.choice(np.array([1, 2, 3], dtype=np.uint16), len(positions), p=[0.6, 0.3, 0.1])
        ordered = to_ordered(bits[positions], True)
        sign = rng.random(len(positions)) < 0.5
        bits[positions] = from_ordered(np.where(sign, ordered + steps, ordered - steps).astype(np.uint16), True)
        target[name] = moved
    return base, target


# ---------------------------------------------------------------------------------------------- measures

def entropy_bound_bytes(base: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> tuple[float, int, int]:
    """(bound in bytes, changed elements, total elements)."""
    position_bits, changes, total = 0.0, 0, 0
    counts: dict[int, int] = {}
    for name, tensor in target.items():
        old, new = bits_of(base[name]), bits_of(tensor)
        positions = np.flatnonzero(old != new)
        n, k = len(new), len(positions)
        total, changes = total + n, changes + k
        position_bits += (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)
        moves = (to_ordered(new[positions], True).astype(np.int64) - to_ordered(old[positions], True).astype(np.int64))
        values, value_counts = np.unique(moves, return_counts=True)
        for value, count in zip(values.tolist(), value_counts.tolist(), strict=True):
            counts[value] = counts.get(value, 0) + count
    probabilities = np.array(list(counts.values()), dtype=np.float64) / max(changes, 1)
    value_bits = -float((probabilities * np.log2(probabilities)).sum()) * changes if changes else 0.0
    return (position_bits + value_bits) / 8, changes, total


def measure(name: str, base: dict[str, torch.Tensor], target: dict[str, torch.Tensor], throughput: bool) -> dict:
    full = sum(t.numel() * 2 for t in target.values())
    bound, changes, total = entropy_bound_bytes(base, target)
    base_root = content_root(base)
    started = time.perf_counter()
    data = encode(base, target, base_version=0, version=1, signer=SIGNER, base_root=base_root).to_bytes()
    encode_seconds = time.perf_counter() - started
    held = {k: v.clone() for k, v in base.items()}
    started = time.perf_counter()
    applied = apply(held, data, trainer=SIGNER.address, base_version=0, base_root=base_root)
    apply_seconds = time.perf_counter() - started
    assert all(torch.equal(held[k].view(torch.int16), target[k].view(torch.int16)) for k in target), "not exact"
    assert applied.root == content_root(target)
    compressor = zstandard.ZstdCompressor(level=3, threads=-1)
    zstd_full = sum(len(compressor.compress(bits_of(t).view("u1").tobytes())) for t in target.values())
    naive = changes * 6
    row = {
        "name": name, "parameters": total, "changed": changes, "change_fraction": changes / total,
        "bytes_full_bf16": full, "bytes_zstd_full": zstd_full, "bytes_naive_sparse": naive,
        "bytes_ours": len(data), "bytes_entropy_bound": round(bound),
        "ratio_zstd_full": full / zstd_full, "ratio_naive_sparse": full / max(naive, 1),
        "ratio_ours": full / len(data), "ratio_entropy_bound": full / max(bound, 1),
        "ours_over_bound": len(data) / max(bound, 1),
        "bits_per_change_ours": 8 * len(data) / max(changes, 1), "bits_per_change_bound": 8 * bound / max(changes, 1),
    }
    if throughput:
        row["encode_gbps"] = full / encode_seconds / 1e9
        row["apply_gbps"] = full / apply_seconds / 1e9
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description="Sparse policy delta sizes and speeds.")
    parser.add_argument("--quick", action="store_true", help="smaller inputs; under 60 s")
    parser.add_argument("--json", type=Path, default=Path("bench/results/delta.json"))
    args = parser.parse_args()
    console = make_console()
    steps = 3 if args.quick else 5
    parameters = 100_663_296 if args.quick else 1_006_632_960  # 6 or 60 tensors of 2^24

    rows = []
    for model_size in ("0.5M",) if args.quick else ("0.5M", "4M"):
        for lr in (1e-6, 1e-5):
            snapshots = grpo_versions(lr, steps, model_size, warmup=2 if args.quick else 3)
            per_step = [measure(f"grpo-{model_size}-lr{lr:g}-step{i + 1}", snapshots[i], snapshots[i + 1], False)
                        for i in range(steps)]
            rows.append(_mean_row(f"grpo-{model_size}-lr{lr:g} ({steps} steps)", per_step))
            console.print(f"measured GRPO on the {model_size} model at lr {lr:g}")
    base = None
    for fraction in (0.001, 0.01, 0.05):
        base, target = synthetic(parameters, fraction, base, seed=7)
        rows.append(measure(f"synthetic-{parameters / 1e9:.1f}B-{fraction:.1%}", base, target, fraction == 0.01))
        del target
        console.print(f"measured synthetic {fraction:.1%}")
    speed = next(r for r in rows if "encode_gbps" in r)

    from rich.table import Table

    table = Table(title="payload as a ratio of full bf16 weights (higher is better); ours/bound: 1.00 is optimal")
    for column in ("input", "params", "changed", "zstd full", "naive sparse", "ours", "entropy bound", "ours/bound",
                   "bits/change"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            r["name"], f"{int(r['parameters']):,}", f"{r['change_fraction']:.3%}", f"{r['ratio_zstd_full']:.2f}x",
            f"{r['ratio_naive_sparse']:.1f}x", f"[bold]{r['ratio_ours']:.1f}x[/]", f"{r['ratio_entropy_bound']:.1f}x",
            f"{r['ours_over_bound']:.3f}", f"{r['bits_per_change_ours']:.2f}",
        )
    console.print(table)
    console.print(f"encode {speed['encode_gbps']:.2f} GB/s, apply {speed['apply_gbps']:.2f} GB/s of bf16 weights "
                  f"({speed['name']}, {os.cpu_count()} cores)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "delta", "quick": args.quick, "inputs": rows,
                                     "encode_gbps": speed["encode_gbps"], "apply_gbps": speed["apply_gbps"]}, indent=2))
    console.print(f"wrote {args.json}")


def _mean_row(name: str, rows: list[dict]) -> dict:
    keys = [k for k in rows[0] if k != "name"]
    mean = {k: float(np.mean([r[k] for r in rows])) for k in keys}
    for k in ("bytes_full_bf16", "bytes_zstd_full", "bytes_naive_sparse", "bytes_ours", "bytes_entropy_bound"):
        mean[k] = sum(r[k] for r in rows)
    mean["ratio_zstd_full"] = mean["bytes_full_bf16"] / mean["bytes_zstd_full"]
    mean["ratio_naive_sparse"] = mean["bytes_full_bf16"] / max(mean["bytes_naive_sparse"], 1)
    mean["ratio_ours"] = mean["bytes_full_bf16"] / mean["bytes_ours"]
    mean["ratio_entropy_bound"] = mean["bytes_full_bf16"] / max(mean["bytes_entropy_bound"], 1)
    mean["ours_over_bound"] = mean["bytes_ours"] / max(mean["bytes_entropy_bound"], 1)
    return {"name": name, **mean, "steps": rows}


if __name__ == "__main__":
    main()

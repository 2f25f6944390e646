"""Does verification catch cheaters? Honest rollouts against seven ways of cheating, on the default model.

Each row generates rollouts (8 tasks x 8 samples per batch) and verifies them the way a validator does
(`verify_rollouts`: one batched prefill at the claimed policy; prompt, seeded sampling and TOPLOC checks
with the CPU-calibrated thresholds). Honest rows must never be flagged; cheat rows must always be.
Also: proof overhead as a share of generation time, verification speed against generation, proof bytes
per generated token, and the honest/cheat statistics the thresholds were calibrated from.

Usage: python bench/toploc.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from rollnet.node import toploc
from rollnet.node.cli.context import make_console
from rollnet.node.config import resolve_data_dir
from rollnet.node.model.builder import _batch, build_default_model
from rollnet.node.rollout.generate import NormCapture, Rollout, generate
from rollnet.node.rollout.verify import CPU_THRESHOLDS, verify_rollouts
from rollnet.node.tasks import load_task
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

TASK = load_task("addition-2digit")
GROUP = 8


def rollouts_for(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, trials: int, first_seed: int,
                 per_call: int = 8) -> list[Rollout]:
    out: list[Rollout] = []
    seed = first_seed
    while len(out) < trials:
        out += generate(model, tokenizer, TASK.examples(range(seed, seed + per_call)), GROUP, max_new_tokens=6)
        seed += per_call
    return out[:trials]


def chunk_statistics(model: torch.nn.Module, rollouts: list[Rollout]) -> np.ndarray:
    """Per rollout: exponent mismatches and mean mantissa difference of its first TOPLOC chunk."""
    rows = []
    capture = NormCapture(model)
    try:
        with torch.no_grad():
            for rollout in rollouts:
                model(input_ids=torch.tensor([rollout.prompt_tokens + rollout.tokens]))
                hidden = capture.take()[0]
                start = len(rollout.prompt_tokens) - 1
                check = toploc.check_chunk(rollout.proofs[0], hidden[start:start + len(rollout.tokens)], 0)
                rows.append((check.exponent_mismatches, check.mean_mantissa_diff))
    finally:
        capture.close()
    return np.array(rows)


def next_version(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> torch.nn.Module:
    """The policy one optimiser step later (AdamW, lr 1e-4): what an honest worker should have used."""
    newer = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(newer.parameters(), lr=1e-4)
    ids, labels = _batch(TASK, tokenizer, range(50_000, 50_128))
    newer(input_ids=ids, labels=labels).loss.backward()
    optimizer.step()
    return newer.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description="TOPLOC and sampling verification against cheaters.")
    parser.add_argument("--quick", action="store_true", help="16 trials per row instead of 64")
    parser.add_argument("--json", type=Path, default=Path("bench/results/toploc.json"))
    args = parser.parse_args()
    trials = 16 if args.quick else 64
    console = make_console()
    torch.set_num_threads(2)
    folder = build_default_model(resolve_data_dir(None) / "models")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    rng = np.random.default_rng(0)

    def verified(rollouts: list[Rollout], verifier: torch.nn.Module = model) -> int:
        return sum(not v.ok for v in verify_rollouts(verifier, tokenizer, TASK, rollouts))

    honest = rollouts_for(model, tokenizer, trials, 1000)
    rows = [{"case": "honest (batch 64)", "honest": True, "trials": trials, "detected": verified(honest)}]
    single = [r for seed in range(2000, 2000 + trials) for r in generate(model, tokenizer, [TASK.instance(seed)], 1)]
    rows.append({"case": "honest (batch 1)", "honest": True, "trials": trials, "detected": verified(single)})
    torch.set_num_threads(1)
    one_thread = rollouts_for(model, tokenizer, trials, 3000)
    torch.set_num_threads(2)
    rows.append({"case": "honest (1 thread, verified with 2)", "honest": True, "trials": trials,
                 "detected": verified(one_thread)})

    noisy = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in noisy.parameters():
            parameter.mul_(1 + 1e-3 * torch.randn_like(parameter))
    cheats = {
        "weights with 1e-3 relative noise": (rollouts_for(noisy, tokenizer, trials, 4000), model),
        "older policy than claimed": (rollouts_for(model, tokenizer, trials, 5000), next_version(model, tokenizer)),
        "bf16 instead of fp32": (rollouts_for(copy.deepcopy(model).to(torch.bfloat16), tokenizer, trials, 6000), model),
        "dynamic int8": (rollouts_for(torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8), tokenizer, trials, 7000), model),
    }
    changed = copy.deepcopy(honest)
    for rollout in changed:
        position = int(rng.integers(len(rollout.tokens)))
        shift = 1 + int(rng.integers(len(tokenizer) - 1))
        rollout.tokens[position] = (rollout.tokens[position] + shift) % len(tokenizer)
    cheats["one token changed"] = (changed, model)
    altered = copy.deepcopy(honest)
    for rollout in altered:
        rollout.prompt_tokens = tokenizer.encode(TASK.instance(rollout.task_seed + 1).prompt)
    cheats["prompt altered"] = (altered, model)
    forced = copy.deepcopy(honest)
    for rollout in forced:
        answer = TASK.instance(rollout.task_seed).answer
        text = answer if rollout.text != answer else str(int(answer) + 1)
        rollout.tokens = tokenizer.encode(text) + [tokenizer.eos_token_id]
    cheats["teacher-forced tokens"] = (forced, model)
    for case, (rollouts, verifier) in cheats.items():
        rows.append({"case": case, "honest": False, "trials": len(rollouts), "detected": verified(rollouts, verifier)})
        console.print(f"{case}: {rows[-1]['detected']}/{len(rollouts)} detected")

    # Cost: proofs against generation, verification against generation.
    instances = TASK.examples(range(8000, 8008))
    generate(model, tokenizer, instances, GROUP)  # warm-up
    repeats = 5 if args.quick else 20
    started = time.perf_counter()
    for _ in range(repeats):
        generate(model, tokenizer, instances, GROUP, prove=False)
    generation_s = (time.perf_counter() - started) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        proved = generate(model, tokenizer, instances, GROUP)
    proving_s = (time.perf_counter() - started) / repeats - generation_s
    started = time.perf_counter()
    for _ in range(repeats):
        verify_rollouts(model, tokenizer, TASK, proved)
    verify_s = (time.perf_counter() - started) / repeats
    tokens = sum(len(r.tokens) for r in proved)
    proof_bytes = sum(len(p) for r in proved for p in r.proofs)
    honest_stats = chunk_statistics(model, honest)
    noisy_stats = chunk_statistics(model, cheats["weights with 1e-3 relative noise"][0])

    for row in rows:
        row["rate"] = row["detected"] / row["trials"]
    report = {
        "benchmark": "toploc", "quick": args.quick, "rows": rows,
        "overhead_fraction": max(proving_s, 0.0) / generation_s,
        "verify_speedup": (generation_s + max(proving_s, 0.0)) / verify_s,
        "proof_bytes_per_token": proof_bytes / tokens, "tokens_per_completion": tokens / len(proved),
        "generation_s": generation_s, "proof_s": proving_s, "verify_s": verify_s,
        "thresholds": CPU_THRESHOLDS.__dict__,
        "calibration": {
            "honest_max_exponent_mismatches": int(honest_stats[:, 0].max()),
            "honest_max_mean_mantissa_diff": float(honest_stats[:, 1].max()),
            "noise_1e-3_min_mean_mantissa_diff": float(noisy_stats[:, 1].min()),
        },
        "threads": torch.get_num_threads(), "cores": os.cpu_count(),
    }
    from rich.table import Table

    table = Table(title="verification on the default model (honest rows: false positives; cheats: detections)")
    for column in ("case", "trials", "flagged", "rate", "goal"):
        table.add_column(column, justify="right")
    for row in rows:
        goal = "0%" if row["honest"] else "100%"
        table.add_row(row["case"], str(row["trials"]), str(row["detected"]), f"{row['rate']:.0%}", goal)
    console.print(table)
    console.print(
        f"proof overhead {report['overhead_fraction']:.1%} of generation; verification "
        f"{report['verify_speedup']:.1f}x faster than generation; {report['proof_bytes_per_token']:.0f} proof "
        f"bytes per generated token ({report['tokens_per_completion']:.1f} tokens per completion)"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

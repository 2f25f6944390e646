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
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from rollnet.node import toploc
from rollnet.node.cli.context import make_console
from rollnet.node.config import resolve_data_dir
from rollnet.node.errors import ConfigError
from rollnet.node.model.builder import _batch, build_default_model
from rollnet.node.model.loading import load_policy
from rollnet.node.model.smollm2 import materialize_smollm2
from rollnet.node.rollout.generate import NormCapture, Rollout, generate
from rollnet.node.rollout.verify import CPU_THRESHOLDS, verify_rollouts
from rollnet.node.tasks import Task, load_task
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


def mixed_length_task(folder: Path) -> Task:
    """Additions of 1- to 3-digit numbers: prompts of four lengths, so generation batches pad."""
    rng = np.random.default_rng(11)
    lines = []
    for _ in range(64):
        a, b = int(rng.integers(0, 10 ** int(rng.integers(1, 4)))), int(rng.integers(0, 100))
        lines.append(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mixed-additions.jsonl"
    path.write_text("\n".join(lines))
    return load_task(str(path))


def hidden_of(model: torch.nn.Module, rollouts: list[Rollout]) -> list[torch.Tensor]:
    """The final-norm states at each rollout's producing positions (what its proofs commit to)."""
    capture, out = NormCapture(model), []
    try:
        with torch.no_grad():
            for rollout in rollouts:
                model(input_ids=torch.tensor([rollout.prompt_tokens + rollout.tokens]), logits_to_keep=1)
                start = len(rollout.prompt_tokens) - 1
                out.append(capture.take()[0, start:start + len(rollout.tokens)])
    finally:
        capture.close()
    return out


def measure_costs(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, task: Task, instances: list,
                  group: int, new_tokens: int, ignore_eos: bool, repeats: int) -> dict:
    """Median generation time (no proofs), the proofs' own time on the same hidden states, and one batched
    verification of the same rollouts."""
    def run(prove: bool) -> list[Rollout]:
        return generate(model, tokenizer, instances, group, max_new_tokens=new_tokens, prove=prove,
                        ignore_eos=ignore_eos)

    proved = run(True)  # warm-up, and the rollouts to verify
    generation, proving, verifying = [], [], []
    hiddens = hidden_of(model, proved)
    for _ in range(repeats):
        started = time.perf_counter()
        run(False)
        generation.append(time.perf_counter() - started)
        started = time.perf_counter()
        toploc.prove_many(hiddens)
        proving.append(time.perf_counter() - started)
        started = time.perf_counter()
        verdicts = verify_rollouts(model, tokenizer, task, proved)
        verifying.append(time.perf_counter() - started)
    assert all(v.ok for v in verdicts), "honest rollouts failed verification while timing"
    generation_s, proof_s, verify_s = (statistics.median(x) for x in (generation, proving, verifying))
    tokens = sum(len(r.tokens) for r in proved)
    return {
        "overhead_fraction": proof_s / generation_s, "verify_speedup": (generation_s + proof_s) / verify_s,
        "proof_bytes_per_token": sum(len(p) for r in proved for p in r.proofs) / tokens,
        "tokens_per_completion": tokens / len(proved), "generation_s": generation_s, "proof_s": proof_s,
        "verify_s": verify_s,
    }


def realistic_costs(quick: bool, console: Console) -> dict:
    """Costs and a threshold check on SmolLM2-135M-Instruct (the `real` extra), where generation is not
    nearly free as it is on the 0.5M default model."""
    try:
        folder = materialize_smollm2(resolve_data_dir(None) / "models")
    except ConfigError as exc:
        return {"skipped": str(exc)}
    model, tokenizer = load_policy(folder)
    instances = TASK.examples(range(9000, 9064))
    shapes = [(1, 32)] if quick else [(1, 128), (8, 64), (64, 32)]
    rows = []
    for batch, new_tokens in shapes:
        console.print(f"SmolLM2 costs: batch {batch}, {new_tokens} tokens...")
        row = measure_costs(model, tokenizer, TASK, instances[:batch], 1, new_tokens, True, 1 if quick else 3)
        rows.append({"batch": batch, "new_tokens": new_tokens, **row})
    trials = 8 if quick else 32
    honest = generate(model, tokenizer, instances[:trials], 1, max_new_tokens=32, ignore_eos=True)
    noisy = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in noisy.parameters():
            parameter.mul_(1 + 1e-3 * torch.randn_like(parameter))
    cheat = generate(noisy, tokenizer, instances[:trials], 1, max_new_tokens=32, ignore_eos=True)
    honest_stats, noisy_stats = chunk_statistics(model, honest), chunk_statistics(model, cheat)

    def caught(rollouts: list[Rollout], thresholds: toploc.Thresholds) -> int:
        return sum(not v.ok for v in verify_rollouts(model, tokenizer, TASK, rollouts, thresholds=thresholds))

    return {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to fp32)", "rows": rows,
        "calibration": {
            "trials": trials, "honest_max_exponent_mismatches": int(honest_stats[:, 0].max()),
            "honest_max_mean": float(honest_stats[:, 1].max()), "noisy_min_mean": float(noisy_stats[:, 1].min()),
            "honest_flagged_cpu": caught(honest, CPU_THRESHOLDS), "noisy_caught_cpu": caught(cheat, CPU_THRESHOLDS),
            "noisy_caught_public": caught(cheat, toploc.PUBLIC_THRESHOLDS),
        },
    }


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
    mixed = mixed_length_task(args.json.parent)
    padded = [r for seed in range(0, trials, 8)
              for r in generate(model, tokenizer, mixed.examples(range(seed, seed + 8)), GROUP, max_new_tokens=6)]
    padded = padded[:trials]
    rows.append({"case": "honest (padded batch, mixed prompt lengths)", "honest": True, "trials": trials,
                 "detected": sum(not v.ok for v in verify_rollouts(model, tokenizer, mixed, padded))})
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

    # Cost on the default model: proofs against generation, verification against generation.
    costs = measure_costs(model, tokenizer, TASK, TASK.examples(range(8000, 8008)), GROUP, 6, False,
                          5 if args.quick else 20)
    realistic = realistic_costs(args.quick, console)
    honest_stats = chunk_statistics(model, honest)
    noisy_stats = chunk_statistics(model, cheats["weights with 1e-3 relative noise"][0])

    for row in rows:
        row["rate"] = row["detected"] / row["trials"]
    report = {
        "benchmark": "toploc", "quick": args.quick, "rows": rows, **costs,
        "thresholds": CPU_THRESHOLDS.__dict__,
        "calibration": {
            "honest_max_exponent_mismatches": int(honest_stats[:, 0].max()),
            "honest_max_mean_mantissa_diff": float(honest_stats[:, 1].max()),
            "noise_1e-3_min_mean_mantissa_diff": float(noisy_stats[:, 1].min()),
        },
        "threads": torch.get_num_threads(), "cores": os.cpu_count(),
        "realistic": realistic,
    }
    table = Table(title="verification on the default model (honest rows: false positives; cheats: detections)")
    for column in ("case", "trials", "flagged", "rate", "goal"):
        table.add_column(column, justify="right")
    for row in rows:
        goal = "0%" if row["honest"] else "100%"
        table.add_row(row["case"], str(row["trials"]), str(row["detected"]), f"{row['rate']:.0%}", goal)
    console.print(table)
    console.print(
        f"default model: proof overhead {report['overhead_fraction']:.1%} of generation; verification "
        f"{report['verify_speedup']:.1f}x faster than generation; {report['proof_bytes_per_token']:.0f} proof "
        f"bytes per generated token ({report['tokens_per_completion']:.1f} tokens per completion)"
    )
    if realistic.get("rows"):
        table = Table(title=f"costs at realistic size: {realistic['model']}, sampled tokens, EOS ignored")
        for column in ("batch", "new tokens", "generation s", "proof s", "overhead", "verify s", "verify speedup",
                       "proof B/token"):
            table.add_column(column, justify="right")
        for row in realistic["rows"]:
            table.add_row(str(row["batch"]), str(row["new_tokens"]), f"{row['generation_s']:.2f}",
                          f"{row['proof_s']:.3f}", f"{row['overhead_fraction']:.2%}", f"{row['verify_s']:.2f}",
                          f"{row['verify_speedup']:.1f}x", f"{row['proof_bytes_per_token']:.1f}")
        console.print(table)
        calibration = realistic["calibration"]
        console.print(f"{realistic['model']}: honest max mean mantissa diff {calibration['honest_max_mean']:.3f}, "
                      f"1e-3 noise min {calibration['noisy_min_mean']:.3f}; caught with CPU thresholds "
                      f"{calibration['noisy_caught_cpu']}/{calibration['trials']}, with public thresholds "
                      f"{calibration['noisy_caught_public']}/{calibration['trials']}; honest flagged "
                      f"{calibration['honest_flagged_cpu']}/{calibration['trials']}")
    else:
        console.print(f"realistic-size costs skipped: {realistic['skipped']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""What decentralization costs: the whole market's training throughput beside two local baselines (issue 17).

For one model, task, batch (32 prompts x 8 samples a step, 6-token completions: the devnet's defaults) and
number of steps, one run measures side by side:
- (a) sync: the synchronous single-process GRPO loop (`trainer.local.LocalRun`, lag 0, one torch thread):
  sample a batch with the current policy, train on it, repeat;
- (b) async_local: generation and training in two processes, the generator up to the staleness budget
  ahead, policies passed back as bf16 bytes, no chain and no p2p (`rollnet.trainer.pipeline`);
- (c) market: `rollnet devnet` (anvil, the contracts, a trainer, 3 workers and 2 validators as processes over
  libp2p, committees, sampled verification at the spec's default fraction), once with instant mining and once
  with a block every 2 s (`--block-times`), as on an L2. Fees come from the node's fee history either way.

Trained samples/s: (a) over its whole loop; (b) from its first batch's arrival at the trainer; (c) from the
trainer's first admission to its last step (so neither (b) nor (c) counts start-up). efficiency = (c) / (b).
From (c)'s event logs: the per-lease latency breakdown (`rollnet/devnet/latency.py`), each role's share of the
machine's CPU time, and the verification fraction (the committee members' verify seconds over the workers'
generation seconds, for the leases the trainer admitted).

Only the embedded model runs here: the market arm on SmolLM2 (`rollnet devnet --model smollm2`) takes minutes
per step on two cores, and arm (b) is written for the embedded model's batch.

Usage: python bench/efficiency.py [--quick] [--json PATH] [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch
from rich.table import Table
from rollnet.node.cli.context import make_console
from rollnet.node.config import resolve_data_dir
from rollnet.node.model.builder import build_default_model
from rollnet.node.model.loading import load_policy
from rollnet.node.model.pinned import EMBEDDED_MODEL, EMBEDDED_TASK
from rollnet.node.tasks import load_task
from rollnet.trainer.config import GRPOConfig
from rollnet.trainer.local import LocalRun
from rollnet.trainer.pipeline import GROUP, PROMPTS, run_arm
from rollnet.trainer.trainer import Trainer

from rollnet.devnet import DevnetConfig, run_devnet

SPARROW_GAP = 0.0891  # SparrowRL: its decentralized run came within 8.91% of an ideal datacenter baseline


def sync_arm(folder: Path, steps: int) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer = load_policy(folder)
    trainer = Trainer(model, tokenizer, load_task(EMBEDDED_TASK),
                      GRPOConfig.make(prompts_per_step=PROMPTS, group_size=GROUP, max_staleness=0))
    local = LocalRun(trainer, lag=0, seed=0)
    local.step()  # warm-up, not timed
    started = time.perf_counter()
    samples = sum(local.step().report.samples for _ in range(steps))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "trained_samples": samples, "samples_per_s": samples / seconds}


def async_arm(folder: Path, steps: int, max_staleness: int) -> dict:
    result = run_arm(str(folder), max_staleness, steps)
    return {"seconds": result["seconds"], "trained_samples": result["samples_trained_on"],
            "samples_per_s": result["samples_trained_on"] / result["seconds"], "staleness": result["staleness"]}


def market_arm(out: Path, steps: int, max_staleness: int, block_time_s: int, console: object) -> tuple[dict, dict]:
    shutil.rmtree(out, ignore_errors=True)
    report = run_devnet(DevnetConfig(out=out, steps=steps, max_staleness=max_staleness, held_out_every=10**6,
                                     baseline_steps=0, block_time_s=block_time_s), console, live=False)
    row = {"seconds": report["run"]["seconds"], "trained_samples": report["samples"]["consumed_by_training"],
           "samples_per_s": report["throughput"]["trained_samples_per_s"], "mean_g": report["staleness"]["mean_g"],
           "max_g": report["staleness"]["max_g"], "run_dir": str(out), "block_time_s": block_time_s}
    return row, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 steps per arm instead of 40")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--max-staleness", type=int, default=4)
    parser.add_argument("--json", type=Path, default=Path("bench/results/efficiency.json"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/efficiency-run"))
    parser.add_argument("--block-times", default=None,
                        help="market arms' seconds between blocks, comma-separated (default 0,2; quick: 0)")
    args = parser.parse_args()
    console = make_console()
    steps = args.steps or (8 if args.quick else 40)
    folder = build_default_model(resolve_data_dir(None) / "models")
    arms = {"sync": sync_arm(folder, steps)}
    console.print(f"(a) sync: {arms['sync']['samples_per_s']:.0f} samples/s")
    arms["async_local"] = async_arm(folder, steps, args.max_staleness)
    console.print(f"(b) async local: {arms['async_local']['samples_per_s']:.0f} samples/s")
    block_times = [int(b) for b in (args.block_times or ("0" if args.quick else "0,2")).split(",")]
    markets = {}
    for block_time in block_times:
        row, report = market_arm(args.out / f"block-time-{block_time}", steps, args.max_staleness, block_time,
                                 console)
        markets[block_time] = (row, report)
        arms["market" if block_time == block_times[0] else f"market, {block_time} s blocks"] = row
    market, report = markets[block_times[0]]
    local = arms["async_local"]["samples_per_s"]
    efficiency = market["samples_per_s"] / local
    fraction = report["throughput"]["verification_fraction"]
    latency, cpu = report["latency"], report["cpu"]

    table = Table(title=f"trained samples/s, {EMBEDDED_MODEL} model, {steps} steps of {PROMPTS}x{GROUP}, 2 cores")
    for column in ("arm", "samples/s", "vs async local", "mean g"):
        table.add_column(column, justify="right")
    for name, row in arms.items():
        table.add_row(name, f"{row['samples_per_s']:.1f}", f"{row['samples_per_s'] / local:.3f}",
                      f"{row['mean_g']:.2f}" if "mean_g" in row else "-")
    console.print(table)
    console.print(f"efficiency (market / async local) = {efficiency:.3f}; SparrowRL's decentralized run reached "
                  f"{1 - SPARROW_GAP:.3f} of its ideal baseline; goal here >= 0.5 (embedded), >= 0.9 (SmolLM2)")
    stages = Table(title="median seconds per lease stage (market arms)")
    stages.add_column("stage")
    for block_time in block_times:
        stages.add_column(f"{block_time} s blocks" if block_time else "instant mining", justify="right")
    for stage in latency:
        stages.add_row(stage, *(f"{markets[b][1]['latency'].get(stage, float('nan')):.3f}" for b in block_times))
    console.print(stages)
    roles = Table(title="CPU by role (market arm)")
    for column in ("role", "CPU s", "share of the machine"):
        roles.add_column(column, justify="right")
    for role, seconds in sorted(cpu["seconds"].items(), key=lambda item: -item[1]):
        roles.add_row(role, f"{seconds:.1f}", f"{cpu['share'].get(role, 0.0):.1%}")
    console.print(roles)
    if fraction is not None:
        console.print(f"verification / generation compute on admitted leases: {fraction:.3f}")
    result = {"benchmark": "efficiency", "quick": args.quick, "steps": steps, "cores": os.cpu_count(),
              "runs": [{"model": EMBEDDED_MODEL, "arm": "sync" if arm == "sync" else "async_local"
                        if arm == "async_local" else "market", "samples_per_s": row["samples_per_s"],
                        "block_time_s": row.get("block_time_s", 0),
                        **{k: v for k, v in row.items() if k not in ("samples_per_s", "block_time_s")}}
                       for arm, row in arms.items()],
              "efficiency": {EMBEDDED_MODEL: efficiency},
              "efficiency_by_block_time": {str(b): markets[b][0]["samples_per_s"] / local for b in block_times},
              "verification_fraction": {EMBEDDED_MODEL: fraction}, "latency": latency,
              "latency_by_block_time": {str(b): markets[b][1]["latency"] for b in block_times}, "cpu": cpu,
              "sparrowrl_fraction_of_ideal": 1 - SPARROW_GAP}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

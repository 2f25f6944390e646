"""What decentralization costs: the whole market's training throughput beside two local baselines (issue 17).

For one model, task, batch and number of steps, one run measures side by side:
- (a) sync: the synchronous single-process GRPO loop (`trainer.local.LocalRun`, lag 0, one torch thread):
  sample a batch with the current policy, train on it, repeat;
- (b) async_local: generation and training in two processes, the generator up to the staleness budget
  ahead, policies passed back as bf16 bytes, no chain and no p2p (`rollnet.trainer.pipeline`);
- (c) market: `rollnet devnet` (anvil, the contracts, a trainer, workers and validators as processes over
  libp2p, committees, sampled verification at the spec's default fraction), with instant mining and, where
  asked, a block every 2 s (`--block-times`), as on an L2. Fees come from the node's fee history either way.

All three arms run the devnet's recipe for the model (`DevnetConfig.local_recipe`): for `embedded`, 32 prompts
x 8 samples of 6 tokens, 3 workers and 2 validators, budget 4; for `smollm2` (`--model smollm2`), the real-model
devnet's 4 prompts x 4 samples of up to 128 tokens of gym:gcd:last-number in the chat template, 2 workers and 2
validators, budget 2, held-out evaluation cut to one task (it is outside the timed window either way).

Trained samples/s (every sample of every group a step consumed, whether its rewards gave it signal or not):
(a) over its whole loop after one untimed warm-up step; (b) from its first batch's arrival at
the trainer; (c) from the trainer's first admission to its last step (so neither (b) nor (c) counts start-up).
efficiency = (c) / (b). From (c)'s event logs: the per-lease latency breakdown (`rollnet/devnet/latency.py`),
each role's share of the machine's CPU time, and the verification fraction (the committee members' verify
seconds over the workers' generation seconds, for the leases the trainer admitted), and the two throughput
ceilings that latency sets (`throughput_ceilings`: the staleness budget's, and the leases in flight's), each as
a fraction of (b): where one is below the goal, no stage but the latency can close the gap.

Usage: python bench/efficiency.py [--model embedded,smollm2] [--quick] [--json PATH] [--steps N] [--out DIR]
                                  [--tasks-per-lease N]
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
from rollnet.node.model.loading import load_policy
from rollnet.node.model.pinned import EMBEDDED_MODEL, PRESETS
from rollnet.trainer.local import LocalRun
from rollnet.trainer.pipeline import LocalRecipe, run_arm
from rollnet.trainer.trainer import Trainer

from rollnet.devnet import REAL_MODEL_SETUP_S, REAL_MODEL_STEP_S, REAL_MODEL_TASK, DevnetConfig, run_devnet

SPARROW_GAP = 0.0891  # SparrowRL: its decentralized run came within 8.91% of an ideal datacenter baseline
DEFAULT_STEPS = {EMBEDDED_MODEL: (40, 8)}  # (full, --quick); a real model: REAL_STEPS
REAL_STEPS = (6, 2)


def market_config(model: str, out: Path, steps: int, max_staleness: int | None, block_time_s: int,
                  tasks_per_lease: int | None = None) -> DevnetConfig:
    """The devnet run arm (c) makes: the model's devnet defaults (or `tasks_per_lease` prompts a lease), no
    baseline and no held-out evaluation inside."""
    common: dict[str, object] = {"steps": steps, "held_out_every": 10**6, "baseline_steps": 0,
                                 "block_time_s": block_time_s}
    if max_staleness is not None:
        common["max_staleness"] = max_staleness
    if tasks_per_lease is not None:
        common["tasks_per_lease"] = tasks_per_lease
    if model == EMBEDDED_MODEL:
        return DevnetConfig(out=out, **common)  # type: ignore[arg-type]
    return DevnetConfig.real_model(out, model, REAL_MODEL_TASK, held_out_prompts=1, **common)


def sync_arm(recipe: LocalRecipe, steps: int) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer = load_policy(Path(recipe.folder))
    trainer = Trainer(model, tokenizer, recipe.task_for(tokenizer), recipe.config(max_staleness=0))
    local = LocalRun(trainer, lag=0, seed=0)
    local.step()  # warm-up, not timed
    started = time.perf_counter()
    done = [local.step() for _ in range(steps)]
    seconds = time.perf_counter() - started
    samples = sum(step.rollouts for step in done)  # consumed by the steps, signal or not
    return {"seconds": seconds, "trained_samples": samples, "samples_per_s": samples / seconds,
            "samples_with_signal": sum(step.report.samples for step in done)}


def async_arm(recipe: LocalRecipe, steps: int, max_staleness: int) -> dict:
    result = run_arm(recipe, max_staleness, steps)
    return {"seconds": result["seconds"], "trained_samples": result["samples_trained_on"],
            "samples_per_s": result["samples_trained_on"] / result["seconds"], "staleness": result["staleness"],
            "samples_with_signal": result["trained_samples"]}


def market_arm(config: DevnetConfig, console: object) -> tuple[dict, dict]:
    shutil.rmtree(config.out, ignore_errors=True)
    timeout_s = REAL_MODEL_SETUP_S + REAL_MODEL_STEP_S * config.steps if config.preset else 1200.0
    report = run_devnet(config, console, live=False, timeout_s=timeout_s)
    row = {"seconds": report["run"]["seconds"], "trained_samples": report["samples"]["consumed_by_training"],
           "samples_with_signal": report["samples"]["trained_with_signal"],
           "samples_per_s": report["throughput"]["trained_samples_per_s"], "mean_g": report["staleness"]["mean_g"],
           "max_g": report["staleness"]["max_g"], "run_dir": str(config.out), "block_time_s": config.block_time_s,
           "tasks_per_lease": config.tasks_per_lease, "submitted_samples": report["samples"]["submitted"]}
    return row, report


def measure_model(model: str, args: argparse.Namespace, console: object) -> dict:
    """The three arms on one model; its rows, efficiency, latency and CPU, printed as tables."""
    full, quick = DEFAULT_STEPS.get(model, REAL_STEPS)
    steps = args.steps or (quick if args.quick else full)
    default_blocks = "0" if args.quick or model != EMBEDDED_MODEL else "0,2"
    block_times = [int(b) for b in (args.block_times or default_blocks).split(",")]
    configs = {b: market_config(model, args.out / model / f"block-time-{b}", steps, args.max_staleness, b,
                                args.tasks_per_lease)
               for b in block_times}
    first = configs[block_times[0]]
    recipe = first.local_recipe(first.model_folder())
    budget = first.max_staleness
    console.print(f"[bold]{model}[/]: {steps} steps of {recipe.prompts}x{recipe.group}, up to "
                  f"{recipe.max_new_tokens} tokens, task {recipe.task}, staleness budget {budget}")
    arms = {"sync": sync_arm(recipe, steps)}
    console.print(f"(a) sync: {arms['sync']['samples_per_s']:.1f} samples/s")
    arms["async_local"] = async_arm(recipe, steps, budget)
    console.print(f"(b) async local: {arms['async_local']['samples_per_s']:.1f} samples/s")
    markets = {}
    for block_time in block_times:
        row, report = market_arm(configs[block_time], console)
        markets[block_time] = (row, report)
        arms["market" if block_time == block_times[0] else f"market, {block_time} s blocks"] = row
    market, report = markets[block_times[0]]
    local = arms["async_local"]["samples_per_s"]
    efficiency = market["samples_per_s"] / local
    fraction = report["throughput"]["verification_fraction"]
    latency, cpu = report["latency"], report["cpu"]

    table = Table(title=f"trained samples/s, {model} model, {steps} steps of {recipe.prompts}x{recipe.group}, "
                        f"{os.cpu_count()} cores")
    for column in ("arm", "samples/s", "vs async local", "samples with signal", "mean g", "submitted, untrained"):
        table.add_column(column, justify="right")
    for name, row in arms.items():
        untrained = row.get("submitted_samples", row["trained_samples"]) - row["trained_samples"]
        table.add_row(name, f"{row['samples_per_s']:.3g}", f"{row['samples_per_s'] / local:.3f}",
                      f"{row['samples_with_signal']} of {row['trained_samples']}",
                      f"{row['mean_g']:.2f}" if "mean_g" in row else "-",
                      f"{untrained}" if "submitted_samples" in row else "-")
    console.print(table)
    goal = 0.5 if model == EMBEDDED_MODEL else 0.9
    console.print(f"efficiency (market / async local) = {efficiency:.3f}; goal >= {goal}; SparrowRL's decentralized "
                  f"run reached {1 - SPARROW_GAP:.3f} of its ideal baseline")
    stages = Table(title=f"median seconds per lease stage ({model}, market arms)")
    stages.add_column("stage")
    for block_time in block_times:
        stages.add_column(f"{block_time} s blocks" if block_time else "instant mining", justify="right")
    for stage in latency:
        stages.add_row(stage, *(f"{markets[b][1]['latency'].get(stage, float('nan')):.3f}" for b in block_times))
    console.print(stages)
    roles = Table(title=f"CPU by role ({model}, market arm)")
    for column in ("role", "CPU s", "share of the machine"):
        roles.add_column(column, justify="right")
    for role, seconds in sorted(cpu["seconds"].items(), key=lambda item: -item[1]):
        roles.add_row(role, f"{seconds:.1f}", f"{cpu['share'].get(role, 0.0):.1%}")
    console.print(roles)
    ceilings = report["throughput"].get("ceilings") or {}
    for bound, why in (("staleness", "within the staleness budget"), ("in_flight", "with the leases in flight")):
        if bound in ceilings:
            console.print(f"ceiling {why} at this latency: {ceilings[bound]:.3g} samples/s, "
                          f"{ceilings[bound] / local:.3f} of (b)")
    if fraction is not None:
        console.print(f"verification / generation compute on admitted leases: {fraction:.3f}")
    return {"steps": steps, "recipe": recipe.model_dump(), "efficiency": efficiency, "fraction": fraction,
            "latency": latency, "cpu": cpu,
            "ceilings": {**{bound: {"samples_per_s": ceilings[bound], "against_async_local": ceilings[bound] / local}
                            for bound in ("staleness", "in_flight") if bound in ceilings},
                         "window_leases": ceilings.get("window_leases")},
            "runs": [{"model": model, "arm": "sync" if arm == "sync" else "async_local" if arm == "async_local"
                      else "market", "samples_per_s": row["samples_per_s"], "block_time_s": row.get("block_time_s", 0),
                      **{k: v for k, v in row.items() if k not in ("samples_per_s", "block_time_s")}}
                     for arm, row in arms.items()],
            "efficiency_by_block_time": {str(b): markets[b][0]["samples_per_s"] / local for b in block_times},
            "latency_by_block_time": {str(b): markets[b][1]["latency"] for b in block_times}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED_MODEL,
                        help=f"models, comma-separated: {EMBEDDED_MODEL} and the presets ({', '.join(PRESETS)})")
    parser.add_argument("--quick", action="store_true", help="fewer steps per arm (embedded 8 instead of 40)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--max-staleness", type=int, default=None, help="default: the model's devnet budget")
    parser.add_argument("--json", type=Path, default=Path("bench/results/efficiency.json"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/efficiency-run"))
    parser.add_argument("--block-times", default=None,
                        help="market arms' seconds between blocks, comma-separated (default 0,2 on the embedded "
                        "model; 0 with --quick or a real model)")
    parser.add_argument("--tasks-per-lease", type=int, default=None,
                        help="prompts a market lease holds (default: the model's devnet lease, 8 on the embedded "
                        "model; 32 makes a lease one step's batch, as the local arms generate it)")
    args = parser.parse_args()
    if args.tasks_per_lease is not None and not 1 <= args.tasks_per_lease <= 1024:
        parser.error("--tasks-per-lease is 1..1024 (the job's bounds)")
    console = make_console()
    models = args.model.split(",")
    unknown = [m for m in models if m != EMBEDDED_MODEL and m not in PRESETS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}: {EMBEDDED_MODEL} or one of {', '.join(PRESETS)}")
    measured = {model: measure_model(model, args, console) for model in models}
    first = measured[models[0]]
    result = {"benchmark": "efficiency", "quick": args.quick, "cores": os.cpu_count(),
              "steps": {m: r["steps"] for m, r in measured.items()},
              "recipes": {m: r["recipe"] for m, r in measured.items()},
              "runs": [run for r in measured.values() for run in r["runs"]],
              "efficiency": {m: r["efficiency"] for m, r in measured.items()},
              "efficiency_by_block_time": {m: r["efficiency_by_block_time"] for m, r in measured.items()},
              "verification_fraction": {m: r["fraction"] for m, r in measured.items()},
              "latency": first["latency"], "latency_by_model": {m: r["latency"] for m, r in measured.items()},
              "latency_by_block_time": {m: r["latency_by_block_time"] for m, r in measured.items()},
              "cpu": {m: r["cpu"] for m, r in measured.items()},
              "ceilings": {m: r["ceilings"] for m, r in measured.items()},
              "sparrowrl_fraction_of_ideal": 1 - SPARROW_GAP}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

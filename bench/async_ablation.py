"""The asynchrony ablation: does GRPO with two-sided clipping absorb a policy that lags the trainer?

Arms (equal rollouts each: the same steps x prompts x group size): synchronous (staleness 0), staleness
exactly 2, exactly 4 with δ = 4, exactly 4 with δ off; several seeds each. Staleness is simulated
faithfully: the sampling policy is the trainer's bf16 policy from k versions earlier (`LocalRun`), and
the buffer's staleness budget is 4. The curve is held-out greedy accuracy (exact-answer reward) of the
trainer's current policy; arms run two at a time, one torch thread each.

Usage: python bench/async_ablation.py [--quick] [--json PATH] [--plot PATH]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from pathlib import Path

ARMS = [  # name, staleness, delta
    ("synchronous", 0, 4.0),
    ("staleness 2", 2, 4.0),
    ("staleness 4, δ=4", 4, 4.0),
    ("staleness 4, δ off", 4, None),
]


def run_arm(job: tuple) -> dict:
    """One (arm, seed) run in its own process."""
    name, lag, delta, seed, steps, every, folder, lr, optimizer_steps = job
    import torch
    from rollnet.node.model.loading import load_policy
    from rollnet.node.tasks import load_task
    from rollnet.trainer.config import GRPOConfig
    from rollnet.trainer.local import LocalRun
    from rollnet.trainer.trainer import Trainer

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model, tokenizer = load_policy(Path(folder))
    config = GRPOConfig.make(delta=delta, max_staleness=4, lr=lr, optimizer_steps=optimizer_steps)
    run = LocalRun(Trainer(model, tokenizer, load_task("addition-2digit"), config), lag=lag, seed=seed)
    curve, sampled, max_ratio, clipped = [(0, run.held_out_accuracy())], [], 1.0, []
    started = time.perf_counter()
    for step in range(1, steps + 1):
        result = run.step()
        sampled.append(result.sampled_reward)
        max_ratio = max(max_ratio, result.report.max_ratio)
        clipped.append(result.report.clipped_fraction)
        if step % every == 0:
            curve.append((step, run.held_out_accuracy()))
    counts = run.buffer.counts
    return {"arm": name, "seed": seed, "curve": curve, "sampled_reward": sampled,
            "staleness": dict(counts.staleness), "seconds": time.perf_counter() - started,
            "skipped_batches": run.trainer.skipped_batches, "max_ratio": max_ratio,
            "clipped_fraction": sum(clipped) / len(clipped)}


def main() -> None:
    parser = argparse.ArgumentParser(description="GRPO under simulated staleness, against synchronous.")
    parser.add_argument("--quick", action="store_true", help="3 seeds x 60 steps (under 5 minutes)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/async_ablation.json"))
    parser.add_argument("--plot", type=Path, default=None, help="PNG (default: beside the JSON)")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--steps", type=int, default=None, help="override the steps per run")
    parser.add_argument("--seeds", type=int, default=None, help="override the number of seeds (at least 2)")
    parser.add_argument("--optimizer-steps", type=int, default=4, help="minibatch updates per batch")
    args = parser.parse_args()
    from rich.table import Table
    from rollnet.node.cli.context import make_console
    from rollnet.node.config import resolve_data_dir
    from rollnet.node.model.builder import build_default_model

    console = make_console()
    folder = build_default_model(resolve_data_dir(None) / "models")
    seeds = list(range(args.seeds or (3 if args.quick else 5)))
    steps, every = (60, 10) if args.quick else (150, 10)
    if args.steps:
        steps, every = args.steps, max(1, min(every, args.steps))
    jobs = [(name, lag, delta, seed, steps, every, str(folder), args.lr, args.optimizer_steps)
            for name, lag, delta in ARMS for seed in seeds]
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(min(2, os.cpu_count() or 1)) as pool:
        results = pool.map(run_arm, jobs, chunksize=1)
    arms = []
    for name, lag, delta in ARMS:
        runs = [r for r in results if r["arm"] == name]
        points = [step for step, _ in runs[0]["curve"]]
        curve = [[r["curve"][i][1] for r in runs] for i in range(len(points))]
        finals = [r["curve"][-1][1] for r in runs]
        staleness: dict[int, int] = {}
        for r in runs:
            for g, count in r["staleness"].items():
                staleness[int(g)] = staleness.get(int(g), 0) + count
        arms.append({
            "name": name, "staleness": lag, "delta": delta, "seeds": seeds,
            "final_reward_mean": statistics.mean(finals), "final_reward_std": statistics.stdev(finals),
            "final_rewards": finals, "base_reward_mean": statistics.mean(c[0][1] for c in (r["curve"] for r in runs)),
            "reward_curve": {"steps": points, "mean": [statistics.mean(c) for c in curve],
                             "std": [statistics.stdev(c) for c in curve]},
            "sampled_reward_curve": [statistics.mean(vals) for vals in zip(*(r["sampled_reward"] for r in runs),
                                                                             strict=True)],
            "realised_staleness": dict(sorted(staleness.items())),
            "seconds_per_run": statistics.mean(r["seconds"] for r in runs),
            "max_ratio": max(r["max_ratio"] for r in runs),
            "clipped_fraction": statistics.mean(r["clipped_fraction"] for r in runs),
        })
    sync = arms[0]
    for arm in arms:
        arm["difference_from_synchronous"] = arm["final_reward_mean"] - sync["final_reward_mean"]
        arm["difference_spread"] = (arm["final_reward_std"] ** 2 + sync["final_reward_std"] ** 2) ** 0.5
        arm["within_one_std_of_synchronous"] = abs(arm["difference_from_synchronous"]) <= sync["final_reward_std"]
    report = {"benchmark": "async_ablation", "quick": args.quick, "steps": steps, "prompts_per_step": 32,
              "group_size": 8, "rollouts_per_arm_and_seed": steps * 32 * 8, "arms": arms, "lr": args.lr,
              "optimizer_steps": args.optimizer_steps,
              "wall_seconds": time.perf_counter() - started}

    table = Table(title=f"held-out greedy accuracy after {steps} steps ({len(seeds)} seeds, "
                        f"{steps * 256:,} rollouts per run)")
    for column in ("arm", "base", "final mean ± std", "vs synchronous", "max ratio", "clipped", "realised g"):
        table.add_column(column, justify="right")
    for arm in arms:
        table.add_row(arm["name"], f"{arm['base_reward_mean']:.3f}",
                      f"{arm['final_reward_mean']:.3f} ± {arm['final_reward_std']:.3f}",
                      f"{arm['difference_from_synchronous']:+.3f} ± {arm['difference_spread']:.3f}",
                      f"{arm['max_ratio']:.2f}", f"{arm['clipped_fraction']:.1%}",
                      ", ".join(f"{g}:{n}" for g, n in arm["realised_staleness"].items()))
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    plot = args.plot or args.json.with_suffix(".png")
    draw(arms, plot)
    console.print(f"wrote {args.json} and {plot} in {report['wall_seconds']:.0f} s")


def draw(arms: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.2))
    for arm in arms:
        curve = arm["reward_curve"]
        low = [m - s for m, s in zip(curve["mean"], curve["std"], strict=True)]
        high = [m + s for m, s in zip(curve["mean"], curve["std"], strict=True)]
        axis.plot(curve["steps"], curve["mean"], label=arm["name"])
        axis.fill_between(curve["steps"], low, high, alpha=0.15)
    axis.set_xlabel("trainer step (policy version)")
    axis.set_ylabel("held-out greedy accuracy")
    axis.set_title("GRPO under simulated staleness (mean ± std over seeds)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    main()

"""rollnet on a real language model (SmolLM2-135M-Instruct, the `smollm2` preset): which reasoning-gym task
gives GRPO signal, measured by sampling the base model the way a worker does.

Section `task` (built): for each candidate reasoning-gym dataset, PROMPTS prompts (seeds from 10,000 up, away
from any training seeds) in SmolLM2's chat template, GROUP seeded samples each at temperature 1.0, up to
--max-new-tokens tokens stopping at its EOS, scored by the dataset's own scorer. It reports the mean sampled
reward, the share of groups whose rewards differ (GRPO learns only from those), the completion lengths and
how many ended at EOS, and picks the candidate whose mean reward lies in [0.1, 0.7] with the most signal.
The remaining sections of issue 16 (deltas from real GRPO steps, honest false positives, the detection table
against per-token KL, costs) are not built yet; the JSON says so.

Usage: python bench/real_model.py [--quick] [--json PATH] [--tasks a,b,c]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.table import Table
from rollnet.node.cli.context import make_console
from rollnet.node.config import resolve_data_dir
from rollnet.node.model.identity import model_eos_token_ids
from rollnet.node.model.loading import load_policy, resolve_model
from rollnet.node.model.pinned import SMOLLM2
from rollnet.node.rollout.generate import generate
from rollnet.node.tasks import load_task
from rollnet.node.tasks.templated import ChatTemplatedTask

CANDIDATES = ("basic_arithmetic", "chain_sum", "leg_counting", "gcd", "letter_counting", "number_sorting",
              "spell_backward", "word_sorting", "simple_equations", "decimal_arithmetic")
SIGNAL_BAND = (0.1, 0.7)
FIRST_SEED = 10_000
BATCH_ROWS = 64
NOT_BUILT = ["delta", "honest", "detection", "cost"]


def measure_task(model, tokenizer, dataset: str, prompts: int, group: int, max_new_tokens: int) -> dict:  # noqa: ANN001
    task = ChatTemplatedTask(load_task(f"gym:{dataset}"), tokenizer)
    eos = model_eos_token_ids(model, tokenizer)
    per_batch = max(1, BATCH_ROWS // group)
    rewards: list[list[float]] = []
    lengths: list[int] = []
    ended = 0
    started = time.perf_counter()
    for first in range(0, prompts, per_batch):
        instances = task.examples(range(FIRST_SEED + first, FIRST_SEED + min(prompts, first + per_batch)))
        rollouts = generate(model, tokenizer, instances, group, max_new_tokens=max_new_tokens, temperature=1.0)
        by_seed: dict[int, list[float]] = {}
        for rollout in rollouts:
            instance = next(i for i in instances if i.seed == rollout.task_seed)
            by_seed.setdefault(rollout.task_seed, []).append(task.reward(instance, rollout.text))
            lengths.append(len(rollout.tokens))
            ended += bool(rollout.tokens) and rollout.tokens[-1] in eos
        rewards += list(by_seed.values())
    seconds = time.perf_counter() - started
    flat = [r for group_rewards in rewards for r in group_rewards]
    return {
        "task": f"gym:{dataset}", "prompts": prompts, "group": group, "samples": len(flat),
        "mean_reward": statistics.fmean(flat),
        "signal_fraction": sum(max(g) > min(g) for g in rewards) / len(rewards),
        "mean_tokens": statistics.fmean(lengths), "max_tokens": max(lengths), "ended_at_eos": ended / len(lengths),
        "seconds": seconds, "tokens_per_s": sum(lengths) / seconds,
    }


def choose(rows: list[dict]) -> dict | None:
    inside = [row for row in rows if SIGNAL_BAND[0] <= row["mean_reward"] <= SIGNAL_BAND[1]]
    return max(inside, key=lambda row: (row["signal_fraction"], -abs(row["mean_reward"] - 0.4)), default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 prompts x 2 samples, 48 tokens, 2 tasks")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--tasks", help="comma-separated reasoning-gym datasets (default: the candidates)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    console = make_console()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    prompts, group, new_tokens = (4, 2, 48) if args.quick else (args.prompts, args.group, args.max_new_tokens)
    tasks = args.tasks.split(",") if args.tasks else list(CANDIDATES[:2] if args.quick else CANDIDATES)
    folder = resolve_model(resolve_data_dir(None), Path(SMOLLM2))
    model, tokenizer = load_policy(folder)
    rows = []
    for dataset in tasks:
        console.print(f"sampling gym:{dataset}: {prompts} prompts x {group}, up to {new_tokens} tokens...")
        rows.append(measure_task(model, tokenizer, dataset, prompts, group, new_tokens))
    chosen = choose(rows)
    table = Table(title=f"SmolLM2-135M-Instruct base model, sampled reward (T = 1.0, chat template, "
                        f"{prompts} prompts x {group}, up to {new_tokens} tokens)")
    for column in ("task", "mean reward", "groups with signal", "mean tokens", "ended at EOS", "tokens/s"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(row["task"] + (" (chosen)" if row is chosen else ""), f"{row['mean_reward']:.3f}",
                      f"{row['signal_fraction']:.0%}", f"{row['mean_tokens']:.0f}", f"{row['ended_at_eos']:.0%}",
                      f"{row['tokens_per_s']:.0f}")
    console.print(table)
    console.print(f"chosen: {chosen['task'] if chosen else 'none in the band'} (band {SIGNAL_BAND})")
    report = {"benchmark": "real_model", "quick": args.quick, "model": "SmolLM2-135M-Instruct", "machine": {
        "cpu": platform.processor() or platform.machine(), "threads": args.threads},
        "task_choice": rows, "chosen_task": chosen["task"] if chosen else None, "signal_band": SIGNAL_BAND,
        "not_built": NOT_BUILT}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

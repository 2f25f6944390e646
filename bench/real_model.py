"""rollnet on a real language model (SmolLM2-135M-Instruct, the `smollm2` preset), issue 16's measurements in
one run: which reasoning-gym task gives GRPO signal, how big real GRPO deltas are, whether verification
passes honest rollouts and catches cheats (against their per-token KL), and what proofs and checks cost.

Section `task`: for each candidate task (a reasoning-gym dataset with an answer rule, node/tasks/gym.py),
PROMPTS prompts (seeds from 10,000 up, away from any training seeds) in SmolLM2's chat template, GROUP seeded
samples each at temperature 1.0, up to --max-new-tokens tokens stopping at its EOS, scored by the dataset's
own scorer on the rule's extract. It reports the mean sampled reward, the share of groups whose rewards
differ (GRPO learns only from those), the completion lengths and how many ended at EOS, and picks the
candidate whose mean reward lies in [0.1, 0.7] with the most signal.
Section `delta` (bench/real_delta.py) and sections `honest`, `detection`, `cost` (bench/real_verify.py) run
on the chosen task (or --task): see those modules for what they measure.

Usage: python bench/real_model.py [--quick] [--json PATH] [--sections task,delta,verify] [--task NAME]
       [--tasks a,b,c]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import real_delta
import real_verify
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

CANDIDATES = ("gcd:last-number", "chain_sum:last-number", "basic_arithmetic:last-number", "lcm:last-number",
              "leg_counting:last-number", "decimal_arithmetic:last-number", "gcd:answer-tag", "gcd",
              "basic_arithmetic", "spell_backward", "letter_counting")
QUICK_CANDIDATES = ("gcd:last-number", "basic_arithmetic")
DEFAULT_TASK = "gym:gcd:last-number"  # the task section's choice (BENCHMARKS.md), when the section is not run
SECTIONS = ("task", "delta", "verify")
SIGNAL_BAND = (0.1, 0.7)
FIRST_SEED = 10_000
BATCH_ROWS = 64


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


def task_section(model, tokenizer, args: argparse.Namespace, console) -> dict:  # noqa: ANN001
    prompts, group, new_tokens = (4, 2, 48) if args.quick else (args.prompts, args.group, args.max_new_tokens)
    tasks = args.tasks.split(",") if args.tasks else list(QUICK_CANDIDATES if args.quick else CANDIDATES)
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
    return {"task_choice": rows, "chosen_task": chosen["task"] if chosen else None, "signal_band": SIGNAL_BAND}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few minutes: fewer prompts, tasks, steps, trials")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--tasks", help="task section: comma-separated gym datasets[:rule] (default: the candidates)")
    parser.add_argument("--task", help=f"the task the other sections run (default: the task section's choice, "
                                       f"else {DEFAULT_TASK})")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256, help="task section's completion limit")
    parser.add_argument("--section-tokens", type=int, default=128, help="delta and verify sections' limit")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    sections = args.sections.split(",")
    if unknown := set(sections) - set(SECTIONS):
        parser.error(f"unknown sections {', '.join(sorted(unknown))}: choose from {', '.join(SECTIONS)}")
    console = make_console()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    folder = resolve_model(resolve_data_dir(None), Path(SMOLLM2))
    model, tokenizer = load_policy(folder)
    report: dict = {"benchmark": "real_model", "quick": args.quick, "model": "SmolLM2-135M-Instruct",
                    "sections": sections, "machine": {"cpu": platform.processor() or platform.machine(),
                                                      "threads": args.threads}}
    if "task" in sections:
        report.update(task_section(model, tokenizer, args, console))
    task_name = args.task or report.get("chosen_task") or DEFAULT_TASK
    task = ChatTemplatedTask(load_task(task_name), tokenizer)
    tokens = 48 if args.quick else args.section_tokens
    report["section_task"], report["section_tokens"] = task_name, tokens
    if "delta" in sections:
        console.print(f"delta: real GRPO steps on {task_name}...")
        report["delta"] = real_delta.delta_section(model, tokenizer, task, quick=args.quick, max_new_tokens=tokens,
                                                   console=console)
        console.print(real_delta.delta_table(report["delta"]))
    if "verify" in sections:
        console.print(f"verification on {task_name}: honest rollouts, cheats, costs...")
        verified = real_verify.verify_sections(model, tokenizer, task, quick=args.quick, max_new_tokens=tokens,
                                               console=console)
        real_verify.print_tables(verified, console)
        report.update(verified)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(real_verify.jsonable(report), indent=2))
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""Policy deltas from real GRPO steps on SmolLM2-135M-Instruct (issue 16's `delta` section): how big rollnet's
payload is next to full bf16 weights, a PULSE-style sparse delta and the entropy bound, on the same steps.

For each learning rate (1e-6, 3e-6, 1e-5) a fresh `rollnet.trainer.Trainer` (fp32 master weights, torch AdamW,
weight decay 0, the project's GRPO loss with its defaults ε = 0.2, δ = 4, token normalisation) takes STEPS
steps; each step is one optimiser step and one new version (`optimizer_steps = 1`), and the policy is the bf16
cast of the master weights after it (`bf16_policy`, as the trainer publishes it). Its rollouts are sampled on
policy from that bf16 policy (run in fp32, as workers run it) by `rollnet.node.rollout.generate` at
temperature 1.0: PROMPTS prompts of the task (fresh seeds every step, the same seeds for every learning rate)
x GROUP samples, up to `max_new_tokens` tokens. They pass through the trainer's own `RolloutBuffer`, and
`Trainer.train_on` recomputes the rewards and the group-normalised advantages. No gradient is made up: a group
whose rewards are all equal carries no signal and the trainer drops it, so when a draw has no group with reward
spread another draw of fresh prompts is added to the batch (at most DRAWS per step); a step still without
signal is a no-op (no optimiser step, no version) and is reported as one, not measured. The first steps of all
learning rates share version 0's rollouts (seeded sampling from the same weights gives the same rollouts).
No warm-up: the first measured step is AdamW's first (its update is lr x sign(g) wherever g != 0).

Each step's delta (version v-1 -> v over every distinct tensor: SmolLM2's lm_head is tied to its embedding, so
its copy in the state dict is left out, `distinct_names`) is measured as a ratio of full bf16 bytes (2 per
element; bigger is better):
  ours: `rollnet.node.delta.encode` (signed by dev account 0), applied with `rollnet.node.delta.apply`;
  PULSE-style: per tensor (name order) a u32 count, the changed positions as int32 delta-coded (the first
      absolute, then differences of consecutive positions), then the new bf16 bit patterns, all concatenated
      and compressed by zstd (level ZSTD_LEVEL, one thread), decoded and applied by `pulse_style_apply`;
  entropy bound: `entropy_bound_bytes` of bench/delta.py (log2 C(n, k) bits per tensor for the positions plus
      k times the order-0 entropy of the changes).
`bytes_ours_published` is rollnet's payload over the whole state dict, tied copy included, which is what the
trainer publishes today (`bf16_policy`); it is applied and checked too.
Goals (issue 16), reported as computed booleans, never asserted: ours at least 1.3x smaller than PULSE-style,
and ours within 5% of the bound (bytes_ours <= 1.05 x bound).

Invariant: every payload is decoded and applied onto a copy of the base and checked bit for bit against the
target (every tensor compared as int16; ours also against the signed content root) before it is counted;
`bit_exact` says that every check passed.

Usage: python bench/real_delta.py [--quick] [--json PATH] [--task NAME] [--threads N] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
import zstandard
from delta import entropy_bound_bytes  # bench/delta.py, beside this script: it sets torch's threads on import
from rich.console import Console
from rich.table import Table
from rollnet.node.cli.context import make_console
from rollnet.node.config import resolve_data_dir
from rollnet.node.delta import apply, content_root, encode
from rollnet.node.delta.bitcast import bits_of
from rollnet.node.keys import dev_account
from rollnet.node.model.loading import load_policy, resolve_model
from rollnet.node.model.pinned import SMOLLM2
from rollnet.node.model.policies import bf16_policy
from rollnet.node.rollout.generate import Rollout, generate
from rollnet.node.tasks import Task, load_task
from rollnet.node.tasks.templated import ChatTemplatedTask
from rollnet.trainer.advantages import group_advantages
from rollnet.trainer.buffer import Group, RolloutBuffer
from rollnet.trainer.config import GRPOConfig
from rollnet.trainer.trainer import Trainer
from transformers import PreTrainedModel, PreTrainedTokenizerFast

# Importing bench/delta.py sets torch's thread count (a module-level line there): callers set theirs afterwards,
# as main() here and bench/real_model.py's main() do.
SIGNER = dev_account(0)
LRS = (1e-6, 3e-6, 1e-5)
QUICK_LR = 1e-5
STEPS, QUICK_STEPS = 3, 1
PROMPTS, QUICK_PROMPTS = 8, 4
GROUP = 4
DRAWS = 3  # draws of PROMPTS fresh prompts at most per step, until one group has reward spread
FIRST_SEED = 20_000  # away from bench/real_model.py's task-search seeds (10,000 up)
ZSTD_LEVEL = 3
GOAL_VS_PULSE = 1.3
GOAL_OVER_BOUND = 1.05


# ---------------------------------------------------------------------------------------------- PULSE-style

def pulse_style_encode(base: dict[str, torch.Tensor], target: dict[str, torch.Tensor],
                       level: int = ZSTD_LEVEL) -> bytes:
    """Per tensor in name order: u32 count | int32 delta-coded positions | new bf16 patterns; then zstd."""
    parts = []
    for name in sorted(target):
        old, new = bits_of(base[name]), bits_of(target[name])
        positions = np.flatnonzero(old != new)
        gaps = np.diff(positions, prepend=0).astype("<i4")
        count = np.array([len(positions)], dtype="<u4")
        parts += [count.tobytes(), gaps.tobytes(), new[positions].astype("<u2").tobytes()]
    return zstandard.ZstdCompressor(level=level, threads=0).compress(b"".join(parts))


def pulse_style_apply(held: dict[str, torch.Tensor], payload: bytes) -> int:
    """Decode a `pulse_style_encode` payload and overwrite the changed elements of `held` in place; returns
    the number of elements written."""
    raw = zstandard.ZstdDecompressor().decompress(payload)
    offset, written = 0, 0
    for name in sorted(held):
        count = int(np.frombuffer(raw, dtype="<u4", count=1, offset=offset)[0])
        offset += 4
        positions = np.cumsum(np.frombuffer(raw, dtype="<i4", count=count, offset=offset).astype(np.int64))
        offset += 4 * count
        values = np.frombuffer(raw, dtype="<u2", count=count, offset=offset)
        offset += 2 * count
        bits_of(held[name])[positions] = values
        written += count
    if offset != len(raw):
        raise ValueError(f"PULSE-style payload has {len(raw) - offset} trailing bytes")
    return written


# ---------------------------------------------------------------------------------------------- measures

def _exact(held: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> bool:
    return held.keys() == target.keys() and all(
        torch.equal(held[k].view(torch.int16), target[k].view(torch.int16)) for k in target)


def distinct_names(model: torch.nn.Module) -> list[str]:
    """The state dict's names less those sharing storage with an earlier one (SmolLM2's lm_head is tied to
    its embedding: the same parameter, in the state dict twice)."""
    seen: set[int] = set()
    names = []
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            names.append(name)
    return names


def _published_bytes(base: dict[str, torch.Tensor], target: dict[str, torch.Tensor], base_version: int,
                     version: int) -> tuple[int, bool]:
    """rollnet's payload over the whole state dict, as the trainer publishes it today, and its check."""
    base_root = content_root(base)
    data = encode(base, target, base_version=base_version, version=version, signer=SIGNER,
                  base_root=base_root).to_bytes()
    held = {k: v.clone() for k, v in base.items()}
    applied = apply(held, data, trainer=SIGNER.address, base_version=base_version, base_root=base_root)
    return len(data), _exact(held, target) and applied.root == content_root(target)


def measure_delta(base: dict[str, torch.Tensor], target: dict[str, torch.Tensor], base_version: int,
                  version: int) -> dict:
    """Sizes of one step's delta three ways, each payload decoded, applied and checked bit for bit."""
    full = sum(t.numel() * 2 for t in target.values())
    bound, changes, total = entropy_bound_bytes(base, target)
    base_root = content_root(base)
    started = time.perf_counter()
    ours = encode(base, target, base_version=base_version, version=version, signer=SIGNER,
                  base_root=base_root).to_bytes()
    encode_s = time.perf_counter() - started
    held = {k: v.clone() for k, v in base.items()}
    started = time.perf_counter()
    applied = apply(held, ours, trainer=SIGNER.address, base_version=base_version, base_root=base_root)
    apply_s = time.perf_counter() - started
    ours_exact = _exact(held, target) and applied.root == content_root(target) and applied.version == version
    started = time.perf_counter()
    pulse = pulse_style_encode(base, target)
    pulse_encode_s = time.perf_counter() - started
    held = {k: v.clone() for k, v in base.items()}
    pulse_written = pulse_style_apply(held, pulse)
    pulse_exact = _exact(held, target) and pulse_written == changes
    del held
    return {
        "version": version, "parameters": total, "changed": changes, "change_fraction": changes / total,
        "bytes_full_bf16": full, "bytes_ours": len(ours), "bytes_pulse_style": len(pulse),
        "bytes_entropy_bound": round(bound),
        "ratio_ours": full / len(ours), "ratio_pulse_style": full / len(pulse),
        "ratio_entropy_bound": full / max(bound, 1.0),
        "bits_per_change_ours": 8 * len(ours) / max(changes, 1),
        "bits_per_change_pulse_style": 8 * len(pulse) / max(changes, 1),
        "bits_per_change_bound": 8 * bound / max(changes, 1),
        "ours_exact": ours_exact, "pulse_style_exact": pulse_exact, "bit_exact": ours_exact and pulse_exact,
        "encode_s": encode_s, "apply_s": apply_s, "pulse_style_encode_s": pulse_encode_s,
    }


# ---------------------------------------------------------------------------------------------- GRPO steps

class Sampler:
    """On-policy rollouts: the bf16 policy loaded into one fp32 copy of the model; rollouts memoised by (policy
    root, seeds), which seeded sampling makes exact (the learning rates' first steps share version 0's)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, group: int,
                 max_new_tokens: int):
        self.model = copy.deepcopy(model).float().eval()
        self.tokenizer, self.task, self.group, self.max_new_tokens = tokenizer, task, group, max_new_tokens
        self._memo: dict[tuple[bytes, tuple[int, ...]], list[Rollout]] = {}
        self.seconds = 0.0

    def rollouts(self, policy: dict[str, torch.Tensor], root: bytes, version: int, seeds: list[int]) -> list[Rollout]:
        key = (root, tuple(seeds))
        if key not in self._memo:
            started = time.perf_counter()
            with torch.no_grad():
                for name, tensor in self.model.state_dict().items():
                    tensor.copy_(policy[name])
            self._memo[key] = generate(self.model, self.tokenizer, [self.task.instance(s) for s in seeds], self.group,
                                       max_new_tokens=self.max_new_tokens, temperature=1.0, policy_version=version,
                                       policy_root=root.hex(), prove=False)
            self.seconds += time.perf_counter() - started
        return [copy.copy(r) for r in self._memo[key]]


def grpo_run(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, sampler: Sampler, lr: float,
             steps: int, prompts: int, console: Console) -> list[dict]:
    """`steps` GRPO steps of a fresh trainer at `lr`; one row per step (measured, or a no-op)."""
    config = GRPOConfig.make(lr=lr, group_size=sampler.group, prompts_per_step=prompts, optimizer_steps=1,
                             max_staleness=0, max_new_tokens=sampler.max_new_tokens, temperature=1.0)
    trainer = Trainer(copy.deepcopy(model), tokenizer, task, config)
    buffer = RolloutBuffer(config.group_size, config.max_staleness, trainer.model.config.vocab_size)
    names = distinct_names(trainer.model)
    policy = bf16_policy(trainer.model)
    rows = []
    for step in range(steps):
        started = time.perf_counter()
        generate_before = sampler.seconds
        root = content_root(policy)
        buffer.advance(trainer.version)
        groups: list[Group] = []
        signal = 0
        draws = 0
        while draws < DRAWS and signal == 0:
            first = FIRST_SEED + (step * DRAWS + draws) * prompts
            buffer.admit_all(sampler.rollouts(policy, root, trainer.version, list(range(first, first + prompts))))
            taken = buffer.take(prompts)
            groups += taken
            signal += sum(group_advantages(trainer.rewards(g), config.advantage_epsilon) is not None for g in taken)
            draws += 1
        report = trainer.train_on(groups)
        row = {"lr": lr, "step": step + 1, "draws": draws, "groups": report.groups,
               "groups_with_signal": report.groups - report.groups_without_signal, "samples": report.samples,
               "mean_reward": report.mean_reward, "loss": report.loss, "grad_norm": report.grad_norm,
               "mean_tokens": sum(len(r.tokens) for g in groups for r in g.rollouts) / max(1, sum(len(g.rollouts)
                                                                                            for g in groups)),
               "generate_s": sampler.seconds - generate_before, "train_s": report.seconds,
               "no_op": report.optimizer_steps == 0}
        if row["no_op"]:
            row["why"] = ("non-finite loss or gradient" if report.skipped_non_finite else
                          f"no group with reward spread in {draws} draws of {prompts} prompts")
            console.print(f"  lr {lr:g} step {step + 1}: no-op ({row['why']})")
        else:
            target = bf16_policy(trainer.model)
            versions = trainer.version - 1, trainer.version
            row.update(measure_delta({n: policy[n] for n in names}, {n: target[n] for n in names}, *versions))
            if len(names) < len(target):
                row["bytes_ours_published"], row["ours_published_exact"] = _published_bytes(policy, target, *versions)
                row["bit_exact"] = row["bit_exact"] and row["ours_published_exact"]
            policy = target
            console.print(f"  lr {lr:g} step {step + 1}: {row['change_fraction']:.3%} changed, ours "
                          f"{row['ratio_ours']:.1f}x, PULSE-style {row['ratio_pulse_style']:.1f}x, bound "
                          f"{row['ratio_entropy_bound']:.1f}x, exact {row['bit_exact']} "
                          f"({row['groups_with_signal']}/{row['groups']} groups with signal)")
        row["seconds"] = time.perf_counter() - started
        rows.append(row)
    del trainer
    return rows


def summarise(lr: float, steps: list[dict]) -> dict:
    """One row per learning rate: bytes summed over its measured steps, ratios of the sums."""
    measured = [s for s in steps if not s["no_op"]]
    row: dict = {"lr": lr, "steps": len(measured), "no_op_steps": len(steps) - len(measured), "per_step": steps}
    if not measured:
        return {**row, "change_fraction": None, "ratio_ours": None, "ratio_pulse_style": None,
                "ratio_entropy_bound": None, "bit_exact": None, "ours_vs_pulse_style": None,
                "ours_over_bound": None, "goal_vs_pulse_style_met": None, "goal_vs_bound_met": None}
    keys = ["parameters", "changed", "bytes_full_bf16", "bytes_ours", "bytes_pulse_style", "bytes_entropy_bound"]
    if all("bytes_ours_published" in s for s in measured):
        keys.append("bytes_ours_published")
    sums = {k: sum(s[k] for s in measured) for k in keys}
    ours_vs_pulse = sums["bytes_pulse_style"] / sums["bytes_ours"]
    ours_over_bound = sums["bytes_ours"] / max(sums["bytes_entropy_bound"], 1)
    return {
        **row, "change_fraction": sums["changed"] / sums["parameters"],
        "change_fraction_per_step": [s["change_fraction"] for s in measured],
        "ratio_ours": sums["bytes_full_bf16"] / sums["bytes_ours"],
        "ratio_pulse_style": sums["bytes_full_bf16"] / sums["bytes_pulse_style"],
        "ratio_entropy_bound": sums["bytes_full_bf16"] / max(sums["bytes_entropy_bound"], 1),
        "bit_exact": all(s["bit_exact"] for s in measured), **sums,
        "ours_vs_pulse_style": ours_vs_pulse, "ours_over_bound": ours_over_bound,
        "goal_vs_pulse_style_met": ours_vs_pulse >= GOAL_VS_PULSE,
        "goal_vs_bound_met": ours_over_bound <= GOAL_OVER_BOUND,
        "bits_per_change_ours": 8 * sums["bytes_ours"] / max(sums["changed"], 1),
        "bits_per_change_pulse_style": 8 * sums["bytes_pulse_style"] / max(sums["changed"], 1),
        "bits_per_change_bound": 8 * sums["bytes_entropy_bound"] / max(sums["changed"], 1),
    }


def delta_section(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, *, quick: bool,
                  max_new_tokens: int, console: Console) -> list[dict]:
    """Issue 16's delta rows, one per learning rate (quick: one lr, one step, QUICK_PROMPTS prompts). `model`
    is not modified (each trainer and the sampler work on copies)."""
    lrs, steps, prompts = ((QUICK_LR,), QUICK_STEPS, QUICK_PROMPTS) if quick else (LRS, STEPS, PROMPTS)
    sampler = Sampler(model, tokenizer, task, GROUP, max_new_tokens)
    rows = []
    for lr in lrs:
        console.print(f"GRPO at lr {lr:g}: {steps} steps of {prompts} prompts x {GROUP}, up to {max_new_tokens} "
                      f"tokens, on {task.name}...")
        started = time.perf_counter()
        row = summarise(lr, grpo_run(model, tokenizer, task, sampler, lr, steps, prompts, console))
        rows.append({**row, "prompts": prompts, "group": GROUP, "max_new_tokens": max_new_tokens,
                     "zstd_level": ZSTD_LEVEL, "task": task.name, "seconds": time.perf_counter() - started})
    return rows


def delta_table(rows: list[dict]) -> Table:
    table = Table(title="SmolLM2-135M-Instruct GRPO deltas: payload as a ratio of full bf16 (higher is better); "
                        f"goals: ours/PULSE-style >= {GOAL_VS_PULSE}, ours/bound <= {GOAL_OVER_BOUND}")
    for column in ("lr", "steps", "changed", "ours", "PULSE-style", "entropy bound", "ours vs PULSE", "ours/bound",
                   "bits/change", "exact"):
        table.add_column(column, justify="right")
    for r in rows:
        if r["ratio_ours"] is None:
            table.add_row(f"{r['lr']:g}", f"0 ({r['no_op_steps']} no-op)", *["-"] * 8)
            continue
        steps = f"{r['steps']}" + (f" ({r['no_op_steps']} no-op)" if r["no_op_steps"] else "")
        table.add_row(
            f"{r['lr']:g}", steps, f"{r['change_fraction']:.3%}", f"[bold]{r['ratio_ours']:.1f}x[/]",
            f"{r['ratio_pulse_style']:.1f}x", f"{r['ratio_entropy_bound']:.1f}x",
            f"{r['ours_vs_pulse_style']:.2f}x" + ("" if r["goal_vs_pulse_style_met"] else " (missed)"),
            f"{r['ours_over_bound']:.3f}" + ("" if r["goal_vs_bound_met"] else " (missed)"),
            f"{r['bits_per_change_ours']:.2f}", "yes" if r["bit_exact"] else "[red]NO[/]",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one lr, one step, 4 prompts")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--task", default="basic_arithmetic", help="reasoning-gym dataset")
    parser.add_argument("--max-new-tokens", type=int, help="default: 48 with --quick, else 128")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    console = make_console()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    max_new_tokens = args.max_new_tokens or (48 if args.quick else 128)
    started = time.perf_counter()
    model, tokenizer = load_policy(resolve_model(resolve_data_dir(None), Path(SMOLLM2)))
    task = ChatTemplatedTask(load_task(f"gym:{args.task}"), tokenizer)
    rows = delta_section(model, tokenizer, task, quick=args.quick, max_new_tokens=max_new_tokens, console=console)
    console.print(delta_table(rows))
    seconds = time.perf_counter() - started
    console.print(f"{seconds:.0f} s with {args.threads} thread(s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        machine = {"cpu": platform.processor() or platform.machine(), "threads": args.threads}
        args.json.write_text(json.dumps({"benchmark": "real_delta", "quick": args.quick,
                                         "model": "SmolLM2-135M-Instruct", "machine": machine, "seconds": seconds,
                                         "delta": rows}, indent=2))
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

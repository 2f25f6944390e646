"""Verification compute per accepted sample as a fraction of generation compute, at sampled fractions f (issue 17).

One lease of n = tasks x group rollouts is generated once, as a worker does (transformers backend, the seeded
sampler, temperature 1, EOS ignored so every completion is exactly --max-new-tokens long, one torch thread).
Then, for each f, each of the q first-round committee members verifies its own sample of m = ceil(f x n)
rollouts (`rollnet.node.sampling.sampled_indices`: its signature over a fixed round seed) with
`verify_rollouts`, exactly as the validator daemon calls it. Per lease:

    verification fraction(f) = (sum over the q members of their verify seconds) / generation seconds,

which is also the ratio per accepted sample (both sides cover the same n samples). The f = 1 row is the
baseline: every member verifies the whole batch, as before sampling. All rows come from one run, on the same
rollouts, one after another; each time is the median of --repeats. Every verdict must accept (honest rollouts).

A second table checks the sizing rule's catch chance against the sampler itself: over --trials simulated
leases of n rollouts with k of them faked at random positions, the share in which at least one of the q
members' samples (their real signatures, `sampled_indices`, at the default f = 1/32 and at 1/8) holds a fake,
beside the rule's 1 - (1 - k/n)^(m x q) and the exact chance for samples drawn without replacement,
1 - (C(n - k, m) / C(n, m))^q.

Usage: python bench/sampled_verify.py [--model embedded|smollm2] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import torch
from eth_account import Account
from rich.table import Table
from rollnet.node.cli.context import make_console
from rollnet.node.config import resolve_data_dir
from rollnet.node.model.loading import load_policy, resolve_model
from rollnet.node.model.pinned import EMBEDDED_TASK
from rollnet.node.rollout.generate import generate
from rollnet.node.rollout.verify import verify_rollouts
from rollnet.node.sampling import catch_probability, sampled_indices, samples_checked
from rollnet.node.tasks import load_task
from rollnet.node.tasks.templated import ChatTemplatedTask

ROUND_SEED = bytes.fromhex("c0" * 20)
LEASE_ID = 1
JOB = "0x" + "70" * 20
FRACTIONS = ["1/32", "1/16", "1/8", "1/4", "1"]
SMOLLM2_TASK = "gym:gcd:last-number"


def median_seconds(work: callable, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def catch_rows(n: int, committee: int, trials: int) -> list[dict]:
    """Simulated catch rates of partial cheats against the sizing rule's formula and the exact chance."""
    members = [Account.from_key("0x" + f"{i + 101:064x}") for i in range(committee)]
    rng = random.Random(17)
    rows = []
    for fraction in ("1/32", "1/8"):
        m = samples_checked(Decimal(Fraction(fraction).numerator) / Decimal(Fraction(fraction).denominator), n)
        for faked in (1, n // 8, n // 2):
            caught = 0
            for lease_id in range(trials):
                fakes = set(rng.sample(range(n), faked))
                seed = rng.randbytes(20)
                caught += any(fakes & set(sampled_indices(seed, JOB, lease_id, member, n, m)) for member in members)
            exact = 1 - (math.comb(n - faked, m) / math.comb(n, m)) ** committee
            rows.append({"f": fraction, "samples_per_member": m, "faked": faked, "trials": trials,
                         "caught_rate": caught / trials, "rule": catch_probability(faked / n, m, committee),
                         "exact": exact})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="embedded or smollm2")
    parser.add_argument("--quick", action="store_true", help="embedded model, 1 repeat")
    parser.add_argument("--json", type=Path, default=Path("bench/results/sampled_verify.json"))
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--committee", type=int, default=3, help="q: first-round members (examples/job.toml: 3)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="completion length (default 32; embedded 6)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=None, help="simulated leases per catch row (default 2000; "
                        "quick 200)")
    args = parser.parse_args()
    model_name = "embedded" if args.quick else args.model
    repeats = 1 if args.quick else args.repeats
    torch.set_num_threads(1)
    console = make_console()
    folder = resolve_model(resolve_data_dir(None), None if model_name == "embedded" else Path(model_name))
    model, tokenizer = load_policy(folder)
    task = load_task(EMBEDDED_TASK if model_name == "embedded" else SMOLLM2_TASK)
    if model_name != "embedded":
        task = ChatTemplatedTask(task, tokenizer)
    tokens = args.max_new_tokens or (6 if model_name == "embedded" else 32)
    instances = [task.instance(seed) for seed in range(1000, 1000 + args.tasks)]
    n = args.tasks * args.group

    def make() -> list:
        return generate(model, tokenizer, instances, args.group, max_new_tokens=tokens, ignore_eos=True)

    rollouts = make()
    generation_s = median_seconds(make, repeats)
    members = [Account.from_key("0x" + f"{i + 1:064x}") for i in range(args.committee)]
    rows = []
    for text in FRACTIONS:
        fraction = Fraction(text)
        m = samples_checked(Decimal(fraction.numerator) / Decimal(fraction.denominator), n)
        member_seconds = []
        for member in members:
            chosen = [rollouts[i] for i in sampled_indices(ROUND_SEED, JOB, LEASE_ID, member, n, m)]

            def verify(chosen: list = chosen) -> None:
                verdicts = verify_rollouts(model, tokenizer, task, chosen, max_new_tokens=tokens, stop_on_eos=False)
                if not all(v.ok for v in verdicts):
                    raise SystemExit(f"an honest rollout was flagged: {[v.reason for v in verdicts if not v.ok]}")

            member_seconds.append(median_seconds(verify, repeats))
        total = sum(member_seconds)
        rows.append({"f": text, "samples_per_member": m,
                     "verify_s_per_member": round(statistics.mean(member_seconds), 4),
                     "verify_s_committee": round(total, 4), "fraction_of_generation": round(total / generation_s, 4)})
    baseline = rows[-1]["verify_s_committee"]
    for row in rows:
        row["vs_full"] = round(row["verify_s_committee"] / baseline, 4)

    table = Table(title=f"verification per accepted sample / generation: {model_name}, lease {args.tasks} x "
                        f"{args.group}, {tokens} tokens, committee {args.committee}; generation {generation_s:.2f} s")
    for column in ("f", "checked per member", "verify s (committee)", "verify / generation", "vs f = 1"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(row["f"], str(row["samples_per_member"]), f"{row['verify_s_committee']:.3f}",
                      f"{row['fraction_of_generation']:.1%}", f"{row['vs_full']:.3f}")
    console.print(table)
    catches = catch_rows(n, args.committee, args.trials or (200 if args.quick else 2000))
    caught = Table(title=f"caught per lease: simulated against the sizing rule ({n} rollouts, {args.committee} "
                         "members, each its own signature-drawn sample)")
    for column in ("f", "checked per member", "faked", "simulated", "rule 1-(1-c)^(mq)", "exact"):
        caught.add_column(column, justify="right")
    for row in catches:
        caught.add_row(row["f"], str(row["samples_per_member"]), f"{row['faked']} of {n}",
                       f"{row['caught_rate']:.3f}", f"{row['rule']:.3f}", f"{row['exact']:.3f}")
    console.print(caught)
    report = {"benchmark": "sampled_verify", "model": model_name, "quick": args.quick, "tasks": args.tasks,
              "group": args.group, "max_new_tokens": tokens, "committee": args.committee, "repeats": repeats,
              "generation_s": round(generation_s, 4), "rows": rows, "cores": os.cpu_count(),
              "verification_fraction": {model_name: {row["f"]: row["fraction_of_generation"] for row in rows}},
              "catch": catches}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

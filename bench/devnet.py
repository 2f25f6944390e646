"""The whole market, three times, side by side: workers with tight back-pressure (at most one batch waiting
for validators), workers with the adaptive in-flight window (the default since issue 17: as many leases as keep
generation busy, halved when batches arrive at the staleness budget's edge), and workers that submit as fast as
they can.

Each arm is a complete `rollnet devnet` run (anvil, trainer, 3 workers, 2 validators as processes; same
steps, lr and staleness budget) and writes its own run directory with the full report. On two shared cores
the validators are the bottleneck: without back-pressure batches queue at the validators and age there,
so the trainer sees them at the staleness budget. The table compares realised staleness, held-out
accuracy, wall time, gas per accepted sample and the samples paid for (accepted) that training never took
(still in the buffer, or dropped as too stale, when the run ended).

Usage: python bench/devnet.py [--quick] [--json PATH] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from rich.table import Table
from rollnet.node.cli.context import make_console

from rollnet.devnet import DevnetConfig, run_devnet

ARMS = {"back-pressure (1 undecided batch per worker)": 1,
        "adaptive in-flight window (the default)": None, "no back-pressure": 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description="Devnet with and without worker back-pressure.")
    parser.add_argument("--quick", action="store_true", help="10 steps per arm instead of 40")
    parser.add_argument("--json", type=Path, default=Path("bench/results/devnet.json"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/devnet-runs"))
    args = parser.parse_args()
    console = make_console()
    steps = 10 if args.quick else 40
    rows = {}
    for index, (arm, max_undecided) in enumerate(ARMS.items()):
        out = args.out / f"arm-{index}"
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        report = run_devnet(DevnetConfig(out=out, steps=steps, max_undecided=max_undecided, held_out_every=5),
                            console, live=False)
        accepted = report["money"]["decided"].get("accepted", 0) * 64
        consumed = report["samples"]["consumed_by_training"]
        rows[arm] = {
            "max_undecided": max_undecided, "seconds": time.perf_counter() - started,
            "mean_g": report["staleness"]["mean_g"], "max_g": report["staleness"]["max_g"],
            "held_out_base": report["held_out"]["base"], "held_out_final": report["held_out"]["final"],
            "held_out_by_version": report["held_out"]["by_version"],
            "gas_per_accepted_sample": report["gas"]["gas_per_accepted_sample"],
            "samples_accepted": accepted, "samples_consumed": consumed,
            "samples_paid_not_trained": max(0, accepted - consumed),
            "predicted_g_pipeline": report["prediction"]["g_pipeline"], "run_dir": str(out),
        }
    table = Table(title=f"devnet, {steps} steps per arm (3 workers, 2 validators, 2 shared cores)")
    for column in ("arm", "mean g", "max g", "held-out base → final", "s", "gas / accepted sample",
                   "accepted, never trained"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for arm, row in rows.items():
        table.add_row(arm, f"{row['mean_g']:.2f}", str(row["max_g"]),
                      f"{row['held_out_base']:.3f} → {row['held_out_final']:.3f}", f"{row['seconds']:.0f}",
                      f"{row['gas_per_accepted_sample']:,.0f}", f"{row['samples_paid_not_trained']:,}")
    console.print(table)
    base, free = rows.values()
    console.print(f"staleness without back-pressure is {free['mean_g'] / max(base['mean_g'], 1e-9):.1f}x the "
                  "back-pressured run's")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"steps": steps, "arms": rows}, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

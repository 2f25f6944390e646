"""Throughput of asynchronous against synchronous GRPO when generation and training are separate processes.

A generator process samples rollouts (seeded sampler and TOPLOC proofs, as a worker does) and a trainer
process trains on them and sends each new bf16 policy back (as safetensors bytes); one torch thread each,
so the two share this machine's two cores. Synchronous: the generator waits for version v+1 before
sampling again (staleness 0).
Asynchronous: it may run up to `--max-staleness` versions ahead of what it has received, so generation and
training overlap. Both arms train the same number of steps on the same batch shape; the table reports
trained samples per second and the realised staleness.

Usage: python bench/async_throughput.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rollnet.trainer.pipeline import GROUP, PROMPTS, run_arm


def main() -> None:
    parser = argparse.ArgumentParser(description="Samples/s of async vs sync GRPO, generation and training apart.")
    parser.add_argument("--quick", action="store_true", help="15 steps per arm instead of 40")
    parser.add_argument("--max-staleness", type=int, default=4)
    parser.add_argument("--json", type=Path, default=Path("bench/results/async_throughput.json"))
    args = parser.parse_args()
    from rich.table import Table
    from rollnet.node.cli.context import make_console
    from rollnet.node.config import resolve_data_dir
    from rollnet.node.model.builder import build_default_model

    console = make_console()
    folder = str(build_default_model(resolve_data_dir(None) / "models"))
    steps = 15 if args.quick else 40
    arms = []
    for name, ahead in (("synchronous", 0), (f"asynchronous (up to {args.max_staleness} ahead)", args.max_staleness)):
        result = run_arm(folder, ahead, steps)
        result.update(name=name, max_staleness=ahead, steps=steps,
                      samples_per_s=result["samples_trained_on"] / result["seconds"])
        arms.append(result)
        console.print(f"{name}: {result['samples_per_s']:.0f} samples/s")
    ratio = arms[1]["samples_per_s"] / arms[0]["samples_per_s"]
    table = Table(title=f"trained samples/s, generation and training in separate processes ({steps} steps, "
                        f"{PROMPTS}x{GROUP} rollouts per step, 1 thread each)")
    for column in ("arm", "seconds", "samples/s", "trainer busy", "realised g"):
        table.add_column(column, justify="right")
    for arm in arms:
        table.add_row(arm["name"], f"{arm['seconds']:.1f}", f"{arm['samples_per_s']:.0f}",
                      f"{arm['train_busy_s'] / arm['seconds']:.0%}",
                      ", ".join(f"{g}:{n}" for g, n in arm["staleness"].items()))
    console.print(table)
    console.print(f"asynchronous / synchronous: {ratio:.2f}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "async_throughput", "quick": args.quick, "arms": arms,
                                     "speedup": ratio}, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

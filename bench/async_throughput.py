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
import multiprocessing
import queue
import time
from pathlib import Path

PROMPTS, GROUP = 32, 8


def generator(folder: str, max_ahead: int, batches: int, rollouts_out: multiprocessing.Queue,
              weights_in: multiprocessing.Queue) -> None:
    import safetensors.torch
    import torch
    from rollnet.node.model.loading import load_policy
    from rollnet.node.rollout.generate import generate
    from rollnet.node.tasks import load_task

    torch.set_num_threads(1)
    model, tokenizer = load_policy(Path(folder))
    task = load_task("addition-2digit")
    version, seed = 0, 0

    def load(message: tuple) -> int:
        new_version, payload = message
        weights = safetensors.torch.load(payload)
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                tensor.copy_(weights[name])
        return new_version

    for sent in range(batches):
        while True:  # take every policy that has arrived; block only when too far ahead
            try:
                version = load(weights_in.get(block=sent - version > max_ahead))
            except queue.Empty:
                break
        rollouts = generate(model, tokenizer, task.examples(range(seed, seed + PROMPTS)), GROUP, max_new_tokens=6,
                            policy_version=version)
        seed += PROMPTS
        rollouts_out.put(rollouts)


def trainer(folder: str, max_staleness: int, steps: int, rollouts_in: multiprocessing.Queue,
            weights_out: multiprocessing.Queue, results: multiprocessing.Queue) -> None:
    import safetensors.torch
    import torch
    from rollnet.node.model.loading import load_policy
    from rollnet.node.tasks import load_task
    from rollnet.trainer.buffer import RolloutBuffer
    from rollnet.trainer.config import GRPOConfig
    from rollnet.trainer.trainer import Trainer, bf16_policy

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer = load_policy(Path(folder))
    config = GRPOConfig.make(max_staleness=max_staleness, prompts_per_step=PROMPTS, group_size=GROUP)
    grpo = Trainer(model, tokenizer, load_task("addition-2digit"), config)
    buffer = RolloutBuffer(GROUP, max_staleness, model.config.vocab_size)
    trained, started, busy = 0, None, 0.0
    while grpo.version < steps:
        buffer.admit_all(rollouts_in.get())
        if started is None:
            started = time.perf_counter()  # both arms: clock from the first batch's arrival
        if buffer.ready_groups < PROMPTS:
            continue
        began = time.perf_counter()
        report = grpo.train_on(buffer.take(PROMPTS))
        busy += time.perf_counter() - began
        trained += report.samples
        buffer.advance(grpo.version)
        # The policy crosses the process boundary as bytes (bf16 safetensors), as it would a network.
        weights_out.put((grpo.version, safetensors.torch.save(bf16_policy(grpo.model))))
    counts = buffer.counts
    results.put({"seconds": time.perf_counter() - started, "trained_samples": trained,
                 "samples_trained_on": sum(counts.staleness.values()), "train_busy_s": busy,
                 "staleness": dict(sorted(counts.staleness.items())), "too_stale": counts.too_stale})


def run_arm(folder: str, max_ahead: int, steps: int) -> dict:
    context = multiprocessing.get_context("spawn")
    rollouts, weights, results = context.Queue(), context.Queue(), context.Queue()
    batches = steps + max_ahead + 1
    processes = [
        context.Process(target=generator, args=(folder, max_ahead, batches, rollouts, weights)),
        context.Process(target=trainer, args=(folder, max(max_ahead, 0), steps, rollouts, weights, results)),
    ]
    for process in processes:
        process.start()
    result = results.get(timeout=1800)
    processes[1].join(timeout=60)
    processes[0].terminate()  # the generator may be waiting for a version that will never come
    processes[0].join(timeout=10)
    return result


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

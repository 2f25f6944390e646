"""Generation throughput: our seeded, proof-less sampler against plain `model.generate` on the same model,
batch sizes and lengths (both sampling, both ignoring EOS so every sequence makes the same tokens).

Usage: python bench/rollout.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from rollnet.node.cli.context import make_console
from rollnet.node.config import resolve_data_dir
from rollnet.node.model.builder import build_default_model
from rollnet.node.rollout.generate import generate
from rollnet.node.tasks import load_task
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

TASK = load_task("addition-2digit")


def paired_tokens_per_second(ours, theirs, tokens: int, repeats: int) -> tuple[float, float]:  # noqa: ANN001
    """Tokens/s of two zero-argument callables, run alternately (so machine noise hits both alike), each
    from the median of its runs after one warm-up."""
    ours(), theirs()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for run, spent in ((ours, times[0]), (theirs, times[1])):
            started = time.perf_counter()
            run()
            spent.append(time.perf_counter() - started)
    return tokens / statistics.median(times[0]), tokens / statistics.median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(description="Our generation loop against model.generate.")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=Path("bench/results/rollout.json"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    folder = build_default_model(resolve_data_dir(None) / "models")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    new_tokens = 32 if args.quick else 64
    repeats = 3 if args.quick else 9
    rows = []
    for batch in (1, 8, 64) if args.quick else (1, 8, 32, 64):
        instances = TASK.examples(range(batch))
        ids = torch.tensor([tokenizer.encode(i.prompt) for i in instances])

        def ours(instances: list = instances) -> None:
            generate(model, tokenizer, instances, 1, max_new_tokens=new_tokens, prove=False, ignore_eos=True)

        def theirs(ids: torch.Tensor = ids) -> None:
            with torch.no_grad():
                model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id, top_k=0, top_p=1.0)

        ours_tps, theirs_tps = paired_tokens_per_second(ours, theirs, batch * new_tokens, repeats)
        rows.append({"batch": batch, "new_tokens": new_tokens, "ours_tokens_per_s": ours_tps,
                     "generate_tokens_per_s": theirs_tps, "ratio": ours_tps / theirs_tps})
    from rich.table import Table

    table = Table(title=f"generated tokens/s, {new_tokens} new tokens per sequence, default model, 2 threads")
    for column in ("batch", "ours (seeded Gumbel-max)", "model.generate (sampling)", "ours / generate"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row["batch"]), f"{row['ours_tokens_per_s']:,.0f}", f"{row['generate_tokens_per_s']:,.0f}",
                      f"{row['ratio']:.2f}x")
    console = make_console()
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "rollout", "quick": args.quick, "rows": rows}, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

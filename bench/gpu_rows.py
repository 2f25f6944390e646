"""Issue 16's GPU rows: generation, proofs and verification of a Qwen2.5-0.5B-shaped model in bf16 on CUDA.

It runs where only torch and transformers are installed (bench/gpu.sh): of rollnet it imports just `toploc` and
`sampler`, copied beside this file, which need nothing but numpy and torch. The model is a random initialisation
(seed 0) of Qwen2.5-0.5B's shape, its config written out below, so nothing is downloaded.

Invariant: rollouts are made as rollnet's transformers backend makes them (one prefill, then KV-cache decoding;
each token the seeded Gumbel-max sampler's argmax of logits / T; the final norm's outputs at the positions that
produced the tokens, proved with `toploc.prove_many`), and checked as its validator checks them (one prefill over
prompt + completion on the same device; sampler margins within 1e-3, TOPLOC statistics, log-prob error against
1e-2), so an honest rollout that fails here would fail a same-platform GPU validator too. Every completion has
exactly `new_tokens` tokens (EOS ignored: a random model has no meaningful stop), so a batch needs no padding.
Timings: `generate_s` is the whole generate call including the sampler's noise and the proofs; `sampler_s` and
`proof_s` are the parts inside it; `verify_s` is the whole check of the batch (prefill, noise, margins, TOPLOC,
log-probs); `verify_speed_over_generation` is generate_s / verify_s. Cross-platform: the rollouts of the
`--cross-batches` sizes are checked again by the same weights on `--cross-device` (default: the CPU, in fp32), a
GPU worker against a CPU validator, and reported apart, with the largest statistics that tolerance must cover.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import sampler
import toploc
import torch
import transformers
from transformers import Qwen2Config, Qwen2ForCausalLM

# transformers 5.20 renamed `past_key_values` to `cache` (the same switch as rollnet's generate module).
CACHE_ARGUMENT = ("cache" if tuple(int(p) for p in transformers.__version__.split(".")[:2]) >= (5, 20)
                  else "past_key_values")
SAMPLING_TOLERANCE = 1e-3  # verify.py's default
LOGPROB_TOLERANCE = 1e-2  # verify.LOGPROB_TOLERANCE
# verify.CPU_THRESHOLDS: the tight same-platform thresholds rollnet's validator uses.
CPU_THRESHOLDS = toploc.Thresholds(max_exponent_mismatches=2, max_mean_mantissa_diff=0.03,
                                   max_median_mantissa_diff=1.0)

SHAPES = {
    # Qwen2.5-0.5B(-Instruct)'s config.json, by hand.
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         hidden_act="silu", use_sliding_window=False),
    # For a smoke run on a CPU.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10_000.0, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False),
}


class NormCapture:
    """The final norm's output of the last forward pass."""

    def __init__(self, model: Qwen2ForCausalLM):
        self.last: torch.Tensor | None = None
        self._handle = model.model.norm.register_forward_hook(self._keep)

    def _keep(self, _module: object, _inputs: object, output: torch.Tensor) -> None:
        self.last = output.detach()

    def close(self) -> None:
        self._handle.remove()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(shape: str, dtype: torch.dtype, device: torch.device) -> Qwen2ForCausalLM:
    config = Qwen2Config(**SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(dtype).eval()


@torch.no_grad()
def generate(model: Qwen2ForCausalLM, prompts: torch.Tensor, seeds: list[int], samples: list[int], new_tokens: int,
             temperature: float) -> dict:
    """Seeded completions with KV cache, their log-probs, the committed states and proofs, and the timings."""
    device = prompts.device
    batch = prompts.shape[0]
    capture = NormCapture(model)
    sampler_s = 0.0
    synchronize(device)
    start = time.perf_counter()
    try:
        output = model(input_ids=prompts, use_cache=True)
        states = [capture.last[:, -1]]
        logits, cache = output.logits[:, -1], getattr(output, CACHE_ARGUMENT)
        noise = sampler.BatchNoise(seeds, samples, logits.shape[-1])
        tokens = torch.empty(batch, new_tokens, dtype=torch.long, device=device)
        logprobs = torch.empty(batch, new_tokens, dtype=torch.float32, device=device)
        for step in range(new_tokens):
            drawn = time.perf_counter()
            step_noise = noise.next().to(device, non_blocking=True)
            sampler_s += time.perf_counter() - drawn
            scaled = logits.float() / temperature
            chosen = torch.argmax(scaled + step_noise, dim=-1)
            logprobs[:, step] = scaled.gather(-1, chosen[:, None])[:, 0] - torch.logsumexp(scaled, -1)
            tokens[:, step] = chosen
            if step + 1 == new_tokens:
                break
            output = model(input_ids=chosen[:, None], use_cache=True, **{CACHE_ARGUMENT: cache})
            states.append(capture.last[:, -1])
            logits, cache = output.logits[:, -1], getattr(output, CACHE_ARGUMENT)
        hidden = torch.stack(states, dim=1)
        synchronize(device)
        proving = time.perf_counter()
        proofs = toploc.prove_many([hidden[row] for row in range(batch)])
        proof_s = time.perf_counter() - proving
        generate_s = time.perf_counter() - start
    finally:
        capture.close()
    return {"tokens": tokens.cpu(), "logprobs": logprobs.cpu(), "proofs": proofs, "generate_s": generate_s,
            "sampler_s": sampler_s, "proof_s": proof_s}


@torch.no_grad()
def verify(model: Qwen2ForCausalLM, prompts: torch.Tensor, made: dict, seeds: list[int], samples: list[int],
           temperature: float) -> dict:
    """The validator's check of one generated batch on the same device: per-rollout flags and statistics."""
    device = prompts.device
    tokens = made["tokens"].to(device)
    new_tokens = tokens.shape[1]
    capture = NormCapture(model)
    synchronize(device)
    start = time.perf_counter()
    try:
        ids = torch.cat([prompts, tokens], dim=1)
        logits = model(input_ids=ids, logits_to_keep=new_tokens + 1).logits[:, :new_tokens]
        hidden = capture.last[:, prompts.shape[1] - 1: prompts.shape[1] - 1 + new_tokens]
        synchronize(device)
        prefill_s = time.perf_counter() - start
        rows = []
        for row in range(ids.shape[0]):
            noise = sampler.noise_for_positions(seeds[row], samples[row], new_tokens, logits.shape[-1]).to(device)
            margins = sampler.choice_margin(logits[row], noise, temperature, tokens[row])
            scaled = logits[row].float() / temperature
            recomputed = scaled.gather(-1, tokens[row][:, None])[:, 0] - torch.logsumexp(scaled, -1)
            error = (made["logprobs"][row].double() - recomputed.double().cpu()).abs()
            checks = [toploc.check_chunk(proof, hidden[row, i * toploc.CHUNK_TOKENS:(i + 1) * toploc.CHUNK_TOKENS], i)
                      for i, proof in enumerate(made["proofs"][row])]
            rows.append({
                "max_margin": float(margins.max()),
                "sampler_flag": bool((margins > SAMPLING_TOLERANCE).any()),
                "max_logprob_error": float(error.max()),
                "logprob_flag": bool((error > LOGPROB_TOLERANCE).any()),
                "public_flag": not toploc.verify(made["proofs"][row], hidden[row]).ok,
                "cpu_thresholds_flag": not toploc.verify(made["proofs"][row], hidden[row], CPU_THRESHOLDS).ok,
                "chunks": len(checks),
                "max_exponent_mismatches": max(c.exponent_mismatches for c in checks),
                "max_mean_mantissa_diff": max(c.mean_mantissa_diff for c in checks),
                "max_median_mantissa_diff": max(c.median_mantissa_diff for c in checks),
            })
        synchronize(device)
        verify_s = time.perf_counter() - start
    finally:
        capture.close()
    return {"rows": rows, "prefill_s": prefill_s, "verify_s": verify_s}


def flagged(row: dict, toploc_flag: str) -> bool:
    """Whether a validator rejects the rollout: the sampler, the log-prob check, or TOPLOC at the given thresholds."""
    return row[toploc_flag] or row["sampler_flag"] or row["logprob_flag"]


def honest_summary(checked: list[dict]) -> dict:
    rollouts = [row for batch in checked for row in batch["rows"]]
    return {
        "rollouts": len(rollouts),
        "chunks": sum(r["chunks"] for r in rollouts),
        "min_chunks": min(r["chunks"] for r in rollouts),
        "flagged_public_thresholds": sum(r["public_flag"] for r in rollouts),
        "flagged_cpu_thresholds": sum(r["cpu_thresholds_flag"] for r in rollouts),
        "flagged_sampler": sum(r["sampler_flag"] for r in rollouts),
        "flagged_logprob": sum(r["logprob_flag"] for r in rollouts),
        "flagged_with_public_thresholds": sum(flagged(r, "public_flag") for r in rollouts),
        "flagged_with_tight_thresholds": sum(flagged(r, "cpu_thresholds_flag") for r in rollouts),
        "max_exponent_mismatches": max(r["max_exponent_mismatches"] for r in rollouts),
        "max_mean_mantissa_diff": max(r["max_mean_mantissa_diff"] for r in rollouts),
        "max_median_mantissa_diff": max(r["max_median_mantissa_diff"] for r in rollouts),
        "max_logprob_error": max(r["max_logprob_error"] for r in rollouts),
        "max_margin": max(r["max_margin"] for r in rollouts),
    }


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.set_grad_enabled(False)
    built = time.perf_counter()
    model = build_model(args.shape, dtype, device)
    build_s = time.perf_counter() - built
    vocab = model.config.vocab_size
    parameters = sum(p.numel() for p in model.parameters())
    prompt_rng = np.random.default_rng(1)
    seed = 60_000

    def batch_of(size: int) -> tuple[torch.Tensor, list[int], list[int]]:
        nonlocal seed
        prompts = torch.from_numpy(prompt_rng.integers(0, vocab, (size, args.prompt_tokens))).to(device)
        seeds = [seed + row for row in range(size)]
        seed += size
        return prompts, seeds, [0] * size

    warm = batch_of(2)
    generate(model, warm[0], warm[1], warm[2], 4, args.temperature)  # kernels and allocator, not timed
    rows, checked, kept = [], [], []
    for size in args.batches:
        for repeat in range(args.repeats):
            prompts, seeds, samples = batch_of(size)
            made = generate(model, prompts, seeds, samples, args.new_tokens, args.temperature)
            result = verify(model, prompts, made, seeds, samples, args.temperature)
            checked.append(result)
            if size in args.cross_batches:
                kept.append((prompts, made, seeds, samples))
            produced = size * args.new_tokens
            rows.append({
                "batch": size, "repeat": repeat, "new_tokens": args.new_tokens,
                "generate_s": made["generate_s"], "tokens_per_s": produced / made["generate_s"],
                "sampler_s": made["sampler_s"], "proof_s": made["proof_s"],
                "proof_fraction": made["proof_s"] / made["generate_s"],
                "sampler_fraction": made["sampler_s"] / made["generate_s"],
                "verify_s": result["verify_s"], "prefill_s": result["prefill_s"],
                "verify_speed_over_generation": made["generate_s"] / result["verify_s"],
                "flagged_with_public_thresholds": sum(flagged(r, "public_flag") for r in result["rows"]),
                "flagged_with_tight_thresholds": sum(flagged(r, "cpu_thresholds_flag") for r in result["rows"]),
            })
            print(f"batch {size:3d} #{repeat}: {rows[-1]['tokens_per_s']:9.1f} tok/s, generate "
                  f"{made['generate_s']:.2f} s (sampler {made['sampler_s']:.2f}, proofs {made['proof_s']:.2f}), "
                  f"verify {result['verify_s']:.2f} s (prefill {result['prefill_s']:.3f}), "
                  f"flagged {rows[-1]['flagged_with_public_thresholds']}/{size} (public), "
                  f"{rows[-1]['flagged_with_tight_thresholds']}/{size} (tight)", flush=True)
    cross = None
    if kept:
        print(f"cross-platform: {sum(len(k[2]) for k in kept)} of these rollouts checked on {args.cross_device} in "
              f"{args.cross_dtype}...", flush=True)
        # The generating model itself, moved: the same bf16 weights (exact in fp32).
        validator_model = model.to(torch.device(args.cross_device)).to(getattr(torch, args.cross_dtype))
        cross_checked = [verify(validator_model, prompts.to(args.cross_device), made, seeds, samples,
                                args.temperature) for prompts, made, seeds, samples in kept]
        cross = {"device": args.cross_device, "dtype": args.cross_dtype, **honest_summary(cross_checked)}
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0],
        "shape": args.shape, "dtype": args.dtype, "parameters": parameters,
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "temperature": args.temperature,
        "model_build_s": build_s, "rows": rows, "honest": honest_summary(checked), "cross_platform": cross,
    }


def describe_honest(label: str, honest: dict) -> str:
    return (f"{label}: {honest['rollouts']} rollouts, {honest['chunks']} chunks; rejected with public TOPLOC "
            f"thresholds {honest['flagged_with_public_thresholds']}, with the tight same-platform ones "
            f"{honest['flagged_with_tight_thresholds']} (TOPLOC public {honest['flagged_public_thresholds']}, tight "
            f"{honest['flagged_cpu_thresholds']}, sampler {honest['flagged_sampler']}, log-prob "
            f"{honest['flagged_logprob']}); largest statistics: exponent mismatches "
            f"{honest['max_exponent_mismatches']}, mean mantissa {honest['max_mean_mantissa_diff']:.3f}, median "
            f"{honest['max_median_mantissa_diff']:.1f}, log-prob error {honest['max_logprob_error']:.2e}, "
            f"sampler margin {honest['max_margin']:.2e}")


def print_table(result: dict) -> None:
    print(f"\n{result['device']} | torch {result['torch']} | transformers {result['transformers']} | "
          f"{result['shape']} {result['dtype']} ({result['parameters'] / 1e6:.0f}M) | "
          f"{result['prompt_tokens']} prompt + {result['new_tokens']} new tokens")
    print("| batch | tokens/s | generate s | sampler share | proof share | verify s | verify speed / generation |")
    print("|---|---|---|---|---|---|---|")
    for row in result["rows"]:
        print(f"| {row['batch']} | {row['tokens_per_s']:.1f} | {row['generate_s']:.2f} | {row['sampler_fraction']:.1%} "
              f"| {row['proof_fraction']:.1%} | {row['verify_s']:.2f} | {row['verify_speed_over_generation']:.2f}x |")
    print(describe_honest("honest, generated and checked on one device", result["honest"]))
    if result["cross_platform"]:
        cross = result["cross_platform"]
        print(describe_honest(f"honest, checked on {cross['device']} in {cross['dtype']}", cross))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--batches", type=lambda text: [int(part) for part in text.split(",")], default=[1, 8, 64])
    parser.add_argument("--repeats", type=int, default=2, help="generate-and-verify runs per batch size")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128, help="128 tokens: 4 TOPLOC chunks")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--cross-batches", type=lambda text: [int(p) for p in text.split(",") if p], default=[1, 8],
                        help="the rollouts of these batch sizes are also checked on --cross-device ('' for none)")
    parser.add_argument("--cross-device", default="cpu", help="a validator on another platform (default: this CPU)")
    parser.add_argument("--cross-dtype", choices=["bfloat16", "float16", "float32"], default="float32")
    parser.add_argument("--json", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here: run with --device cpu --shape tiny for a smoke run", file=sys.stderr)
        return 2
    result = run(args)
    print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

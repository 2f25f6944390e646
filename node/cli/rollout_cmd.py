"""`rollnet rollout generate|verify`: make seeded, proven rollouts with a policy, and check them as a
validator does.

Invariant: both commands load the policy the same way (`--model PATH`, or the embedded default built on
demand); `generate` writes a rollout batch file that `verify` reads back; `verify` exits 1 when any
rollout fails and names each failure's reason and position.
"""

from __future__ import annotations

from pathlib import Path

import torch
import typer
from rich.markup import escape
from rich.table import Table
from rollnet.node.cli import params
from rollnet.node.cli.context import console, get_context
from rollnet.node.errors import ConfigError
from rollnet.node.model.loading import load_policy, resolve_model
from rollnet.node.rollout.backend import load_backend
from rollnet.node.rollout.backend_names import BACKENDS
from rollnet.node.rollout.verify import verify_rollouts
from rollnet.node.rollout.wire import RolloutBatch
from rollnet.node.tasks import load_task

app = typer.Typer(help="Generate and verify rollouts locally.", no_args_is_help=True)

ModelOption = typer.Option(None, "--model", help="local Hugging Face model folder or preset (smollm2); default: the "
                           "embedded model",
                           **params.INPUT_DIR)
TaskOption = typer.Option("addition-2digit", "--task",
                          help="addition-2digit, gym:<dataset>[:last-number|answer-tag] or a .jsonl file")


@app.command("generate")
def generate_command(
    ctx: typer.Context,
    out: Path = typer.Option(..., "--out", help="rollout batch file to write (JSON)", **params.OUTPUT_FILE),
    task: str = TaskOption,
    seed: int = typer.Option(0, "--seed", min=0, help="first task seed"),
    count: int = typer.Option(4, "--count", min=1, help="number of tasks (seeds SEED..SEED+COUNT-1)"),
    group_size: int = typer.Option(8, "--group-size", min=1),
    max_new_tokens: int = typer.Option(16, "--max-new-tokens", min=1),
    temperature: float = typer.Option(1.0, "--temperature", min=1e-3),
    model: Path = ModelOption,
    backend: str = typer.Option("transformers", "--backend", help=f"one of {', '.join(BACKENDS)}"),
    threads: int = typer.Option(0, "--threads", min=0, help="torch threads (0: torch's default)"),
) -> None:
    """Generate GROUP_SIZE seeded completions for each of COUNT tasks, with log-probs and TOPLOC proofs."""
    task_def = load_task(task)
    if threads:
        torch.set_num_threads(threads)
    folder = resolve_model(get_context(ctx).data_dir, model)
    engine = load_backend(backend, folder)
    rollouts = engine.generate(task_def.examples(range(seed, seed + count)), group_size,
                               max_new_tokens=max_new_tokens, temperature=temperature, policy_version=0,
                               policy_root="")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(RolloutBatch.of(task, rollouts).to_json())
    rewards = [task_def.reward(task_def.instance(r.task_seed), r.text) for r in rollouts]
    table = Table(title=f"{len(rollouts)} rollouts from {folder.name} ({backend})")
    for column in ("seed", "sample", "tokens", "completion", "reward"):
        table.add_column(column)
    for rollout, reward in list(zip(rollouts, rewards, strict=True))[:16]:
        table.add_row(str(rollout.task_seed), str(rollout.sample), str(len(rollout.tokens)), escape(repr(rollout.text)),
                      f"{reward:.2f}")
    console.print(table)
    console.print(f"mean reward {sum(rewards) / len(rewards):.3f}; wrote {out}")


@app.command("verify")
def verify_command(
    ctx: typer.Context,
    batch_file: Path = typer.Argument(..., help="rollout batch file written by `rollnet rollout generate`",
                                      metavar="BATCH_FILE", **params.INPUT_FILE),
    model: Path = ModelOption,
    temperature: float = typer.Option(1.0, "--temperature", min=1e-3),
) -> None:
    """Check every rollout of a batch: prompt from its seed, seeded sampling, TOPLOC proofs."""
    if not batch_file.is_file():
        raise ConfigError(f"no rollout batch at {batch_file}")
    batch = RolloutBatch.from_json(batch_file.read_bytes())
    task_def = load_task(batch.task)
    policy, tokenizer = load_policy(resolve_model(get_context(ctx).data_dir, model))
    rollouts = batch.to_rollouts()
    vocab = policy.config.vocab_size
    for rollout in rollouts:
        if any(not 0 <= t < vocab for t in rollout.prompt_tokens + rollout.tokens):
            raise ConfigError(f"rollout (seed {rollout.task_seed}, sample {rollout.sample}) has token ids outside "
                              f"the model's vocabulary of {vocab}")
    verdicts = verify_rollouts(policy, tokenizer, task_def, rollouts, temperature=temperature)
    failed = [(r, v) for r, v in zip(rollouts, verdicts, strict=True) if not v.ok]
    table = Table(title=f"{len(failed)} of {len(rollouts)} rollouts rejected")
    for column in ("seed", "sample", "position", "reason"):
        table.add_column(column)
    for rollout, verdict in failed[:32]:
        table.add_row(str(rollout.task_seed), str(rollout.sample), str(verdict.position), escape(verdict.reason))
    if failed:
        console.print(table)
        raise typer.Exit(1)
    console.print(f"all {len(rollouts)} rollouts verified")

"""`rollnet model init|smollm2|identity`: build (or find in the cache) the embedded default model; print a
model folder's identity for a job spec.

Invariant: the model lives under `<data-dir>/models/<task>-<recipe hash>/` and is an ordinary Hugging Face
folder; the command prints its path, so `--model PATH` elsewhere can take either it or a real checkpoint
(`rollnet model smollm2` makes one such checkpoint from the `real` extra).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rollnet.node.cli import params
from rollnet.node.cli.context import console, get_context
from rollnet.node.model.builder import Recipe, build_default_model, is_built, load_metadata
from rollnet.node.model.loading import resolve_model
from rollnet.node.model.smollm2 import materialize_smollm2
from rollnet.node.tasks import load_task

app = typer.Typer(help="The embedded default model.", no_args_is_help=True)


@app.command()
def init(
    ctx: typer.Context,
    task: str = typer.Option("addition-2digit", "--task", help="task the warm-up trains on"),
    seed: int = typer.Option(0, "--seed"),
    force: bool = typer.Option(False, "--force", help="make it again even if cached"),
    rebuild: bool = typer.Option(False, "--rebuild", help="train the default recipe from scratch instead of "
                                 "using its shipped reference build (about two minutes on 2 quiet cores)"),
) -> None:
    """Make the default model (the shipped reference build for the default task, else a warm-up of about two
    minutes on 2 quiet cores) or reuse the cached one; print its folder."""
    load_task(task)  # an unknown task is a clear error before any work
    recipe = Recipe(task=task, seed=seed)
    cache = get_context(ctx).data_dir / "models"
    cached = is_built(cache, recipe) and not (force or rebuild)
    trains = not cached and (rebuild or recipe != Recipe())
    if trains:
        console.print(f"building the default model for {task} (about two minutes; the warm-up logs its steps)...")
    folder = build_default_model(cache, recipe, force=force or rebuild, rebuild=rebuild)
    metadata = load_metadata(folder)
    made = "cached model" if cached else "built model" if trains else "model (the default recipe's reference build)"
    console.print(f"{made}: {folder}")
    console.print(f"held-out greedy accuracy {metadata['held_out_greedy_accuracy']:.2f} after {metadata['steps']} "
                  f"warm-up steps; bf16 content root {metadata['bf16_content_root'][:16]}...")


@app.command()
def smollm2(ctx: typer.Context) -> None:
    """Convert SmolLM2-135M-Instruct (from the `real` extra's GGUF) to a model folder; print its path."""
    folder = materialize_smollm2(get_context(ctx).data_dir / "models")
    console.print(f"SmolLM2-135M-Instruct: {folder}")


@app.command()
def identity(
    ctx: typer.Context,
    folder: Path = typer.Argument(..., help="a model folder, or a preset (smollm2)", **params.INPUT_DIR),
) -> None:
    """Print the two lines a job spec needs to pin this model: model_root (its bf16 weights) and
    model_files_hash (its config, tokenizer, chat template and EOS set)."""
    from rollnet.node.cli.job_cmd import base_model_files_hash, base_model_root

    folder = resolve_model(get_context(ctx).data_dir, folder)

    console.print(f'model_root = "0x{base_model_root(folder).hex()}"', markup=False, highlight=False)
    console.print(f'model_files_hash = "0x{base_model_files_hash(folder).hex()}"', markup=False, highlight=False)

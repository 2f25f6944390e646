"""`rollnet trainer run|export`: GRPO against the in-process rollout source (the synchronous baseline, or a
simulated lag), publishing every version to a policy store; with `--job`, against the market: validated
batches from workers, each version published on chain and as a delta over libp2p.

Invariant: a run directory holds exactly one run: re-running the command with the same `--run-dir`
resumes it from its last saved version (optimiser state included) and trains up to `--steps` versions
in total; progress and the end summary print as rich tables. With `--job`, the chain, the job and its
trainer address are checked before the model is loaded, so a chain mistake costs no model load. `export`
writes one version as a Hugging Face folder (trainer.export), checked against the chain's root with `--job`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import typer
from eth_account.signers.local import LocalAccount
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rollnet.node.chain.job import JobClient
from rollnet.node.chain.registry import RegistryClient
from rollnet.node.cli import params
from rollnet.node.cli.context import CliContext, DevAccountOption, KeyOption, console, get_context
from rollnet.node.cli.job_cmd import resolve_job
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import RollnetError
from rollnet.node.events import EventLog
from rollnet.node.lease_book import book_file
from rollnet.node.ledger import SubmissionLedger
from rollnet.node.model.identity import loaded_model_files_hash
from rollnet.node.model.loading import load_policy, preset_of, resolve_model
from rollnet.node.model.pinned import EMBEDDED_TASK, PRESETS
from rollnet.node.p2p.anchors import model_files
from rollnet.node.p2p.fetch import batch_fetcher
from rollnet.node.p2p.identity import load_or_create_identity
from rollnet.node.participant import register_trainer, serve_anchors, start_participant
from rollnet.node.recipe import agree, recipe_task
from rollnet.node.tasks import load_task
from rollnet.node.tasks.base import Task
from rollnet.node.tasks.templated import ChatTemplatedTask
from rollnet.trainer.config import GRPOConfig
from rollnet.trainer.export import export_version, record_run
from rollnet.trainer.local import HELD_OUT_PROMPTS, LocalRun, held_out_accuracy
from rollnet.trainer.market import MarketTrainer
from rollnet.trainer.trainer import Trainer
from transformers import PreTrainedTokenizerBase

app = typer.Typer(help="The GRPO trainer.", no_args_is_help=True)


@app.command()
def run(
    ctx: typer.Context,
    steps: int = typer.Option(60, "--steps", min=1, help="train until this many versions exist"),
    lag: int = typer.Option(0, "--lag", min=0, help="simulated staleness: sample with the policy LAG versions old"),
    max_staleness: int = typer.Option(None, "--max-staleness", min=0, help="default 4; with --job, the recipe's"),
    epsilon: float = typer.Option(None, "--epsilon", help="GRPO clip ε (default 0.2; with --job, the recipe's)"),
    delta: float = typer.Option(None, "--delta", help="cap for negative-advantage ratios, 0 turns it off (default "
                                "4; with --job, the recipe's)"),
    lr: float = typer.Option(1e-5, "--lr"),
    optimizer_steps: int = typer.Option(4, "--optimizer-steps", min=1),
    prompts_per_step: int = typer.Option(32, "--prompts-per-step", min=1),
    group_size: int = typer.Option(None, "--group-size", min=2, help="default 8; with --job, the recipe's"),
    loss: str = typer.Option("token", "--loss", help="token or sequence normalisation"),
    max_new_tokens: int = typer.Option(None, "--max-new-tokens", min=1, help="completion limit (default: a preset's "
                                       "own, else 6; with --job, the recipe's)"),
    temperature: float = typer.Option(None, "--temperature", min=1e-3, help="sampling temperature (default 1.0; "
                                      "with --job, the recipe's)"),
    chat_template: bool = typer.Option(None, "--chat-template/--raw-prompts", help="wrap prompts in the tokenizer's "
                                       "chat template (default: when the tokenizer has one; with --job, the "
                                       "recipe's)"),
    task: str = typer.Option(None, "--task", help="default addition-2digit; with --job, the recipe's"),
    model: Path = typer.Option(None, "--model", help="local model folder or preset (smollm2); default: the job's "
                               "preset, else the embedded model",
                               **params.INPUT_DIR),
    run_dir: Path = typer.Option(None, "--run-dir", help="state and policy store (default <data-dir>/trainer)",
                                 **params.STATE_DIR),
    seed: int = typer.Option(0, "--seed"),
    threads: int = typer.Option(1, "--threads", min=1),
    job: str = typer.Option(None, "--job", help="train on a market job's validated rollouts (address or 'latest')",
                            **params.JOB),
    listen: str = typer.Option("/ip4/127.0.0.1/tcp/0", "--listen", help="libp2p listen multiaddr (with --job)",
                               **params.MULTIADDR),
    held_out_every: int = typer.Option(10, "--held-out-every", min=1, help="versions between held-out evaluations"),
    held_out_prompts: int = typer.Option(HELD_OUT_PROMPTS, "--held-out-prompts", min=1,
                                         help="held-out tasks each evaluation decodes greedily"),
    advertise: str = typer.Option(None, "--advertise", help="multiaddr peers dial (default: the listen address)",
                                  **params.MULTIADDR),
    addr_file: Path = typer.Option(None, "--addr-file", help="also write the dialable address here (with --job)",
                                   **params.OUTPUT_FILE),
    key: str = KeyOption,
    dev_account: int = DevAccountOption,
) -> None:
    """Train with GRPO on locally generated rollouts (or, with --job, on the market's validated rollouts);
    every version is signed and stored as a delta."""
    cli = get_context(ctx)
    signer = cli.signer(key, dev_account)
    market_job = connect_job(cli, signer, job) if job is not None else None  # chain mistakes before model loading
    flags = {"epsilon": epsilon, "delta": delta, "group_size": group_size, "max_staleness": max_staleness,
             "max_new_tokens": max_new_tokens, "temperature": temperature}
    private = {"lr": lr, "optimizer_steps": optimizer_steps, "prompts_per_step": prompts_per_step,
               "loss_normalisation": loss}
    if market_job is not None:
        recipe = market_job.spec().recipe
        config = GRPOConfig.for_recipe(recipe, flags, **private)
        agree("--chat-template" if chat_template else "--raw-prompts", chat_template, recipe.chat_template)
    else:
        recipe = None
        preset = preset_of(model)
        if max_new_tokens is None and preset is not None:
            flags["max_new_tokens"] = PRESETS[preset].completion_tokens
        chosen = {name: value for name, value in flags.items() if value is not None}
        if chosen.get("delta") == 0:
            chosen["delta"] = None
        config = GRPOConfig.make(**chosen, **private)
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    folder = run_dir or cli.data_dir / "trainer"
    task_name = recipe.task_name if recipe else task or EMBEDDED_TASK
    policy, tokenizer = load_policy(resolve_model(cli.data_dir, model, task_name,
                                                  recipe.model_name if recipe else None))
    task_def = recipe_task(recipe, tokenizer, task_flag=task) if recipe else local_task(task_name, tokenizer,
                                                                                       chat_template)
    store = PolicyStore(folder / "policies", trainer=signer.address)
    record_run(folder, signer.address, model_files(policy, tokenizer), loaded_model_files_hash(policy, tokenizer))
    trainer = Trainer(policy, tokenizer, task_def, config, state_dir=folder / "state", store=store, signer=signer,
                      persist_in_background=market_job is not None)  # the market's loop takes persisted steps
    if market_job is not None:
        market_run(cli, trainer, market_job, folder, listen, steps, held_out_every, advertise, addr_file,
                   held_out_prompts=held_out_prompts)
        return
    local = LocalRun(trainer, lag=lag, seed=seed + trainer.version)
    if trainer.version:
        console.print(f"resumed at version {trainer.version} from {folder}")
    base = held_out_accuracy(trainer, held_out_prompts)
    table = Table(title=f"GRPO, lag {lag}, max staleness {config.max_staleness}, ε {config.epsilon}, "
                        f"δ {config.delta or 'off'}")
    for column in ("version", "sampled reward", "loss", "clipped", "max ratio", "g", "delta bytes", "s"):
        table.add_column(column, justify="right")
    history = []
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=True, disable=not console.is_terminal)
    with progress:
        bar = progress.add_task("sampling and training", total=steps, completed=trainer.version)
        while trainer.version < steps:
            history.append(local_step(local, table, steps))
            last = history[-1]
            progress.update(bar, completed=trainer.version, description=f"version {trainer.version}: sampled reward "
                            f"{last['sampled_reward']:.3f}, {last['mean_tokens']:.0f} tokens, {last['step_s']:.0f} s")
    final = held_out_accuracy(trainer, held_out_prompts)
    console.print(table)
    counts = local.buffer.counts
    summary = {
        "task": task_def.name, "chat_template": isinstance(task_def, ChatTemplatedTask),
        "max_new_tokens": config.max_new_tokens, "temperature": config.temperature, "lr": config.lr,
        "held_out_accuracy_before": base, "held_out_accuracy_after": final, "version": trainer.version,
        "admitted": counts.admitted, "too_stale": counts.too_stale, "invalid": counts.invalid,
        "staleness_histogram": dict(sorted(counts.staleness.items())), "skipped_batches": trainer.skipped_batches,
        "groups_without_signal": trainer.groups_without_signal, "history": history,
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"held-out greedy accuracy {base:.3f} -> {final:.3f} at version {trainer.version}; "
                  f"samples admitted {counts.admitted}, too stale {counts.too_stale}, invalid {counts.invalid}; "
                  f"staleness {summary['staleness_histogram']}; wrote {folder / 'summary.json'}")


@app.command()
def export(
    ctx: typer.Context,
    version: int = typer.Option(..., "--version", min=0, help="the policy version to write out"),
    out: Path = typer.Option(..., "--out", help="a new (or empty) folder for the Hugging Face model",
                             **params.STATE_DIR),
    run_dir: Path = typer.Option(None, "--run-dir", help="the run's directory (default <data-dir>/trainer)",
                                 **params.STATE_DIR),
    job: str = typer.Option(None, "--job", help="check the version against this job's root on chain (address or "
                            "'latest')", **params.JOB),
) -> None:
    """Write a trained policy version as an ordinary Hugging Face folder (config, tokenizer, bf16 safetensors)
    whose content root is the version's (the chain's, with --job)."""
    cli = get_context(ctx)
    folder = run_dir or cli.data_dir / "trainer"
    expected = files_hash = None
    if job is not None:
        client, deployment = cli.client()
        job_client = JobClient(client, resolve_job(client, deployment, job))
        current = job_client.current_version()
        if version > current:
            raise RollnetError(f"job {job_client.address} has published versions up to {current}, not {version}")
        expected = job_client.policy_root(version)
        files_hash = job_client.spec().model_files_hash
    exported = export_version(folder, version, out, expected, files_hash)
    checked = "the chain's root" if expected is not None else "the run's recorded root"
    console.print(f"version {version} (root {exported.root.hex()[:16]}…, {checked}) written to {exported.folder}")


def local_step(local: LocalRun, table: Table, steps: int) -> dict:
    """One step of a local run, as the summary's history records it (every tenth version, and the last, also
    as a row of `table`)."""
    started = time.perf_counter()
    step = local.step()
    report = step.report
    delta_bytes = report.published.delta_bytes if report.published else None
    if report.version % 10 == 0 or report.version == steps:
        table.add_row(str(report.version), f"{step.sampled_reward:.3f}", f"{report.loss:.4f}",
                      f"{report.clipped_fraction:.1%}", f"{report.max_ratio:.2f}",
                      ",".join(map(str, sorted(set(report.staleness)))), f"{delta_bytes or 0:,}",
                      f"{report.seconds:.2f}")
    return {"version": report.version, "sampled_reward": step.sampled_reward, "mean_tokens": step.mean_tokens,
            "train_s": report.seconds, "step_s": time.perf_counter() - started, "loss": report.loss,
            "staleness": sorted(set(report.staleness)), "delta_bytes": delta_bytes}


def local_task(name: str, tokenizer: PreTrainedTokenizerBase, chat_template: bool | None) -> Task:
    """A local run's task: its prompts in the tokenizer's chat template when asked, or by default when the
    tokenizer has one (an instruct model such as SmolLM2 answers in its own format only there)."""
    task = load_task(name)
    wrap = bool(getattr(tokenizer, "chat_template", None)) if chat_template is None else chat_template
    return ChatTemplatedTask(task, tokenizer) if wrap else task


def connect_job(cli: CliContext, signer: LocalAccount, job: str) -> JobClient:
    """The market job `job` (an address or 'latest') on the deployment's chain, checked to name `signer` as
    its trainer."""
    client, deployment = cli.client(signer)
    job_client = JobClient(client, resolve_job(client, deployment, job))
    if job_client.spec().trainer.lower() != signer.address.lower():
        raise RollnetError(f"job {job_client.address} names trainer {job_client.spec().trainer}, "
                           f"not {signer.address}")
    return job_client


def market_run(cli: CliContext, trainer: Trainer, job_client: JobClient, folder: Path, listen: str, steps: int,
               held_out_every: int, advertise: str | None = None, addr_file: Path | None = None, *,
               held_out_prompts: int = HELD_OUT_PROMPTS) -> None:
    """Train on a job's validated rollouts until `steps` versions exist; resumable like the local run."""
    registry = RegistryClient(job_client.client, cli.deployment().registry)
    events = EventLog(cli.data_dir)
    if register_trainer(registry, load_or_create_identity(cli.data_dir)):
        console.print(f"registered this trainer's peer ID for {trainer.signer.address} (no stake)")
    participant = start_participant(registry, job_client, cli.data_dir, folder / "objects", listen=listen,
                                    advertise=advertise)
    node, address = participant.node, participant.address
    market: MarketTrainer | None = None
    try:
        serve_anchors(node, job_client.address, trainer.store, trainer.model, trainer.tokenizer)
        for path in filter(None, (cli.data_dir / "p2p-addr", addr_file)):
            path.write_text(address + "\n")
        market = MarketTrainer(trainer, job_client, registry, node, SubmissionLedger(folder / "trainer.sqlite"),
                               batch_fetcher(node, registry, job_client.spec()), events, held_out_every=held_out_every,
                               held_out_prompts=held_out_prompts, from_block=cli.deployment().deployed_at_block,
                               lease_book_path=book_file(folder, job_client.address, "trainer"))
        console.print(f"training job {job_client.address} from version {trainer.version} to {steps}; "
                      f"peer {address}")
        market.start_demand(steps)  # before the held-out pass: no worker claims before it hears the demand
        base = market.held_out()
        events.emit("start", version=trainer.version, held_out=base, steps=steps)
        market.run(steps)
        final = market.held_out()
        counts = market.buffer.counts
        summary = {"version": trainer.version, "held_out_accuracy_before": base, "held_out_accuracy_after": final,
                   "admitted_batches": market.counts.admitted_batches,
                   "refused_batches": market.counts.refused_batches, "samples_admitted": counts.admitted,
                   "samples_too_stale": counts.too_stale, "samples_invalid": counts.invalid,
                   "staleness_histogram": dict(sorted(counts.staleness.items()))}
        (folder / "summary.json").write_text(json.dumps(summary, indent=2))
        events.emit("done", **summary)
        console.print(f"held-out greedy accuracy {base:.3f} -> {final:.3f} at version {trainer.version}; "
                      f"batches admitted {market.counts.admitted_batches}, refused {market.counts.refused_batches}")
    except KeyboardInterrupt:
        trainer.close(run_callbacks=False)  # the steps being written are finished; nothing more is published
        console.print(f"stopped at version {trainer.version}; state is saved in {folder}")
    finally:
        try:
            trainer.close(run_callbacks=False)  # after an error: what is written stays (a no-op once closed)
        finally:
            if market is not None:
                market.close()
            node.stop()

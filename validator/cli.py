"""`rollnet validator run`: stake as a validator if needed, then verify and vote on the job's submissions
this validator is drawn for, appeal rounds it lost, and collect its rewards.

Invariant: the daemon's progress lives in `<data-dir>/validator.sqlite`, so stopping and re-running the
command resumes where it stopped, never voting twice; Ctrl-C stops it between rounds; its host runs the
stake gate.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rollnet.node.chain.job import JobClient
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.cli import params
from rollnet.node.cli.context import DevAccountOption, KeyOption, console, get_context
from rollnet.node.cli.job_cmd import resolve_job
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import ChainUnavailable, RollnetError
from rollnet.node.events import EventLog
from rollnet.node.lease_book import book_file
from rollnet.node.ledger import SubmissionLedger
from rollnet.node.model.peer_source import job_model
from rollnet.node.model.policies import StorePolicies
from rollnet.node.p2p.fetch import batch_fetcher
from rollnet.node.p2p.host import topics
from rollnet.node.p2p.identity import load_or_create_identity
from rollnet.node.p2p.prefetch import Prefetcher
from rollnet.node.participant import start_participant
from rollnet.node.policy_sync import PolicyFollower
from rollnet.node.recipe import agree, recipe_task
from rollnet.node.units import eth_to_wei, format_eth
from rollnet.validator.daemon import ValidatorDaemon

app = typer.Typer(help="Verify rollout batches and vote on chain.", no_args_is_help=True)


@app.command()
def run(
    ctx: typer.Context,
    stake: str = typer.Option("10", "--stake", help="ETH to stake if not yet registered as a validator", **params.ETH),
    job: str = typer.Option("latest", "--job", help="job address, or 'latest'", **params.JOB),
    task: str = typer.Option(None, "--task", help="the job's task (default and only choice: the recipe's on chain)"),
    model: Path = typer.Option(None, "--model", help="the job's base model folder or preset "
                               "(default: the job's preset, else embedded)",
                               **params.INPUT_DIR),
    policies: Path = typer.Option(None, "--policies", help="policy store (default <data-dir>/policies)",
                                  **params.STATE_DIR),
    listen: str = typer.Option("/ip4/127.0.0.1/tcp/0", "--listen", help="libp2p listen multiaddr", **params.MULTIADDR),
    advertise: str = typer.Option(None, "--advertise", help="multiaddr registered for peers to dial (default: listen)",
                                  **params.MULTIADDR),
    bootstrap: list[str] = typer.Option([], "--bootstrap", help="peer multiaddr to dial, or @FILE",
                                        **params.BOOTSTRAP),
    interval: float = typer.Option(2.0, "--interval", min=0.1, help="seconds between rounds"),
    once: bool = typer.Option(False, "--once", help="run one round and exit"),
    key: str = KeyOption,
    dev_account: int = DevAccountOption,
) -> None:
    """Follow JOB's submissions from the last processed block: fetch, check, gossip verdicts, attest."""
    cli = get_context(ctx)
    account = cli.signer(key, dev_account)
    client, deployment = cli.client(account)
    registry = RegistryClient(client, deployment.registry)
    job_client = JobClient(client, resolve_job(client, deployment, job))
    identity = load_or_create_identity(cli.data_dir)
    info = registry.info(account.address)
    if not info.registered:
        stake_wei = eth_to_wei(stake, "--stake")
        if stake_wei < registry.min_stake(Role.VALIDATOR):
            raise RollnetError(f"stake {format_eth(stake_wei)} is below the validator minimum of "
                               f"{format_eth(registry.min_stake(Role.VALIDATOR))}")
        registry.join(identity, Role.VALIDATOR, stake_wei)
        console.print(f"joined as validator: {account.address} staked {format_eth(stake_wei)}")
    elif not registry.is_active(account.address, Role.VALIDATOR):
        raise RollnetError(f"{account.address} is registered but not an active validator: see `rollnet node status`")
    spec = job_client.spec()
    recipe = spec.recipe
    agree("--task", task, recipe.task_name)
    store = PolicyStore(policies or cli.data_dir / "policies", trainer=spec.trainer)
    node = start_participant(registry, job_client, cli.data_dir, cli.data_dir / "objects", listen=listen,
                             advertise=advertise, bootstrap=bootstrap).node
    prefetcher: Prefetcher | None = None
    try:
        events = EventLog(cli.data_dir)
        follower = PolicyFollower(node, store, job_client, registry, events)
        # Local if it is the job's base model, else the newest anchor from peers, checked against the chain.
        obtained = job_model(follower, cli.data_dir, model, recipe.task_name, strict=False)
        base, tokenizer = obtained.model, obtained.tokenizer
        console.print(f"the job's model: {obtained.source}")
        task_def = recipe_task(recipe, tokenizer, task_flag=task)
        verdict_topic = topics(job_client.address)["verdict"]
        prefetcher = Prefetcher(batch_fetcher(node, registry, spec))
        daemon = ValidatorDaemon(job_client, registry, account, task_def,
                                 StorePolicies(store, base, tokenizer, job_client.policy_root),
                                 prefetcher, SubmissionLedger(cli.data_dir / "validator.sqlite"),
                                 publish=lambda data: node.publish(verdict_topic, data), events=events,
                                 from_block=deployment.deployed_at_block,
                                 book_path=book_file(cli.data_dir, job_client.address, f"validator-{account.address}"),
                                 prefetch=prefetcher.start)
        console.print(f"validating job {job_client.address} as {account.address} (peer {identity.peer_id})")
        events.emit("start", address=account.address, peer=identity.peer_id)
        while True:
            follower.poll()
            try:
                report = daemon.run_once()
            except ChainUnavailable as exc:
                console.print(f"chain unavailable ({exc}); retrying")
                events.emit("chain_unavailable", wait_s=interval)
                time.sleep(interval)
                continue
            if report.new_submissions or report.judged or report.attested or report.appealed:
                console.print(f"new {report.new_submissions}, drawn {report.drawn}, judged {report.judged}, "
                              f"voted {report.attested}, appealed {report.appealed}")
            if once:
                break
            if not (report.judged or report.attested):
                time.sleep(interval)  # nothing judged or voted: wait for news (a busy pass goes straight on)
    except KeyboardInterrupt:
        console.print("stopped; progress is saved")
    finally:
        if prefetcher is not None:
            prefetcher.close()
        node.stop()

"""`rollnet node join|status|unbond|withdraw|work`: a contributor's stake and identity on chain, and its work.

Invariant: `join` registers the libp2p peer ID of this data directory's identity with that key's signature
of the binding, so the address and the peer the node answers as are bound on chain and nobody else can
claim the peer ID; stake checks happen before any transaction is sent; `work` generates only with a policy
version whose weights match the root published on chain, behind the stake gate. The rollout backend
`join --backend` chose (checked to be installed before anything is sent) is `work`'s default.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.table import Table
from rollnet.node.chain.job import JobClient
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.cli import params
from rollnet.node.cli.context import DevAccountOption, KeyOption, console, get_context
from rollnet.node.cli.job_cmd import resolve_job
from rollnet.node.errors import RollnetError
from rollnet.node.events import EventLog
from rollnet.node.lease_book import book_file
from rollnet.node.p2p.identity import b58encode, load_or_create_identity
from rollnet.node.recipe import agree, recipe_task
from rollnet.node.rollout.backend_names import BACKENDS, require_vllm
from rollnet.node.units import eth_to_wei, format_eth

app = typer.Typer(help="Register this node (stake), inspect it, unbond and withdraw.", no_args_is_help=True)
NODE_SETTINGS = "node.json"


def _check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise RollnetError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if name == "vllm":
        require_vllm()
    return name


def _saved_backend(data_dir: Path) -> str:
    path = data_dir / NODE_SETTINGS
    return json.loads(path.read_text()).get("backend", "transformers") if path.is_file() else "transformers"


def _registry(ctx: typer.Context, key: str, dev_account: int | None) -> RegistryClient:
    cli = get_context(ctx)
    client, deployment = cli.client(cli.signer(key, dev_account))
    return RegistryClient(client, deployment.registry)


@app.command()
def join(
    ctx: typer.Context,
    stake: str = typer.Option(..., "--stake", help="ETH to stake", **params.ETH),
    role: str = typer.Option("worker", "--role", help="worker or validator"),
    backend: str = typer.Option("transformers", "--backend",
                                help=f"rollout backend `node work` uses: {', '.join(BACKENDS)}"),
    key: str = KeyOption,
    dev_account: int = DevAccountOption,
) -> None:
    """Register this node with its libp2p peer ID and stake ETH for a role."""
    parsed_role = Role.parse(role)
    _check_backend(backend)
    stake_wei = eth_to_wei(stake, "--stake")
    registry = _registry(ctx, key, dev_account)
    address = registry.client.address
    minimum = registry.min_stake(parsed_role)
    if stake_wei < minimum:
        raise RollnetError(
            f"stake {format_eth(stake_wei)} is below the {parsed_role.name.lower()} minimum of {format_eth(minimum)}"
        )
    if registry.info(address).registered:
        raise RollnetError(f"{address} is already registered: see `rollnet node status`")
    balance = registry.client.balance(address)
    if balance < stake_wei:
        raise RollnetError(f"{address} holds {format_eth(balance)}, less than the stake {format_eth(stake_wei)}")
    identity = load_or_create_identity(get_context(ctx).data_dir)
    registry.join(identity, parsed_role, stake_wei)
    (get_context(ctx).data_dir / NODE_SETTINGS).write_text(json.dumps({"backend": backend}))
    console.print(
        f"joined as {parsed_role.name.lower()}: {address} staked {format_eth(stake_wei)}, peer {identity.peer_id}"
    )


@app.command()
def status(ctx: typer.Context, key: str = KeyOption, dev_account: int = DevAccountOption) -> None:
    """Show this node's registration, stake and wallet balance."""
    registry = _registry(ctx, key, dev_account)
    address = registry.client.address
    info = registry.info(address)
    table = Table(show_header=False, box=None)
    table.add_row("address", address)
    table.add_row("wallet", format_eth(registry.client.balance(address)))
    if not info.registered:
        table.add_row("registered", "no (run `rollnet node join --stake ETH`)")
        console.print(table)
        return
    roles = ", ".join(role.name.lower() for role in Role if role in info.roles)
    table.add_row("peer id", b58encode(info.peer_id))
    table.add_row("roles", roles)
    table.add_row("active stake (free)", format_eth(info.active))
    table.add_row("locked as lease collateral", format_eth(info.locked))
    table.add_row("unbonding", format_eth(info.unbonding))
    if info.unbonding:
        when = datetime.fromtimestamp(info.unbond_ready_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        table.add_row("withdrawable at", when)
    for role in (Role.WORKER, Role.VALIDATOR):
        if role in info.roles:
            active = "yes" if registry.is_active(address, role) else "no (stake below minimum)"
            table.add_row(f"active {role.name.lower()}", active)
    console.print(table)


@app.command("rotate-peer")
def rotate_peer(ctx: typer.Context, key: str = KeyOption, dev_account: int = DevAccountOption) -> None:
    """Bind this address to this data directory's libp2p key (proven by the key's signature)."""
    registry = _registry(ctx, key, dev_account)
    address = registry.client.address
    identity = load_or_create_identity(get_context(ctx).data_dir)
    info = registry.info(address)
    if not info.registered:
        raise RollnetError(f"{address} is not registered: run `rollnet node join --stake ETH`")
    if info.peer_id == identity.peer_id_bytes:
        console.print(f"{address} is already bound to peer {identity.peer_id}")
        return
    registry.set_peer_id(identity)
    console.print(f"{address} now answers as peer {identity.peer_id}")


@app.command()
def unbond(
    ctx: typer.Context,
    amount: str = typer.Argument(..., help="ETH to move from active stake to unbonding", callback=params.eth_amount,
                                 metavar="AMOUNT"),
    key: str = KeyOption,
    dev_account: int = DevAccountOption,
) -> None:
    """Start unbonding AMOUNT ETH; it becomes withdrawable after the unbonding period."""
    amount_wei = eth_to_wei(amount, "AMOUNT")
    registry = _registry(ctx, key, dev_account)
    registry.request_unbond(amount_wei)
    info = registry.info(registry.client.address)
    wait = max(0, info.unbond_ready_at - int(time.time()))
    console.print(f"unbonding {format_eth(info.unbonding)}; withdrawable in {wait} s (`rollnet node withdraw`)")


@app.command()
def withdraw(ctx: typer.Context, key: str = KeyOption, dev_account: int = DevAccountOption) -> None:
    """Withdraw unbonded stake once the unbonding period has passed."""
    registry = _registry(ctx, key, dev_account)
    amount = registry.info(registry.client.address).unbonding
    registry.withdraw()
    console.print(f"withdrew {format_eth(amount)}")


@app.command()
def work(
    ctx: typer.Context,
    job: str = typer.Option("latest", "--job", help="job address, or 'latest'", **params.JOB),
    leases: int = typer.Option(1, "--leases", min=0, help="leases to claim, generate and submit (0: until Ctrl-C)"),
    serve: float = typer.Option(60.0, "--serve", min=0, help="seconds to keep serving the batches afterwards"),
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
    delay: float = typer.Option(0.0, "--delay", min=0, help="seconds added before each submission (slow hardware)"),
    max_undecided: int = typer.Option(None, "--max-undecided", min=1,
                                      help="leases in flight at once, claimed or awaiting a decision (default: "
                                      "adaptive, from the staleness budget: as many as keep generation busy, halved "
                                      "when batches arrive at the budget's edge)"),
    cheat: str = typer.Option(None, "--cheat", hidden=True, help="a registered demonstration cheat (devnet only)"),
    backend: str = typer.Option(None, "--backend", help=f"rollout backend, {', '.join(BACKENDS)} "
                                "(default: the one `node join` chose)"),
    key: str = KeyOption,
    dev_account: int = DevAccountOption,
) -> None:
    """Claim leases, generate seeded and proven rollouts with the newest policy (deltas arrive over libp2p and
    are checked against the chain), submit their roots, and serve the batches to validators and the trainer."""
    # the worker's machinery (torch, libp2p, the model) loads here, so the node's other commands stay light
    from rollnet.node.delta.store import PolicyStore
    from rollnet.node.model.peer_source import job_model
    from rollnet.node.model.policies import StorePolicies
    from rollnet.node.participant import start_participant
    from rollnet.node.policy_sync import PolicyFollower
    from rollnet.node.rollout.backend import PolicyEngine, TransformersEngine
    from rollnet.node.worker import HONEST, TAMPERS, WorkerLoop

    if cheat is not None and cheat not in TAMPERS:
        raise RollnetError(f"no cheat named {cheat!r} is registered (cheats exist only in the devnet's cheater)")
    cli = get_context(ctx)
    backend = _check_backend(backend or _saved_backend(cli.data_dir))
    if cheat is not None and backend != "transformers":
        raise RollnetError("demonstration cheats run on the transformers backend only")
    account = cli.signer(key, dev_account)
    client, deployment = cli.client(account)
    registry = RegistryClient(client, deployment.registry)
    if not registry.is_active(account.address, Role.WORKER):
        raise RollnetError(f"{account.address} is not an active worker: run `rollnet node join --stake ETH`")
    job_client = JobClient(client, resolve_job(client, deployment, job))
    spec = job_client.spec()
    recipe = spec.recipe
    agree("--task", task, recipe.task_name)
    store = PolicyStore(policies or cli.data_dir / "policies", trainer=spec.trainer)
    events = EventLog(cli.data_dir)
    node = start_participant(registry, job_client, cli.data_dir, cli.data_dir / "objects", listen=listen,
                             advertise=advertise, bootstrap=bootstrap).node
    try:
        follower = PolicyFollower(node, store, job_client, registry, events)
        # Local if it is the job's base model, else the newest anchor from peers, checked against the chain.
        obtained = job_model(follower, cli.data_dir, model, recipe.task_name)
        folder, base, tokenizer = obtained.folder, obtained.model, obtained.tokenizer
        console.print(f"the job's model: {obtained.source}")
        task_def = recipe_task(recipe, tokenizer, task_flag=task)
        tamper = TAMPERS[cheat](tokenizer) if cheat is not None else HONEST
        engine: PolicyEngine
        if backend == "vllm":
            from rollnet.node.rollout.vllm_backend import VllmBackend, VllmEngine

            console.print("starting the vLLM engine")
            engine = VllmEngine(VllmBackend.shared(folder), store, job_client.policy_root)
        else:
            engine = TransformersEngine(StorePolicies(store, base, tokenizer, job_client.policy_root), tamper.model)
        if store.latest is not None and store.latest > 0:
            console.print(f"policy store holds versions up to {store.latest}")
        loop = WorkerLoop(job_client, account, task_def, follower, engine, node.store, events,
                          delay_s=delay, tamper=tamper, max_undecided=max_undecided,
                          from_block=deployment.deployed_at_block,
                          book_path=book_file(cli.data_dir, job_client.address, f"worker-{account.address}"))
        events.emit("start", address=account.address, peer=node.peer_id, backend=backend)
        loop.run(leases)
        console.print(f"submitted {loop.submitted} leases; serving the batches as {node.peer_id} for {serve:g} s")
        time.sleep(serve)
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        node.stop()

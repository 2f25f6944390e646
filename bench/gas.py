"""Gas the market charges per accepted sample, measured with real transactions on a real anvil.

For each lease size (tasks per lease) it runs the worker's whole path for several leases — claim (locks the
collateral), drawSeed (the prompt seed, from the claim block's hash), submit, one vote per committee member
(two validators of equal stake: both sit and both are needed for a majority), finalize (pays, releases the
collateral), withdrawPayment — and divides by the samples accepted. The baseline is one task per lease (no
batching); the ratio shows what batching under one Merkle root saves.

Usage: python bench/gas.py [--quick] [--json PATH]
Invariant: every number comes from a mined receipt's gasUsed; nothing is estimated.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from rich.table import Table
from rollnet.node.chain.anvil import start_anvil
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.deploy import deploy_market
from rollnet.node.chain.job import FactoryClient, JobClient
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.cli.context import make_console
from rollnet.node.keys import dev_account
from rollnet.node.p2p.identity import PeerIdentity
from rollnet.node.spec import load_job_spec

REPO = Path(__file__).resolve().parents[1]
ETH = 10**18
WORKER, VALIDATORS, REQUESTER = 1, (2, 3), 0
STEPS = ("claim", "drawSeed", "submit", "vote", "finalize", "withdrawPayment")


def measure(url: str, factory: str, tasks_per_lease: int, leases: int) -> dict:
    spec = load_job_spec(REPO / "examples" / "job.toml").model_copy(update={"tasks_per_lease": tasks_per_lease})
    requester = ChainClient(url, dev_account(REQUESTER))
    job = FactoryClient(requester, factory).create_job(spec.to_abi(requester.address), 50 * ETH)
    JobClient(requester, job).publish_policy(1, b"\x01" * 32)
    worker = JobClient(ChainClient(url, dev_account(WORKER)), job)
    validators = [JobClient(ChainClient(url, dev_account(v)), job) for v in VALIDATORS]
    gas: dict[str, list[int]] = defaultdict(list)
    for index in range(leases):
        lease = worker.claim()
        gas["claim"].append(worker.client.w3.eth.get_transaction_receipt(_last_tx(worker))["gasUsed"])
        worker.draw_seed(lease.lease_id)
        gas["drawSeed"].append(worker.client.w3.eth.get_transaction_receipt(_last_tx(worker))["gasUsed"])
        gas["submit"].append(worker.submit(lease.lease_id, (index + 1).to_bytes(32, "big"), 1)["gasUsed"])
        gas["vote"].append(sum(v.vote(lease.lease_id, True)["gasUsed"] for v in validators))
        requester.rpc("evm_increaseTime", [spec.appeal_seconds + 1])
        requester.rpc("evm_mine", [])
        gas["finalize"].append(worker.finalize(lease.lease_id)["gasUsed"])
        gas["withdrawPayment"].append(worker.withdraw_payment()["gasUsed"])
    samples = tasks_per_lease * spec.group_size
    per_lease = {step: statistics.mean(gas[step]) for step in STEPS}
    total = sum(per_lease.values())
    return {
        "tasks_per_lease": tasks_per_lease,
        "group_size": spec.group_size,
        "committee_size": spec.committee_size,
        "voters": len(VALIDATORS),
        "leases": leases,
        "gas_per_lease": {k: round(v) for k, v in per_lease.items()},
        "gas_per_lease_total": round(total),
        "gas_per_accepted_sample": round(total / samples, 1),
    }


def _last_tx(job: JobClient) -> bytes:
    block = job.client.w3.eth.get_block("latest")
    return block["transactions"][-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer leases and sizes")
    parser.add_argument("--json", type=Path, default=Path("bench/results/gas.json"))
    args = parser.parse_args()
    sizes = (1, 8) if args.quick else (1, 4, 8, 32)
    leases = 2 if args.quick else 5
    anvil = start_anvil()
    try:
        deployer = ChainClient(anvil.url, dev_account(0))
        deployment = deploy_market(deployer)
        for index, role in ((WORKER, Role.WORKER), *((v, Role.VALIDATOR) for v in VALIDATORS)):
            registry = RegistryClient(ChainClient(anvil.url, dev_account(index)), deployment.registry)
            registry.join(PeerIdentity.generate(), role, 10 * ETH)
        rows = [measure(anvil.url, deployment.factory, size, leases) for size in sizes]
    finally:
        anvil.stop()
    baseline = rows[0]["gas_per_accepted_sample"]
    for row in rows:
        row["ratio_vs_one_task_per_lease"] = round(baseline / row["gas_per_accepted_sample"], 2)

    table = Table(title="gas per accepted sample (group 8, two committee votes; anvil, real receipts)")
    for column in ("tasks/lease", *STEPS, "per lease", "per sample", "saving vs 1 task/lease"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["tasks_per_lease"]), *(str(row["gas_per_lease"][s]) for s in STEPS),
            str(row["gas_per_lease_total"]), str(row["gas_per_accepted_sample"]),
            f"{row['ratio_vs_one_task_per_lease']}x",
        )
    make_console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "gas", "quick": args.quick, "rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""The on-chain half of the market end to end on a real anvil, through the Python bindings."""

from __future__ import annotations

import pytest
from conftest import ETH, REPO, advance_time, client_for
from rollnet.node.chain.anvil import AnvilProcess
from rollnet.node.chain.job import FactoryClient, JobClient, LeaseStatus
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.config import Deployment
from rollnet.node.errors import ContractRevert
from rollnet.node.spec import load_job_spec

WORKER, VALIDATOR_A, VALIDATOR_B, REQUESTER = 1, 2, 3, 0


@pytest.fixture
def job(market: Deployment, anvil: AnvilProcess) -> str:
    for index, role in ((WORKER, Role.WORKER), (VALIDATOR_A, Role.VALIDATOR), (VALIDATOR_B, Role.VALIDATOR)):
        RegistryClient(client_for(anvil, index), market.registry).join(f"peer-{index}".encode(), role, 10 * ETH)
    requester = client_for(anvil, REQUESTER)
    spec = load_job_spec(REPO / "examples" / "job.toml")
    address = FactoryClient(requester, market.factory).create_job(spec.to_abi(requester.address), 5 * ETH)
    JobClient(requester, address).publish_policy(1, b"\x11" * 32)
    return address


def _submitted_lease(anvil: AnvilProcess, job: str) -> tuple[JobClient, int]:
    worker = JobClient(client_for(anvil, WORKER), job)
    lease = worker.claim()
    assert lease.status is LeaseStatus.LEASED and lease.seed != b"\0" * 32
    assert lease.task_seed(0) != lease.task_seed(1)
    worker.submit(lease.lease_id, b"\x22" * 32, 1)
    return worker, lease.lease_id


def test_accepted_batch_pays_the_worker_after_the_challenge_window(anvil: AnvilProcess, job: str) -> None:
    worker, lease_id = _submitted_lease(anvil, job)
    JobClient(client_for(anvil, VALIDATOR_A), job).attest(lease_id, True)
    JobClient(client_for(anvil, VALIDATOR_B), job).attest_batch({lease_id: True})
    assert worker.lease(lease_id).status is LeaseStatus.ACCEPTED
    with pytest.raises(ContractRevert, match="DeadlineNotReached"):
        worker.finalize(lease_id)
    advance_time(worker.client, 3601)
    worker.finalize(lease_id)
    pay = 64 * 10**15  # 8 tasks x 8 completions x 0.001 ETH
    assert worker.owed(worker.client.address) == pay
    balance_before = worker.client.balance(worker.client.address)
    receipt = worker.withdraw_payment()
    gas_cost = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    assert worker.client.balance(worker.client.address) == balance_before + pay - gas_cost
    state = worker.status()
    assert state.escrow == 5 * ETH - pay and state.balance == state.escrow + state.total_owed + state.bonds_held


def test_rejected_batch_slashes_the_worker_into_escrow(market: Deployment, anvil: AnvilProcess, job: str) -> None:
    worker, lease_id = _submitted_lease(anvil, job)
    for validator in (VALIDATOR_A, VALIDATOR_B):
        JobClient(client_for(anvil, validator), job).attest(lease_id, False)
    advance_time(worker.client, 3601)
    worker.finalize(lease_id)
    registry = RegistryClient(worker.client, market.registry)
    assert registry.info(worker.client.address).active == 9 * ETH
    state = worker.status()
    assert worker.lease(lease_id).status is LeaseStatus.SLASHED
    assert state.escrow == 6 * ETH and state.reserved == 0 and state.balance == 6 * ETH


def test_stale_submission_is_refused_on_chain(anvil: AnvilProcess, job: str) -> None:
    requester = JobClient(client_for(anvil, REQUESTER), job)
    worker = JobClient(client_for(anvil, WORKER), job)
    lease = worker.claim()
    for version in range(2, 7):
        requester.publish_policy(version, bytes([version]) * 32)
    with pytest.raises(ContractRevert, match="policy version 1 is too stale: current is 6, max staleness 4"):
        worker.submit(lease.lease_id, b"\x33" * 32, 1)
    worker.submit(lease.lease_id, b"\x33" * 32, 2)
    assert worker.lease(lease.lease_id).policy_version == 2

"""Deploy the three contracts and wire them together.

Invariant: after `deploy_market` the registry's factory is the new JobFactory (set once), so only jobs
that factory creates can slash.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from rollnet.node.chain.client import ChainClient
from rollnet.node.config import Deployment
from rollnet.node.units import eth_to_wei


class RegistryParams(BaseModel):
    """The registry's constructor arguments."""

    min_worker_stake_eth: str = "1"
    min_validator_stake_eth: str = "5"
    unbonding_period_seconds: int = Field(default=7 * 86_400, ge=1)


def deploy_market(
    client: ChainClient, params: RegistryParams | None = None, anvil_pid: int | None = None
) -> Deployment:
    params = params or RegistryParams()
    start_block = client.block_number()
    registry = client.deploy(
        "NodeRegistry",
        eth_to_wei(params.min_worker_stake_eth),
        eth_to_wei(params.min_validator_stake_eth),
        params.unbonding_period_seconds,
    )
    implementation = client.deploy("TrainingJob")
    factory = client.deploy("JobFactory", registry, implementation)
    client.transact(client.contract("NodeRegistry", registry).functions.setFactory(factory))
    return Deployment(
        chain_id=client.chain_id,
        rpc_url=client.rpc_url,
        registry=registry,
        factory=factory,
        job_implementation=implementation,
        deployed_at_block=start_block,
        anvil_pid=anvil_pid,
    )

"""A requester's job spec: the TOML file `rollnet job deploy --spec` reads, validated, and its ABI tuple.

Invariant: a spec that passes `load_job_spec` satisfies every check `JobFactory.createJob` makes, so a
bad field is reported by name here, before any transaction. Amounts are ETH strings, durations seconds.
"""

from __future__ import annotations

import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Annotated

from eth_utils import is_address, keccak, to_checksum_address
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from rollnet.node.errors import ConfigError
from rollnet.node.units import eth_to_wei

DAY = 86_400
Seconds = Annotated[int, Field(ge=1, le=30 * DAY)]
EthAmount = Annotated[Decimal, Field(ge=0)]


class JobSpecFile(BaseModel):
    """The `[job]` table of a spec file; see examples/job.toml for every field documented."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="model name, or 'embedded' for the built-in default")
    model_root: str | None = Field(default=None, description="0x-prefixed 32-byte content root of version 0")
    task: str = Field(min_length=1, description="task generator or task file name")
    trainer: str = Field(description="address that publishes policy versions; 'self' for the requester")
    arbiter: str | None = Field(default=None, description="address resolving challenges; default the requester")
    group_size: int = Field(ge=2, le=1024)
    tasks_per_lease: int = Field(ge=1, le=1024)
    max_staleness: int = Field(ge=0, le=1024)
    quorum: int = Field(ge=1, le=100)
    clip_epsilon: Decimal = Field(gt=0, lt=1)
    clip_delta: Decimal = Field(gt=1, le=1000)
    lease_seconds: Seconds
    vote_seconds: Seconds
    challenge_seconds: Seconds
    resolve_seconds: Seconds
    reward_per_sample_eth: EthAmount = Field(gt=0)
    slash_eth: EthAmount
    challenge_bond_eth: EthAmount

    @field_validator("model_root")
    @classmethod
    def _root_is_32_bytes(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("0x") or len(value) != 66):
            raise ValueError("must be 0x followed by 64 hex digits")
        if value is not None:
            bytes.fromhex(value[2:])
        return value

    @field_validator("trainer", "arbiter")
    @classmethod
    def _is_address(cls, value: str | None) -> str | None:
        if value is None or value == "self":
            return value
        if not is_address(value):
            raise ValueError("must be an Ethereum address or 'self'")
        return to_checksum_address(value)

    @model_validator(mode="after")
    def _thousandths(self) -> JobSpecFile:
        for name in ("clip_epsilon", "clip_delta"):
            if (getattr(self, name) * 1000) % 1 != 0:
                raise ValueError(f"{name} has more than 3 decimal places")
        return self

    @property
    def timeline_seconds(self) -> int:
        return self.lease_seconds + self.vote_seconds + self.challenge_seconds + self.resolve_seconds

    def root_of_version_zero(self) -> bytes:
        if self.model_root:
            return bytes.fromhex(self.model_root[2:])
        return keccak(text=f"rollnet/model/{self.model}")

    def to_abi(self, requester: str) -> tuple:
        """The `JobSpec` struct as a tuple in Solidity field order."""
        trainer = requester if self.trainer == "self" else self.trainer
        arbiter = requester if self.arbiter in (None, "self") else self.arbiter
        return (
            self.root_of_version_zero(),
            keccak(text=f"rollnet/task/{self.task}"),
            trainer,
            arbiter,
            self.group_size,
            self.tasks_per_lease,
            self.max_staleness,
            self.quorum,
            int(self.clip_epsilon * 1000),
            int(self.clip_delta * 1000),
            self.lease_seconds,
            self.vote_seconds,
            self.challenge_seconds,
            self.resolve_seconds,
            eth_to_wei(self.reward_per_sample_eth, "reward_per_sample_eth"),
            eth_to_wei(self.slash_eth, "slash_eth"),
            eth_to_wei(self.challenge_bond_eth, "challenge_bond_eth"),
        )

    def lease_cost_wei(self) -> int:
        return eth_to_wei(self.reward_per_sample_eth) * self.group_size * self.tasks_per_lease


def _describe(error: dict) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "spec"
    if error["type"] == "missing":
        return f"missing field '{field}'"
    if error["type"] == "extra_forbidden":
        return f"unknown field '{field}'"
    return f"field '{field}': {error['msg']}"


def parse_job_spec(data: dict, source: str = "spec") -> JobSpecFile:
    table = data.get("job", data)
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [job] must be a table")
    try:
        return JobSpecFile.model_validate(table)
    except ValidationError as exc:
        problems = "; ".join(_describe(err) for err in exc.errors())
        raise ConfigError(f"{source}: {problems}") from None


def load_job_spec(path: Path) -> JobSpecFile:
    if not path.exists():
        raise ConfigError(f"spec file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return parse_job_spec(data, str(path))

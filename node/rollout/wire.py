"""The rollout file/wire schema: a batch of rollouts for one task and policy version, as JSON.

Invariant: `RolloutBatch.from_json(batch.to_json())` equals the batch; proofs travel as hex of whole
258-byte proofs; anything malformed (bad JSON, missing fields, wrong types, odd-length or mis-sized proof
hex, log-probs and tokens of different lengths, negative or huge token ids, a prompt over 32,768 or a
completion over 4,096 tokens) is a ConfigError naming what is wrong.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from rollnet.node import toploc
from rollnet.node.errors import ConfigError, first_validation_problem
from rollnet.node.rollout.generate import Rollout

SCHEMA = "rollnet-rollouts-v1"
MAX_PROMPT_TOKENS = 32_768
MAX_COMPLETION_TOKENS = 4_096  # JobFactory.MAX_NEW_TOKENS
TokenId = Annotated[int, Field(ge=0, lt=2**32)]


class RolloutRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    task_seed: int = Field(ge=0)
    sample: int = Field(ge=0)
    prompt_tokens: list[TokenId] = Field(max_length=MAX_PROMPT_TOKENS)
    tokens: list[TokenId] = Field(max_length=MAX_COMPLETION_TOKENS)
    logprobs: list[float]
    text: str
    proofs: list[str]
    reward: float | None = None  # what the worker claims; validators and the trainer recompute it

    @field_validator("proofs")
    @classmethod
    def _proof_hex(cls, proofs: list[str]) -> list[str]:
        for proof in proofs:
            if len(proof) != 2 * toploc.PROOF_BYTES:
                raise ValueError(f"a proof is {toploc.PROOF_BYTES} bytes ({2 * toploc.PROOF_BYTES} hex digits)")
            bytes.fromhex(proof)
        return proofs

    @model_validator(mode="after")
    def _lengths(self) -> RolloutRecord:
        if len(self.logprobs) != len(self.tokens):
            raise ValueError("tokens and logprobs differ in length")
        return self


class RolloutBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_: str = Field(SCHEMA, alias="schema")
    task: str
    policy_version: int = Field(ge=0)
    policy_root: str
    rollouts: list[RolloutRecord]

    @classmethod
    def of(cls, task: str, rollouts: list[Rollout], rewards: list[float] | None = None) -> RolloutBatch:
        versions = {(r.policy_version, r.policy_root) for r in rollouts}
        if len(versions) > 1:
            raise ValueError("a batch holds rollouts of one policy version")
        version, root = versions.pop() if versions else (0, "")
        claimed = rewards if rewards is not None else [None] * len(rollouts)
        return cls(schema=SCHEMA, task=task, policy_version=version, policy_root=root, rollouts=[
            RolloutRecord(task_seed=r.task_seed, sample=r.sample, prompt_tokens=r.prompt_tokens, tokens=r.tokens,
                          logprobs=r.logprobs, text=r.text, proofs=[p.hex() for p in r.proofs], reward=reward)
            for r, reward in zip(rollouts, claimed, strict=True)
        ])

    def to_rollouts(self) -> list[Rollout]:
        return [Rollout(r.task_seed, r.sample, list(r.prompt_tokens), list(r.tokens), list(r.logprobs), r.text,
                        self.policy_version, self.policy_root, [bytes.fromhex(p) for p in r.proofs])
                for r in self.rollouts]

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> RolloutBatch:
        try:
            batch = cls.model_validate_json(text)
        except ValidationError as exc:
            raise ConfigError(f"malformed rollout batch: {first_validation_problem(exc)}") from None
        if batch.schema_ != SCHEMA:
            raise ConfigError(f"unknown rollout schema {batch.schema_!r} (expected {SCHEMA})")
        return batch

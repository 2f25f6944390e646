"""The trainer's settings, validated once: GRPO clipping, loss normalisation, optimiser, staleness budget.

Invariant: every field is checked at construction (ε in (0, 1), δ > 1 or off, positive counts), so a bad
setting is a ConfigError before any training; δ = None means the upper cap on negative-advantage ratios
is off (δ = ∞).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from rollnet.node.errors import ConfigError, first_validation_problem


class GRPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    epsilon: float = Field(0.2, gt=0, lt=1, description="clip: ratios above 1+ε (A ≥ 0) or below 1-ε (A < 0)")
    delta: float | None = Field(4.0, description="cap on ratios for A < 0; None turns it off (δ = ∞)")
    loss_normalisation: Literal["token", "sequence"] = "token"
    kl_coef: float = Field(0.0, ge=0, description="weight of the k3 KL estimate to the reference policy")
    entropy_coef: float = Field(0.0, ge=0, description="weight of the entropy bonus")
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    optimizer_steps: int = Field(4, ge=1, description="optimiser steps per batch (minibatches of the batch)")
    group_size: int = Field(8, ge=2)
    prompts_per_step: int = Field(32, ge=1)
    max_staleness: int = Field(4, ge=0)
    max_new_tokens: int = Field(6, ge=1)
    temperature: float = Field(1.0, gt=0)
    advantage_epsilon: float = Field(1e-6, gt=0)

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        if self.delta is not None and self.delta <= 1:
            raise ValueError("delta must be greater than 1 (or None to turn the cap off)")
        if self.optimizer_steps > self.prompts_per_step:
            raise ValueError("optimizer_steps cannot exceed prompts_per_step (each minibatch holds whole groups)")
        return self

    @classmethod
    def make(cls, **fields: object) -> GRPOConfig:
        """Construct, turning validation errors into one ConfigError line naming the field."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise ConfigError(f"trainer setting {first_validation_problem(exc)}") from None

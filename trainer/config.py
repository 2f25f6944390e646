"""The trainer's settings, validated once: GRPO clipping, loss normalisation, optimiser, staleness budget.

Invariant: every field is checked at construction (ε in (0, 1), δ > 1 or off, positive counts), so a bad
setting is a ConfigError before any training; δ = None means the upper cap on negative-advantage ratios
is off (δ = ∞). For a market job the settings its recipe fixes (ε, δ, group size, staleness budget, length
and temperature) come from the chain (`for_recipe`), and a trainer whose config contradicts them is refused.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from rollnet.node.errors import ConfigError, first_validation_problem
from rollnet.node.recipe import Recipe, agree

# The settings a job's recipe fixes, by the flag that would name them.
RECIPE_SETTINGS = {"epsilon": "--epsilon", "delta": "--delta", "group_size": "--group-size",
                   "max_staleness": "--max-staleness", "max_new_tokens": "--max-new-tokens",
                   "temperature": "--temperature"}


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
    temperature: float = Field(1.0, gt=0, allow_inf_nan=False)
    advantage_epsilon: float = Field(1e-6, gt=0)

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        if self.delta is not None and self.delta <= 1:
            raise ValueError("delta must be greater than 1 (or None to turn the cap off)")
        if self.optimizer_steps > self.prompts_per_step:
            raise ValueError("optimizer_steps cannot exceed prompts_per_step (each minibatch holds whole groups)")
        return self

    @classmethod
    def for_recipe(cls, recipe: Recipe, flags: dict[str, object | None], **private: object) -> GRPOConfig:
        """The config for a market job: the recipe's settings (a flag may only repeat one), plus the
        trainer's private ones (learning rate, optimiser, loss normalisation)."""
        chain = recipe_settings(recipe)
        fixed = {name: agree(RECIPE_SETTINGS[name], flags.get(name), value) for name, value in chain.items()}
        return cls.make(**fixed, **private)

    def contradictions(self, recipe: Recipe) -> list[str]:
        """The recipe settings this config does not share, as 'name here vs chain' strings."""
        return [f"{name} {getattr(self, name)} vs {value}" for name, value in recipe_settings(recipe).items()
                if getattr(self, name) != value]

    @classmethod
    def make(cls, **fields: object) -> GRPOConfig:
        """Construct, turning validation errors into one ConfigError line naming the field."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise ConfigError(f"trainer setting {first_validation_problem(exc)}") from None


def recipe_settings(recipe: Recipe) -> dict[str, object]:
    """The GRPOConfig fields a job's recipe fixes, with the recipe's values."""
    return {"epsilon": recipe.clip_epsilon, "delta": recipe.clip_delta, "group_size": recipe.group_size,
            "max_staleness": recipe.max_staleness, "max_new_tokens": recipe.max_new_tokens,
            "temperature": recipe.temperature}

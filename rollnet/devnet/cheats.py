"""The devnet's demonstration cheater: a worker process that departs from honest work in one named way.

Run as `python -m rollnet.devnet.cheats <rollnet node work arguments> --cheat MODE`. Importing this module
registers the cheats with the worker; the ordinary `rollnet` command never imports it, so a production
worker has no cheat to pick. Invariant: each cheat changes only what its name says, so the validator's
rejection reason in the report matches the cheat.
"""

from __future__ import annotations

import copy
import sys

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from rollnet.node.rollout.generate import Rollout
from rollnet.node.worker import TAMPERS, Tamper


def _noisy(model: PreTrainedModel) -> PreTrainedModel:
    """A substituted model: every weight scaled by (1 + 1e-3 noise)."""
    out = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in out.parameters():
            parameter.mul_(1 + 1e-3 * torch.randn(parameter.shape, generator=generator))
    return out


def _fabricate(tokenizer: PreTrainedTokenizerFast) -> Tamper:
    def rewrite(rollouts: list[Rollout]) -> None:
        generator = torch.Generator().manual_seed(1)
        for rollout in rollouts:
            rollout.tokens = torch.randint(0, len(tokenizer), (len(rollout.tokens),), generator=generator).tolist()
            rollout.text = tokenizer.decode(rollout.tokens, skip_special_tokens=True)
        return None

    return Tamper(rollouts=rewrite)


def _wrong_tokens(tokenizer: PreTrainedTokenizerFast) -> Tamper:
    """Writes completions itself (not the seeded sampler's tokens), claiming them as sampled."""

    def rewrite(rollouts: list[Rollout]) -> None:
        for rollout in rollouts:
            rollout.tokens = tokenizer.encode(rollout.text[::-1] or "0") + [tokenizer.eos_token_id]
            rollout.text = tokenizer.decode(rollout.tokens, skip_special_tokens=True)
            rollout.logprobs = [0.0] * len(rollout.tokens)
        return None

    return Tamper(rollouts=rewrite)


TAMPERS.update({
    "fabricate": _fabricate,
    "noise": lambda tokenizer: Tamper(model=_noisy),
    "wrong-tokens": _wrong_tokens,
    "inflate": lambda tokenizer: Tamper(rollouts=lambda rollouts: [1.0] * len(rollouts)),
    "withhold": lambda tokenizer: Tamper(withhold=True),
})


def main() -> int:
    from rollnet.cli import main as rollnet_main

    return rollnet_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())

"""Verifiable sampling: Gumbel-max with noise from a counter-based generator keyed by (task seed, sample
index, position).

Invariant: `gumbel_noise(seed, sample, position, vocab)` is the same on every machine (numpy's Philox,
keyed by a blake2b of the three counters), so the token at each position is argmax(logits / T + noise),
checkable by anyone holding the logits; ties within `tolerance` count as honest (float noise).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def gumbel_noise(task_seed: int, sample: int, position: int, vocab: int) -> np.ndarray:
    key = hashlib.blake2b(f"rollnet-sampler-v1/{task_seed}/{sample}/{position}".encode(), digest_size=16).digest()
    generator = np.random.Generator(np.random.Philox(key=int.from_bytes(key, "little")))
    uniform = generator.random(vocab)
    return -np.log(-np.log(np.clip(uniform, 1e-12, 1 - 1e-12)))


def noise_batch(task_seeds: list[int], samples: list[int], positions: list[int], vocab: int) -> torch.Tensor:
    return torch.from_numpy(np.stack([gumbel_noise(s, i, p, vocab) for s, i, p in
                                      zip(task_seeds, samples, positions, strict=True)])).float()


def pick(logits: torch.Tensor, noise: torch.Tensor, temperature: float) -> torch.Tensor:
    """The seeded sampler's choice for each row of logits."""
    return torch.argmax(logits.float() / temperature + noise, dim=-1)


def choice_margin(logits: torch.Tensor, noise: torch.Tensor, temperature: float, tokens: torch.Tensor) -> torch.Tensor:
    """How far each claimed token's score is below the best score (0 when it is the argmax)."""
    scores = logits.float() / temperature + noise
    return scores.max(dim=-1).values - scores.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

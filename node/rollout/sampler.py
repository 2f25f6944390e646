"""Verifiable sampling: Gumbel-max with noise from a counter-based generator keyed by (task seed, sample
index, position).

Invariant: the noise at (task seed, sample index, position) is the same on every machine (numpy's Philox
keyed by a blake2b of seed and sample; position p takes the stream's uniforms p*V..(p+1)*V), so the token
at each position is argmax(logits / T + noise), checkable by anyone holding the logits; ties within a
small tolerance count as honest (float noise).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def _generator(task_seed: int, sample: int) -> np.random.Generator:
    key = hashlib.blake2b(f"rollnet-sampler-v2/{task_seed}/{sample}".encode(), digest_size=16).digest()
    return np.random.Generator(np.random.Philox(key=int.from_bytes(key, "little")))


def _gumbel(uniform: np.ndarray) -> np.ndarray:
    return -np.log(-np.log(np.clip(uniform, 1e-12, 1 - 1e-12)))


class NoiseStream:
    """The Gumbel noise of one (task seed, sample) sequence, position after position.

    Position p uses uniforms [p * vocab, (p + 1) * vocab) of the sequence's Philox stream, so drawing them
    one position at a time (generation) or all at once (verification) gives the same numbers.
    """

    def __init__(self, task_seed: int, sample: int, vocab: int):
        self._generator = _generator(task_seed, sample)
        self.vocab = vocab

    def next(self) -> np.ndarray:
        return _gumbel(self._generator.random(self.vocab))


def noise_for_positions(task_seed: int, sample: int, count: int, vocab: int) -> torch.Tensor:
    """[count, vocab] noise for positions 0..count-1 of one sequence."""
    uniform = _generator(task_seed, sample).random(count * vocab).reshape(count, vocab)
    return torch.from_numpy(_gumbel(uniform)).float()


def next_noise(streams: list[NoiseStream]) -> torch.Tensor:
    """The next position's noise for every sequence of a batch."""
    return torch.from_numpy(np.stack([stream.next() for stream in streams])).float()


def pick(logits: torch.Tensor, noise: torch.Tensor, temperature: float) -> torch.Tensor:
    """The seeded sampler's choice for each row of logits."""
    return torch.argmax(logits.float() / temperature + noise, dim=-1)


def choice_margin(logits: torch.Tensor, noise: torch.Tensor, temperature: float, tokens: torch.Tensor) -> torch.Tensor:
    """How far each claimed token's score is below the best score (0 when it is the argmax)."""
    scores = logits.float() / temperature + noise
    return scores.max(dim=-1).values - scores.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

"""Verifiable sampling: Gumbel-max with noise from a counter-based generator keyed by (task seed, sample
index, position).

Invariant: the noise at (task seed, sample index, position) is a pure function of those three numbers
(numpy's Philox keyed by a blake2b of seed and sample, float64 uniforms; position p takes the stream's
uniforms p*V..(p+1)*V, clamped into [1e-12, 1 - 1e-12]; the Gumbel transform -log(-log(u)) in float64,
then rounded to float32), so the token at each position is argmax(logits / T + noise),
checkable by anyone holding the logits; scores within a small tolerance of the best count as honest,
for float noise across machines.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

EDGE = 1e-12


def _generator(task_seed: int, sample: int) -> np.random.Generator:
    key = hashlib.blake2b(f"rollnet-sampler-v3/{task_seed}/{sample}".encode(), digest_size=16).digest()
    return np.random.Generator(np.random.Philox(key=int.from_bytes(key, "little")))


def _uniforms(generator: np.random.Generator, count: int) -> np.ndarray:
    return generator.random(count)


def _gumbel(uniform: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(uniform).clamp_(EDGE, 1 - EDGE).log_().neg_().log_().neg_().float()


def noise_for_positions(task_seed: int, sample: int, count: int, vocab: int) -> torch.Tensor:
    """[count, vocab] noise for positions 0..count-1 of one sequence."""
    return _gumbel(_uniforms(_generator(task_seed, sample), count * vocab)).view(count, vocab)


class BatchNoise:
    """Noise for a batch of sequences, drawn a block of positions at a time (one numpy call per sequence
    per block rather than per step); row i of the k-th `next()` is row k of `noise_for_positions` for
    sequence i."""

    BLOCK_VALUES = 1 << 20  # uniforms drawn per refill across the batch, at most

    def __init__(self, seeds: list[int], samples: list[int], vocab: int):
        self._generators = [_generator(seed, sample) for seed, sample in zip(seeds, samples, strict=True)]
        self.vocab = vocab
        self._block = max(1, min(32, self.BLOCK_VALUES // max(1, len(seeds) * vocab)))
        self._buffer = torch.empty(len(seeds), 0, vocab)
        self._used = 0

    def next(self) -> torch.Tensor:
        if self._used == self._buffer.shape[1]:
            uniform = np.stack([_uniforms(g, self._block * self.vocab) for g in self._generators])
            self._buffer = _gumbel(uniform).view(-1, self._block, self.vocab)
            self._used = 0
        self._used += 1
        return self._buffer[:, self._used - 1]


class SequenceNoise:
    """Noise for one sequence, position by position (as a step-by-step engine asks for it), drawn a block of
    positions at a time; `at(p)` is row p of `noise_for_positions`, and asking again for a position is free."""

    BLOCK = 16

    def __init__(self, task_seed: int, sample: int, vocab: int):
        self.task_seed, self.sample, self.vocab = task_seed, sample, vocab
        self._restart()

    def _restart(self) -> None:
        self._generator = _generator(self.task_seed, self.sample)
        self._start = -self.BLOCK  # the first position of the block held
        self._block = torch.empty(0, self.vocab)

    def at(self, position: int) -> torch.Tensor:
        if position < self._start:
            self._restart()  # the stream is sequential: an earlier position means drawing it again
        while position >= self._start + self.BLOCK:
            uniform = _uniforms(self._generator, self.BLOCK * self.vocab)
            self._start += self.BLOCK
            self._block = _gumbel(uniform).view(self.BLOCK, self.vocab)
        return self._block[position - self._start]


def choice_margin(logits: torch.Tensor, noise: torch.Tensor, temperature: float, tokens: torch.Tensor) -> torch.Tensor:
    """How far each claimed token's score is below the best score (0 when it is the argmax)."""
    scores = logits.float() / temperature + noise
    return scores.max(dim=-1).values - scores.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

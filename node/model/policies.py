"""Policy versions for workers and validators: reconstructed from a policy store (anchor checkpoint plus signed
deltas) and checked against the root the trainer published on chain.

Invariant: the model returned for version v has exactly the bf16 weights whose content root the job
published for v (computed in fp32, as workers run them); a store that lacks v, or whose v differs from
the chain's root, is a ConfigError, never a silently wrong policy. The last few versions stay cached.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable

import torch
from rollnet.node.delta.checkpoint import content_root
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import ConfigError, DeltaError, PolicyUnavailable
from transformers import PreTrainedModel, PreTrainedTokenizerFast


def bf16_policy(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The weights workers get: every tensor of the state dict in bf16."""
    return {name: tensor.detach().to(torch.bfloat16).contiguous() for name, tensor in model.state_dict().items()}


class StorePolicies:
    def __init__(self, store: PolicyStore, base: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                 published_root: Callable[[int], bytes], cache: int = 3):
        self.store = store
        self.base = base
        self.tokenizer = tokenizer
        self.published_root = published_root
        self.cache = cache
        self._models: OrderedDict[int, PreTrainedModel] = OrderedDict()

    def __call__(self, version: int) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
        if version not in self._models:
            try:
                tensors = self.store.materialize(version)
            except DeltaError as exc:
                raise PolicyUnavailable(f"cannot reconstruct policy version {version}: {exc}") from None
            if content_root(tensors) != self.published_root(version):
                raise ConfigError(f"policy version {version} in {self.store.folder} differs from the root "
                                  "published on chain")
            model = copy.deepcopy(self.base).eval()
            with torch.no_grad():
                for name, tensor in model.state_dict().items():
                    tensor.copy_(tensors[name])
            self._models[version] = model
            while len(self._models) > self.cache:
                self._models.popitem(last=False)
        self._models.move_to_end(version)
        return self._models[version], self.tokenizer

"""Policy versions for workers and validators: reconstructed from a policy store (anchor checkpoint plus signed
deltas) and checked against the root the trainer published on chain.

Invariant: the model returned for version v has exactly the bf16 weights whose content root the job
published for v (computed in fp32, as workers run them); a store that lacks v, or whose v differs from
the chain's root, is a ConfigError, never a silently wrong policy. The last few versions stay cached.
Reaching a new version costs the deltas since the newest version reached (kept as the store's bf16 weights),
not every delta since the store's anchor: a follower's store holds only the job's base as an anchor, so
rebuilding from it would cost a whole run's deltas at every version. Nothing is pruned here: a validator may
still need an old version (an appeal, a late draw), so every version stays reachable from the base.
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
        self._head: tuple[int, dict[str, torch.Tensor]] | None = None  # the newest version reached, its weights

    def _weights(self, version: int) -> tuple[dict[str, torch.Tensor], bytes | None]:
        """`version`'s bf16 weights: the newest version reached, moved on by the deltas since, where they lead
        there; else rebuilt from the store's anchor. With them, their root when applying the deltas verified
        every tensor against it (None: not verified here)."""
        head = self._head
        verified = None
        try:
            if head is not None and head[0] == version:
                tensors = head[1]
            elif head is not None and head[0] < version and self.store.reaches(head[0], version):
                self._head = None  # an advance that fails part-way leaves no head behind
                tensors = head[1]
                verified = self.store.advance(tensors, head[0], version)
            else:
                tensors = self.store.materialize(version)
        except DeltaError as exc:
            raise PolicyUnavailable(f"cannot reconstruct policy version {version}: {exc}") from None
        if head is None or version >= head[0]:
            self._head = (version, tensors)
        else:
            self._head = head  # an older version was asked for: the newest stays the head
        return tensors, verified

    def __call__(self, version: int) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
        if version not in self._models:
            tensors, verified = self._weights(version)
            root = verified if verified is not None else content_root(tensors)  # advancing hashed every tensor
            if root != self.published_root(version):
                self._head = None
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

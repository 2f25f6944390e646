"""The vLLM rollout backend: the same seeded, proven rollouts as the transformers backend, made by vLLM.

Invariants:
- The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the sampling hook, the hidden-state
  capture and the weight updates below all touch the one model the engine serves.
- Every token vLLM emits for a rollnet request is `argmax(logits / T + noise(seed, sample, position))`, with the
  sampler module's noise: `SeededGumbel` (a vLLM logits processor) computes that token and masks every other
  one, and vLLM's own sampling is greedy. Its log-prob is the one the transformers backend reports.
- The hidden states a completion commits to (TOPLOC) are the final norm's outputs at the rows vLLM computes
  logits from: the last prompt position through the second-to-last completion position, as a validator's
  prefill recomputes them. They stay on the engine's device until the proof is built.
- The engine's weights are always exactly one published policy version: a delta is applied to the engine's
  own parameters (views of its fused tensors, under the checkpoint's names; through a bf16 copy when the
  engine computes in fp32), the CPU's packed GEMM kernels are rebuilt from those parameters, the content
  root is recomputed from them, and a root that differs from the announced one leaves the engine serving no
  version (the worker stops rather than submit) until a good version is written whole.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rollnet.node import toploc
from rollnet.node.delta.checkpoint import content_root
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import ConfigError, DeltaError, PolicyUnavailable
from rollnet.node.model.identity import model_eos_token_ids
from rollnet.node.rollout import sampler
from rollnet.node.rollout.generate import Rollout
from rollnet.node.tasks import TaskInstance

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality  # noqa: E402

REQUEST_KEY = "rollnet"
_REQUESTS = itertools.count()  # request keys, unique within the process


@dataclass
class _Sequence:
    """One rollnet request inside the engine: its noise stream and what each generated position recorded."""

    noise: sampler.SequenceNoise
    temperature: float
    output: list[int] = field(default_factory=list)  # vLLM's live list of this request's generated tokens
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)

    def record(self, position: int, token: int, logprob: float, hidden: torch.Tensor) -> None:
        # A position can be computed twice (a prompt prefilled in chunks first samples a discarded token):
        # the last computation wins.
        del self.tokens[position:], self.logprobs[position:], self.hidden[position:]
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.hidden.append(hidden)


class _Capture:
    """The rows vLLM computes logits from in the current step (final-norm outputs, in batch order)."""

    def __init__(self) -> None:
        self.rows: torch.Tensor | None = None
        self.sequences: dict[str, _Sequence] = {}
        self.lock = threading.Lock()

    def hook(self, _module: torch.nn.Module, args: tuple) -> None:
        self.rows = args[1]  # LogitsProcessor.forward(lm_head, hidden_states, ...)


CAPTURE = _Capture()


class SeededGumbel(LogitsProcessor):
    """vLLM logits processor: for rollnet requests, force the seeded Gumbel-max token and record its log-prob
    and hidden state; other requests pass through untouched."""

    def __init__(self, vllm_config: object, device: torch.device, is_pin_memory: bool):
        self.rows: dict[int, _Sequence] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            key = (params.extra_args or {}).get(REQUEST_KEY)
            if key is None:
                self.rows.pop(index, None)
                continue
            sequence = CAPTURE.sequences[key]
            sequence.output = output
            self.rows[index] = sequence
        for first, second, direction in batch_update.moved:
            a, b = self.rows.pop(first, None), self.rows.pop(second, None)
            if a is not None:
                self.rows[second] = a
            if direction is MoveDirectionality.SWAP and b is not None:
                self.rows[first] = b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        indices = sorted(self.rows)
        sequences = [self.rows[i] for i in indices]
        positions = [len(sequence.output) for sequence in sequences]
        rows = torch.tensor(indices, device=logits.device)
        noise = torch.stack([s.noise.at(p) for s, p in zip(sequences, positions, strict=True)])
        temperature = torch.tensor([[s.temperature] for s in sequences])
        # The same operations, in the same order, as the transformers backend's sampling step.
        scaled = logits[rows].float() / temperature.to(logits.device)
        chosen = torch.argmax(scaled + noise.to(logits.device), dim=-1)
        logprobs = scaled.gather(-1, chosen[:, None])[:, 0] - torch.logsumexp(scaled, -1)
        hidden = CAPTURE.rows[rows]  # one gather of this step's committed rows; it stays on the device
        for k, (sequence, position, token, logprob) in enumerate(
                zip(sequences, positions, chosen.tolist(), logprobs.tolist(), strict=True)):
            sequence.record(position, token, logprob, hidden[k])
        logits[rows] = float("-inf")
        logits[rows, chosen] = 0.0
        return logits


class EngineWeights(MutableMapping[str, torch.Tensor]):
    """The engine's parameters under the checkpoint's tensor names: each is a view into vLLM's (possibly
    fused) parameter, so writing into it changes what the engine serves."""

    def __init__(self, model: torch.nn.Module, names: dict[str, tuple[int, ...]]):
        params = dict(model.named_parameters())
        packed = getattr(model, "packed_modules_mapping", {}) or {}
        self._views: dict[str, torch.Tensor] = {}
        for name, shape in names.items():
            view = self._locate(name, names, params, packed)
            if view is None or tuple(view.shape) != shape:
                raise ConfigError(f"the vLLM engine has no parameter matching checkpoint tensor {name!r} {shape}")
            self._views[name] = view

    @staticmethod
    def _locate(name: str, names: dict[str, tuple[int, ...]], params: dict, packed: dict) -> torch.Tensor | None:
        rows = names[name][0]
        if name in params:  # vLLM may pad a vocabulary dimension: the checkpoint's rows come first
            return params[name].data[:rows]
        if name == "lm_head.weight" and "model.embed_tokens.weight" in params:  # tied: vLLM keeps one tensor
            return params["model.embed_tokens.weight"].data[:rows]
        for fused, parts in packed.items():
            for i, part in enumerate(parts):
                if f".{part}." not in f".{name}":
                    continue
                fused_name = name.replace(f"{part}.", f"{fused}.", 1)
                if fused_name in params:  # the parts sit along dim 0, in the order the mapping lists them
                    start = sum(names[name.replace(f"{part}.", f"{p}.", 1)][0] for p in parts[:i])
                    return params[fused_name].data[start: start + rows]
        return None

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._views[name]

    def __setitem__(self, name: str, tensor: torch.Tensor) -> None:
        self._views[name].copy_(tensor)

    def __delitem__(self, name: str) -> None:
        raise ConfigError(f"a delta may not remove tensor {name!r} from a running engine")

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)


def _pack_for_cpu() -> Callable[[torch.nn.Module], None] | None:
    """On a CPU, vLLM hands each linear layer's weight to a packed GEMM kernel (oneDNN or SGL) that keeps its own
    copy, and then drops the parameter, so an in-place update would never reach it. Here the parameters stay
    (the tensors `EngineWeights` edits); the returned function packs a layer again from them, and the backend
    calls it on every packed layer after each weight update. None off the CPU, where weights are used as they are."""
    from vllm.model_executor.layers import utils
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    pack = getattr(utils.dispatch_cpu_unquantized_gemm, "rollnet_original", utils.dispatch_cpu_unquantized_gemm)

    def keep_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        pack(layer, remove_weight=False)

    keep_weight.rollnet_original = pack  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = keep_weight
    return lambda layer: pack(layer, remove_weight=False)


class VllmBackend:
    """Rollouts from an in-process vLLM engine; see the module invariants."""

    name = "vllm"
    _shared: dict[tuple[Path, str], VllmBackend] = {}

    @classmethod
    def shared(cls, folder: Path, dtype: str = "float32") -> VllmBackend:
        """This process's engine for `folder` and `dtype`, started on first use (a start takes tens of seconds,
        and one process holds one engine's memory, not one per caller)."""
        key = (folder.resolve(), dtype)
        if key not in cls._shared:
            cls._shared[key] = cls(folder, dtype=dtype)
        return cls._shared[key]

    def __init__(self, folder: Path, *, dtype: str = "float32", max_model_len: int | None = None, seed: int = 0,
                 kv_cache_gib: float = 1.0):
        from rollnet.node.model.loading import load_policy

        self.folder = folder
        reference, self.tokenizer = load_policy(folder)
        self._shapes = {name: tuple(t.shape) for name, t in reference.state_dict().items()}
        self._vocab = reference.config.vocab_size  # the logits' width, as the transformers backend samples them
        # Every EOS ends a completion, as on the transformers backend and in the validators' bounds check.
        self._stops = list(model_eos_token_ids(reference, self.tokenizer))
        del reference
        self._pack = _pack_for_cpu()
        try:
            self.llm = LLM(model=str(folder), dtype=dtype, enforce_eager=True, skip_tokenizer_init=True,
                           max_model_len=max_model_len, logits_processors=[SeededGumbel], seed=seed,
                           enable_prefix_caching=False, max_num_batched_tokens=8192,
                           async_scheduling=False, kv_cache_memory_bytes=int(kv_cache_gib * (1 << 30)))
        except (ValueError, RuntimeError, OSError) as exc:  # an architecture or setting this vLLM cannot serve
            raise ConfigError(f"vLLM cannot serve the model in {folder}: {str(exc).splitlines()[0]}") from None
        self.llm.apply_model(lambda model: model.logits_processor.register_forward_pre_hook(CAPTURE.hook))
        (self.weights,) = self.llm.apply_model(lambda model: EngineWeights(model, self._shapes))
        in_place = all(view.dtype == torch.bfloat16 and view.device.type == "cpu" for view in self.weights.values())
        # Deltas are bf16 bit patterns decoded on the host: a bf16 engine on the CPU takes them in its own tensors,
        # any other (fp32, or on a GPU) through a bf16 host copy that is then written into the engine.
        self._policy: MutableMapping[str, torch.Tensor] = self.weights if in_place else {
            name: view.to(device="cpu", dtype=torch.bfloat16) for name, view in self.weights.items()}
        self.version: int | None = None  # None: the folder's weights as loaded, not (yet) a published version

    def generate(self, instances: list[TaskInstance], group_size: int, *, max_new_tokens: int,
                 temperature: float = 1.0, policy_version: int = 0, policy_root: str = "",
                 prove: bool = True, ignore_eos: bool = False) -> list[Rollout]:
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        requests, keys = [], []
        with CAPTURE.lock:
            for instance in instances:
                prompt = self.tokenizer.encode(instance.prompt)
                for sample in range(group_size):
                    key = str(next(_REQUESTS))
                    CAPTURE.sequences[key] = _Sequence(sampler.SequenceNoise(instance.seed, sample, self._vocab),
                                                       temperature)
                    keys.append((key, prompt, instance.seed, sample))
                    requests.append(TokensPrompt(prompt_token_ids=prompt))
            params = [SamplingParams(temperature=0.0, max_tokens=max_new_tokens, detokenize=False,
                                     stop_token_ids=[] if ignore_eos else self._stops, ignore_eos=ignore_eos,
                                     extra_args={REQUEST_KEY: key}) for key, *_ in keys]
            try:
                outputs = self.llm.generate(requests, params, use_tqdm=False)
                sequences = [CAPTURE.sequences[key] for key, *_ in keys]
            finally:
                for key, *_ in keys:
                    CAPTURE.sequences.pop(key, None)
        rollouts = []
        for (_key, prompt, seed, sample), output, sequence in zip(keys, outputs, sequences, strict=True):
            emitted = list(output.outputs[0].token_ids)
            if emitted != sequence.tokens[: len(emitted)] or len(sequence.tokens) != len(emitted):
                raise RuntimeError(f"vLLM emitted {emitted}, but the seeded sampler chose {sequence.tokens}")
            rollouts.append(Rollout(seed, sample, prompt, emitted, sequence.logprobs,
                                    self.tokenizer.decode(emitted, skip_special_tokens=True),
                                    policy_version, policy_root))
        if prove:
            proofs = toploc.prove_many([torch.stack(s.hidden) for s in sequences])
            for rollout, proof in zip(rollouts, proofs, strict=True):
                rollout.proofs = proof
        return rollouts

    def serve_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Write whole weights (every checkpoint tensor) into the engine; it then serves no published version."""
        self.version = None
        with torch.no_grad():
            for name, tensor in tensors.items():
                self.weights[name] = tensor
        self._repack()
        if self._policy is not self.weights:
            for name, view in self.weights.items():
                self._policy[name].copy_(view)

    def _repack(self) -> None:
        """Make the engine's kernels compute with the parameters as they are now (see `_pack_for_cpu`)."""
        if self._pack is not None:
            pack = self._pack
            self.llm.apply_model(lambda model: [pack(m) for m in model.modules() if hasattr(m, "cpu_linear")])

    def move_to(self, version: int, store: PolicyStore, root: bytes) -> None:
        """Serve policy `version` (content root `root`): the deltas from the version served now are applied to
        the engine's weights in place (a full write from the store when there is no delta chain), then the root
        of what the engine actually holds is checked. On any failure the engine serves no version."""
        previous, self.version = self.version, None
        try:
            if previous is not None and previous < version and store.reaches(previous, version):
                store.advance(self._policy, previous, version)
            else:
                for name, tensor in store.materialize(version).items():
                    self._policy[name].copy_(tensor)
        except DeltaError as exc:
            raise PolicyUnavailable(f"cannot bring the vLLM engine to policy version {version}: {exc}") from None
        if self._policy is not self.weights:
            for name, tensor in self._policy.items():
                self.weights[name] = tensor
        self._repack()
        held = self.weights_root()
        if held != root:
            raise ConfigError(f"the vLLM engine's weights after moving to version {version} have root "
                              f"{held.hex()[:16]}..., not the published {root.hex()[:16]}...: not submitting")
        self.version = version

    def weights_root(self) -> bytes:
        """The content root of the weights the engine serves, in the checkpoint's dtype (bf16)."""
        return content_root({name: view.to(device="cpu", dtype=torch.bfloat16) for name, view in self.weights.items()})


class VllmEngine:
    """Published policy versions served by one vLLM engine (see `VllmBackend.move_to`)."""

    def __init__(self, backend: VllmBackend, store: PolicyStore, published_root: Callable[[int], bytes]):
        self.backend, self.store, self.published_root = backend, store, published_root

    def at(self, version: int) -> VllmBackend:
        if self.backend.version != version:
            self.backend.move_to(version, self.store, self.published_root(version))
        return self.backend

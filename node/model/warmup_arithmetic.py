"""The embedded model's warm-up arithmetic, made of operations whose bits no CPU chooses.

MKL's vector math (VML), which ATen calls for float `sqrt`, `rsqrt`, `sin`, `cos`, `exp`, `log`, `tanh` and
their kin on contiguous tensors, picks its kernels by CPU and rounds within an ulp rather than correctly:
an Intel Sapphire Rapids core and an AMD one return other last bits for the same `torch.sqrt` (here about
15% of float32 inputs differ by one ulp from the correctly rounded root under MKL_CBWR=COMPATIBLE), and a
warm-up of ten AdamW steps then builds other weights. So the warm-up replaces the four such operations its
model and optimiser use:

- AdamW's square root of the second moment: numpy's float32 square root (IEEE 754 requires a correctly
  rounded root, and every x86 `sqrtps` gives it);
- RMSNorm's reciprocal square root: 1 / that root (two correctly rounded operations), with the gradient
  -0.5 * grad * r^3 from products alone;
- the rotary embedding's cos and sin: a table over every position, each entry the float32 rounding of the
  C library's double `cos`/`sin` of the float32 angle position * inv_freq (inv_freq likewise from the
  double `pow`); a double result one ulp off would change the float32 rounding about once in 2^29 entries,
  and the table has 256 x head_dim of them.

Invariant: a warm-up step under `pin_model` and `PinnedAdamW` calls none of ATen's VML-backed operators
(tests/test_model_and_tasks.py traces one step), so with MKL's BLAS pinned to its vendor-independent branch
(`builder.PINNED_ARITHMETIC`) and ATen pinned to its AVX2 kernels, its floating-point results are the same
on every x86-64 CPU with AVX2 and FMA. The model saved afterwards is an ordinary Qwen2 checkpoint: the
replacements are instance attributes, never written.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
from transformers import Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm, Qwen2RotaryEmbedding

# ATen operators that reach MKL's vector math for float tensors (aten/src/ATen/cpu/vml.h): the warm-up uses none.
VML_BACKED_OPS = frozenset({
    "aten.sqrt", "aten.rsqrt", "aten.exp", "aten.expm1", "aten.log", "aten.log10", "aten.log1p", "aten.log2",
    "aten.sin", "aten.cos", "aten.tan", "aten.tanh", "aten.asin", "aten.acos", "aten.atan", "aten.erf",
    "aten.erfc", "aten.erfinv", "aten.trunc", "aten.lgamma",
})


def exact_sqrt(tensor: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of a float32 tensor, computed by numpy (a new tensor)."""
    return torch.from_numpy(np.sqrt(tensor.detach().contiguous().numpy()))


class _ExactRsqrt(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, value: torch.Tensor) -> torch.Tensor:
        result = torch.from_numpy(np.float32(1.0) / np.sqrt(value.detach().contiguous().numpy()))
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (result,) = ctx.saved_tensors
        return grad * -0.5 * result * result * result  # d(v^-1/2)/dv = -1/2 v^-3/2 = -1/2 r^3


def _rms_norm(norm: Qwen2RMSNorm, hidden_states: torch.Tensor) -> torch.Tensor:
    """Qwen2RMSNorm.forward with its rsqrt made of correctly rounded operations."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * _ExactRsqrt.apply(variance + norm.variance_epsilon)
    return norm.weight * hidden_states.to(input_dtype)


def rotary_tables(rotary: Qwen2RotaryEmbedding) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * inv_freq for every position the config allows, shape (positions, head_dim)."""
    config = rotary.config
    if rotary.rope_type != "default":
        raise ValueError(f"the warm-up's rotary tables implement default RoPE, not {rotary.rope_type!r}")
    base = float(config.rope_parameters["rope_theta"])
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    exponents = [float(np.float32(i) / np.float32(dim)) for i in range(0, dim, 2)]
    inv_freq = np.float32(1.0) / np.array([math.pow(base, e) for e in exponents], dtype=np.float32)
    positions = np.arange(config.max_position_embeddings, dtype=np.float32)
    angles = positions[:, None] * inv_freq[None, :]  # float32 products, as the model's forward forms them
    angles = np.concatenate([angles, angles], axis=1)
    cos = np.array([[math.cos(float(a)) for a in row] for row in angles], dtype=np.float32)
    sin = np.array([[math.sin(float(a)) for a in row] for row in angles], dtype=np.float32)
    scale = np.float32(rotary.attention_scaling)
    return torch.from_numpy(cos * scale), torch.from_numpy(sin * scale)


def pin_model(model: Qwen2ForCausalLM) -> Qwen2ForCausalLM:
    """Route `model`'s RMSNorms and rotary embedding through the functions above (in place; returns it)."""
    for module in model.modules():
        if isinstance(module, Qwen2RMSNorm):
            module.forward = _rms_norm.__get__(module)  # type: ignore[method-assign]
        elif isinstance(module, Qwen2RotaryEmbedding):
            cos, sin = rotary_tables(module)

            def rotary(x: torch.Tensor, position_ids: torch.Tensor, cos: torch.Tensor = cos,
                       sin: torch.Tensor = sin) -> tuple[torch.Tensor, torch.Tensor]:
                return cos[position_ids].to(dtype=x.dtype), sin[position_ids].to(dtype=x.dtype)

            module.forward = rotary  # type: ignore[method-assign]
    return model


class PinnedAdamW:
    """AdamW without weight decay, as torch's single-tensor form computes it, but with `exact_sqrt`:
    m <- m + (1 - beta1)(g - m); v <- beta2 v + (1 - beta2) g^2; p <- p - (lr / (1 - beta1^t)) m / d,
    where d = sqrt(v) / sqrt(1 - beta2^t) + eps."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        self.steps = 0
        self.first = [torch.zeros_like(p) for p in self.params]
        self.second = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        step_size = self.lr / (1 - self.beta1 ** self.steps)
        correction_root = math.sqrt(1 - self.beta2 ** self.steps)
        for param, first, second in zip(self.params, self.first, self.second, strict=True):
            if param.grad is None:
                continue
            grad = param.grad
            first.lerp_(grad, 1 - self.beta1)
            second.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            denominator = exact_sqrt(second).div_(correction_root).add_(self.eps)
            param.addcdiv_(first, denominator, value=-step_size)

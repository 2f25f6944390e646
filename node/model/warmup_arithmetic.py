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
- the rotary embedding's cos and sin: a table over positions (grown as sequences need), each entry the
  float32 rounding of the C library's double `cos`/`sin` of the float32 angle position * inv_freq (the
  module's own inv_freq); a double result one ulp off would change the float32 rounding about once in 2^29
  entries, and the table has 256 x head_dim of them.

Invariant: a warm-up step under `pin_model` and `PinnedAdamW` calls none of ATen's VML-backed operators
(tests/test_model_and_tasks.py profiles one step and a greedy evaluation), so with MKL's BLAS pinned to its
vendor-independent branch and ATen to its AVX2 kernels, Sleef's vector exp and log included
(`builder.PINNED_ARITHMETIC`), its floating-point results are the same on every x86-64 CPU with AVX2 and FMA.
The model saved afterwards is an ordinary Qwen2 checkpoint: the replacements are instance attributes, never
written.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
from transformers import Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm, Qwen2RotaryEmbedding

# ATen operators (as the profiler names them) that reach MKL's vector math for float tensors, or may
# (aten/src/ATen/cpu/vml.h): the warm-up uses none.
VML_BACKED_OPS = frozenset(f"aten::{name}{suffix}" for name in (
    "sqrt", "rsqrt", "exp", "expm1", "log", "log10", "log1p", "log2", "sin", "cos", "tan", "tanh", "asin", "acos",
    "atan", "erf", "erfc", "erfinv", "trunc", "lgamma") for suffix in ("", "_"))


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


class RotaryTable:
    """cos and sin of position * inv_freq, one row per position, grown on demand (a long sequence needs more
    rows than `max_position_embeddings`, as the stock module allows). inv_freq is the module's own buffer,
    so angles are the float32 products the stock forward forms."""

    def __init__(self, rotary: Qwen2RotaryEmbedding):
        if rotary.rope_type != "default":
            raise ValueError(f"the warm-up's rotary tables implement default RoPE, not {rotary.rope_type!r}")
        self.inv_freq = rotary.inv_freq.detach().to(torch.float32).numpy().copy()
        self.scale = np.float32(rotary.attention_scaling)
        self.cos = torch.empty(0, 2 * len(self.inv_freq))
        self.sin = torch.empty(0, 2 * len(self.inv_freq))
        self.grow(rotary.config.max_position_embeddings)

    def grow(self, positions: int) -> None:
        """Rows for positions 0 .. positions-1 (rows already computed stay as they are)."""
        have = self.cos.shape[0]
        if positions <= have:
            return
        angles = np.arange(have, positions, dtype=np.float32)[:, None] * self.inv_freq[None, :]
        angles = np.concatenate([angles, angles], axis=1)
        cos = np.array([[math.cos(float(a)) for a in row] for row in angles], dtype=np.float32) * self.scale
        sin = np.array([[math.sin(float(a)) for a in row] for row in angles], dtype=np.float32) * self.scale
        self.cos = torch.cat([self.cos, torch.from_numpy(cos)])
        self.sin = torch.cat([self.sin, torch.from_numpy(sin)])

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if position_ids.numel() and int(position_ids.min()) < 0:
            raise ValueError("negative position ids")
        self.grow(int(position_ids.max()) + 1 if position_ids.numel() else 0)
        return self.cos[position_ids].to(dtype=x.dtype), self.sin[position_ids].to(dtype=x.dtype)


def pin_model(model: Qwen2ForCausalLM) -> Qwen2ForCausalLM:
    """Route `model`'s RMSNorms and rotary embedding through the functions above (in place; returns it)."""
    for module in model.modules():
        if isinstance(module, Qwen2RMSNorm):
            module.forward = _rms_norm.__get__(module)  # type: ignore[method-assign]
        elif isinstance(module, Qwen2RotaryEmbedding):
            module.forward = RotaryTable(module)  # type: ignore[method-assign]
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

"""In-place scaling of precomputed gradients by an incoming gradient, in one Triton launch that does
nothing when that gradient is 1.

The fused rasterization kernel (kernels/fused_raster.py) computes a loss and all its gradients in
one launch, before autograd knows the gradient flowing into the loss; its autograd function then
multiplies the saved gradients by that scalar. In training the scalar is almost always exactly 1
(``loss.backward()``), and multiplying by 1 changes no float (x * 1 == x, signed zeros, infinities
and NaNs included), so the launch's programs read the scalar on the device and return at once when
it is 1: no host synchronization, and no pass over the gradients (on a 2 M-Gaussian image the pass
reads and writes about 144 MB). Any other value (a weighted loss, AMP's loss scale) scales every
element, as ``x.mul_(factor)`` does.

PyTorch reference: :func:`scale_reference`; other devices than CUDA / ROCm, and machines without
Triton, run it.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only torch wheels
    triton = None

BLOCK = 2048
MAX_PROGRAMS = 1024  # a grid-stride loop beyond this: few programs to start when the factor is 1


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit(do_not_specialize=["num", "num_programs"])
    def _scale_kernel(x_ptr, factor_ptr, num, num_programs, BLOCK: tl.constexpr):
        factor = tl.load(factor_ptr)
        if factor != 1.0:
            start = tl.program_id(0).to(tl.int64) * BLOCK
            step = num_programs.to(tl.int64) * BLOCK
            for base in range(start, num.to(tl.int64), step):  # 64-bit bounds: numel may pass 2^31
                offs = base + tl.arange(0, BLOCK)
                mask = offs < num
                x = tl.load(x_ptr + offs, mask=mask)
                tl.store(x_ptr + offs, x * factor, mask=mask)


def scale_reference(x: Tensor, factor: Tensor) -> None:
    """REFERENCE: x *= factor in place."""
    x.mul_(factor)


def scale_(x: Tensor, factor: Tensor) -> None:
    """x *= factor in place, skipping the pass when factor == 1 (decided on the device).

    x: contiguous float32 tensor (any shape; numel may exceed 2^31); factor: one float32 element on
    x's device. Raises ValueError otherwise. CUDA / ROCm tensors: one Triton launch (CPU tensors too
    under TRITON_INTERPRET=1, as the tests run it); elsewhere :func:`scale_reference`."""
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError(f"scale_: x must be contiguous float32, got {x.dtype} (contiguous: {x.is_contiguous()})")
    if factor.numel() != 1 or factor.dtype != torch.float32 or factor.device != x.device:
        raise ValueError(
            f"scale_: factor must be one float32 element on {x.device}, got {factor.dtype} {tuple(factor.shape)} on {factor.device}"
        )
    num = x.numel()
    if num == 0:
        return
    if triton is None or (x.device.type != "cuda" and not _interpreting()):
        scale_reference(x, factor)
        return
    programs = min(triton.cdiv(num, BLOCK), MAX_PROGRAMS)
    _scale_kernel[(programs,)](x, factor, num, programs, BLOCK=BLOCK)


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"

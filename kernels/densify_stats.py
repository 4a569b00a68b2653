"""Densification statistics of one step in one Triton launch.

gsplat's DefaultStrategy accumulates, per Gaussian, the norm of the image-plane gradient of its 2D
mean in NDC (``grad2d``) over the views that saw it, and how many views saw it (``count``);
trainer/densify.py decides when to grow from them. In PyTorch that is ten small operations a step
(scale, hypot, visibility mask, masked sum over cameras, count); here it is one program per block
of Gaussians that loops over the step's cameras.

Dense layout: grads [C, N, 2] (pixels), radii [C, N, 2] (int32, 0 = not seen);
    grad2d[n] += sum_c seen(c, n) * hypot(sx_c * gx, sy_c * gy),  count[n] += sum_c seen(c, n),
    seen(c, n) = radii[c, n, 0] > 0 and radii[c, n, 1] > 0.
Packed layout: grads [R, 2] of visible records, gaussian_ids [R]: the same sums with atomics.
sx_c, sy_c: the NDC scale of camera c (width / 2 and height / 2 times the cameras of the pass;
see densify.ndc_gradient_norms). PyTorch reference: kernels.reference.densify_stats_update.
"""

from __future__ import annotations

from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only torch wheels
    triton = None

BLOCK = 1024


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit(do_not_specialize=["num", "num_cameras"])
    def _dense_kernel(grad_ptr, radii_ptr, scale_ptr, grad2d_ptr, count_ptr, num, num_cameras, BLOCK: tl.constexpr):
        offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)  # C x N x 2 may pass 2^31
        mask = offs < num
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        seen_count = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(num_cameras):
            row = c * num.to(tl.int64) + offs  # c * num alone would be 32-bit
            rx = tl.load(radii_ptr + 2 * row, mask=mask, other=0)
            ry = tl.load(radii_ptr + 2 * row + 1, mask=mask, other=0)
            seen = mask & (rx > 0) & (ry > 0)  # the gradients of records not seen are not read
            gx = tl.load(grad_ptr + 2 * row, mask=seen, other=0.0) * tl.load(scale_ptr + 2 * c)
            gy = tl.load(grad_ptr + 2 * row + 1, mask=seen, other=0.0) * tl.load(scale_ptr + 2 * c + 1)
            acc += tl.where(seen, tl.sqrt(gx * gx + gy * gy), 0.0)
            seen_count += tl.where(seen, 1.0, 0.0)
        upd = seen_count > 0.0  # a Gaussian no camera saw keeps its sums: not read, not written
        tl.store(grad2d_ptr + offs, tl.load(grad2d_ptr + offs, mask=upd, other=0.0) + acc, mask=upd)
        tl.store(count_ptr + offs, tl.load(count_ptr + offs, mask=upd, other=0.0) + seen_count, mask=upd)

    @triton.jit(do_not_specialize=["num"])
    def _packed_kernel(grad_ptr, ids_ptr, cams_ptr, scale_ptr, grad2d_ptr, count_ptr, num, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # 2 * offs passes 2^31 at 2^30 records
        mask = offs < num
        cam = tl.load(cams_ptr + offs, mask=mask, other=0)
        gx = tl.load(grad_ptr + 2 * offs, mask=mask, other=0.0) * tl.load(scale_ptr + 2 * cam, mask=mask, other=0.0)
        gy = tl.load(grad_ptr + 2 * offs + 1, mask=mask, other=0.0) * tl.load(
            scale_ptr + 2 * cam + 1, mask=mask, other=0.0
        )
        ids = tl.load(ids_ptr + offs, mask=mask, other=0)
        tl.atomic_add(grad2d_ptr + ids, tl.sqrt(gx * gx + gy * gy), mask=mask)
        tl.atomic_add(count_ptr + ids, tl.full([BLOCK], 1.0, tl.float32), mask=mask)


def accumulate(
    grad2d: Tensor,
    count: Tensor,
    grads: Tensor,
    scales: Tensor,
    radii: Tensor | None = None,
    gaussian_ids: Tensor | None = None,
    camera_ids: Tensor | None = None,
) -> None:
    """kernels.reference.densify_stats_update in one launch on a CUDA/ROCm device (or the CPU under
    TRITON_INTERPRET=1). All float tensors float32; radii int32; ids int32 or int64."""
    grads = grads.contiguous()
    scales = scales.contiguous()
    if gaussian_ids is not None:
        assert camera_ids is not None, "packed statistics need camera_ids"
        num = grads.shape[0]
        if num:
            _packed_kernel[(triton.cdiv(num, BLOCK),)](
                grads, gaussian_ids.contiguous(), camera_ids.contiguous(), scales, grad2d, count, num, BLOCK=BLOCK
            )
        return
    assert radii is not None, "dense statistics need radii"
    num_cameras, num = grads.shape[0], grads.shape[1]
    if num:
        _dense_kernel[(triton.cdiv(num, BLOCK),)](
            grads, radii.contiguous(), scales, grad2d, count, num, num_cameras, BLOCK=BLOCK
        )

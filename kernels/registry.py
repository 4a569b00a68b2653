"""Every Triton kernel of splat_train.kernels at the configuration its host code launches, for the
ahead-of-time compiles of kernels/resources.py (scripts/kernel_resources.py prints the table).
A spec is (jit function, constexpr values, pointer element types, scalar types, num_warps).
The fused rasterization kernel is native code (kernels/csrc), not listed here."""

from __future__ import annotations

from typing import Optional, Union

from . import adam
from . import densify_stats as ds
from . import fused_ssim as fs
from . import lazy_adam as la
from . import projection as pj
from . import sparse_comm as sc
from .resources import compile_spec


def kernel_specs() -> dict:
    """name -> spec, for every Triton kernel of the package."""
    ints = {n: "*i32" for n in ("bits_ptr", "bitmap_ptr", "counts_ptr", "offsets_ptr", "packed_ptr")}
    rows = dict(BLOCK_R=sc.BLOCK_ROWS, BLOCK_D=16)
    adam_args = dict(
        {f"{k}{i}": "*fp32" for k in "pgmv" for i in range(adam.MAX_TENSORS)},
        **{f"{k}{i}": "fp32" for k in "sc" for i in range(adam.MAX_TENSORS)},
        beta1="fp32",
        beta2="fp32",
        eps="fp32",
        vis="*u8",
        cnt="*fp32",  # unused but with MASKED
        seen="*fp32",  # unused but with SEEN
    )
    ssim = fs.kernel_specs()
    proj = pj.kernel_specs()
    return {
        **{k: ssim[k] for k in ("ssim_forward", "ssim_backward", "l1_ssim_forward", "l1_ssim_backward")},
        "adam": (
            adam._adam_kernel,
            dict(BLOCK=adam.BLOCK, SELECTIVE=False, MASKED=False, SEEN=False),
            {},
            adam_args,
            4,
        ),
        # --visible_adam: gsplat's SelectiveAdam update, visible Gaussians only
        "adam_selective": (
            adam._adam_kernel,
            dict(BLOCK=adam.BLOCK, SELECTIVE=True, MASKED=False, SEEN=False),
            {},
            adam_args,
            4,
        ),
        # --lazy_sh_adam: sh0 / shN step their seen rows only, the rest densely
        "adam_lazy": (
            adam._adam_kernel,
            dict(BLOCK=adam.BLOCK, SELECTIVE=False, MASKED=True, SEEN=False),
            {},
            dict(adam_args, vis="*i32", cnt="*i32"),
            4,
        ),
        # ... and the unseen Gaussians' geometric gradient rows, left unwritten, read as zeros by their bits
        "adam_lazy_seen": (
            adam._adam_kernel,
            dict(BLOCK=adam.BLOCK, SELECTIVE=False, MASKED=True, SEEN=True),
            {},
            dict(adam_args, vis="*i32", cnt="*i32", seen="*i32"),
            4,
        ),
        "densify_dense": (ds._dense_kernel, dict(BLOCK=ds.BLOCK), {"radii_ptr": "*i32"}, {}, 4),
        "densify_packed": (ds._packed_kernel, dict(BLOCK=ds.BLOCK), {"ids_ptr": "*i64", "cams_ptr": "*i64"}, {}, 4),
        "loss_combine": ssim["loss_combine"],
        # fused projection + SH of the dense pass and its per-Gaussian backward (SH degree 3)
        "projection_forward": proj["projection_forward"],
        # --lazy_sh_adam: the forward catching the seen SH rows up and colouring them again; the flush of
        # every row, the seen rows' list and their count stamped after the step's Adam
        "projection_catch_up": proj["projection_catch_up"],
        "projection_listed_colors": proj["projection_listed_colors"],
        **la.kernel_specs(),
        "projection_backward": proj["projection_backward"],
        "projection_backward_lazy": proj["projection_backward_lazy"],
        "projection_backward_adam": proj["projection_backward_adam"],
        "projection_backward_adam_selective": proj["projection_backward_adam_selective"],
        "sparse_mark": (sc._mark_kernel, rows, ints, {}, 4),
        "sparse_count": (sc._count_kernel, dict(BLOCK_R=sc.BLOCK_ROWS), ints, {}, 4),
        "sparse_compact": (sc._compact_kernel, rows, ints, {}, 4),
        "sparse_scatter_add": (
            sc._scatter_kernel,
            dict(rows, MODE=2),
            dict(ints, index_ptr="*i64", packed_ptr="*fp32"),
            {},
            4,
        ),
    }


def compile_kernel(name: str, target: Union[str, object], num_warps: Optional[int] = None, **constants) -> dict:
    """resources.compile_spec for kernel ``name`` of :func:`kernel_specs`. Raises ValueError for an
    unknown kernel or target."""
    specs = kernel_specs()
    if name not in specs:
        raise ValueError(f"unknown kernel {name!r}; one of {sorted(specs)}")
    return compile_spec(name, specs[name], target, num_warps, **constants)

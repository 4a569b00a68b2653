"""Registers, spills and shared memory of the fused rasterization kernel for a GPU target, from an
ahead-of-time compile (no GPU needed).

Triton compiles the kernel for the target exactly as it would at the first launch on that GPU; the
counts are read from the compiled code object: for CUDA, ``cuobjdump --dump-resource-usage`` of
the cubin (the tool ships with Triton's NVIDIA backend), for HIP the ``.vgpr_count`` /
``.vgpr_spill_count`` metadata of the AMDGCN assembly. A configuration that spills keeps part of
its per-pixel state in local (off-chip, cached) memory.

The kernel's pixels x Gaussians blocks ([256, K] fp32, one value per thread per Gaussian of the
chunk) live in registers, so the chunk length K decides whether a tile's state stays on chip:
kernels/fused_raster.py uses :func:`largest_spill_free` to pick its chunk lengths per device.
scripts/kernel_resources.py prints the table for any target.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Union

INT_POINTERS = ("offsets_ptr", "flatten_ptr", "tile_ids_ptr")
INT_SCALARS = ("width", "height", "tile_width", "num_tiles")


def _signature(kernel, constants: dict) -> tuple[dict, dict]:
    sig = {}
    for name in kernel.arg_names:
        if name in constants:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*i32" if name in INT_POINTERS else "*fp32"
        else:
            sig[name] = "i32" if name in INT_SCALARS else "fp32"
    names = list(kernel.arg_names)
    return sig, {(names.index(k),): v for k, v in constants.items()}


def _cuda_usage(cubin: bytes) -> dict:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([str(tool), "--dump-resource-usage", str(path)], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    if m is None:
        raise RuntimeError(f"cuobjdump printed no resource line:\n{out}")
    regs, stack, shared, local = (int(v) for v in m.groups())
    return dict(registers=regs, spill_bytes=stack + local, static_shared_bytes=shared)


def _hip_usage(amdgcn: str) -> dict:
    """From the AMDGCN assembly's kernel metadata: VGPRs per lane, scratch (private segment) bytes
    per lane, which is where spilled registers go, and the static LDS (group segment) size."""
    def field(name):
        m = re.search(rf"\.{name}:\s+(\d+)", amdgcn)
        if m is None:
            raise RuntimeError(f"the AMDGCN metadata has no .{name}")
        return int(m.group(1))

    return dict(registers=field("vgpr_count"), spill_bytes=field("private_segment_fixed_size"),
                static_shared_bytes=field("group_segment_fixed_size"))


def parse_target(target: str):
    """``"cuda:90"`` / ``"hip:gfx942"`` -> triton GPUTarget. Raises ValueError otherwise."""
    from triton.backends.compiler import GPUTarget

    backend, _, arch = target.partition(":")
    if backend == "cuda" and arch.isdigit():
        return GPUTarget("cuda", int(arch), 32)
    if backend == "hip" and arch:
        return GPUTarget("hip", arch, 64)
    raise ValueError(f"target {target!r} is neither cuda:<compute capability> nor hip:<gfx arch>")


def target_name(gpu) -> str:
    return f"{gpu.backend}:{gpu.arch}"


def compile_config(target: Union[str, object], resident: bool, K: int, num_warps: int) -> dict:
    """Compile one configuration of ``_fused_raster_loss_kernel`` for ``target`` (a "cuda:90" /
    "hip:gfx942" string or a triton GPUTarget). Returns {target, variant, K, num_warps, threads,
    compile_s, registers (per thread), spill_bytes (per thread), shared_bytes}. Raises ValueError
    for an unknown target, and whatever Triton raises when the configuration does not compile."""
    import triton
    from triton.compiler import ASTSource

    from . import fused_raster as fr

    gpu = parse_target(target) if isinstance(target, str) else target
    backend, warp = gpu.backend, gpu.warp_size
    constants = dict(HAS_BG=True, RETURN_IMAGE=False, ABSGRAD=False, RESIDENT=resident, K=K,
                     TS=fr.TILE_SIZE, WIN=fr.SSIM_WINDOW)
    sig, constexprs = _signature(fr._fused_raster_loss_kernel, constants)
    t0 = time.perf_counter()
    compiled = triton.compile(ASTSource(fn=fr._fused_raster_loss_kernel, signature=sig, constexprs=constexprs),
                              target=gpu, options=dict(num_warps=num_warps))
    seconds = time.perf_counter() - t0
    usage = _cuda_usage(compiled.asm["cubin"]) if backend == "cuda" else _hip_usage(compiled.asm["amdgcn"])
    usage["shared_bytes"] = max(int(compiled.metadata.shared), usage.pop("static_shared_bytes"))
    return dict(target=target_name(gpu), variant="resident" if resident else "streaming", K=K, num_warps=num_warps,
                threads=num_warps * warp, compile_s=round(seconds, 1), **usage)




def largest_spill_free(usage: Callable[[int], dict], candidates: Iterable[int]) -> int:
    """The largest K of the increasing ``candidates`` whose ``usage(K)["spill_bytes"]`` is 0, trying
    them in order and stopping at the first that spills (register use grows with K). Returns the
    first candidate when even that one spills (the kernel still works, from local memory)."""
    candidates = list(candidates)
    best = candidates[0]
    for k in candidates:
        if usage(k)["spill_bytes"] > 0:
            break
        best = k
    return best

"""Registers, spills and shared memory of the package's Triton kernels for a GPU target, from an
ahead-of-time compile (no GPU needed). (The per-tile Gaussian budget, a run-time figure, is
kernels/budget.py.)

Triton compiles the kernel for the target exactly as it would at the first launch on that GPU; the
counts are read from the compiled code object: for CUDA, ``cuobjdump --dump-resource-usage`` of
the cubin (the tool ships with Triton's NVIDIA backend), for HIP the ``.vgpr_count`` /
``.vgpr_spill_count`` metadata of the AMDGCN assembly. A configuration that spills keeps part of
its per-pixel state in local (off-chip, cached) memory.

The SSIM kernels take the fewest warps that compile without spilling (:func:`spill_free_warps`);
scripts/kernel_resources.py prints the table for any target. The fused rasterization kernel is
native code (kernels/csrc; ``nvcc -Xptxas -v`` reports its registers), not in this table.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union


def _signature(kernel, constants: dict, pointers: dict, scalars: dict) -> tuple[dict, dict]:
    """Triton signature of ``kernel``: constexpr for ``constants``; a ``*_ptr`` argument is
    ``pointers.get(name, "*fp32")``, any other ``scalars.get(name, "i32")``."""
    sig = {}
    for name in kernel.arg_names:
        if name in constants:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = pointers.get(name, "*fp32")
        else:
            sig[name] = scalars.get(name, "i32")
    names = list(kernel.arg_names)
    return sig, {(names.index(k),): v for k, v in constants.items()}


def _cuda_usage(cubin: bytes) -> dict:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run(
            [str(tool), "--dump-resource-usage", str(path)], capture_output=True, text=True, check=True
        ).stdout
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

    return dict(
        registers=field("vgpr_count"),
        spill_bytes=field("private_segment_fixed_size"),
        static_shared_bytes=field("group_segment_fixed_size"),
    )


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


def compile_spec(
    name: str, spec: tuple, target: Union[str, object], num_warps: Optional[int] = None, **constants
) -> dict:
    """Compile kernel ``name`` described by ``spec`` (jit function, constexpr values, pointer element
    types, scalar types, default num_warps; kernels/registry.py holds every kernel's) for ``target``
    (a "cuda:90" / "hip:gfx942" string or a triton GPUTarget), with ``constants`` overriding its
    constexpr values. Returns
    {kernel, target, num_warps, threads, compile_s, registers (per thread), spill_bytes (per
    thread), shared_bytes}. Raises ValueError for an unknown target or kernel, and whatever Triton
    raises when the kernel does not compile for that target."""
    import triton
    from triton.compiler import ASTSource

    fn, consts, pointers, scalars, default_warps = spec
    num_warps = default_warps if num_warps is None else num_warps
    gpu: Any = parse_target(target) if isinstance(target, str) else target
    sig, constexprs = _signature(fn, dict(consts, **constants), pointers, scalars)
    t0 = time.perf_counter()
    compiled = triton.compile(
        ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=gpu, options=dict(num_warps=num_warps)
    )
    seconds = time.perf_counter() - t0
    if gpu.backend == "cuda":
        usage = _cuda_usage(compiled.asm["cubin"])
    else:
        usage = _hip_usage(compiled.asm["amdgcn"])
    usage["shared_bytes"] = max(int(compiled.metadata.shared), usage.pop("static_shared_bytes"))
    return dict(
        kernel=name,
        target=target_name(gpu),
        num_warps=num_warps,
        threads=num_warps * gpu.warp_size,
        compile_s=round(seconds, 1),
        **usage,
    )


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


def device_target(device):
    """The triton GPUTarget of a CUDA / ROCm torch device (Triton's driver, for that device)."""
    import torch
    from triton.runtime import driver

    with torch.cuda.device(device):
        return driver.active.get_current_target()


WARP_CANDIDATES = (4, 8, 16)
_WARPS: dict = {}


def spill_free_warps(
    name: str, specs: Callable[[], dict], device, default: int = 4, candidates: Iterable[int] = WARP_CANDIDATES
) -> int:
    """The fewest warps (wavefronts on AMD) per program, of ``candidates``, at which kernel ``name``
    of ``specs()`` (the calling module's kernel_specs, read on a cache miss) compiles for ``device``
    without spilling; more warps share a tile's work, so each thread holds
    less. ``default`` on CPU / the interpreter, when every candidate spills, or (with a warning)
    when the compile probe fails. Cached per (kernel, device); Triton caches the compiles."""
    import warnings

    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return default
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    key = (name, str(dev))
    if key not in _WARPS:
        chosen = default
        try:
            target = device_target(dev)
            for w in candidates:
                if compile_spec(name, specs()[name], target, w)["spill_bytes"] == 0:
                    chosen = w
                    break
        except Exception as e:  # pragma: no cover - depends on the GPU toolchain
            warnings.warn(
                f"{name}: could not measure register use on {dev} ({type(e).__name__}: {e}); "
                f"launching with {default} warps"
            )
        _WARPS[key] = chosen
    return _WARPS[key]

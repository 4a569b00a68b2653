"""Builds and loads the native fused rasterization kernel (kernels/csrc) on first use.

The CUDA C++ source is compiled with ``torch.utils.cpp_extension.load``, as gsplat compiles its
own: for the GPUs of this machine (``TORCH_CUDA_ARCH_LIST`` when set), into
``$SPLAT_TRAIN_CACHE/torch_extensions/<name>`` when SPLAT_TRAIN_CACHE is set, else torch's
default extensions directory (``TORCH_EXTENSIONS_DIR`` or ~/.cache/torch_extensions). ninja
rebuilds only when a source changed, so the second start loads the cached module. On ROCm
builds of PyTorch cpp_extension hipifies the same source (kernels/csrc/portability.h keeps
the warp-level operations portable).

:func:`load` returns the module, or None with one clear line on stderr when it cannot be built
here: a CPU-only torch, no CUDA toolkit (nvcc / hipcc), a compiler error. The reason is kept in
:data:`LOAD_ERROR`; the caller then takes the unfused path.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Optional

CSRC = Path(__file__).resolve().parent / "csrc"
# the binding (host compiler, torch headers) and the device code (nvcc / hipcc, no torch headers)
SOURCES = ("fused_raster_ext.cpp", "fused_raster_device.cu")
HEADERS = ("fused_raster.cuh", "fused_raster_params.h", "portability.h", "bind_common.h")
NAME = "splat_train_fused_raster"

_MODULE = None
LOAD_ERROR: Optional[str] = None
_LOCK = threading.Lock()


def build_directory(name: str) -> Optional[str]:
    """``$SPLAT_TRAIN_CACHE/torch_extensions/<name>`` (created) when SPLAT_TRAIN_CACHE is set, else
    None (torch's default)."""
    root = os.environ.get("SPLAT_TRAIN_CACHE")
    if not root:
        return None
    path = Path(root) / "torch_extensions" / name
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def _why_not() -> Optional[str]:
    """Why the CUDA/HIP extension cannot be built here (None when it may be)."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA/ROCm device visible"
    if torch.version.cuda is None and torch.version.hip is None:
        return "this PyTorch has no CUDA/ROCm support"
    from torch.utils import cpp_extension

    home = cpp_extension.ROCM_HOME if torch.version.hip else cpp_extension.CUDA_HOME
    if home is None:
        return "no CUDA toolkit (nvcc) found; set CUDA_HOME" if torch.version.cuda else "no ROCm toolkit found"
    return None


def device_flags() -> list:
    """nvcc / hipcc flags of the device code: -O3, C++17 and, on CUDA, denormals flushed to zero
    (-ftz=true: no subnormal fix-ups around the exponential and the reciprocal)."""
    import torch

    return ["-O3", "-std=c++17"] + (["-ftz=true"] if torch.version.hip is None else [])


def load(verbose: bool = False, quiet: bool = False):
    """The compiled extension module, or None (:data:`LOAD_ERROR` set, and unless ``quiet`` one line
    on stderr) when it cannot be built on this machine. Builds once per process; cached on disk
    across processes (the first build takes a minute or so: nvcc)."""
    global _MODULE, LOAD_ERROR
    with _LOCK:
        if _MODULE is not None or LOAD_ERROR is not None:
            return _MODULE
        reason = _why_not()
        if reason is None:
            try:
                from torch.utils import cpp_extension

                _MODULE = cpp_extension.load(
                    name=NAME,
                    sources=[str(CSRC / s) for s in SOURCES],
                    extra_include_paths=[str(CSRC)],
                    extra_cflags=["-O3"],
                    extra_cuda_cflags=device_flags(),
                    build_directory=build_directory(NAME),
                    verbose=verbose,
                )
            except Exception as e:  # noqa: BLE001 - a compiler failure is reported, not raised
                first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
                reason = f"build failed ({type(e).__name__}: {first[:200]})"
        if _MODULE is None:
            LOAD_ERROR = reason
            if not quiet:
                print(unavailable_warning(), file=sys.stderr, flush=True)
        return _MODULE


def unavailable_warning(raster: str = "fused") -> str:
    """The one line saying that the native kernel could not be built, and why (:data:`LOAD_ERROR`);
    ``raster``: the --raster value that asked for it."""
    return f"warning: --raster {raster}: the native kernel is unavailable ({LOAD_ERROR}); using the unfused path"


def available() -> bool:
    """Whether :func:`load` gives a module (builds it if needed)."""
    return load() is not None


_EMU = None


def load_cpu_emulation(verbose: bool = False):
    """TESTS ONLY: the same kernel source compiled for the CPU under tests/csrc/cpu_emu.h (one host
    thread per GPU thread; slow). Its ``fused_raster_loss`` takes the warp size first. Raises when
    it cannot be built (no C++20 compiler / ninja)."""
    global _EMU
    if _EMU is None:
        from torch.utils import cpp_extension

        tests = Path(__file__).resolve().parent.parent / "tests" / "csrc"
        name = NAME + "_cpu_emu"
        _EMU = cpp_extension.load(
            name=name,
            sources=[str(tests / "emu_ext.cpp")],
            extra_include_paths=[str(CSRC), str(tests)],
            extra_cflags=["-O1", "-std=c++20", "-pthread"],
            extra_ldflags=["-pthread"],
            build_directory=build_directory(name),
            verbose=verbose,
        )
    return _EMU

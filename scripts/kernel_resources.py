"""Compile the package's Triton kernels ahead of time for GPU targets and report the registers,
spills and shared memory each uses, on any machine (no GPU needed).

    python -m splat_train.scripts.kernel_resources --targets cuda:90 hip:gfx942

Triton compiles each kernel for the named target (``cuda:<compute capability>`` or
``hip:<gfx arch>``) exactly as it would on that GPU at first launch, at the configuration its host
code launches; the resource counts are read from the compiled code object: for CUDA,
``cuobjdump --dump-resource-usage`` of the cubin (the tool ships with Triton's NVIDIA backend),
for HIP the ``.vgpr_count`` / ``.vgpr_spill_count`` metadata of the AMDGCN assembly. A kernel
that spills keeps part of its state in local (off-chip, cached) memory. Output: one markdown table
on stdout, one JSON row per kernel with ``--json FILE``.

The fused rasterization kernel is native CUDA / HIP code (kernels/csrc), not Triton: ``nvcc
-arch=sm_90 -Xptxas -v -c kernels/csrc/fused_raster_device.cu`` reports its registers, and
.ci/run compiles it for AMD gfx90a.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from splat_train.kernels.registry import compile_kernel, kernel_specs
from splat_train.kernels.resources import parse_target


def _error(e: Exception) -> str:
    text = str(e).splitlines()[0][:120] if str(e) else ""
    return f"{type(e).__name__}: {text}"


def table(rows: list[dict]) -> str:
    """One row per (target, kernel at its launch configuration)."""
    lines = [
        "| target | kernel | warps | threads | registers/thread | spill bytes/thread | shared bytes |",
        "|" + "---|" * 7,
    ]
    for r in rows:
        key = f"| {r['target']} | {r['kernel']} | {r['num_warps']} |"
        if "error" in r:
            lines.append(f"{key} - | error: {r['error']} | | |")
        else:
            lines.append(f"{key} {r['threads']} | {r['registers']} | {r['spill_bytes']} | {r['shared_bytes']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m splat_train.scripts.kernel_resources", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--targets", nargs="+", default=["cuda:90", "hip:gfx942"])
    p.add_argument("--all_kernels", action="store_true", help="kept for old command lines: every kernel is listed")
    p.add_argument("--json", help="also write the rows to this JSON file")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        print(
            "error: kernel_resources needs Triton (pip install 'triton>=3.3'; CPU-only torch wheels ship without it)",
            file=sys.stderr,
        )
        return 2
    for target in args.targets:
        try:
            parse_target(target)
        except ValueError as e:
            print(f"error: --targets: {e}", file=sys.stderr)
            return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the default Triton uses at launch
    rows = []
    for target in args.targets:
        for name in kernel_specs():
            try:
                rows.append(compile_kernel(name, target))
            except Exception as e:  # a kernel that does not compile for a target is a result too
                rows.append(dict(target=target, kernel=name, num_warps="-", error=_error(e)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    print(table(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

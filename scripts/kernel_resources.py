"""Compile the fused rasterization kernel ahead of time for a GPU target and report the registers,
spills and shared memory each configuration uses, on any machine (no GPU needed).

    python -m splat_train.scripts.kernel_resources --targets cuda:90 hip:gfx942 --k 16 32 64
    python -m splat_train.scripts.kernel_resources --all_kernels     # every kernel, both vendors

Triton compiles the kernel for the named target (``cuda:<compute capability>`` or
``hip:<gfx arch>``) exactly as it would on that GPU at first launch; the resource counts are read
from the compiled code object: for CUDA, ``cuobjdump --dump-resource-usage`` of the cubin (the
tool ships with Triton's NVIDIA backend), for HIP the ``.vgpr_count`` / ``.vgpr_spill_count``
metadata of the AMDGCN assembly. A configuration that spills keeps part of its per-pixel state in
local (off-chip, cached) memory: on a GPU it is slower than the count of its loads suggests. Output:
one markdown table on stdout, one JSON row per configuration with ``--json FILE``.

The kernel's pixels x Gaussians blocks ([256, K] fp32) live in registers, so the chunk length K,
not the shared-memory capacity, decides whether a tile's state stays on chip; at run time
kernels/fused_raster.py makes the same compile for the device it runs on and picks the largest
spill-free K (kernels/resources.py). This script shows the whole table, for any vendor.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from splat_train.kernels.resources import compile_config, compile_kernel, kernel_specs, parse_target


def _error(e: Exception) -> str:
    text = str(e).splitlines()[0][:120] if str(e) else ""
    return f"{type(e).__name__}: {text}"


def table(rows: list[dict]) -> str:
    """Fused-raster sweep rows (with variant and K) or whole-package rows (kernel at its launch config)."""
    sweep = any("variant" in r for r in rows)
    first = "| target | variant | K | warps |" if sweep else "| target | kernel | warps |"
    lines = [first + " threads | registers/thread | spill bytes/thread | shared bytes |",
             "|" + "---|" * (8 if sweep else 7)]
    for r in rows:
        key = f"| {r['target']} | {r['variant']} | {r['K']} | {r['num_warps']} |" if sweep else \
            f"| {r['target']} | {r['kernel']} | {r['num_warps']} |"
        if "error" in r:
            lines.append(f"{key} - | error: {r['error']} | | |")
        else:
            lines.append(f"{key} {r['threads']} | {r['registers']} | {r['spill_bytes']} | {r['shared_bytes']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m splat_train.scripts.kernel_resources",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", nargs="+", default=["cuda:90", "hip:gfx942"])
    p.add_argument("--variants", nargs="+", default=["streaming", "resident"], choices=["streaming", "resident"])
    p.add_argument("--k", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--num_warps", type=int, nargs="+", default=[4, 8])
    p.add_argument("--all_kernels", action="store_true",
                   help="instead of the fused-raster sweep: every Triton kernel of the package at its "
                        "default launch configuration (a portability check; at run time the SSIM kernels "
                        "take the fewest warps that do not spill on the device)")
    p.add_argument("--json", help="also write the rows to this JSON file")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    for k in args.k:
        if k < 1 or k & (k - 1):
            print(f"error: --k {k}: chunk lengths must be powers of two", file=sys.stderr)
            return 2
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        print("error: kernel_resources needs Triton (pip install 'triton>=3.3'; CPU-only torch wheels ship "
              "without it)", file=sys.stderr)
        return 2
    for target in args.targets:
        try:
            parse_target(target)
        except ValueError as e:
            print(f"error: --targets: {e}", file=sys.stderr)
            return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the default Triton uses at launch
    rows = []
    if args.all_kernels:
        for target in args.targets:
            for name in kernel_specs():
                try:
                    rows.append(compile_kernel(name, target))
                except Exception as e:  # a kernel that does not compile for a target is a result too
                    rows.append(dict(target=target, kernel=name, num_warps="-", error=_error(e)))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    for target in [] if args.all_kernels else args.targets:
        for variant in args.variants:
            for k in args.k:
                for w in args.num_warps:
                    try:
                        row = compile_config(target, variant == "resident", k, w)
                    except Exception as e:  # a configuration that does not compile is a result too
                        row = dict(target=target, variant=variant, K=k, num_warps=w, error=_error(e))
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    print(table(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

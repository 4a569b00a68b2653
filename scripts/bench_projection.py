"""Times the fused projection + SH kernels (kernels/projection.py) against the path they replace
(model.activated + render.project_and_shade with gsplat's ops), forward and backward, on one GPU,
and prints each one's achieved bandwidth from the bytes model (projection.traffic).

    python -m splat_train.scripts.bench_projection [--gaussians 20000000] [--cameras 1]
        [--resolution 1920x1080] [--sh_degree 3] [--layout all|tenth] [--antialiased]
        [--repeats 20] [--warmup 3] [--json FILE]

The scene is synthetic, made on the GPU: cameras at the origin (C > 1: moved 0.5 scene units
apart along x) looking down +z with fx = fy = the image width; means 2-20 units deep, inside the
view (``--layout all``) or spread over ten times its width and sorted along x (``tenth``: a camera
sees about a tenth of the Gaussians, and they are neighbours in memory, as in a spatially ordered
shard); log-scales in [-4.5, -2.5], random quaternions, SH coefficients and logit opacities.
Each direction is timed alone with CUDA events (the backward from fixed random output gradients),
``--warmup`` untimed calls first, then the median of ``--repeats``. The fused outputs' largest
relative difference from gsplat's on the records both keep is printed as a sanity check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from splat_train.kernels import projection
from splat_train.trainer.model import activated
from splat_train.trainer.render import camera_centres, ops_for, project_and_shade

NEAR, FAR = 0.01, 1e10


def make_scene(n: int, C: int, width: int, height: int, layout: str, K: int, device) -> tuple[dict, list]:
    """Raw parameters and the cameras (viewmats, Ks, campos) of the module docstring's scene."""
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=device)

    z = 2 + rand(n) * 18
    spread = 10.0 if layout == "tenth" else 1.0
    x = (rand(n) - 0.5) * z * spread
    y = (rand(n) - 0.5) * z * height / width
    means = torch.stack([x, y, z], -1)
    if layout == "tenth":
        means = means[torch.argsort(x)]
    params = dict(
        means=means.contiguous(),
        quats=torch.randn(n, 4, generator=gen, device=device),
        scales=rand(n, 3) * 2 - 4.5,
        opacities=torch.randn(n, generator=gen, device=device),
        sh0=torch.randn(n, 1, 3, generator=gen, device=device) * 0.5,
        shN=torch.randn(n, K - 1, 3, generator=gen, device=device) * 0.1,
    )
    viewmats = torch.eye(4, device=device).repeat(C, 1, 1)
    viewmats[:, 0, 3] = -0.5 * torch.arange(C, device=device)
    f = float(width)
    Ks = torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]], device=device).repeat(C, 1, 1)
    return params, [viewmats, Ks, camera_centres(viewmats)]


def time_ms(fn, warmup: int, repeats: int) -> float:
    """Median CUDA-event time of ``fn()``, milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench_path(name: str, run, params: dict, grads: dict, warmup: int, repeats: int) -> tuple[dict, dict]:
    """(forward ms, backward ms) of ``run(leaves) -> outputs``, and the outputs."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    keys = list(grads)
    out = run(leaves)
    forward = time_ms(lambda: run(leaves), warmup, repeats)

    def backward():
        o = run(leaves)
        torch.autograd.backward([o[k] for k in keys], [grads[k] for k in keys])
        for v in leaves.values():
            v.grad = None

    both = time_ms(backward, warmup, repeats)
    return dict(path=name, forward_ms=forward, backward_ms=both - forward), {k: v.detach() for k, v in out.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m splat_train.scripts.bench_projection", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--gaussians", type=int, default=20_000_000)
    p.add_argument("--cameras", type=int, default=1)
    p.add_argument("--resolution", default="1920x1080", help="WxH pixels")
    p.add_argument("--sh_degree", type=int, default=3)
    p.add_argument("--layout", choices=["all", "tenth"], default="all")
    p.add_argument("--antialiased", action="store_true")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", help="also write the rows to this JSON file")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        width, height = (int(v) for v in args.resolution.lower().split("x"))
    except ValueError:
        print(f"error: --resolution must be WxH, got {args.resolution!r}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or not projection.available():
        print("error: bench_projection needs a CUDA/ROCm GPU and Triton", file=sys.stderr)
        return 2
    if args.gaussians < 1 or not 1 <= args.cameras <= projection.MAX_CAMERAS or not 0 <= args.sh_degree <= 3:
        print("error: --gaussians >= 1, --cameras 1..32, --sh_degree 0..3", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    N, C, K, deg = args.gaussians, args.cameras, (args.sh_degree + 1) ** 2, args.sh_degree
    params, cams = make_scene(N, C, width, height, args.layout, K, dev)
    gen = torch.Generator(device=dev).manual_seed(1)
    shapes = dict(means2d=(C, N, 2), conics=(C, N, 3), opacities=(C, N), colors=(C, N, 3))
    grads = {k: torch.randn(s, generator=gen, device=dev) for k, s in shapes.items()}
    ops = ops_for("gsplat", dev)

    def unfused(leaves):
        return project_and_shade(ops, activated(leaves), *cams, [(width, height)] * C, deg, NEAR, FAR, False,
                                 "pinhole", args.antialiased)  # fmt: skip

    def fused(leaves):
        return projection.project_and_shade_fused(leaves, *cams, width, height, deg, NEAR, FAR,
                                                  antialiased=args.antialiased)  # fmt: skip

    rows, outs = [], {}
    for name, run in (("gsplat (activated + project_and_shade)", unfused), ("fused", fused)):
        row, outs[name] = bench_path(name, run, params, grads, args.warmup, args.repeats)
        rows.append(row)
        torch.cuda.empty_cache()
    gsplat_out, fused_out = outs.values()
    seen = (fused_out["radii"] > 0).all(-1)
    both = seen & (gsplat_out["radii"] > 0).all(-1)
    visible = int(seen.any(0).sum())
    t = projection.traffic(N, C, K, deg, visible=visible, visible_records=int(seen.sum()))
    for row in rows:
        row.update(forward_gbs=t.forward / row["forward_ms"] / 1e6, backward_gbs=t.backward / row["backward_ms"] / 1e6)
    diffs = {
        k: float(((fused_out[k] - gsplat_out[k])[both].abs().max() / gsplat_out[k][both].abs().max()).item())
        for k in ("means2d", "depths", "conics", "opacities", "colors")
    }
    print(f"N = {N}, C = {C}, {width}x{height}, SH degree {deg}, layout {args.layout}, visible {visible / N:.1%}")
    print(f"bytes model: forward {t.forward / 1e9:.2f} GB, backward {t.backward / 1e9:.2f} GB")
    print("| path | forward ms | forward GB/s | backward ms | backward GB/s |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['path']} | {r['forward_ms']:.2f} | {r['forward_gbs']:.0f} | {r['backward_ms']:.2f} | "
              f"{r['backward_gbs']:.0f} |")  # fmt: skip
    print(f"fused vs gsplat, largest relative difference on records both keep: {diffs}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(args=vars(args), rows=rows, diffs=diffs, visible=visible), indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Rasterization + loss + backward on the same inputs: gsplat's rasterizer, the SSIM + L1 loss and
gsplat's backward (the unfused step) against the fused native kernel (kernels/fused_raster.py).

    splat-train bench-raster [--data_dir DIR --data_factor 4 | --synthetic_gaussians N --resolution WxH
        [--synthetic_layout orbit|city]]
        [--ckpt RUN/ckpts/ckpt_<step>_rank*.pt] [--batch_size C] [--packed]
        [--fused [default ...]] [--repeats 30] [--warmup 5] [--profile CALLS] [--out DIR]

The inputs are one training batch of the trainer (W = 1): the model is the initial one, or the
checkpoint's (its shards merged); the cameras are the first ``--batch_size`` training views
(``--views`` picks others); projection and SH run once and their records, tile lists and
ground truth are reused by every timed call. Each call is timed alone, forward and backward to
the records' gradients (CUDA events on a GPU; wall clock on the CPU, where the fused path is the
PyTorch reference), ``--warmup`` untimed calls first, then the median and 90th percentile of
``--repeats``.

The unfused loss is the trainer's (full-image SSIM, valid padding; ``losses.photometric_loss``),
timed with every SSIM implementation available (``--unfused_ssim``); the fastest unfused row is the
baseline of the "vs fastest unfused" column, so no speedup comes from a slow convolution SSIM. The
fused loss is the kernel's tile-local SSIM, so the two losses differ by design. Repeated fused rows
(``--fused default default``) compute the same function; the table reports each one's largest
relative difference from the first in loss and record gradients (atomics reorder sums), and its
caption says what ran the fused rows.

``--profile CALLS`` runs each step CALLS more times under ``torch.profiler`` and adds, per row, the
time of its GPU kernels (on the CPU: of its operators) per call, the launches, and the largest
ones (``trainer.profiling.profile_calls``): with the wall-clock median it separates kernel time
from host time, and shows how much of the fused step runs in the fallback's kernels.

Writes ``bench_raster.json`` and ``bench_raster.md`` into ``--out`` (atomically) and prints the table.
"""

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

GRAD_FIELDS = ("means2d", "conics", "colors", "opacities")


def parse(argv):
    from splat_train.scripts.bench import add_scene_args

    p = argparse.ArgumentParser(prog="splat-train bench-raster", description=__doc__.split("\n\n")[0])
    add_scene_args(p)
    p.add_argument("--ckpt", nargs="+", help="a run's checkpoint shards of one step (merged into one model)")
    p.add_argument("--batch_size", type=int, default=1, help="images per call")
    p.add_argument("--views", type=int, nargs="*", help="training views to render (default: the first batch_size)")
    p.add_argument("--packed", action="store_true", help="packed records (as --packed training)")
    p.add_argument(
        "--fused",
        nargs="*",
        default=["default"],
        help="fused rows: 'default' once per row (the native kernel has no tuning knobs); none: skip",
    )
    p.add_argument("--ssim_lambda", type=float, default=0.2)
    p.add_argument(
        "--unfused_ssim",
        nargs="+",
        choices=["pytorch", "triton", "fused_ssim"],
        help="SSIM implementations of the unfused rows (default: every one available on the device); "
        "the fastest unfused row is the baseline",
    )
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="CALLS",
        help="also run each step CALLS more times under torch.profiler and report, per call, the time "
        "of its kernels (GPU) or operators (CPU) and the largest ones (0: off)",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--out", default="results/bench_raster")
    return p.parse_args(argv)


def _fused_configs(specs) -> list:
    """'default' -> ("fused (default)", {}) per spec. Raises ValueError on anything else (the Triton
    kernel's STREAM_CHUNK:NUM_WARPS[:BUDGET] tuning configurations are gone with it)."""
    out: list[tuple[str, dict]] = []
    for spec in specs:
        if spec != "default":
            raise ValueError(f"--fused {spec!r}: the native fused kernel has no tuning configurations; use 'default'")
        out.append(("fused (default)", {}))
    return out


def capture_inputs(args) -> dict:
    """One batch's records, tile lists and ground truth, as the trainer hands them to rasterization."""
    from splat_train.scripts.bench import build_scene, check_scene_args
    from splat_train.trainer import checkpoint
    from splat_train.trainer.config import from_argv
    from splat_train.trainer.launch import DistContext
    from splat_train.trainer.loop import Trainer
    from splat_train.trainer.model import activated
    from splat_train.trainer.render import render

    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and device.type != "cuda":
        raise ValueError("--device cuda: no CUDA/ROCm device is visible")
    check_scene_args(args)
    scene = build_scene(argparse.Namespace(**dict(vars(args), device=device.type)))
    layout = [] if args.data_dir else ["--synthetic_layout", args.synthetic_layout]  # its near and far planes
    cfg = from_argv(["default", "--batch_size", str(args.batch_size), *layout] + (["--packed"] if args.packed else []))
    trainer = Trainer(cfg, DistContext(device=device), scene)
    if args.ckpt:
        trainer.load_state_dict(checkpoint.load_shard([Path(f) for f in args.ckpt], 0, 1), restore_rng=False)
    views = args.views or list(range(args.batch_size))
    if len(views) != args.batch_size or not all(0 <= v < len(trainer.trainset) for v in views):
        raise ValueError(f"--views: {args.batch_size} indices in [0, {len(trainer.trainset)}) needed, got {views}")
    batch = trainer.trainset.batch(views)
    cams = trainer.setup.camera_batch(batch)
    with torch.no_grad():
        result = render(
            activated(trainer.params),
            cams,
            trainer.ctx,
            trainer.ops,
            trainer.sh_degree_at(trainer.step),
            packed=cfg.step.packed,
            near=cfg.step.near_plane,
            far=cfg.step.far_plane,
            rasterize=False,
        )
    info, rec, tiles = result.info, result.info.records, result.info.tiles
    assert rec is not None and tiles is not None
    fields = {k: getattr(rec, k).detach().float().contiguous() for k in GRAD_FIELDS}
    return dict(
        fields,
        isect_offsets=tiles.offsets,
        flatten_ids=tiles.flatten_ids,
        gts=batch["image"].to(device).float(),
        width=int(info.width),
        height=int(info.height),
        packed=cfg.step.packed,
        ops=trainer.ops,
        backend=trainer.backend,
        device=device,
        num_gaussians=int(trainer.params["means"].shape[0]),
        num_isects=int(tiles.flatten_ids.numel()),
        step=trainer.step,
        visible_fraction=None  # of the batch's cameras
        if scene.visible_fraction is None
        else [float(scene.visible_fraction[trainer.trainset.indices[v]]) for v in views],
    )


def _leaves(inputs):
    return [inputs[k].clone().requires_grad_(True) for k in GRAD_FIELDS]


def unfused_step(inputs, ssim_lambda, ssim_backend):
    """gsplat rasterize_to_pixels -> (1 - l) L1 + l (1 - SSIM) -> backward. Returns (loss, grads)."""
    from splat_train.kernels.constants import TILE_SIZE
    from splat_train.trainer.losses import photometric_loss

    leaves = _leaves(inputs)
    means2d, conics, colors, opacities = leaves
    image, _ = inputs["ops"].rasterize_to_pixels(
        means2d,
        conics,
        colors,
        opacities,
        inputs["width"],
        inputs["height"],
        TILE_SIZE,
        inputs["isect_offsets"],
        inputs["flatten_ids"],
        packed=inputs["packed"],
    )
    loss, _ = photometric_loss(image, inputs["gts"], ssim_lambda, ssim_padding="valid", ssim_backend_name=ssim_backend)
    return loss.detach(), torch.autograd.grad(loss, leaves)


@functools.lru_cache(maxsize=None)
def _trainer_scratch_mb(device: str) -> float:
    """The fused kernel's scratch cap the trainer's plan would take on ``device`` (a CUDA device;
    trainer/step/plan.scratch_mode, no model counted), read once per device: not inside the timed
    calls."""
    from splat_train.trainer.step.plan import scratch_mode

    free, total = torch.cuda.mem_get_info(torch.device(device))
    return scratch_mode("cuda", total, free)


def fused_step(inputs, ssim_lambda, config):
    """The fused kernel (forward, tile-local loss, backward in one) -> (loss, grads, stats)."""
    from splat_train.kernels.fused_raster import fused_raster_loss

    leaves = _leaves(inputs)
    device = leaves[0].device
    if device.type == "cuda" and "scratch_mb" not in config:
        config = dict(config, scratch_mb=_trainer_scratch_mb(str(device)))
    loss, stats = fused_raster_loss(
        *leaves,
        inputs["isect_offsets"],
        inputs["flatten_ids"],
        inputs["gts"],
        inputs["width"],
        inputs["height"],
        ssim_lambda,
        packed=inputs["packed"],
        fallback=inputs["ops"],
        **config,
    )
    return loss.detach(), torch.autograd.grad(loss, leaves), stats


def time_calls(fn, device, warmup: int, repeats: int) -> tuple[list, Any]:
    """Per-call milliseconds of ``repeats`` calls after ``warmup``; and the last call's output."""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t0) * 1000.0)
    return times, out


def available_ssim(device) -> list:
    """The SSIM implementations that run on ``device``: pytorch always; on a GPU also this
    project's Triton kernel and the fused_ssim package when they import."""
    from splat_train.trainer import losses

    out = ["pytorch"]
    if device.type == "cuda":
        out += [
            name
            for name, fn in (("triton", losses._triton_ssim_fn), ("fused_ssim", losses._fused_ssim_fn))
            if fn() is not None
        ]
    return out


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def run(args) -> dict:
    from splat_train.trainer.profiling import profile_calls

    configs = _fused_configs(args.fused)
    if not 0.0 <= args.ssim_lambda <= 1.0:
        raise ValueError(f"--ssim_lambda must be in [0, 1], got {args.ssim_lambda}")
    want_cuda = args.device != "cpu" and torch.cuda.is_available()
    available = available_ssim(torch.device("cuda" if want_cuda else "cpu"))
    missing = sorted(set(args.unfused_ssim or []) - set(available))
    if missing:
        raise ValueError(f"--unfused_ssim {' '.join(missing)}: not available here (available: {' '.join(available)})")
    inputs = capture_inputs(args)
    device = inputs["device"]
    rows = []
    raster = inputs["backend"]
    for backend in args.unfused_ssim or available_ssim(device):
        times, (loss, _) = time_calls(
            lambda: unfused_step(inputs, args.ssim_lambda, backend), device, args.warmup, args.repeats
        )
        rows.append(
            dict(
                name=f"unfused ({raster} raster + {backend} SSIM + L1 + {raster} backward)",
                ms_median=statistics.median(times),
                ms_p90=float(np.percentile(times, 90)),
                loss=float(loss),
                unfused=True,
            )
        )
        if args.profile:
            rows[-1]["profile"] = profile_calls(
                lambda: unfused_step(inputs, args.ssim_lambda, backend), args.profile, device
            )
    first = None
    for name, config in configs:
        times, (loss, grads, stats) = time_calls(
            lambda: fused_step(inputs, args.ssim_lambda, config), device, args.warmup, args.repeats
        )
        row = dict(
            name=name,
            config=config,
            ms_median=statistics.median(times),
            ms_p90=float(np.percentile(times, 90)),
            loss=float(loss),
        )
        if args.profile:
            row["profile"] = profile_calls(lambda: fused_step(inputs, args.ssim_lambda, config), args.profile, device)
        if first is None:
            first = (loss, grads)
        else:
            row["max_rel_diff_vs_first"] = max([_rel(loss, first[0])] + [_rel(g, f) for g, f in zip(grads, first[1])])
        rows.append(row)
    base = min(r["ms_median"] for r in rows if r.get("unfused"))
    for row in rows:
        row["speedup_vs_unfused"] = base / row["ms_median"]
    scene = dict(
        data_dir=args.data_dir,
        data_factor=args.data_factor if args.data_dir else None,
        synthetic_gaussians=None if args.data_dir else args.synthetic_gaussians,
        synthetic_layout=None if args.data_dir else args.synthetic_layout,
        visible_fraction=inputs["visible_fraction"],
        resolution=f"{inputs['width']}x{inputs['height']}",
        batch_size=args.batch_size,
        packed=inputs["packed"],
        num_gaussians=inputs["num_gaussians"],
        num_isects=inputs["num_isects"],
        model_step=inputs["step"],
        ckpt=args.ckpt,
    )
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    from splat_train.kernels import native

    fused_by = (
        "the PyTorch reference of the fused function (CPU)"
        if device.type != "cuda"
        else "the native CUDA kernel"
        if native.load() is not None
        else f"the unfused path of the fused function (native kernel unavailable: {native.LOAD_ERROR})"
    )
    return dict(device=dev, scene=scene, repeats=args.repeats, warmup=args.warmup, rows=rows, fused_by=fused_by)


def markdown(report: dict) -> str:
    s = report["scene"]
    lines = [
        f"Rasterization + loss + backward, {report['device']}: {s['resolution']}, {s['batch_size']} image(s), "
        f"{s['num_gaussians']:,} Gaussians (model step {s['model_step']}), {s['num_isects']:,} tile "
        f"intersections, {'packed' if s['packed'] else 'dense'}; median of {report['repeats']} calls; "
        f"fused rows: {report['fused_by']}.",
        "",
        "| step | ms (median) | p90 | vs fastest unfused | max rel. diff vs first fused |",
        "|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        diff = f"{r['max_rel_diff_vs_first']:.1e}" if "max_rel_diff_vs_first" in r else "-"
        lines.append(
            f"| {r['name']} | {r['ms_median']:.3f} | {r['ms_p90']:.3f} | {r['speedup_vs_unfused']:.2f}x | {diff} |"
        )
    profiled = [r for r in report["rows"] if "profile" in r]
    if profiled:
        p = profiled[0]["profile"]
        lines += [
            "",
            f"Where the time goes (torch.profiler, {p['calls']} more calls; ms per call, {p['unit']}, by self time):",
            "",
            f"| step | {p['unit']} | count | largest |",
            "|---|---|---|---|",
        ]
        for r in profiled:
            q = r["profile"]
            top = "; ".join(f"{t['name'][:60]} {t['ms']:.3f} (x{t['count']:g})" for t in q["top"])
            lines.append(f"| {r['name']} | {q['total_ms']:.3f} | {q['count']:.0f} | {top} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from splat_train.trainer.fileio import atomic_write_bytes

    args = parse(sys.argv[1:] if argv is None else argv)
    for flag, value, least in (
        ("--repeats", args.repeats, 1),
        ("--batch_size", args.batch_size, 1),
        ("--warmup", args.warmup, 0),
        ("--profile", args.profile, 0),
    ):
        if value < least:
            print(f"error: {flag} must be >= {least}, got {value}", file=sys.stderr)
            return 2
    try:
        report = run(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    table = markdown(report)
    atomic_write_bytes(out / "bench_raster.json", json.dumps(report, indent=2).encode())
    atomic_write_bytes(out / "bench_raster.md", table.encode())
    print(table)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

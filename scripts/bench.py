"""Benchmark: the baseline and our variants on the same scene, GPUs and initial Gaussians, in one
invocation, with the ratio to the baseline.

    splat-train bench --data_dir ../shared/data/juicebox --data_factor 4 --world_sizes 1 2
    splat-train bench --synthetic_gaussians 2000000 --resolution 1600x1200 --world_sizes 1 2
    splat-train bench --synthetic_layout city --synthetic_gaussians 20000000 --resolution 1920x1080
    python -m splat_train.scripts.bench ...            # the same

Each variant is a list of ordinary ``splat-train`` flags (``--variant NAME="--packed ..."`` adds
one); every variant starts from the same initial model (same scene, seed and sharding; the
scene and its points' nearest-neighbour distances are built once per invocation) and trains
``--steps`` steps. Per variant and rank it records: ms per iteration over the steps after the
``--warmup`` ones, run back to back (the rate a run trains at), the time from start-up to the end
of the first step, images/s, the median of ``--phase_steps`` more steps each closed by a device synchronize, the
per-phase split of as many steps run back to back (CUDA events, the device's time; profiling.py), collectives and bytes per iteration in each
direction, tile-Gaussian intersections (load skew), peak device memory against the memory model,
and the test PSNR after the run. Output under ``--out``: ``bench.json``, ``bench.md`` (a table
with ratios to the baseline column) and ``phases.png`` (stacked per-phase bars, matplotlib).
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import shlex
import statistics
import sys
import tempfile
import time
from typing import Any, Optional
from pathlib import Path

import numpy as np
import torch

from splat_train.trainer import checkpoint
from splat_train.trainer.fileio import atomic_write_bytes

DEFAULT_VARIANTS = {
    "gsplat-dist": "--pipeline gsplat-dist",
    "ours-dense": "--raster unfused",
    "ours-packed": "--packed --raster unfused",
    "ours-packed-sparse": "--packed --sparse_grad_comm --raster unfused",
    "ours-packed-fused": "--packed --raster fused",
    "ours-dense-fused": "--raster fused",
}
# run only when --variants names them: the distributed path in one process (--loopback), against
# the rows above at W = 1 (its host work and waits, without a second GPU); at W > 1 they are skipped
OPTIONAL_VARIANTS = {
    "ours-dense-loopback": "--raster unfused --loopback",
    "ours-packed-loopback": "--packed --raster unfused --loopback",
    "ours-dense-fused-loopback": "--raster fused --loopback",
    "ours-dense-fused-loopback-graphs": "--raster fused --loopback --cuda_graphs on",
    "ours-packed-sparse-loopback": "--packed --sparse_grad_comm --raster unfused --loopback",
}


def _percentile(values, q):
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _worker(
    ctx,
    scene,
    flags: list[str],
    steps: int,
    warmup: int,
    out_file: str,
    ckpt=None,
    phase_steps: int = 10,
    profile_steps: int = 0,
):
    """One rank of one variant: ``warmup`` steps, then ``steps - warmup`` steps back to back with
    one synchronization at each end (ms_per_iter: the rate a run trains at, the host free to run
    ahead of the device), then ``phase_steps`` steps each closed by a synchronization (ms_median /
    ms_p90: a step that cannot overlap the next), then ``phase_steps`` steps back to back with the
    per-phase timer's events kept (the phase split: the device's time in each phase, the host
    ahead as in training), then ``profile_steps`` steps back to back under the torch profiler
    (``profile``: profiling.summarize_trace of their trace; none when 0)."""
    from splat_train.trainer.config import from_argv
    from splat_train.trainer.loop import Trainer
    from splat_train.trainer.profiling import memory_model
    from splat_train.trainer.render import visibility_counts

    t_start = time.perf_counter()
    cfg = from_argv(["default", *flags])
    trainer = Trainer(cfg, ctx, scene)
    try:
        start = 0
        if ckpt:  # a trained model, re-sharded for this world size; steps continue from its step
            trainer.load_state_dict(checkpoint.load_shard(ckpt, ctx.rank, ctx.world_size), restore_rng=False)
            start = trainer.step
            trainer.defer_sh_adam_if_large(start)  # as a resumed run: --lazy_sh_adam auto at the model's size
        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)
        rows = []

        def step_row(step, ms=None):
            out = trainer.train_step(step)
            rows.append(
                dict(
                    ms=ms,
                    phases=trainer.last_phases,
                    isects=out["num_isects"],
                    comm=ctx.stats.reset(),
                    num_gaussians=out["num_gaussians"],
                )
            )

        step_row(start)
        _sync(ctx.device)
        startup_s = time.perf_counter() - t_start  # start-up and the first step (compilation included)
        for step in range(start + 1, start + warmup):
            step_row(step)
        _sync(ctx.device)
        t0 = time.perf_counter()
        for step in range(start + warmup, start + steps):
            step_row(step)
        _sync(ctx.device)
        ms_per_iter = (time.perf_counter() - t0) * 1000.0 / (steps - warmup)
        window = rows[warmup:]
        synced = []  # the synced steps: each alone on the device, closed by a synchronization
        for step in range(start + steps, start + steps + phase_steps):
            _sync(ctx.device)
            t1 = time.perf_counter()
            trainer.train_step(step)
            _sync(ctx.device)
            synced.append((time.perf_counter() - t1) * 1000.0)
            ctx.stats.reset()
        # the phase steps: back to back with the timer's events kept (PhaseTimer deferred), the host
        # ahead of the device as in training, so that a phase's events time the device's work and
        # not a launch the host makes while the device waits (on the CPU the host's clock, at once).
        # The Triton projection's steps keep their RenderInfo: the visible counts of the bytes model
        # (_stage_traffic), counted on the device and read after the last step
        trainer.timer.switch(True, deferred=True)
        trainer.record_info = trainer.plan.projection == "triton"
        timed: list[dict[str, Any]] = []
        for step in range(start + steps + phase_steps, start + steps + 2 * phase_steps):
            trainer.train_step(step)
            timed.append(dict(phases=trainer.last_phases))
            if trainer.last_info is not None:
                timed[-1]["visible"] = visibility_counts(trainer.last_info)
                trainer.last_info = None
                if trainer.shard.lazy is not None and trainer.forward_backward.lazy_listed:
                    timed[-1]["waiting"] = trainer.shard.lazy.seen.waiting.clone()  # rows its forward caught up
            ctx.stats.reset()
        for row, phases_of_step in zip(timed, trainer.timer.collect() or [r["phases"] for r in timed]):
            row["phases"] = phases_of_step
            if "visible" in row:
                row["visible"] = tuple(int(v) for v in row["visible"])
            if "waiting" in row:
                row["waiting"] = int(row["waiting"])
        trainer.record_info = False
        steady = window
        peak = torch.cuda.max_memory_allocated(ctx.device) if ctx.device.type == "cuda" else None
        trainer.timer.switch(False)
        end = start + steps + 2 * phase_steps
        profile = _profile_steps(trainer, end, profile_steps, out_file) if profile_steps else None
        end += profile_steps
        metrics = trainer.evaluation.run(trainer.shard, end) if len(trainer.testset) else None
        phases = {}
        for name in timed[0]["phases"]:
            phases[name] = statistics.median(r["phases"].get(name, 0.0) for r in timed)
        traffic = _stage_traffic(trainer, timed, start + steps + phase_steps)

        def per_iter(key):
            total: dict = {}
            for r in steady:
                for op, v in r["comm"][key].items():
                    total[op] = total.get(op, 0) + v
            return {op: v / len(steady) for op, v in total.items()}

        fb = trainer.forward_backward
        result = dict(
            rank=ctx.rank,
            world_size=ctx.world_size,
            loopback=ctx.loopback,  # the distributed path over a group of one rank: its bytes to peers are zero
            backend=trainer.backend,
            device=str(ctx.device),
            ms_per_iter=ms_per_iter,
            startup_s=startup_s,
            ms_median=statistics.median(synced),
            ms_p90=_percentile(synced, 90),
            phases_median_ms=phases,
            isects_mean=float(np.mean([r["isects"] for r in steady])),
            calls_per_iter=per_iter("calls"),
            bytes_sent_per_iter=per_iter("bytes_sent"),
            bytes_recv_per_iter=per_iter("bytes_recv"),
            peak_memory_bytes=peak,
            num_gaussians_local=steady[-1]["num_gaussians"],
            memory_model=memory_model(cfg.model.sh_degree, ctx.world_size, ctx.device),
            batch_size=cfg.step.batch_size,
            steps=steps,
            warmup=warmup,
            phase_steps=phase_steps,
            start_step=start,
            test_psnr=(metrics or {}).get("psnr"),
            test_ssim=(metrics or {}).get("ssim"),
            step=dict(raster=trainer.plan.raster, projection=trainer.plan.projection, graphs=trainer.plan.graphs),
            cuda_graph_captures=fb.graphed_head.captures if fb.graphed_head is not None else None,
            whole_step_captures=fb.graphed_step.captures if fb.graphed_step is not None else None,
            record_exchange_captures=fb.graphed_step.exchange_captures if fb.graphed_step is not None else None,
            ssim_backend=(trainer.loss.backend if trainer.loss.backend != "auto" else _ssim_backend(ctx.device)),
            profile=profile,
            traffic=traffic,
        )
        Path(out_file).write_text(json.dumps(result, indent=2))
    finally:  # a step's captured collectives go before the process group (launch.loopback_group)
        trainer.forward_backward.release()


def _stage_traffic(trainer, timed: list[dict], step: int) -> Optional[dict]:
    """The per-Gaussian stages of the timed steps against their bytes model
    (profiling.stage_traffic at each timed step's visible counts, ``timed[i]["visible"]``, its
    rows caught up where the SH Adam waited, ``timed[i]["waiting"]``, and the SH degree of ``step``; the Triton projection's steps only, else None): {"copy_gbps": the
    device's copy bandwidth (profiling.copy_bandwidth; None where its buffers do not fit),
    "visible", "visible_records", "waiting" (medians; waiting None where no step deferred), "stages": {phase: {"bytes", "ms", "gbps" (each the
    median over the steps: a camera of the city sees 0.6-7% of it, so bytes and time vary
    together), "floor_ms" (the median bytes at the copy bandwidth, or None)}}}."""
    from splat_train.trainer.profiling import copy_bandwidth, stage_traffic

    counted = [r for r in timed if "visible" in r]
    if trainer.plan.projection != "triton" or not counted:
        return None
    params, plan = trainer.params, trainer.plan
    models = []
    for r in counted:
        visible, records = r["visible"]
        models.append(
            stage_traffic(
                int(params["means"].shape[0]),
                trainer.cfg.step.batch_size * trainer.ctx.world_size,  # a rank projects for every camera of the step
                int(params["shN"].shape[1]) + 1,
                trainer.sh_degree_at(step),
                visible,
                records,
                lazy=plan.lazy_sh_adam,
                waiting=r.get("waiting"),
                fused_adam=plan.fused_adam,
                unseen_zeros=trainer.shard.lazy is None or trainer.shard.lazy.unseen_zeros,
            )
        )
    try:
        gbps: Optional[float] = copy_bandwidth(trainer.device) / 1e9
    except torch.OutOfMemoryError:  # a model that fills the device: the stages without their floor
        gbps = None
    stages = {}
    for name, first in models[0].items():
        pairs = [(m[name], r["phases"].get(name)) for m, r in zip(models, counted)]
        if first is None or not all(ms for _, ms in pairs):
            continue
        nbytes = statistics.median(b for b, _ in pairs)
        stages[name] = dict(
            bytes=nbytes,
            ms=statistics.median(ms for _, ms in pairs),
            gbps=statistics.median(b / ms / 1e6 for b, ms in pairs),
            floor_ms=nbytes / gbps / 1e6 if gbps else None,
        )
    waiting = [r["waiting"] for r in counted if "waiting" in r]
    return dict(
        copy_gbps=gbps,
        visible=statistics.median(r["visible"][0] for r in counted),
        waiting=statistics.median(waiting) if waiting else None,
        visible_records=statistics.median(r["visible"][1] for r in counted),
        stages=stages,
    )


def _profile_steps(trainer, first: int, count: int, out_file: str) -> dict:
    """Steps ``first`` .. ``first + count - 1`` run back to back under the torch profiler (host
    operators and device activity); returns profiling.summarize_trace of the trace and prints
    its summary. The trace itself is left beside ``out_file`` (``.trace.json``)."""
    from splat_train.trainer.profiling import format_trace_summary, summarize_trace

    device = trainer.device
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    _sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        for step in range(first, first + count):
            trainer.train_step(step)
        _sync(device)
    trace_path = Path(out_file).with_suffix(".trace.json")
    prof.export_chrome_trace(str(trace_path))
    summary = summarize_trace(json.loads(trace_path.read_text()), count, most=20)
    print(f"bench: rank {trainer.ctx.rank} profile\n{format_trace_summary(summary)}", flush=True)
    return summary


def _ssim_backend(device):
    from splat_train.trainer.losses import ssim_backend

    return ssim_backend(device)


def points_knn_rms(points: np.ndarray, device: str) -> np.ndarray:
    """RMS distance of every point to its 3 nearest others (model.create_shard's initial scales)."""
    from splat_train.trainer.model import knn_mean_distance, knn_mean_distance_morton

    if device != "cpu" and torch.cuda.is_available():
        pts = torch.from_numpy(np.ascontiguousarray(points, dtype=np.float32)).cuda()
        return knn_mean_distance_morton(pts, torch.arange(len(points), device="cuda")).cpu().numpy()
    return knn_mean_distance(points, points)


def build_scene(args):
    from splat_train.trainer.config import Config, DataConfig
    from splat_train.trainer.data import scene_from_config
    from splat_train.trainer.data.city import make_city_scene
    from splat_train.trainer.data.synthetic import make_synthetic_scene

    if args.data_dir:
        return scene_from_config(Config(data=DataConfig(data_dir=Path(args.data_dir), data_factor=args.data_factor)))
    w, h = (int(v) for v in args.resolution.lower().split("x"))
    device = "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    if args.synthetic_layout == "city":  # its far plane: the trainer's for the layout (variant_flags)
        return make_city_scene(
            args.synthetic_gaussians, args.num_cameras, w, h, device=device, num_points=args.synthetic_points
        )
    return make_synthetic_scene(args.synthetic_gaussians, args.num_cameras, w, seed=0, height=h, device=device)


def check_scene_args(args) -> None:
    """Raise ValueError naming the flag when the scene flags do not go together."""
    if args.synthetic_points is not None and (args.data_dir or args.synthetic_layout != "city"):
        raise ValueError("--synthetic_points: only the city (--synthetic_layout city) starts from fewer points")
    if args.synthetic_points is not None and not 1 <= args.synthetic_points <= args.synthetic_gaussians:
        raise ValueError(f"--synthetic_points must be in [1, --synthetic_gaussians], got {args.synthetic_points}")


def run(args, on_result=None) -> dict:
    """Train every variant at every world size; ``on_result(report)`` is called after each one
    (the report so far), so a run cut short by a time limit keeps what it measured."""
    from splat_train.trainer.launch import TIMED_OUT, launch

    variants = dict(DEFAULT_VARIANTS)
    if args.variants:
        known = {**DEFAULT_VARIANTS, **OPTIONAL_VARIANTS}
        variants = {k: v for k, v in known.items() if k in args.variants}
    for spec in args.variant or []:
        name, _, flags = spec.partition("=")
        variants[name] = flags
    if (args.device == "cpu" or not torch.cuda.is_available()) and variants.pop("gsplat-dist", None) is not None:
        print("bench: gsplat-dist skipped (gsplat's distributed rasterization needs a GPU)", file=sys.stderr)
    start = ckpt_step(args.ckpt) if args.ckpt else 0
    check_scene_args(args)
    check_variants(variants, lambda extra: variant_flags(args, start, extra, "bench-check"))
    scene = build_scene(args)
    if not args.ckpt and scene.points is not None:  # every variant's initial scales, computed once
        scene.points_knn_rms = points_knn_rms(scene.points, args.device)
    results: list[dict] = []
    baseline = next(iter(variants), None)

    def report() -> dict:
        return dict(scene=scene_summary(args, scene), variants=list(results), baseline=baseline)

    with tempfile.TemporaryDirectory() as tmp:
        for world_size in args.world_sizes:
            for name, extra in variants.items():
                if world_size > 1 and "--loopback" in shlex.split(extra):
                    print(f"bench: {name} skipped at W={world_size} (--loopback runs one process)", file=sys.stderr)
                    continue
                flags = variant_flags(args, start, extra, f"{tmp}/{name}_{world_size}")
                files = [f"{tmp}/{name}_{world_size}_rank{r}.json" for r in range(world_size)]
                t0 = time.perf_counter()
                rc: "int | str"
                try:
                    rc = launch(
                        _worker_entry,
                        (
                            scene,
                            flags,
                            args.steps,
                            args.warmup,
                            f"{tmp}/{name}_{world_size}",
                            args.ckpt,
                            args.phase_steps,
                            args.profile_steps,
                        ),
                        nproc_per_node=world_size,
                        device=args.device,
                        timeout_s=args.variant_timeout or None,
                    )
                except Exception as e:  # one process runs in this one: record the failure, go on
                    print(f"bench: {name} W={world_size} failed: {e}", file=sys.stderr, flush=True)
                    rc = f"{type(e).__name__}: {e}"
                wall = time.perf_counter() - t0
                if rc != 0:
                    error = f"exit code {rc}" if isinstance(rc, int) else rc
                    if rc == TIMED_OUT and args.variant_timeout:
                        error = f"timed out after {args.variant_timeout:g} s (ranks' stacks on stderr)"
                    reasons = [
                        p.read_text() for p in (Path(f[: -len(".json")] + ".error") for f in files) if p.exists()
                    ]
                    if isinstance(rc, int) and reasons:
                        error += f": {reasons[0]}"
                    results.append(dict(variant=name, world_size=world_size, flags=extra, error=error))
                else:
                    ranks = [json.loads(Path(f).read_text()) for f in files]
                    results.append(dict(variant=name, world_size=world_size, flags=extra, wall_s=wall, ranks=ranks))
                    print(
                        f"bench: {name} W={world_size}: {max(r['ms_per_iter'] for r in ranks):.2f} ms/iter, start-up "
                        f"to first step {max(r['startup_s'] for r in ranks):.1f} s",
                        flush=True,
                    )
                if on_result is not None:
                    on_result(report())
                _release_cached_gpu_memory()
    return report()


def _release_cached_gpu_memory() -> None:
    """A one-rank variant runs in this process: hand its cached blocks back to the driver, so the
    next multi-rank variant's rank 0 does not find GPU 0 partly held by this process's cache."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def variant_flags(args, start: int, extra: str, result_dir: str) -> list[str]:
    """The trainer flags of one variant: the bench's own, then the variant's.

    The window [start, start + steps) trains without densifying, resetting opacities or pruning:
    from the initial model (start 0) gsplat's strategy still accumulates its gradient statistics,
    as in the first steps of a run; from a checkpoint (start > 0) the strategy is past its stop
    step, as in the late steps of a run. Variant flags come last and win."""
    end = start + args.steps + 2 * args.phase_steps + args.profile_steps
    flags = [
        "--device",
        args.device,
        "--batch_size",
        str(args.batch_size),
        "--max_steps",
        str(end),
        "--refine_start_iter",
        str(end + 1),
        "--refine_stop_iter",
        str(start if start > 0 else end + 2),
        "--reset_every",
        str(end + 1),
        "--prune_stage2_step",
        "0",
        "--prune_stage3_step",
        "0",
        "--result_dir",
        result_dir,
        "--num_traj_frames",
        "0",
        "--no_save_eval_images",
    ]
    if args.data_dir:
        flags += ["--data_dir", args.data_dir, "--data_factor", str(args.data_factor)]
    else:  # the layout's near and far planes, as its ground truth was rendered (config.resolve)
        flags += ["--synthetic_layout", args.synthetic_layout]
    return flags + shlex.split(extra)


def check_variants(variants: dict, flags_of) -> None:
    """Parse and validate every variant's full flag list (``flags_of(extra)``) before anything
    runs; raise ValueError naming a bad one."""
    import contextlib
    import io

    from splat_train.trainer.config import from_argv

    for name, extra in variants.items():
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                from_argv(["default", *flags_of(extra)])
        except ValueError as e:  # config validation (flags that parse but do not go together)
            raise ValueError(f"--variant {name}={extra!r}: {e}") from None
        except SystemExit:
            text = re.sub("[\u2500-\u257f]", " ", err.getvalue())  # tyro's box drawing
            lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "full helptext" not in ln]
            lines = lines[1:] if len(lines) > 1 else lines  # the first is the box's title
            raise ValueError(
                f"--variant {name}={extra!r}: splat-train rejects these flags: " + " ".join(lines[:6])
            ) from None


def _worker_entry(ctx, scene, flags, steps, warmup, prefix, ckpt, phase_steps, profile_steps=0):
    from splat_train.trainer.config import from_argv
    from splat_train.trainer.launch import loopback_group

    try:
        with loopback_group(
            ctx, from_argv(["default", *flags]).distributed.loopback
        ) as ctx:  # --loopback: a group of one rank
            _worker(ctx, scene, flags, steps, warmup, f"{prefix}_rank{ctx.rank}.json", ckpt, phase_steps, profile_steps)
    except Exception as e:  # the parent reports the first line of it in the variant's row
        Path(f"{prefix}_rank{ctx.rank}.error").write_text(f"{type(e).__name__}: {e}")
        raise


def ckpt_step(files: list) -> int:
    """The completed step of a run's checkpoint shards (``ckpt_<step>_rank<r>.pt``, all of one step).
    Raises ValueError naming a missing file or a set that mixes steps."""
    steps = set()
    for f in files:
        parsed = checkpoint.parse_name(Path(f).name)
        if not Path(f).is_file():
            raise ValueError(f"--ckpt: no such file: {f}")
        if parsed is None:
            raise ValueError(f"--ckpt: {f} is not named ckpt_<step>_rank<r>.pt")
        steps.add(parsed[0])
    if len(steps) != 1:
        raise ValueError(f"--ckpt: the files mix steps {sorted(steps)}; pass every rank's file of one step")
    return steps.pop()


def scene_summary(args, scene) -> dict:
    """The scene's entry of bench.json; ``visible_fraction``: min / mean / max over the cameras of
    the share of the true Gaussians each one's projection keeps (synthetic scenes only)."""
    layout = None if args.data_dir else args.synthetic_layout
    shares = scene.visible_fraction
    return dict(
        source=args.data_dir or f"synthetic {layout} {args.synthetic_gaussians} Gaussians at {args.resolution}",
        layout=layout,
        ckpt=[str(f) for f in args.ckpt] if args.ckpt else None,
        data_factor=args.data_factor if args.data_dir else None,
        num_cameras=len(scene.cameras),
        image_size=[scene.cameras[0].width, scene.cameras[0].height],
        num_points=0 if scene.points is None else len(scene.points),
        visible_fraction=None
        if shares is None
        else dict(min=float(shares.min()), mean=float(shares.mean()), max=float(shares.max())),
    )


def iteration_ms(entry) -> float:
    """A step ends when the slowest rank ends: the max over ranks of the window's ms/iter."""
    return max(r["ms_per_iter"] for r in entry["ranks"])


def markdown(report: dict) -> str:
    base = report["baseline"]
    head = (
        "| variant | W | ms/iter | synced step median | images/s | vs baseline | fwd bytes/rank | bwd bytes/rank "
        "| collectives/iter | isects per rank (min-max) | peak mem/rank (GiB) | model (B/G) | test PSNR "
        "| step (raster, projection, graphs) |"
    )
    start = f" from {len(report['scene']['ckpt'])} checkpoint shard(s)" if report["scene"].get("ckpt") else ""
    shares = report["scene"].get("visible_fraction")
    seen = (
        f" (each sees {100 * shares['min']:.1f}-{100 * shares['max']:.1f}% of the true Gaussians, "
        f"mean {100 * shares['mean']:.1f}%)"
        if shares
        else ""
    )
    lines = [
        f"Scene: {report['scene']['source']}{start}, {report['scene']['num_cameras']} cameras "
        f"{report['scene']['image_size'][0]}x{report['scene']['image_size'][1]}{seen}; baseline: {base}; "
        f"loss (L1 + D-SSIM): {report['variants'][0].get('ranks', [{}])[0].get('ssim_backend', '?')}",
        "",
        head,
        "|" + "---|" * 14,
    ]
    by_w = {}
    for e in report["variants"]:
        if "ranks" in e and e["variant"] == base:
            by_w[e["world_size"]] = iteration_ms(e)
    for e in report["variants"]:
        if "ranks" not in e:
            error = " ".join(str(e["error"]).split()).replace("|", "/")  # one table cell
            lines.append(f"| {e['variant']} | {e['world_size']} | {error} |" + " |" * 11)
            continue
        ranks, ms = e["ranks"], iteration_ms(e)
        imgs = e["world_size"] * ranks[0]["batch_size"] * 1000.0 / ms
        ratio = f"{by_w[e['world_size']] / ms:.2f}x" if e["world_size"] in by_w else "-"
        fwd = np.mean([sum(v for k, v in r["bytes_sent_per_iter"].items() if k.startswith("forward")) for r in ranks])
        bwd = np.mean([sum(v for k, v in r["bytes_sent_per_iter"].items() if k.startswith("backward")) for r in ranks])
        calls = np.mean([sum(r["calls_per_iter"].values()) for r in ranks])
        isects = [r["isects_mean"] for r in ranks]
        peaks = [r["peak_memory_bytes"] / 2**30 for r in ranks if r["peak_memory_bytes"]]
        per_gaussian = [
            r["peak_memory_bytes"] / max(r["num_gaussians_local"], 1) for r in ranks if r["peak_memory_bytes"]
        ]
        psnr = ranks[0]["test_psnr"]
        mem = ", ".join(f"{p:.2f}" for p in peaks) or "-"
        model = str(ranks[0]["memory_model"]["bytes_per_gaussian"])
        if per_gaussian:
            model += f" (peak/G {np.mean(per_gaussian):.0f})"
        cells = [
            e["variant"],
            e["world_size"],
            f"{ms:.2f}",
            f"{max(r['ms_median'] for r in ranks):.2f}",
            f"{imgs:.1f}",
            ratio,
            f"{fwd / 1e6:.2f} MB",
            f"{bwd / 1e6:.2f} MB",
            f"{calls:.1f}",
            f"{min(isects):,.0f}-{max(isects):,.0f}",
            mem,
            model,
            f"{psnr:.2f}" if psnr is not None else "-",
            _step_cell(ranks),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    graphed = [
        f"{e['variant']} (W={e['world_size']}): {e['ranks'][0]['cuda_graph_captures']} captures"
        + (
            f", whole steps ({e['ranks'][0]['whole_step_captures']} tail captures)"
            if e["ranks"][0].get("whole_step_captures")
            else ""
        )
        for e in report["variants"]
        if "ranks" in e and e["ranks"][0].get("cuda_graph_captures")
    ]
    lines += ["", "CUDA graphs (--cuda_graphs; rank 0, whole run): " + ("; ".join(graphed) or "none")]
    lines += _traffic_lines(report)
    return "\n".join(lines) + "\n"


def _traffic_lines(report: dict) -> list[str]:
    """bench.md's table of the per-Gaussian stages against their bytes model (rank 0 of each
    variant that ran the Triton projection; none where no variant did)."""
    rows = []
    for e in report["variants"]:
        traffic = e.get("ranks", [{}])[0].get("traffic")
        if not traffic:
            continue
        for name, st in traffic["stages"].items():
            floor = (f"{st['floor_ms']:.3f}", f"{st['ms'] / st['floor_ms']:.2f}x") if st["floor_ms"] else ("-", "-")
            copy = f"{traffic['copy_gbps']:.0f}" if traffic["copy_gbps"] else "- (no room)"
            waiting = traffic.get("waiting")
            visible = f"{traffic['visible']:,.0f}" + (f" ({waiting:,.0f})" if waiting is not None else "")
            rows.append(
                f"| {e['variant']} (W={e['world_size']}) | {visible} | {copy} | {name} "
                f"| {st['bytes'] / 1e9:.3f} | {st['ms']:.3f} | {st['gbps']:.0f} | {floor[0]} | {floor[1]} |"
            )
    if not rows:
        return []
    return [
        "",
        "Per-Gaussian stages against their bytes model (rank 0; trainer/profiling.stage_traffic, each byte "
        "once, at each timed step's visible Gaussians, in brackets those whose deferred SH steps the "
        "forward caught up; medians over the timed steps; floor: the median bytes at the device's copy "
        "bandwidth):",
        "",
        "| variant | visible Gaussians | copy GB/s | stage | model GB | ms | GB/s | floor ms | x floor |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]


def _step_cell(ranks) -> str:
    """The step rank 0 took (StepPlan): rasterization, projection and CUDA graphs."""
    step = ranks[0].get("step")
    return "-" if not step else f"{step['raster']}, {step['projection']}, {step['graphs']}"


def chart(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from splat_train.trainer.profiling import PHASES

    entries = [e for e in report["variants"] if "ranks" in e]
    labels = [f"{e['variant']}\nW={e['world_size']}" for e in entries]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(entries)), 4.5))
    bottom = np.zeros(len(entries))
    for phase in PHASES:
        values = np.array([e["ranks"][0]["phases_median_ms"].get(phase, 0.0) for e in entries])
        ax.bar(labels, values, bottom=bottom, label=phase)
        bottom += values
    ax.set_ylabel("ms per iteration (rank 0, median)")
    ax.set_title(report["scene"]["source"])
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _resolution(text: str) -> str:
    """--resolution: 'WxH' (positive ints) -> 'WxH'; argparse reports anything else (exit 2)."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
        if w < 1 or h < 1:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WxH in pixels, e.g. 1600x1200, got {text!r}") from None
    return f"{w}x{h}"


def add_scene_args(p: argparse.ArgumentParser) -> None:
    """The scene flags :func:`build_scene` reads (shared with bench-raster)."""
    p.add_argument("--data_dir", help="real scene folder (else a synthetic scene)")
    p.add_argument("--data_factor", type=int, default=4)
    p.add_argument("--synthetic_gaussians", type=int, default=20_000)
    p.add_argument(
        "--synthetic_layout",
        choices=["orbit", "city"],
        default="orbit",
        help="synthetic scene: orbit (a torus knot and a sphere, every camera sees nearly all of it) or city "
        "(streets and blocks, street-level and aerial cameras, each seeing under 10%% of the Gaussians)",
    )
    p.add_argument(
        "--synthetic_points",
        type=int,
        help="city: SfM points the model starts from, a random subset of the true centres (default: one per "
        "Gaussian, so every variant steps the scene's full size)",
    )
    p.add_argument("--resolution", type=_resolution, default="256x192", help="synthetic image size WxH")
    p.add_argument("--num_cameras", type=int, default=16, help="synthetic cameras")


def parse(argv):
    p = argparse.ArgumentParser(prog="splat-train bench", description=__doc__.split("\n\n")[0])
    add_scene_args(p)
    p.add_argument("--world_sizes", type=int, nargs="+", default=[1])
    p.add_argument(
        "--variants",
        nargs="*",
        help=f"the variants to run, of {list(DEFAULT_VARIANTS)} (the default set) and {list(OPTIONAL_VARIANTS)}",
    )
    p.add_argument("--variant", action="append", help='extra variant NAME="--flags ..."')
    p.add_argument(
        "--ckpt",
        nargs="+",
        help="start every variant from these checkpoint shards (every rank's "
        "ckpt_<step>_rank<r>.pt of one step, any world size) instead of the initial model; pass "
        "the --data_dir / --data_factor of the run that wrote them",
    )
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument(
        "--phase_steps",
        type=int,
        default=10,
        help="steps after the measured window, each synchronized (the synced step median), and as many "
        "again back to back for the per-phase split (the device's time in each phase)",
    )
    p.add_argument(
        "--profile_steps",
        type=int,
        default=0,
        help="steps after the phase steps run under the torch profiler: each variant's GPU-busy share, "
        "kernels, copies and host syncs per step and its largest kernels (bench.json 'profile'; 0: none)",
    )
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--variant_timeout",
        type=float,
        default=0.0,
        help="seconds a multi-rank variant may run before its ranks print their stacks and are "
        "stopped, recorded as timed out (0: no limit)",
    )
    p.add_argument("--out", default="results/bench")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.warmup >= args.steps:
        print("error: --warmup must be smaller than --steps", file=sys.stderr)
        return 2
    if args.phase_steps < 1:
        print("error: --phase_steps must be >= 1", file=sys.stderr)
        return 2
    if args.profile_steps < 0:
        print("error: --profile_steps must be >= 0", file=sys.stderr)
        return 2
    if args.variant_timeout < 0:
        print("error: --variant_timeout must be >= 0 seconds (0: no limit)", file=sys.stderr)
        return 2
    from splat_train.trainer.launch import LaunchError, detect_external

    try:
        external = detect_external() is not None
    except LaunchError:  # a launcher's variables, incomplete
        external = True
    if external:
        print(
            "error: splat-train bench starts its own ranks for each --world_sizes entry; run it directly, "
            "not under torchrun / mpirun / srun",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out)  # created by the first write: a refused run leaves nothing behind

    def write(report: dict) -> str:
        table = markdown(report)
        atomic_write_bytes(out / "bench.json", json.dumps(report, indent=2).encode())
        atomic_write_bytes(out / "bench.md", table.encode())
        return table

    try:
        report = run(args, on_result=write)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = write(report)
    try:
        chart(report, out / "phases.png")
    except ImportError:
        print(
            "bench: phases.png not written: matplotlib is not installed (pip install 'splat-train[bench]')",
            file=sys.stderr,
        )
    print(table)
    return 0 if all("ranks" in e for e in report["variants"]) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

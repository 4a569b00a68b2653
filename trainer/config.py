"""The configuration tree of a training run.

Every flag of ``splat-train`` is a field here, in one section of :class:`Config`: ``data`` (the
scene and its images), ``model`` (the initial Gaussians), ``step`` (what a training step
computes), ``schedule`` (every step count), ``optim`` (learning rates), ``densify`` (the
densification strategy), ``prune`` (ByteSplat's pruning), ``outputs`` (what the run writes) and
``distributed`` (processes, devices, restarts); only ``steps_scaler`` and ``seed``, which act on
every section, sit at the top. tyro turns the tree into the command line with the section
prefixes omitted (``--max_steps``, not ``--schedule.max_steps``), spelled as gsplat's
``examples/simple_trainer.py`` spells them; docs/flags.md is generated from it
(scripts/flag_reference.py).

Every step-valued field lives in :class:`Schedule` and nowhere else, so that ``--steps_scaler``
can scale all of them by iterating the section's fields (there is no hand-kept list to forget a
new field in; ``tests/test_config.py`` fails when a step-like field appears outside the section).

Presets (``default``, ``mcmc``, ``bytesplat``) are YAML files in ``configs/`` holding the values
that differ from the dataclass defaults; ``<result_dir>/cfg.yml`` holds a whole resolved config, in
sections, and ``--config <file>`` reloads it. Every field name is unique in the tree, so a flat key
(a cfg.yml or a checkpoint written before the sections) is read into its section (:func:`nest`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Sequence

import tyro
import yaml


def _gsplat_alias(*names: str):
    """tyro metadata: also accept gsplat simple_trainer's spellings ``names`` of a flag (its
    strategy fields are nested: ``--strategy.grow_grad2d``)."""
    return tyro.conf.arg(aliases=names)


@dataclass
class Schedule:
    """Step-valued settings. ``--steps_scaler`` multiplies every field of this section.

    Each field is an ``int`` or a ``list[int]`` counted in training steps (one step = one batch of
    ``batch_size`` images on every rank).
    """

    max_steps: int = 30_000
    """Number of training steps."""
    eval_steps: list[int] = field(default_factory=lambda: [7_000, 30_000])
    """Steps after which the test views are rendered and scored (the last step is always scored)."""
    save_steps: list[int] = field(default_factory=lambda: [7_000, 30_000])
    """Steps after which each rank writes ``ckpts/ckpt_<step>_rank<r>.pt``."""
    save_every: int = 0
    """Also write a checkpoint every this many steps (0: only at --save_steps, the last step, --save_every_minutes and on SIGTERM / SIGINT)."""
    ply_steps: list[int] = field(default_factory=lambda: [7_000, 30_000])
    """Steps after which a PLY is exported (a PLY is always exported after the last step)."""
    sh_degree_interval: int = 1_000
    """The SH degree in use rises by one every this many steps, up to ``--sh_degree``."""
    refine_start_iter: Annotated[int, _gsplat_alias("--strategy.refine_start_iter")] = 500
    """Densification starts after this step."""
    refine_stop_iter: Annotated[int, _gsplat_alias("--strategy.refine_stop_iter")] = 15_000
    """Densification stops at this step."""
    refine_every: Annotated[int, _gsplat_alias("--strategy.refine_every")] = 100
    """Densify every this many steps."""
    reset_every: Annotated[int, _gsplat_alias("--strategy.reset_every")] = 3_000
    """Default strategy: reset opacities every this many steps (while densifying)."""
    pause_refine_after_reset: Annotated[int, _gsplat_alias("--strategy.pause_refine_after_reset")] = 0
    """Default strategy: no densification for this many steps after an opacity reset."""
    log_every: Annotated[int, _gsplat_alias("--tb_every")] = 100
    """Write TensorBoard scalars (and with --tb_save_image the training render) and refresh the progress bar's figures every this many steps (gsplat's --tb_every): loss (the last step's), gs (Gaussians on rank 0) and it/s (training steps per second over those steps, evaluation included)."""
    bilateral_grid_warmup: int = 1_000
    """--use_bilateral_grid: the grids' learning rate rises linearly from 1% over this many steps (gsplat's fixed 1000)."""
    profile_start_step: int = 100
    """--profile: the first profiled step (earlier steps are warm-up: NCCL set-up, compilation)."""
    profile_num_steps: int = 10
    """--profile: how many steps the trace and the per-phase table cover."""
    prune_stage2_step: int = 0
    """ByteSplat stage 2 (initial pruning) after this step: keep only Gaussians that are some training pixel's largest contributor; no densification from this step on (0 = off)."""
    prune_stage3_step: int = 0
    """ByteSplat stage 3 (hardware-aware pruning) after this step: prune Gaussians of tiles over the per-tile budget, in rounds (0 = off)."""


@dataclass
class OptimConfig:
    """Learning rates at batch size 1 (gsplat simple_trainer's values); see model.create_optimizers
    for the batch rule."""

    means_lr: float = 1.6e-4
    """Learning rate of the means, multiplied by the scene scale; decays exponentially to 1% of it."""
    scales_lr: float = 5e-3
    """Learning rate of the log-scales."""
    quats_lr: float = 1e-3
    """Learning rate of the quaternions."""
    opacities_lr: float = 5e-2
    """Learning rate of the logit opacities."""
    sh0_lr: float = 2.5e-3
    """Learning rate of the degree-0 SH coefficients."""
    shN_lr: float = 2.5e-3 / 20
    """Learning rate of the higher-degree SH coefficients."""
    pose_opt_lr: float = 1e-5
    """--pose_opt: learning rate of the per-camera pose corrections."""
    pose_opt_reg: float = 1e-6
    """--pose_opt: weight decay of the pose corrections."""
    app_opt_lr: float = 1e-3
    """--app_opt: learning rate of the per-image colour corrections."""
    app_opt_reg: float = 1e-6
    """--app_opt: weight decay of the colour corrections."""


@dataclass
class StrategyConfig:
    """Densification settings (gsplat's DefaultStrategy / MCMCStrategy); step-valued ones live in
    Schedule."""

    strategy: Literal["default", "mcmc"] = "default"
    """Densification strategy: gsplat's DefaultStrategy (clone/split/prune) or MCMCStrategy."""
    prune_opa: Annotated[float, _gsplat_alias("--strategy.prune_opa")] = 0.005
    """Default: prune Gaussians whose opacity falls below this."""
    grow_grad2d: Annotated[float, _gsplat_alias("--strategy.grow_grad2d")] = 0.0002
    """Default: densify Gaussians whose mean image-plane gradient (NDC) exceeds this (gsplat suggests 0.0008 with --absgrad)."""
    grow_scale3d: Annotated[float, _gsplat_alias("--strategy.grow_scale3d")] = 0.01
    """Default: clone below / split above this scale (fraction of the scene scale)."""
    prune_scale3d: Annotated[float, _gsplat_alias("--strategy.prune_scale3d")] = 0.1
    """Default: prune Gaussians larger than this (fraction of the scene scale)."""
    absgrad: Annotated[bool, _gsplat_alias("--strategy.absgrad")] = False
    """Default: densify on the absolute 2D-mean gradient (per pixel |dL/dmean2d| summed; AbsGS, Ye et al. 2024) instead of the gradient's norm; at any world size the per-record sums travel back to the owners with the other gradients."""
    cap_max: Annotated[int, _gsplat_alias("--strategy.cap_max")] = 1_000_000
    """MCMC: maximum number of Gaussians (per rank)."""
    noise_lr: Annotated[float, _gsplat_alias("--strategy.noise_lr")] = 5e5
    """MCMC: scale of the position noise."""
    min_opacity: Annotated[float, _gsplat_alias("--strategy.min_opacity")] = 0.005
    """MCMC: Gaussians below this opacity are relocated."""


@dataclass
class PruneConfig:
    """ByteSplat hardware-aware pruning (trainer/prune.py); the stage steps live in Schedule."""

    prune_rounds: int = 10
    """Stage 3: at most this many prune-and-remeasure rounds."""
    prune_fraction: float = 0.1
    """Stage 3: fraction of the candidates (Gaussians in over-budget tiles) removed per round, highest score first (fewer when the estimated removals still needed are fewer)."""
    tile_budget: int = 0
    """Pruning stage 3's target of Gaussians per tile (0: ByteSplat's on-chip figure of the device; see prune.tile_budget). The native fused kernel runs tiles of any length; the budget only steers pruning."""


@dataclass
class DataConfig:
    """The scene and its images: where they are read from, which of them are test views, how they are
    decoded and kept; without --data_dir, the embedded synthetic scene."""

    data_dir: Optional[Path] = None
    """Scene folder: COLMAP (sparse/0 or sparse, images/) or NeRF (transforms.json). Unset: train the embedded synthetic scene."""
    data_factor: int = 4
    """Downsample factor of the images; reads images_<f>/ when present, else downsamples images/ once into a cache."""
    test_every: int = 8
    """Every this-th image (sorted by name) is a test view; 0 keeps every image for training."""
    normalize_world_space: bool = True
    """Centre, rotate and scale the world as gsplat's COLMAP parser does."""
    camera_model: Literal["pinhole", "ortho", "fisheye"] = "pinhole"
    """Projection (gsplat's camera_model): pinhole; ortho (fx, fy in pixels per scene unit); fisheye (ideal equidistant, r = f theta). COLMAP *_FISHEYE and nerfstudio OPENCV_FISHEYE cameras are remapped to it and need fisheye; other cameras' intrinsics are read as the model says."""
    alpha_as_mask: bool = True
    """An image's alpha channel is its loss mask (alpha < 128 left out of the loss); off: composited onto black, every pixel trains. Mask files in masks/ apply either way."""
    patch_size: Optional[int] = None
    """Train on a random patch_size x patch_size crop of each image (gsplat's patch_size; the crop is a function of --seed, the step and the rank). Unset: whole images."""
    image_cache_gb: float = 0.0
    """Host memory (GiB) a rank may keep decoded images in; 0 keeps them all (decoded once at the start). With a bound, training images are decoded on background threads a few steps ahead of their use and test images when evaluated, so a dataset of any size fits; a GPU still takes every training image when they fit --device_images_share."""
    decode_threads: int = 0
    """Threads that decode training images on each rank (the preload at the start, and the background decoding under --image_cache_gb); 0 = min(8, CPU cores)."""
    device_images_share: float = 0.25
    """Largest share of a GPU's memory the training images may take on it, as uint8 (uploaded once; the loss reads them there). Beyond it (or at 0) they stay in pinned host memory and each batch is copied one step ahead on a side stream."""
    synthetic_num_gaussians: int = 600
    """Synthetic scene (no --data_dir): Gaussians of the ground-truth cloud."""
    synthetic_num_cameras: int = 40
    """Synthetic scene: cameras (on the orbit, or in the city)."""
    synthetic_image_size: int = 96
    """Synthetic scene: image width (and height, unless --synthetic_image_height), pixels."""
    synthetic_image_height: int = 0
    """Synthetic scene: image height, pixels; 0 = --synthetic_image_size (square images)."""
    synthetic_layout: Literal["orbit", "city"] = "orbit"
    """Synthetic scene: orbit = a torus knot and a sphere seen from cameras on an orbit, each seeing nearly all of it; city = a grid of streets and blocks (facades with windows, roofs, roads, trees, parked cars) seen by street-level and aerial cameras, each seeing under 10% of the Gaussians (trainer/data/city.py: the large-scene benchmark). With city, --far_plane left at its default becomes the city's viewing distance, 350 scene units (metres), which its ground truth is rendered with."""


@dataclass
class ModelConfig:
    """The Gaussians: how they start (SfM or random points, opacity, scale), their SH degree, antialiasing
    and the scene scale."""

    init_type: Literal["sfm", "random"] = "sfm"
    """Initial Gaussians: the SfM points, or random points in the camera bounds."""
    init_num_pts: int = 100_000
    """Number of random initial points (--init_type random)."""
    init_extent: float = 3.0
    """Half-size of the random-init cube, in scene scales."""
    init_opa: float = 0.1
    """Initial opacity of every Gaussian (0..1)."""
    init_scale: float = 1.0
    """Initial scales are this times the mean distance to the 3 nearest neighbours."""
    sh_degree: int = 3
    """Highest spherical-harmonics degree (0..3)."""
    antialiased: bool = False
    """gsplat's antialiased rasterization: opacities scaled by the 2D low-pass filter's compensation sqrt(det(cov2d) / det(cov2d + 0.3 I)) (Mip-Splatting, Yu et al. 2024), in training, evaluation and video."""
    global_scale: float = 1.0
    """Extra multiplier of the scene scale."""
    morton_order: bool = True
    """Keep each rank's Gaussians in Morton (Z-curve) order of their means (trainer/model.py morton_order, as LiteGS does), so that the Gaussians a tile renders sit near each other in memory: the shard is ordered when it is created and again after each densification step that may grow it (the new Gaussians come last). --pipeline gsplat-dist (gsplat's own pass, the benchmark's baseline) keeps the input order."""


@dataclass
class StepConfig:
    """One training step: the batch, the records' exchange and rasterization, the kernels that run, the
    loss and its regularizers, the optimizer's update, and the learned corrections (camera poses,
    colours, bilateral grids) and depth loss. trainer/step/plan.py decides from these which step runs."""

    batch_size: int = 1
    """Images per step on each rank."""
    packed: bool = False
    """Packed exchange and rasterization: only visible (camera, Gaussian) records travel."""
    packed_auto: bool = False
    """Choose --packed by the world size at the start: packed records at W > 1 (--pipeline ours), dense at W = 1 (the bytesplat preset's setting; config.resolve_packed). --packed or --no_packed on the command line turns it off."""
    pipeline: Literal["ours", "gsplat-dist"] = "ours"
    """Rendering pass: ours (explicit exchange, dense or --packed), or gsplat-dist (gsplat's own rasterization(distributed=True), dense; the benchmark's baseline, CUDA only)."""
    raster: Literal["auto", "unfused", "fused"] = "auto"
    """Training rasterization: fused (ByteSplat: one native CUDA/HIP kernel for forward, tile-local L1 + D-SSIM and backward of every tile, built on first use; kernels/fused_raster.py; on a GPU where it cannot be built, one line and the unfused step; on the CPU its PyTorch reference), unfused (rasterize, full-image L1 + D-SSIM, backward), or auto: fused on a GPU unless the run needs the rendered image (--app_opt, --depth_loss, --use_bilateral_grid, --tb_save_image, --pipeline gsplat-dist, training views with loss masks), unfused on the CPU."""
    random_tile_shift: bool = False
    """When the fused step runs (--raster fused, or auto on a GPU): each step, shift the images by a random 0-15 pixels right and down against the 16-pixel tile grid (the principal point moves, the render is padded by as much at the top and left, and those pixels stay out of the loss), so that the tile-local SSIM's tile borders fall elsewhere every step. The same shift on every rank. Off by default (why: docs/design-measurements.md)."""
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    """Replay each step's activation, projection and SH colours, forward and backward, as CUDA graphs, captured again whenever the shard, the SH degree or the image size changes (trainer/step/capture.py); where nothing but the photometric loss trains, the whole step (the rasterizer or fused kernel, the loss and their backward too; trainer/step/graphed.py), and on the distributed path the record all_to_alls with it (captured over NCCL; not with --sparse_grad_comm or --absgrad; trainer/step/graphed_exchange.py). auto: on for a one-process run on an NVIDIA GPU (not yet run with several GPUs or on ROCm, where NCCL's watchdog and HIP's capture rules differ), on: at any world size and with --loopback, off: never. Applies to dense steps whose cameras share one size; elsewhere (CPU, --packed, mixed sizes, --random_tile_shift, --pipeline gsplat-dist) the step runs as without it, and a run whose shapes change too often to repay a capture stops capturing."""
    projection: Literal["auto", "triton", "gsplat"] = "auto"
    """The training step's activation, projection and SH colours: triton (kernels/projection.py: one kernel forward reading the raw parameters once and writing the records, one per-Gaussian backward writing the parameters' gradients; pinhole cameras, dense records, no --pose_opt), gsplat (the parameters' activations, gsplat's fully_fused_projection and spherical_harmonics), or auto: triton on a GPU where it applies, else gsplat."""
    backend: Literal["auto", "gsplat", "reference"] = "auto"
    """Projection/rasterization ops: gsplat's CUDA ops, or the plain-PyTorch reference (auto: gsplat on CUDA)."""
    ssim_backend: Literal["auto", "pytorch", "triton", "fused_ssim"] = "auto"
    """SSIM implementation: auto (on a GPU the fused_ssim package when installed, else the project's Triton kernel when Triton imports, else PyTorch; PyTorch on the CPU), or one of them by name."""
    ssim_lambda: float = 0.2
    """Weight of the D-SSIM term: loss = (1 - lambda) L1 + lambda (1 - SSIM)."""
    opacity_reg: float = 0.0
    """Weight of the opacity regularizer mean(sigmoid(opacities))."""
    scale_reg: float = 0.0
    """Weight of the scale regularizer mean(exp(scales))."""
    random_bkgd: bool = False
    """Composite over a random background colour each step."""
    near_plane: float = 0.01
    """Near clipping plane (scene units)."""
    far_plane: float = 1e10
    """Far clipping plane (scene units)."""
    visible_adam: bool = False
    """gsplat's SelectiveAdam (Taming 3DGS, Mallick et al. 2024): each step only the Gaussians visible in some camera of the global batch move and update their moments; like gsplat's kernel, no bias correction."""
    fused_adam: Literal["auto", "on", "off"] = "auto"
    """The Gaussians' Adam step (or --visible_adam's) inside the projection's backward kernel, which then writes no gradient for a separate Adam to read back (trainer/step/backward_adam.py; the same update): the parameters' gradients take no memory (236 bytes per Gaussian at SH degree 3), at some speed. on: needs --projection triton's kernels and no loss term on the parameters themselves (--opacity_reg, --scale_reg); auto: on where it applies and the model is large for the device (step/plan.py, TIGHT_BYTES_PER_GAUSSIAN), else the separate launch; off: the separate Adam launch."""
    lazy_sh_adam: Literal["auto", "on", "off"] = "auto"
    """Adam's update of the SH coefficients (sh0, shN) deferred for the Gaussians no camera of the step sees (their gradient is zero), and caught up in closed form when the projection next sees them or before anything else reads them (kernels/lazy_adam.py): the same parameters as the dense Adam to float32 rounding, with the SH share of the optimizer's memory traffic only for the Gaussians seen (a city-scale scene's cameras see a few percent). on: where it applies (--projection triton's kernels with the separate Adam launch: not --fused_adam on, --visible_adam or --sparse_grad), else raises; auto: on where it applies, the rank's shard holds at least 2 M Gaussians and a step sees at most a tenth of them (estimated from the training cameras' frusta), from the start or from the densification step or resumed checkpoint that brings it there (step/plan.py, LAZY_MIN_GAUSSIANS and LAZY_MAX_SEEN_SHARE: below the size its host work costs more than it saves, above the share its catch-up does); off: every SH row steps every step."""
    sparse_grad: bool = False
    """gsplat's sparse gradients (SparseAdam on the visible rows): here gradients reach the owners dense through the exchange, so this selects the same update as --visible_adam and saves no memory."""
    sparse_grad_comm: bool = False
    """Zero-eliding backward exchange: gradient rows that are exactly zero are not sent (a bitmap says which rows follow)."""
    pose_opt: bool = False
    """Learn a pose correction per training camera (replicated; DDP over ranks)."""
    app_opt: bool = False
    """Learn a colour (appearance) correction per training image (replicated; DDP over ranks)."""
    pose_noise: float = 0.0
    """Perturb the training cameras by a fixed random rigid transform (translation and 6D-rotation offsets with this standard deviation; gsplat's pose_noise), to test --pose_opt. Test views are not perturbed."""
    use_bilateral_grid: bool = False
    """Learn a bilateral grid per training image that colour-corrects its render before the loss (Wang et al. 2024, "Bilateral Guided Radiance Field Processing"; gsplat's lib_bilagrid idea), with gsplat's total-variation regularizer and schedule."""
    bilateral_grid_shape: list[int] = field(default_factory=lambda: [16, 16, 8])
    """--use_bilateral_grid: cells in x, y and luminance (gsplat's grid_X, grid_Y, grid_W)."""
    depth_loss: bool = False
    """Add gsplat's depth loss: L1 between the rendered and the SfM points' disparity (1 / camera z) at the pixels they project to, times the scene scale (COLMAP scenes: each image's observed points)."""
    depth_lambda: float = 1e-2
    """--depth_loss: its weight."""


@dataclass
class OutputsConfig:
    """What the run writes to --result_dir (exports, test renders and metrics, videos, TensorBoard, the
    profiler's trace) and the live viewer; docs/outputs.md describes the folder."""

    result_dir: Path = Path("results/default")
    """Where checkpoints, PLYs, stats, renders, videos and TensorBoard logs go."""
    save_ply: bool = True
    """Export a PLY at --ply_steps and the last step (gsplat's default is off; here on, as before). --no-save_ply exports none (the checkpoints hold the model; --ckpt exports later)."""
    export_frame: Literal["original", "normalized"] = "original"
    """Frame of every export (PLY, Inria folder and its cameras.json, web formats): original = the input data's world (COLMAP / transforms.json), the world normalization undone, so the splats line up with the input cameras and points; normalized = the centred, rotated, scaled world the trainer works in."""
    export_formats: list[Literal["ply", "inria", "splat", "ply_compressed"]] = field(
        default_factory=lambda: ["ply", "inria"]
    )
    """What each export writes: ply (ply/point_cloud_<step>.ply, always written: the run's model), inria (point_cloud/iteration_<step>/point_cloud.ply, cameras.json and cfg_args, the original 3DGS code's layout), splat (ply/point_cloud_<step>.splat, antimatter15's web format), ply_compressed (ply/point_cloud_<step>.compressed.ply, SuperSplat / PlayCanvas); the last two through gsplat's exporter."""
    num_traj_frames: int = 60
    """Frames of the trajectory video written at each evaluation (0: no video)."""
    render_traj_path: Literal["interp", "ellipse", "spiral"] = "interp"
    """The video's camera path: interp (through the training cameras), ellipse (around their focus, at their mean height), spiral (forward-facing, between the SfM points' near and far depths); gsplat's examples/datasets/traj.py paths."""
    disable_video: bool = False
    """Write no trajectory video (as --num_traj_frames 0)."""
    save_eval_images: bool = True
    """Write side-by-side test renders (ground truth | render) at each evaluation."""
    lpips_net: Literal["alex", "vgg"] = "alex"
    """LPIPS backbone of the test metrics: alex (gsplat's evaluation: images scaled to [-1, 1]) or vgg (the original 3DGS evaluation: [0, 1] images fed as they are, normalize=False); stats/val_step*.json names the one used."""
    lpips_weights: Optional[Path] = None
    """The ImageNet backbone file of --lpips_net (torchvision's alexnet-owt-7be5be79.pth / vgg16-397923af.pth); unset: looked up in the torch hub cache. Nothing is ever downloaded; a file given here that cannot be used is an error at start."""
    tb_save_image: bool = False
    """Every --log_every (--tb_every) steps, also write the training render (ground truth | render) to TensorBoard."""
    profile: bool = False
    """Write a torch-profiler trace (Chrome/Perfetto JSON, NVTX/roctx phase ranges) and a per-phase table for a window of steps, under result_dir/profile."""
    profile_mode: Literal["full", "device"] = "full"
    """--profile: full (host operators, device activity and the per-phase table) or device (only the device's kernels, copies and runtime calls, no operator recording and no phase timer: the GPU-busy share least disturbed by the profiler's own host work; on a CPU run, full)."""
    disable_viewer: bool = True
    """No live viewer: the default, unlike gsplat's simple_trainer, so that a run (a batch job, a test, CI) never serves a port or waits on a browser. --no_disable_viewer: a single-process run serves a viser viewer on --port that renders the current model between steps, and stops with the run (pip install -e '.[viewer]'); watch a multi-process run with `splat-train view RESULT_DIR`."""
    port: int = 8080
    """Port of the live viewer (--no_disable_viewer); viser takes the next free one when it is in use, and the run prints the one it serves."""


@dataclass
class DistributedConfig:
    """Processes, devices and restarts: how many ranks on which device, how long a collective waits, and
    continuing (or only evaluating) a run from its checkpoints."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train (auto: CUDA when visible)."""
    nproc_per_node: int = 0
    """Processes to start on this node: 0 = one per visible GPU (1 without GPUs); N > 1 without GPUs runs N CPU ranks over gloo."""
    loopback: bool = False
    """A benchmarking and testing mode of the distributed path: one process over a real process group of one rank (NCCL on a GPU, gloo on the CPU), whose step takes every step of a multi-GPU run (the collectives, the records and their gradients through the all_to_alls, --sparse_grad_comm's zero elision, the pruning statistics' routing) and none of one process's shortcuts; it trains what one process trains. CUDA graphs as at W > 1 (--cuda_graphs auto: none; on: the whole step with the record exchanges captured). Not with --nproc_per_node > 1 or a launcher's several ranks."""
    dist_timeout_s: float = 1800.0
    """Seconds a collective (and the rendezvous) waits for a slower rank before the run fails."""
    resume: bool = False
    """Continue from the newest complete, readable set of checkpoints in result_dir/ckpts (a newer set with a missing or unreadable rank file is skipped, and a stray shard of another world size ignored, each with a warning). `--resume auto`: continue when there is such a set, else start afresh: the same command can be rerun after a preemption."""
    auto_resume: bool = False
    """`--resume auto`: continue when result_dir/ckpts holds a complete set, else start afresh (moving a stopped run's other outputs aside): the same command can be rerun after a preemption (SLURM requeue, torchrun --max-restarts)."""
    overwrite: bool = False
    """Allow starting a new run in a result_dir that already holds checkpoints (they are moved aside, never deleted)."""
    ckpt: Optional[list[Path]] = None
    """Evaluate and export these checkpoint(s) (one per rank of the run that wrote them) without training."""
    save_every_minutes: float = 0.0
    """Also write a checkpoint whenever this many minutes passed since the last one (0: only at --save_steps, --save_every and on SIGTERM / SIGINT)."""


@dataclass
class Config:
    """A splat-train run. Flags are spelled as gsplat's simple_trainer spells them."""

    steps_scaler: float = 1.0
    """Multiply every step-valued setting (the Schedule section) by this, e.g. 0.25 on 4 GPUs."""
    seed: int = 42
    """Random seed (each rank draws its cameras with its own stream)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    step: StepConfig = field(default_factory=StepConfig)
    schedule: Schedule = field(default_factory=Schedule)
    optim: OptimConfig = field(default_factory=OptimConfig)
    densify: StrategyConfig = field(default_factory=StrategyConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    outputs: OutputsConfig = field(default_factory=OutputsConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


def scale_schedule(schedule: Schedule, factor: float) -> Schedule:
    """Multiply every field of ``schedule`` by ``factor`` (rounding down; gsplat's adjust_steps).

    Step counts that are intervals or lengths (``*_every``, ``*_interval``, ``*_warmup``) never fall below 1 (0, off, stays 0).
    Raises ValueError naming --steps_scaler when it leaves ``max_steps`` at 0 (gsplat would train
    no step; a run of one step instead would hide the slip).
    """
    if int(schedule.max_steps * factor) < 1 <= schedule.max_steps:
        raise ValueError(
            f"--steps_scaler {factor:g} makes --max_steps {schedule.max_steps} zero steps "
            f"(it multiplies every step count); use at least 1/{schedule.max_steps}"
        )
    values: dict[str, Any] = {}
    for f in dataclasses.fields(schedule):
        value = getattr(schedule, f.name)
        if isinstance(value, list):
            values[f.name] = [int(v * factor) for v in value]
        else:
            scaled = int(value * factor)
            if value > 0 and (f.name.endswith(("_every", "_interval", "_warmup")) or f.name == "profile_num_steps"):
                scaled = max(scaled, 1)  # (0 stays 0: off, as --save_every 0)
            values[f.name] = scaled
    return Schedule(**values)


def resolve(cfg: Config) -> Config:
    """Apply ``steps_scaler`` once (the result has ``steps_scaler = 1``, so saving and reloading it
    reruns exactly the same schedule), make ``data_dir`` absolute (a saved cfg.yml reruns from
    any working directory), and give the synthetic city its far plane (data/city.py
    VIEW_DISTANCE) when ``far_plane`` is at its default."""
    if cfg.data.data_dir is not None and not Path(cfg.data.data_dir).is_absolute():
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, data_dir=Path(cfg.data.data_dir).absolute()))
    if cfg.data.data_dir is None and cfg.data.synthetic_layout == "city" and cfg.step.far_plane == StepConfig.far_plane:
        from .data.city import VIEW_DISTANCE

        cfg = dataclasses.replace(cfg, step=dataclasses.replace(cfg.step, far_plane=VIEW_DISTANCE))
    if cfg.steps_scaler == 1.0:
        return cfg
    return dataclasses.replace(cfg, schedule=scale_schedule(cfg.schedule, cfg.steps_scaler), steps_scaler=1.0)


def validate(cfg: Config) -> None:
    """Raise ValueError naming the flag when a value is out of range or flags conflict."""
    checks = [
        (cfg.data.data_factor >= 1, "--data_factor must be >= 1"),
        (cfg.step.batch_size >= 1, "--batch_size must be >= 1"),
        (cfg.steps_scaler > 0 and math.isfinite(cfg.steps_scaler), "--steps_scaler must be > 0"),
        (0 <= cfg.model.sh_degree <= 3, "--sh_degree must be in 0..3"),
        (cfg.schedule.max_steps >= 1, "--max_steps must be >= 1"),
        (cfg.data.test_every >= 0, "--test_every must be >= 0"),
        (0.0 < cfg.model.init_opa < 1.0, "--init_opa must be in (0, 1)"),
        (cfg.model.init_num_pts >= 1, "--init_num_pts must be >= 1"),
        (0.0 <= cfg.step.ssim_lambda <= 1.0, "--ssim_lambda must be in [0, 1]"),
        (cfg.distributed.nproc_per_node >= 0, "--nproc_per_node must be >= 0"),
        (
            not (cfg.distributed.loopback and cfg.distributed.nproc_per_node > 1),
            "--loopback runs one process over a group of one rank; drop --nproc_per_node or --loopback",
        ),
        (cfg.schedule.sh_degree_interval >= 1, "--sh_degree_interval must be >= 1"),
        (cfg.schedule.refine_every >= 1, "--refine_every must be >= 1"),
        (cfg.schedule.reset_every >= 1, "--reset_every must be >= 1"),
        (cfg.schedule.profile_num_steps >= 1, "--profile_num_steps must be >= 1"),
        (
            not cfg.outputs.profile or cfg.schedule.profile_start_step < cfg.schedule.max_steps,
            f"--profile: the window starts at step {cfg.schedule.profile_start_step} (--profile_start_step), "
            f"but the run ends at --max_steps {cfg.schedule.max_steps}; lower --profile_start_step",
        ),
        (not (cfg.distributed.resume and cfg.distributed.overwrite), "--resume and --overwrite cannot be combined"),
        (
            not (cfg.distributed.auto_resume and (cfg.distributed.overwrite or cfg.distributed.ckpt)),
            "--resume auto cannot be combined with --overwrite or --ckpt",
        ),
        (cfg.distributed.save_every_minutes >= 0, "--save_every_minutes must be >= 0 (0 = off)"),
        (cfg.schedule.save_every >= 0, "--save_every must be >= 0 (0 = off)"),
        (cfg.distributed.dist_timeout_s > 0, "--dist_timeout_s must be > 0"),
        (not (cfg.distributed.resume and cfg.distributed.ckpt), "--resume and --ckpt cannot be combined"),
        (
            cfg.step.near_plane > 0 and cfg.step.far_plane > cfg.step.near_plane,
            "--near_plane/--far_plane must satisfy 0 < near < far",
        ),
        (cfg.data.synthetic_image_size >= 16, "--synthetic_image_size must be >= 16"),
        (
            cfg.data.synthetic_image_height == 0 or cfg.data.synthetic_image_height >= 16,
            "--synthetic_image_height must be 0 or >= 16",
        ),
        (cfg.data.synthetic_num_cameras >= 2, "--synthetic_num_cameras must be >= 2"),
        (
            cfg.schedule.prune_stage2_step >= 0 and cfg.schedule.prune_stage3_step >= 0,
            "--prune_stage2_step/--prune_stage3_step must be >= 0 (0 = off)",
        ),
        (
            not (cfg.schedule.prune_stage2_step and cfg.schedule.prune_stage3_step)
            or cfg.schedule.prune_stage3_step > cfg.schedule.prune_stage2_step,
            "--prune_stage3_step must come after --prune_stage2_step",
        ),
        (cfg.prune.prune_rounds >= 1, "--prune_rounds must be >= 1"),
        (0.0 <= cfg.data.device_images_share <= 1.0, "--device_images_share must be in [0, 1]"),
        (cfg.data.image_cache_gb >= 0, "--image_cache_gb must be >= 0 (0 = keep every image)"),
        (cfg.data.decode_threads >= 0, "--decode_threads must be >= 0 (0 = min(8, CPU cores))"),
        (0.0 < cfg.prune.prune_fraction <= 1.0, "--prune_fraction must be in (0, 1]"),
        (cfg.prune.tile_budget >= 0, "--tile_budget must be >= 0 (0 = from the device)"),
        (
            not (cfg.step.raster == "fused" and cfg.step.app_opt),
            "--raster fused never materializes the rendered image, so --app_opt cannot correct it; drop one",
        ),
        (not (cfg.step.raster == "fused" and cfg.step.pipeline != "ours"), "--raster fused needs --pipeline ours"),
        (
            cfg.step.raster != "unfused" or not cfg.step.random_tile_shift,
            "--random_tile_shift moves the fused kernel's tile-local SSIM; it needs --raster fused (or auto)",
        ),
        (
            not (cfg.step.random_tile_shift and fused_conflicts(cfg)),
            f"--random_tile_shift needs the fused step, which cannot run with {', '.join(fused_conflicts(cfg))} "
            "(the fused step never renders the image); drop one",
        ),
        (
            not (cfg.step.pipeline == "gsplat-dist" and cfg.step.sparse_grad_comm),
            "--sparse_grad_comm is an exchange of --pipeline ours (gsplat-dist runs gsplat's own); drop one",
        ),
        (
            cfg.outputs.lpips_weights is None or Path(cfg.outputs.lpips_weights).is_file(),
            f"--lpips_weights: no such file: {cfg.outputs.lpips_weights}",
        ),
        (1 <= cfg.outputs.port <= 65535, "--port must be in 1..65535"),
        (
            not (cfg.step.pipeline == "gsplat-dist" and cfg.step.packed),
            "--pipeline gsplat-dist is dense only (gsplat's packed distributed path crashes); drop --packed",
        ),
    ]
    checks += _gsplat_flag_checks(cfg)
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def fused_conflicts(cfg: Config) -> list[str]:
    """The options of ``cfg`` that need the rendered training image, which the fused step never
    materializes (each as its flag); --raster auto takes the unfused step when there is any, and
    --raster fused refuses them (:func:`validate`)."""
    return [
        flag
        for flag, on in (
            ("--app_opt", cfg.step.app_opt),
            ("--depth_loss", cfg.step.depth_loss),
            ("--use_bilateral_grid", cfg.step.use_bilateral_grid),
            ("--tb_save_image", cfg.outputs.tb_save_image),
            ("--pipeline gsplat-dist", cfg.step.pipeline != "ours"),
        )
        if on
    ]


def _gsplat_flag_checks(cfg: Config) -> list[tuple[bool, str]]:
    """The checks of the options gsplat simple_trainer users bring (docs/gsplat-flags.md: their table)."""
    fused = cfg.step.raster == "fused"
    return [
        (
            not (cfg.densify.absgrad and cfg.densify.strategy == "mcmc"),
            "--absgrad (--strategy.absgrad) is DefaultStrategy's; the mcmc strategy has none: drop one",
        ),
        (
            not (cfg.densify.absgrad and cfg.step.pipeline == "gsplat-dist"),
            "--absgrad with --pipeline gsplat-dist: gsplat's distributed rasterization refuses absgrad (use "
            "--pipeline ours, which routes it to the owners)",
        ),
        (
            not (cfg.step.depth_loss and (fused or cfg.step.pipeline == "gsplat-dist")),
            "--depth_loss renders expected depth with the unfused rasterizer of --pipeline ours: drop --raster fused "
            "or --pipeline gsplat-dist",
        ),
        (cfg.step.depth_lambda >= 0, "--depth_lambda must be >= 0"),
        (
            not (cfg.step.use_bilateral_grid and fused),
            "--raster fused never materializes the rendered image, so --use_bilateral_grid cannot correct it; drop one",
        ),
        (
            len(cfg.step.bilateral_grid_shape) == 3 and min(cfg.step.bilateral_grid_shape) >= 1,
            "--bilateral_grid_shape needs three positive cell counts (x y luminance)",
        ),
        (
            not (cfg.outputs.tb_save_image and fused),
            "--tb_save_image needs the rendered image, which --raster fused never materializes; drop one",
        ),
        (cfg.data.patch_size is None or cfg.data.patch_size >= 11, "--patch_size must be >= 11 (the SSIM window)"),
        (cfg.step.pose_noise >= 0, "--pose_noise must be >= 0"),
        (cfg.schedule.bilateral_grid_warmup >= 1, "--bilateral_grid_warmup must be >= 1"),
    ]


# ---------------------------------------------------------------- YAML (de)serialization


def to_dict(obj: Any) -> Any:
    """Dataclass tree -> plain dict of YAML-safe values (Paths as strings)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if value is None:
        if origin is typing.Union and type(None) in args:
            return None
        raise ValueError(f"{where}: null is not allowed")
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        return [_coerce(args[0], v, where) for v in value]
    if origin is Literal:
        if isinstance(value, bool) and "on" in args and "off" in args:  # YAML 1.1 reads on / off as booleans
            value = "on" if value else "off"
        if value not in args:
            raise ValueError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        return _from_dict(typing.cast(type, tp), value, where)
    if tp is Path:
        return Path(value)
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is bool and isinstance(value, bool):
        return value
    raise ValueError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def _from_dict(cls: type, data: dict, where: str, base: Any = None) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown}")
    obj = base if base is not None else cls()
    values = {}
    for name, value in data.items():
        if dataclasses.is_dataclass(hints[name]) and isinstance(value, dict):
            values[name] = _from_dict(hints[name], value, f"{where}.{name}", getattr(obj, name))
        else:
            values[name] = _coerce(hints[name], value, f"{where}.{name}")
    return dataclasses.replace(obj, **values)


def _leaves(cls: type) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        below: dict[str, tuple[str, ...]] = {f.name: ()}
        if dataclasses.is_dataclass(tp):
            below = {k: (f.name, *p) for k, p in _leaves(typing.cast(type, tp)).items()}
        for name, path in below.items():
            if name in out:
                raise TypeError(f"{cls.__name__}: two settings named {name!r}")
            out[name] = path
    return out


@functools.cache
def leaf_sections() -> dict[str, tuple[str, ...]]:
    """{field name: the sections it sits in} of every leaf field of Config, read from the
    dataclass tree: ``{"raster": ("step",), "max_steps": ("schedule",), "seed": (), ...}``.
    Raises TypeError when two leaves share a name (the flat command line could not tell them
    apart)."""
    return _leaves(Config)


def nest(data: dict, where: str) -> dict:
    """``data`` (a saved config, a checkpoint's, or a preset's settings) with each top-level key
    that names a field of a section moved into that section (:func:`leaf_sections`): a cfg.yml or
    checkpoint written before the settings were grouped into sections holds them flat
    (``raster: fused``, now ``step: {raster: fused}``). Other keys stay as they are (an unknown
    one is the loader's error). Raises ValueError naming ``where`` when a setting is given both
    flat and in its section, or a section is not a mapping."""
    paths = leaf_sections()
    out = copy.deepcopy({k: v for k, v in data.items() if not paths.get(k)})
    for key, value in data.items():
        node = out
        for section in paths.get(key, ()):
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise ValueError(f"{where}.{section}: expected a mapping")
        if node is out:
            continue  # a top-level setting (or an unknown key), already there
        if key in node:
            raise ValueError(f"{where}: {key} is given twice, at the top level and under {'.'.join(paths[key])}")
        node[key] = copy.deepcopy(value)
    return out


def saved_setting(data: dict, name: str) -> Any:
    """The value of setting ``name`` in a saved config mapping (a checkpoint's ``config``), flat
    or in sections; None when it holds none."""
    node: Any = nest(data, "config")
    for section in leaf_sections().get(name, ()):
        node = node.get(section) if isinstance(node, dict) else None
    return node.get(name) if isinstance(node, dict) else None


def apply_overrides(cfg: Config, data: dict, source: str) -> Config:
    """Return ``cfg`` with the (possibly partial, nested or flat) settings in ``data`` applied
    (a flat key of a section's field goes into its section: :func:`nest`).

    Raises ValueError naming ``source`` and the setting on an unknown key or a wrong type."""
    return _from_dict(Config, nest(data or {}, source), source, base=cfg)


def load_yaml(path: Path, base: Optional[Config] = None) -> Config:
    """Load a config (whole, or a preset's partial overrides) from a YAML file.

    Raises ValueError naming the file when it is missing, malformed or holds unknown settings."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--config: no such file: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"--config: {path} is not valid YAML: {e}") from e
    return apply_overrides(base or Config(), data, str(path))


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


TYRO_CONFIG: dict[str, Any] = {"use_underscores": True, "config": (tyro.conf.OmitArgPrefixes,)}
"""How tyro reads Config (from_argv, scripts/flag_reference.py): underscores as gsplat spells the
flags, and the section prefixes omitted (``--max_steps``, not ``--schedule.max_steps``)."""


def _pop_config_flag(args: list[str]) -> Optional[Path]:
    for i, a in enumerate(args):
        if a == "--config":
            if i + 1 >= len(args):
                raise ValueError("--config needs a file")
            path = Path(args[i + 1])
            del args[i : i + 2]
            return path
        if a.startswith("--config="):
            del args[i]
            return Path(a.split("=", 1)[1])
    return None


def _resume_auto_alias(args: list[str]) -> list[str]:
    """``--resume auto`` / ``--resume=auto`` -> ``--auto_resume`` (``--resume`` alone stays a
    switch, as gsplat users type it)."""
    out, i = [], 0
    while i < len(args):
        if args[i] == "--resume" and i + 1 < len(args) and args[i + 1] == "auto":
            out.append("--auto_resume")
            i += 2
            continue
        out.append("--auto_resume" if args[i] == "--resume=auto" else args[i])
        i += 1
    return out


def from_argv(argv: Sequence[str], prog: Optional[str] = None) -> Config:
    """``[PRESET] [--config FILE] [FLAGS]`` -> validated, resolved Config (``--steps_scaler``
    applied): the library's way from a command line to a config (the CLI, the scripts). ``prog``
    names the command in tyro's help (``--help`` prints it and exits 0).

    Raises ValueError naming the flag or file on bad input, or when neither a preset nor a
    config file is named."""
    from ..configs import preset_names, preset_path

    args = list(argv)
    preset = args.pop(0) if args and not args[0].startswith("-") else None
    if preset is not None and preset not in preset_names():
        raise ValueError(f"unknown preset {preset!r}; choose one of {preset_names()}")
    config_file = _pop_config_flag(args)
    args = _resume_auto_alias(args)
    if preset is None and config_file is None:
        raise ValueError(f"name a preset ({', '.join(preset_names())}) or pass --config FILE")
    base = load_yaml(preset_path(preset)) if preset else Config()
    if config_file is not None:
        # a saved cfg.yml records how that run was started (--resume, --overwrite, --ckpt); rerunning
        # its config starts a new run unless this command line says otherwise
        base = load_yaml(config_file, base)
        base = dataclasses.replace(
            base,
            distributed=dataclasses.replace(
                base.distributed, resume=False, overwrite=False, ckpt=None, auto_resume=False
            ),
        )
    cfg = tyro.cli(
        Config,
        default=base,
        args=args,
        prog=prog or f"splat-train {preset or ''}".strip(),
        **TYRO_CONFIG,
    )
    if cfg.step.packed_auto and any(a in PACKED_FLAGS for a in args):
        # the user's --packed / --no_packed wins
        cfg = dataclasses.replace(cfg, step=dataclasses.replace(cfg.step, packed_auto=False))
    validate(cfg)
    return resolve(cfg)


PACKED_FLAGS = ("--packed", "--no_packed", "--no-packed")  # how tyro spells the switch


def resolve_packed(cfg: Config, world_size: int) -> tuple[Config, Optional[str]]:
    """``packed_auto`` (the bytesplat preset's): packed records where they travel between ranks
    (``world_size`` > 1, --pipeline ours), dense records at W = 1, where nothing travels and
    packed rendering costs more (docs/bytesplat.md). Returns the config with
    ``packed`` set and ``packed_auto`` off (so its cfg.yml reruns the same exchange), and the
    console line that says so; ``cfg`` and None without ``packed_auto``."""
    if not cfg.step.packed_auto:
        return cfg, None
    packed = world_size > 1 and cfg.step.pipeline == "ours"
    why = (
        "only visible records travel between ranks" if packed else "no records travel, and packed rendering costs more"
    )
    line = (
        f"exchange: {'packed' if packed else 'dense'} records at world size {world_size} (--packed_auto: {why}; "
        f"{'--no_packed' if packed else '--packed'} overrides it)"
    )
    return dataclasses.replace(cfg, step=dataclasses.replace(cfg.step, packed=packed, packed_auto=False)), line

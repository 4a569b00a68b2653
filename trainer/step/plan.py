"""Which training step a run takes, decided once: :class:`StepPlan`.

A step has six independent choices, each made here and nowhere else, each with its reason:

- the path (``distributed``): the distributed one (every collective, the records and their
  gradients through the all_to_alls; W > 1, or ``--loopback``: one process over a process group
  of one rank, launch.loopback_group) or one process's, whose exchange is the identity;
- the projection (``projection``): kernels/projection.py's Triton kernels on the raw parameters
  (activation, projection and SH in one launch, a per-Gaussian backward in another) or the
  activations and gsplat's projection and SH ops;

- the rasterization (``raster``): the fused native kernel (forward compositing, tile-local loss
  and backward in one launch; kernels/fused_raster.py) or the unfused step (gsplat's rasterizer,
  the full-image loss, autograd);
- the pass (``pipeline``): this trainer's exchange (dense or ``--packed``) or gsplat's own
  ``rasterization(distributed=True)`` (the benchmark's baseline);
- the optimizer (``fused_adam``): the Gaussians' Adam inside the projection's backward kernel
  (step/backward_adam.py) or kernels/adam.py's launch after the backward, and with the latter
  (``lazy_sh_adam``) the SH coefficients' update deferred for the Gaussians not seen
  (kernels/lazy_adam.py);
- the CUDA graphs (``graphs``): the whole step as three replays around the tile intersection
  (``"whole"``, step/graphed.py), only the activation, projection and SH (``"head"``,
  step/capture.py), or none (``"off"``).

What still varies from step to step is the data: a step whose cameras differ in size, or whose
images carry loss masks, runs its forward eagerly even under a graph plan (step/forward.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..config import Config, fused_conflicts


@dataclass(frozen=True)
class StepPlan:
    """The step of a run: built once by :func:`plan_step`, read by every step."""

    raster: str  # "fused" | "unfused"
    raster_why: str
    graphs: str  # "whole" | "head" | "off"
    graphs_why: str
    pipeline: str = "ours"  # "ours" | "gsplat-dist"
    packed: bool = False
    tile_shift: bool = False  # --random_tile_shift moves the fused step's tile grid every step
    selective_adam: bool = False  # --visible_adam / --sparse_grad: only visible Gaussians step
    projection: str = "gsplat"  # "triton" (kernels/projection.py) | "gsplat"
    projection_why: str = ""
    distributed: bool = False  # the distributed path (W > 1 or --loopback; DistContext.distributed)
    distributed_why: str = ""
    fused_adam: bool = False  # the Gaussians' Adam inside the projection's backward (step/backward_adam.py)
    fused_adam_why: str = ""
    lazy_sh_adam: bool = False  # the SH Adam of unseen Gaussians deferred (kernels/lazy_adam.py)
    lazy_sh_adam_why: str = ""
    # --lazy_sh_adam auto left off for the shard's size or the share a step sees: asked again at each
    # later check (Trainer.defer_sh_adam_if_large)
    lazy_sh_adam_later: bool = False
    # the share of the shard a step sees, where --lazy_sh_adam auto estimated it (step_seen_share)
    lazy_sh_adam_share: Optional[float] = None
    # MiB of checkpoint scratch one launch of the fused kernel may take (kernels/fused_raster.py)
    fused_scratch_mb: float = 2048.0

    @property
    def fused(self) -> bool:
        return self.raster == "fused"

    def scratch_gib(self) -> float:
        """GiB of checkpoint scratch a fused launch may take: ``fused_scratch_mb`` or what
        SPLAT_TRAIN_FUSED_SCRATCH_MB sets instead (ValueError where that is not positive)."""
        from ...kernels.fused_raster import _scratch_cap_floats

        return _scratch_cap_floats(self.fused_scratch_mb) * 4 / 2**30

    def describe(self) -> str:
        """One console line: the step and why."""
        exchange = "gsplat's distributed pass" if self.pipeline != "ours" else ("packed" if self.packed else "dense")
        graphs = {"whole": "whole-step CUDA graphs", "head": "CUDA graphs of the projection", "off": "no CUDA graphs"}
        path = "the distributed path" if self.distributed else "one process's path"
        adam = "Adam in the projection's backward" if self.fused_adam else "Adam after the backward"
        scratch = f"; checkpoints up to {self.scratch_gib():.1f} GiB a launch" if self.fused else ""
        lazy = f", the SH Adam of unseen Gaussians deferred ({self.lazy_sh_adam_why})" if self.lazy_sh_adam else ""
        if not self.lazy_sh_adam and self.lazy_sh_adam_share is not None:  # the share decided: say so
            lazy = f", the SH Adam dense ({self.lazy_sh_adam_why})"
        return (
            f"step: {path} ({self.distributed_why}), {self.projection} projection ({self.projection_why}), "
            f"{self.raster} rasterization "
            f"({self.raster_why}{scratch}), {exchange} records, {graphs[self.graphs]} ({self.graphs_why}), "
            f"{adam} ({self.fused_adam_why}){lazy}"
        )


def raster_mode(cfg: Config, device_type: str, masked: bool, kernel_ready: Callable[[], bool]) -> tuple[str, str]:
    """(the step's rasterization, why) from --raster: auto is fused on a GPU unless the run needs
    the rendered image (config.fused_conflicts) or its training views have loss masks
    (``masked``), and unfused on the CPU; --raster fused on the CPU runs the kernel's PyTorch
    reference. A fused step on a GPU where the native kernel cannot be built (``kernel_ready()``,
    called only then, is False) is unfused: full-image SSIM, no --random_tile_shift.
    Raises ValueError for --raster fused with masks."""
    if cfg.step.raster == "fused" and masked:
        raise ValueError(
            "the training views have loss masks (masks/ files, alpha channels or fisheye borders), "
            "which --raster fused cannot apply (its tile-local loss reads the images as they are): "
            "use --raster unfused, or --no-alpha_as_mask when the masks are alpha channels"
        )
    if cfg.step.raster == "unfused":
        return "unfused", "--raster unfused"
    if cfg.step.raster == "auto":
        if device_type != "cuda":
            return "unfused", "--raster auto on the CPU"
        if cfg.distributed.ckpt:
            return "unfused", "--ckpt: evaluation only"
        if masked:
            return "unfused", "--raster auto: the training views have loss masks"
        if fused_conflicts(cfg):
            return "unfused", f"--raster auto: {', '.join(fused_conflicts(cfg))} needs the rendered image"
    if device_type != "cuda":
        return "fused", "--raster fused on the CPU: the kernel's PyTorch reference"
    if not kernel_ready():
        return "unfused", f"--raster {cfg.step.raster}: the native kernel is unavailable"
    return "fused", f"--raster {cfg.step.raster} on a GPU"


def native_kernel_everywhere(ctx, raster_flag: str, warn: Callable[[str], None]) -> bool:
    """Whether every rank of ``ctx`` can run the native fused kernel (kernels/native.py builds it
    here on first use; one all_reduce of a flag, exchange.any_rank). A fused step is unfused on
    every rank when any rank cannot build it; ``warn`` says why in one line (``raster_flag``:
    --raster, for the line)."""
    from ...kernels import native
    from .. import exchange

    here = native.load(quiet=True) is not None
    if not exchange.any_rank(ctx, [not here])[0]:
        return True
    warn(
        native.unavailable_warning(raster_flag)
        if not here
        else f"warning: --raster {raster_flag}: the native kernel is unavailable on another rank; "
        "every rank takes the unfused step"
    )
    return False


def use_cuda_graphs(setting: str, world_size: int, loopback: bool = False) -> bool:
    """Whether --cuda_graphs ``setting`` ("auto", "on", "off") asks for graphs in a run of
    ``world_size`` processes: "auto" is on for one process off the distributed path (not
    ``loopback``) on CUDA (not on a ROCm build of torch)."""
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"--cuda_graphs must be auto, on or off, got {setting!r}")
    if setting == "auto":
        return world_size == 1 and not loopback and torch.version.hip is None
    return setting == "on"


def path_mode(world_size: int, loopback: bool) -> tuple[bool, str]:
    """(whether the step takes the distributed path, why): W > 1, or ``loopback`` (--loopback)."""
    if loopback:
        return True, "--loopback: a process group of one rank, no shortcut of one process"
    if world_size > 1:
        return True, f"{world_size} processes"
    return False, "one process: the exchange is the identity"


def trains_photometric_only(cfg: Config, aux: tuple[str, ...]) -> Optional[str]:
    """None when a step trains nothing but the photometric loss (what a whole-step graph replays),
    else the first flag that adds something (``aux``: the names of the auxiliary modules,
    trainer/aux_modules.py)."""
    if aux:
        return {"pose": "--pose_opt", "app": "--app_opt", "bilagrid": "--use_bilateral_grid"}.get(aux[0], aux[0])
    for flag, on in (
        ("--depth_loss", cfg.step.depth_loss),
        ("--opacity_reg", cfg.step.opacity_reg > 0),
        ("--scale_reg", cfg.step.scale_reg > 0),
        ("--tb_save_image", cfg.outputs.tb_save_image),
    ):
        if on:
            return flag
    return None


def graphs_mode(
    cfg: Config, device_type: str, world_size: int, raster: str, aux: tuple[str, ...], loopback: bool = False
) -> tuple[str, str]:
    """(the step's CUDA graphs, why): "whole" (the step as three replays around the tile
    intersection, dense records, nothing but the photometric loss, no tile shift; on the
    distributed path, W > 1 or ``loopback``, with the record exchanges captured too
    (step/graphed_exchange.py), where neither --sparse_grad_comm nor --absgrad is set), "head"
    (the activation, projection and SH replayed, the rest eager) or "off". --cuda_graphs auto
    asks for graphs on one process only (:func:`use_cuda_graphs`)."""
    if cfg.step.cuda_graphs == "off":
        return "off", "--cuda_graphs off"
    if device_type != "cuda":
        return "off", "a CPU run"
    if not use_cuda_graphs(cfg.step.cuda_graphs, world_size, loopback):
        why = "--loopback" if loopback else ("a ROCm build" if world_size == 1 else f"{world_size} processes")
        return "off", f"--cuda_graphs auto: {why}"
    if cfg.step.pipeline != "ours":
        return "off", "--pipeline gsplat-dist"
    if cfg.step.packed:
        return "off", "--packed"
    if cfg.step.random_tile_shift and raster == "fused":
        return "off", "--random_tile_shift"
    extra = trains_photometric_only(cfg, aux)
    if extra is not None:
        return "head", f"{extra} trains besides the photometric loss"
    if world_size > 1 or loopback:
        where = "--loopback" if loopback else f"{world_size} processes"
        if cfg.step.sparse_grad_comm:
            return "head", f"{where} with --sparse_grad_comm (its reverse exchange reads its counts on the host)"
        if cfg.densify.absgrad:
            return "head", f"{where} with --absgrad"
        return "whole", f"--cuda_graphs {cfg.step.cuda_graphs}, {where}: the dense record exchange captured"
    return "whole", f"--cuda_graphs {cfg.step.cuda_graphs}"


def projection_mode(cfg: Config, device_type: str, world_size: int, aux: tuple[str, ...]) -> tuple[str, str]:
    """(the step's projection, why): "triton" (kernels/projection.py's fused kernels, on the raw
    parameters) where they apply: a CUDA device with Triton, pinhole cameras, dense records of
    this trainer's pass, cameras not learned (--pose_opt), at most projection.MAX_CAMERAS cameras
    a step; else "gsplat". Raises ValueError for --projection triton where it cannot run."""
    from ...kernels import projection

    why_not = None
    if device_type != "cuda":
        why_not = "a CPU run"
    elif not projection.available():
        why_not = "Triton is not installed"
    elif cfg.data.camera_model != "pinhole":
        why_not = f"--camera_model {cfg.data.camera_model}"
    elif cfg.step.packed:
        why_not = "--packed"
    elif cfg.step.pipeline != "ours":
        why_not = "--pipeline gsplat-dist"
    elif "pose" in aux:
        why_not = "--pose_opt"
    elif cfg.step.batch_size * world_size > projection.MAX_CAMERAS:
        why_not = f"{cfg.step.batch_size * world_size} cameras a step (at most {projection.MAX_CAMERAS})"
    if cfg.step.projection == "gsplat":
        return "gsplat", "--projection gsplat"
    if why_not is None:
        return "triton", f"--projection {cfg.step.projection}"
    if cfg.step.projection == "triton":
        raise ValueError(f"--projection triton cannot run this pass ({why_not}); use --projection auto or gsplat")
    return "gsplat", f"--projection auto: {why_not}"


# a dense fused step's peak device memory per Gaussian with the separate Adam (1,177 B at 60 M,
# 1,234 at 20 M, SH degree 3: docs/bench/large-scenes/bench-60m, bench-20m), rounded up
TIGHT_BYTES_PER_GAUSSIAN = 1300
TIGHT_SHARE = 0.8  # --fused_adam auto: on when that peak would pass this share of free device memory


def memory_tight(num_gaussians: int, free_bytes: Optional[int]) -> bool:
    """Whether a step with the separate Adam would need more than TIGHT_SHARE of ``free_bytes``
    (free device memory; None: unknown, not tight) for ``num_gaussians`` local Gaussians."""
    return free_bytes is not None and num_gaussians * TIGHT_BYTES_PER_GAUSSIAN > TIGHT_SHARE * free_bytes


SCRATCH_SHARE = 0.125  # of the device's memory: the most the fused kernel's scratch takes


def scratch_mode(
    device_type: str,
    total_bytes: Optional[int],
    free_bytes: Optional[int] = None,
    num_gaussians: int = 0,
    lean: bool = False,
) -> float:
    """MiB of checkpoint scratch one launch of the fused kernel may take: SCRATCH_SHARE of the
    device's memory (``total_bytes``), at most half of what ``free_bytes`` leaves after a step of
    ``num_gaussians`` local Gaussians at TIGHT_BYTES_PER_GAUSSIAN, and at least
    kernels.fused_raster's DEFAULT_SCRATCH_MB, which it is also off a GPU and for a ``lean`` step
    (the Adam in the projection's backward: a run that saves the gradients' memory). A step whose scratch passes it
    runs the kernel in several launches, reading the tile offsets on the host, and its tail
    uncaptured (step/graphed.py); the 20 M benchmarks need about 6 GB (128 bytes per tile
    intersection)."""
    from ...kernels.fused_raster import DEFAULT_SCRATCH_MB

    mb = float(DEFAULT_SCRATCH_MB)
    if device_type != "cuda" or not total_bytes or lean:
        return mb
    room = SCRATCH_SHARE * total_bytes
    if free_bytes is not None:
        room = min(room, (free_bytes - num_gaussians * TIGHT_BYTES_PER_GAUSSIAN) / 2)
    return max(mb, room / 2**20)


def adam_mode(cfg: Config, projection: str, tight: bool = False) -> tuple[bool, str]:
    """(whether the Gaussians' Adam runs inside the projection's backward kernel, why) from
    --fused_adam: it needs the Triton projection (``projection``, StepPlan.projection), SH of at
    most degree 3 stored, and no loss term on the parameters outside the projection (their
    gradients would arrive after the kernel stepped them); auto takes it only where memory is
    ``tight`` (:func:`memory_tight`): the separate launch is faster (docs/large-scenes.md).
    Raises ValueError for --fused_adam on where it cannot run."""
    why_not = None
    if projection != "triton":
        why_not = "the gsplat projection (--projection, or a CPU run)"
    elif cfg.model.sh_degree > 3:
        why_not = f"--sh_degree {cfg.model.sh_degree} (the kernel steps at most 16 SH bases)"
    elif cfg.step.opacity_reg > 0:
        why_not = "--opacity_reg (a gradient on the opacities outside the projection)"
    elif cfg.step.scale_reg > 0:
        why_not = "--scale_reg (a gradient on the scales outside the projection)"
    auto = (
        (True, "--fused_adam auto: the gradients' memory is needed (a large model for the device)")
        if tight
        else (False, "--fused_adam auto: the model fits with the gradients, where the separate launch is faster")
    )
    return switch("--fused_adam", cfg.step.fused_adam, why_not, auto)


def switch(flag: str, setting: str, why_not: Optional[str], auto: tuple[bool, str]) -> tuple[bool, str]:
    """(on, why) of an auto|on|off ``flag`` at ``setting`` for a step it cannot take where
    ``why_not`` says why (None: it can): off is off; on is on, or a ValueError naming the flag and
    the reason; auto is ``auto`` where the step can take it, else off with the reason."""
    if setting == "off":
        return False, f"{flag} off"
    if why_not is None:
        return (True, f"{flag} on") if setting == "on" else auto
    if setting == "on":
        raise ValueError(f"{flag} on cannot run this step ({why_not}); use {flag} auto or off")
    return False, f"{flag} auto: {why_not}"


# --lazy_sh_adam auto: on from this many Gaussians in the rank's shard (at the start, or once
# densification or a resumed checkpoint brings it there), where the step is bound by the device's
# memory traffic; below it the deferral's host work and launches cost more than the SH traffic it
# saves (juicebox f4: 1.84-2.24 against 1.56-1.61 ms/step; city 20 M: 16.88 against 19.50 ms/iter;
# docs/large-scenes.md)
LAZY_MIN_GAUSSIANS = 2_000_000
# ... and only where a step sees at most this share of the shard (step_seen_share). A seen row that
# waited costs the deferral its catch-up and its listed SH step, about ten times the dense Adam's
# SH traffic per row (the city 20 M profile), so it pays where a step sees under about a tenth of
# the Gaussians; where every Gaussian is seen nothing waits and the listing is pure cost
# (docs/large-scenes.md, "Which scenes defer").
LAZY_MAX_SEEN_SHARE = 0.1


def lazy_adam_mode(
    cfg: Config,
    projection: str,
    fused_adam: bool,
    selective: bool,
    num_gaussians: int = 0,
    seen_share: Optional[float] = None,
) -> tuple[bool, str]:
    """(whether the SH coefficients' Adam is deferred for unseen Gaussians, why) from
    --lazy_sh_adam: it needs the Triton projection (``projection``: its forward catches the rows
    up) and kernels/adam.py's separate launch (not ``fused_adam``, not the ``selective`` update of
    --visible_adam / --sparse_grad); auto takes it where the shard holds at least
    :data:`LAZY_MIN_GAUSSIANS` (``num_gaussians``) and a step sees at most
    :data:`LAZY_MAX_SEEN_SHARE` of them (``seen_share``, :func:`step_seen_share`; None: not
    estimated, the size alone decides). Raises ValueError for --lazy_sh_adam on where it cannot
    run."""
    why_not = lazy_adam_blocker(projection, fused_adam, selective)
    if num_gaussians < LAZY_MIN_GAUSSIANS:
        auto = (False, f"--lazy_sh_adam auto: {num_gaussians:,} Gaussians, under {LAZY_MIN_GAUSSIANS:,}")
    elif seen_share is not None and seen_share > LAZY_MAX_SEEN_SHARE:
        auto = (False, f"--lazy_sh_adam auto: {seen_share_words(seen_share)}, over {LAZY_MAX_SEEN_SHARE:.0%}")
    else:
        seen = "" if seen_share is None else f", {seen_share_words(seen_share)}"
        auto = (True, f"--lazy_sh_adam auto: {num_gaussians:,} Gaussians in the shard{seen}")
    return switch("--lazy_sh_adam", cfg.step.lazy_sh_adam, why_not, auto)


def seen_share_words(share: float) -> str:
    """The console's words for a :func:`step_seen_share` estimate."""
    return f"a step sees about {share:.1%} of the shard's Gaussians (the training cameras' frusta)"


def step_seen_share(
    means: torch.Tensor,
    viewmats: torch.Tensor,
    Ks: torch.Tensor,
    sizes: torch.Tensor,
    near: float,
    far: float,
    batch_size: int,
    world_size: int = 1,
    sample: int = 65536,
    chunk: int = 64,
) -> float:
    """The expected share of the Gaussians ``means`` (float [N, 3], world units) that a step sees,
    each of its ``world_size`` ranks drawing ``batch_size`` distinct training cameras (data.
    CameraSampler: a rank's batch from a permutation of the views, the ranks' independent) from
    ``viewmats`` (float [V, 4, 4], world-to-camera), ``Ks`` (float [V, 3, 3], pixels) and ``sizes``
    (int [V, 2], width and height in pixels): each Gaussian's mean tested against every camera's
    pinhole frustum (depth in (``near``, ``far``), pixel inside the image; extents and lens models
    ignored), on at most ``sample`` Gaussians taken at an even stride, ``chunk`` cameras at a
    time. A Gaussian seen by m of the V cameras escapes a rank's B = min(batch_size, V) cameras
    with probability C(V - m, B) / C(V, B) = prod_{j < B} (V - m - j) / (V - j), and the step with
    that to the power world_size; the result is the mean of one minus it. No synchronization beyond
    the one .item(). Raises ValueError for an empty camera set, or batch_size or world_size under 1."""
    V = int(viewmats.shape[0])
    if V == 0 or batch_size < 1 or world_size < 1:
        raise ValueError(
            f"step_seen_share needs cameras (got {V}), batch_size >= 1 (got {batch_size}) and world_size >= 1 "
            f"(got {world_size})"
        )
    N = int(means.shape[0])
    if N == 0:
        return 0.0
    S = min(N, sample)
    idx = torch.arange(S, device=means.device) * N // S  # an even stride over the whole shard
    pts = means.detach()[idx].float()  # [S, 3]
    seen = torch.zeros(pts.shape[0], device=pts.device, dtype=torch.float32)
    for c0 in range(0, V, chunk):
        vm = viewmats[c0 : c0 + chunk].to(pts)
        K = Ks[c0 : c0 + chunk].to(pts)
        wh = sizes[c0 : c0 + chunk].to(pts)
        cam = torch.einsum("cij,sj->csi", vm[:, :3, :3], pts) + vm[:, None, :3, 3]  # [c, S, 3]
        z = cam[..., 2]
        zs = torch.where(z > 0, z, torch.ones_like(z))
        u = K[:, None, 0, 0] * cam[..., 0] / zs + K[:, None, 0, 2]
        v = K[:, None, 1, 1] * cam[..., 1] / zs + K[:, None, 1, 2]
        inside = (z > near) & (z < far) & (u >= 0) & (u < wh[:, None, 0]) & (v >= 0) & (v < wh[:, None, 1])
        seen += inside.float().sum(0)
    miss = torch.ones_like(seen)
    for j in range(min(int(batch_size), V)):
        miss = miss * ((V - seen - j) / (V - j)).clamp_min(0.0)
    return float((1.0 - miss**world_size).mean().item())


def lazy_adam_blocker(projection: str, fused_adam: bool, selective: bool) -> Optional[str]:
    """Why the step cannot defer the SH Adam (:func:`lazy_adam_mode`'s arguments), or None."""
    from ...kernels import lazy_adam

    why_not = None
    if projection != "triton":
        why_not = "the gsplat projection (--projection, or a CPU run)"
    elif fused_adam:
        why_not = "Adam in the projection's backward (--fused_adam)"
    elif selective:
        why_not = "--visible_adam / --sparse_grad (gsplat's SelectiveAdam)"
    elif not lazy_adam.available():
        why_not = "Triton is not installed"
    return why_not


def check_pipeline(cfg: Config, device_type: str, world_size: int, sampler, loopback: bool = False) -> None:
    """Raise ValueError for a run its device or data cannot take: --loopback without its group
    (``loopback``: the rank's DistContext.loopback, set by launch.loopback_group), mcmc's
    relocation and --pipeline gsplat-dist on the CPU, gsplat-dist's exchange with uneven batches
    (``sampler``: this rank's data.CameraSampler)."""
    if cfg.distributed.loopback != loopback:
        raise ValueError(
            "--loopback needs the process group of one rank that launch.loopback_group makes "
            f"(this rank's context has loopback={loopback})"
        )
    if cfg.densify.strategy == "mcmc" and device_type != "cuda":
        raise ValueError(
            "the mcmc preset relocates Gaussians with gsplat's CUDA op, which needs a GPU; "
            "on the CPU use the default preset (or --device cuda on a GPU machine)"
        )
    if cfg.step.pipeline == "gsplat-dist" and world_size > 1 and not sampler.uniform_batches:
        raise ValueError(
            f"--pipeline gsplat-dist with {world_size} ranks needs batches of one camera count "
            f"and image size on every rank (gsplat's exchange assumes it), but the "
            f"{sum(len(g) for g in sampler.groups)} training views ({len(sampler.groups)} image size(s)) in batches of "
            f"--batch_size {cfg.step.batch_size} leave shorter or mixed batches; use a --batch_size "
            "that divides the view count of a one-size dataset, or --pipeline ours"
        )
    if cfg.step.pipeline == "gsplat-dist" and device_type != "cuda":
        raise ValueError(
            "--pipeline gsplat-dist is gsplat's CUDA rasterization(distributed=True), which needs "
            "a GPU; on the CPU use --pipeline ours"
        )


def plan_step(
    cfg: Config,
    device_type: str,
    world_size: int,
    masked: bool,
    aux: tuple[str, ...] = (),
    kernel_ready: Callable[[], bool] = lambda: True,
    loopback: bool = False,
    tight: bool = False,
    num_gaussians: int = 0,
    total_bytes: Optional[int] = None,
    free_bytes: Optional[int] = None,
    seen_share: Optional[float] = None,
) -> StepPlan:
    """The :class:`StepPlan` of a run of ``cfg`` on ``device_type`` ("cuda" | "cpu") with
    ``world_size`` processes; ``masked``: the training views have loss masks; ``aux``: the
    auxiliary modules it trains; ``kernel_ready``: whether every rank can run the native kernel
    (asked only for a fused step on a GPU); ``loopback``: one process on the distributed path
    (launch.loopback_group); ``tight``: device memory is tight for the model (:func:`memory_tight`);
    ``num_gaussians``: the rank's shard at the start; ``total_bytes``, ``free_bytes``: the device's
    memory and what is free of it (for the fused kernel's scratch, :func:`scratch_mode`);
    ``seen_share``: the share of the shard a step sees (:func:`step_seen_share`; None: unknown).
    Raises ValueError as :func:`raster_mode`, :func:`adam_mode` and :func:`lazy_adam_mode`."""
    raster, raster_why = raster_mode(cfg, device_type, masked, kernel_ready)
    graphs, graphs_why = graphs_mode(cfg, device_type, world_size, raster, aux, loopback)
    distributed, distributed_why = path_mode(world_size, loopback)
    projection, projection_why = projection_mode(cfg, device_type, world_size, aux)
    fused_adam, fused_adam_why = adam_mode(cfg, projection, tight)
    selective = cfg.step.visible_adam or cfg.step.sparse_grad
    lazy, lazy_why = lazy_adam_mode(cfg, projection, fused_adam, selective, num_gaussians, seen_share)
    later = (
        not lazy and cfg.step.lazy_sh_adam == "auto" and lazy_adam_blocker(projection, fused_adam, selective) is None
    )
    return StepPlan(
        raster=raster,
        raster_why=raster_why,
        graphs=graphs,
        graphs_why=graphs_why,
        pipeline=cfg.step.pipeline,
        packed=cfg.step.packed,
        tile_shift=cfg.step.random_tile_shift and raster == "fused",
        selective_adam=selective,
        projection=projection,
        projection_why=projection_why,
        distributed=distributed,
        distributed_why=distributed_why,
        fused_adam=fused_adam,
        fused_adam_why=fused_adam_why,
        lazy_sh_adam=lazy,
        lazy_sh_adam_why=lazy_why,
        lazy_sh_adam_later=later,
        lazy_sh_adam_share=seen_share if cfg.step.lazy_sh_adam == "auto" else None,
        fused_scratch_mb=scratch_mode(device_type, total_bytes, free_bytes, num_gaussians, lean=fused_adam),
    )

"""The training loop: ``Trainer.train()`` and ``Trainer.train_step()``.

A step, in data-flow order: draw this rank's cameras -> render (projection, SH, exchange,
rasterization; render.py) -> loss -> backward (the exchange's reverse all_to_all brings every
partial gradient to its Gaussian's owner) -> Adam on the local shard -> densify the local shard.
"""

from __future__ import annotations

import functools
import json
import math
import random
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from . import checkpoint, evaluate, exchange, export, prune
from ..kernels.fused_ssim import fused_l1_ssim_loss, uint8_to_unit
from .config import Config, dump_yaml, fused_conflicts
from .data import CameraSampler, Dataset, Scene, split_indices
from .bilagrid import LR as BILAGRID_LR
from .bilagrid import TV_WEIGHT, BilateralGrid
from .bilagrid import lr_lambda as bilagrid_lr_lambda
from .data.sampler import patch_window
from .data.views import TrainViews, rows_of
from . import densify
from .densify import initialize_state, make_strategy
from .depth import DepthTargets, depth_loss
from .launch import DistContext, Interrupted
from . import losses
from .losses import opacity_reg, photometric_loss, scale_reg
from .aux_modules import pose_perturbation
from .model import activated, create_optimizers, create_shard, initial_points, means_lr_scheduler, optimizer_step
from .graphs import GraphedHead, graphable, use_cuda_graphs
from . import step_graphs
from .step_graphs import GraphedStep
from .profiling import PhaseTimer
from .report import Reporter
from .render import (
    TILE_SIZE,
    CameraBatch,
    PassLayout,
    RenderSetup,
    check_camera_model,
    ops_for,
    padding_only_radii,
    render,
    resolve_backend,
    rigid_inverse,
    shift_cameras,
    shift_intrinsics,
    visible_gaussians,
)
from .shard import GaussianShard
from .viewer import start_training_viewer


STOP_CHECK_EVERY = 20  # W > 1: the most steps between the collectives that agree on a stop or a timed save


def _unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel wrapper (--pose_opt / --app_opt with W > 1)."""
    return getattr(module, "module", module)


def _upload(rows: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host table on ``device`` without a host synchronization: staged in pinned memory
    and copied asynchronously on a GPU (a copy from pageable memory waits for the device)."""
    if device.type == "cpu":
        return torch.tensor(rows, dtype=dtype)
    return torch.tensor(rows, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def raster_mode(cfg: Config, device_type: str, masked: bool, kernel_ready) -> str:
    """The step a run takes, "fused" or "unfused", from --raster: auto is fused on a GPU unless the
    run needs the rendered image (config.fused_conflicts) or its training views have loss masks
    (``masked``), and unfused on the CPU; --raster fused on the CPU runs the kernel's PyTorch
    reference. A fused step on a GPU where the native kernel cannot be built (``kernel_ready()``,
    called only then, is False) is unfused: full-image SSIM, no --random_tile_shift.
    Raises ValueError for --raster fused with masks."""
    if cfg.raster == "fused" and masked:
        raise ValueError(
            "the training views have loss masks (masks/ files, alpha channels or fisheye borders), "
            "which --raster fused cannot apply (its tile-local loss reads the images as they are): "
            "use --raster unfused, or --no-alpha_as_mask when the masks are alpha channels"
        )
    if cfg.raster == "unfused":
        return "unfused"
    if cfg.raster == "auto" and (device_type != "cuda" or masked or fused_conflicts(cfg) or cfg.ckpt):
        return "unfused"  # (--ckpt: evaluation only, no training step to build a kernel for)
    if device_type != "cuda":
        return "fused"
    return "fused" if kernel_ready() else "unfused"


class Trainer:
    """One rank's view of a run. Every rank constructs one and calls the same methods."""

    def __init__(self, cfg: Config, ctx: DistContext, scene: Scene):
        self.cfg, self.ctx, self.device = cfg, ctx, ctx.device
        self.result_dir = Path(cfg.result_dir)
        self.report = Reporter(self.result_dir, ctx.rank)  # rank 0 writes; a no-op elsewhere
        self.backend = resolve_backend(cfg.backend, self.device)
        self.ops = ops_for(cfg.backend, self.device)
        self.scene = scene
        self.scene_scale = scene.scene_scale * 1.1 * cfg.global_scale
        check_camera_model(scene, cfg.camera_model)
        train_idx, test_idx = split_indices(len(scene.cameras), cfg.test_every)
        preload = cfg.image_cache_gb == 0  # with a bound, images are decoded as needed
        self.trainset = Dataset(scene, train_idx, preload=preload, alpha_as_mask=cfg.alpha_as_mask)
        mine = exchange.deal_views(len(test_idx), ctx)[0] if preload else ()  # the test views this rank scores
        self.testset = Dataset(scene, test_idx, preload=mine, alpha_as_mask=cfg.alpha_as_mask)
        # every rank's sampler: a rank knows what every other rank renders at a step without asking
        self.samplers = [CameraSampler(self.trainset, cfg.batch_size, cfg.seed, r) for r in range(ctx.world_size)]
        self.sampler = self.samplers[ctx.rank]
        self.depth_targets = DepthTargets(self.trainset, cfg.camera_model, self.device) if cfg.depth_loss else None
        self.views = TrainViews(
            self.trainset,
            self.device,
            cfg.device_images_share,
            host_cache_bytes=int(cfg.image_cache_gb * 2**30),
            decode_threads=cfg.decode_threads,
            items_at=lambda step: self.sampler.batch_at(step),
            batch_size=cfg.batch_size,
        )
        self.raster = self._raster_mode(cfg, masked=self.views.channels == 4)
        if cfg.pose_noise > 0:  # gsplat's pose_perturb: a fixed random correction of every training camera
            self.views.camtoworlds = pose_perturbation(len(self.trainset), cfg.pose_noise, cfg.seed, self.device)(
                self.views.camtoworlds, self.views.ids
            ).detach()
        self.viewmats = rigid_inverse(self.views.camtoworlds)  # [V, 4, 4] world-to-camera, training views
        self.render_options: dict[str, Any] = dict(
            camera_model=cfg.camera_model, antialiased=cfg.antialiased
        )  # every render's
        self.setup = RenderSetup(
            ctx, self.ops, cfg.sh_degree, cfg.packed, cfg.near_plane, cfg.far_plane, self.render_options
        )  # evaluation's and pruning's renders
        self.selective_adam = cfg.visible_adam or cfg.sparse_grad
        self.graphed_head = (
            GraphedHead(self.ops, cfg.near_plane, cfg.far_plane, **self.render_options, warn=self.report.warn)
            if use_cuda_graphs(cfg.cuda_graphs, ctx.world_size)
            and self.device.type == "cuda"
            and cfg.pipeline == "ours"
            and not cfg.packed
            and not (cfg.random_tile_shift and self.raster == "fused")  # a new image size every step
            # every GPU placement of the images: the streaming cache's decode threads make no CUDA
            # call (data/views.py), so nothing but the capture touches CUDA while it runs
            else None
        )  # --cuda_graphs
        if cfg.cuda_graphs == "on" and self.graphed_head is None:
            why = (
                "a CPU run"
                if self.device.type != "cuda"
                else "--pipeline gsplat-dist"
                if cfg.pipeline != "ours"
                else "--packed"
                if cfg.packed
                else "--random_tile_shift"
            )
            self.report.warn(f"--cuda_graphs on: graphs do not apply to this run ({why}); its steps run eagerly")
        self._tb_image: Optional[torch.Tensor] = None  # --tb_save_image: the last logged training render
        self.loss_backend = losses.training_loss_backend(self.device, cfg.ssim_backend)
        torch.manual_seed(cfg.seed + ctx.rank)
        np.random.seed((cfg.seed + ctx.rank) % 2**32)
        points = initial_points(scene, cfg, self.scene_scale)
        params = create_shard(points, cfg, ctx.rank, ctx.world_size, self.device)
        optimizers = create_optimizers(params, cfg, ctx.world_size, self.scene_scale)
        scheduler = means_lr_scheduler(optimizers["means"], cfg.schedule.max_steps)
        if cfg.densify.strategy == "mcmc" and self.device.type != "cuda":
            raise ValueError(
                "the mcmc preset relocates Gaussians with gsplat's CUDA op, which needs a GPU; "
                "on the CPU use the default preset (or --device cuda on a GPU machine)"
            )
        if cfg.pipeline == "gsplat-dist" and ctx.world_size > 1 and not self.sampler.uniform_batches:
            sizes = len(self.sampler.groups)
            raise ValueError(
                f"--pipeline gsplat-dist with {ctx.world_size} ranks needs batches of one camera count "
                f"and image size on every rank (gsplat's exchange assumes it), but the "
                f"{len(self.trainset)} training views ({sizes} image size(s)) in batches of "
                f"--batch_size {cfg.batch_size} leave shorter or mixed batches; use a --batch_size "
                "that divides the view count of a one-size dataset, or --pipeline ours"
            )
        if cfg.pipeline == "gsplat-dist" and self.device.type != "cuda":
            raise ValueError(
                "--pipeline gsplat-dist is gsplat's CUDA rasterization(distributed=True), which needs "
                "a GPU; on the CPU use --pipeline ours"
            )
        strategy = make_strategy(cfg)
        prune.limit_densification(strategy, cfg)  # off from ByteSplat stage 2 on
        strategy.check_sanity(params, optimizers)
        self.shard = GaussianShard(
            params, optimizers, scheduler, strategy, initialize_state(strategy, self.scene_scale)
        )
        self.aux, self.aux_optimizers = self._make_aux_modules()
        # --cuda_graphs at W = 1 with nothing but the photometric loss: the whole step replayed
        # around gsplat's tile intersection (step_graphs.py); anything else runs the eager step
        self.graphed_step = (
            GraphedStep(
                self.graphed_head,
                self.ops,
                self.photometric,
                cfg.densify.absgrad,
                warn=self.report.warn,
                fused=self._fused_tail_loss() if self.raster == "fused" else None,
            )
            if self.graphed_head is not None and step_graphs.applies(cfg, ctx.world_size, self.raster, self.aux)
            else None
        )
        self.step = 0  # completed steps
        self._stats_step = 0  # step of the previous train stats file
        self.evaluation = evaluate.Evaluation(
            cfg, self.setup, scene, self.scene_scale, self.trainset, self.testset, self.report
        )
        self.last_stats: dict = {}
        self.timer = PhaseTimer(self.device, enabled=False)  # the benchmark and --profile enable it
        self.last_phases: dict = {}
        # --raster fused, last step: the fused call's tile statistics (kernels/fused_raster.py)
        self.last_fused_stats: dict = {}
        self.last_export: Optional[dict] = None  # rank 0: the last exported model (export.export_merged)

    def _make_aux_modules(self):
        """--pose_opt / --app_opt / --use_bilateral_grid modules (DDP-wrapped when W > 1), their
        Adams, and the grids' learning-rate schedule (trainer/bilagrid.py)."""
        from .aux_modules import AppearanceModule, PoseOptModule
        from .exchange import replicate
        from .model import batch_rule

        cfg, aux, opts, schedulers = self.cfg, {}, {}, {}
        lr_mult = batch_rule(cfg.batch_size, self.ctx.world_size)[0]
        for name, enabled, cls, lr, reg in (
            ("pose", cfg.pose_opt, PoseOptModule, cfg.optim.pose_opt_lr, cfg.optim.pose_opt_reg),
            ("app", cfg.app_opt, AppearanceModule, cfg.optim.app_opt_lr, cfg.optim.app_opt_reg),
        ):
            if enabled:
                aux[name] = replicate(cls(len(self.trainset)), self.ctx)
                opts[name] = torch.optim.Adam(aux[name].parameters(), lr=lr * lr_mult, weight_decay=reg)
        if cfg.use_bilateral_grid:
            aux["bilagrid"] = replicate(BilateralGrid(len(self.trainset), *cfg.bilateral_grid_shape), self.ctx)
            opts["bilagrid"] = torch.optim.Adam(aux["bilagrid"].parameters(), lr=BILAGRID_LR * lr_mult, eps=1e-15)
            schedulers["bilagrid"] = torch.optim.lr_scheduler.LambdaLR(
                opts["bilagrid"], bilagrid_lr_lambda(cfg.schedule.bilateral_grid_warmup, cfg.schedule.max_steps)
            )
        self.aux_schedulers = schedulers
        return aux, opts

    # ------------------------------------------------------------------ the shard's parts
    # (read and replaced by tests and the benchmark; the stages take self.shard)
    params = property(lambda self: self.shard.params, lambda self, v: setattr(self.shard, "params", v))
    optimizers = property(lambda self: self.shard.optimizers, lambda self, v: setattr(self.shard, "optimizers", v))
    scheduler = property(lambda self: self.shard.scheduler, lambda self, v: setattr(self.shard, "scheduler", v))
    strategy = property(lambda self: self.shard.strategy, lambda self, v: setattr(self.shard, "strategy", v))
    strategy_state = property(
        lambda self: self.shard.strategy_state, lambda self, v: setattr(self.shard, "strategy_state", v)
    )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return dict(
            **self.shard.state_dict(),  # params, optimizers, scheduler, strategy_state
            aux={k: _unwrapped(m).state_dict() for k, m in self.aux.items()},  # the same keys at any W
            aux_optimizers={k: o.state_dict() for k, o in self.aux_optimizers.items()},
            aux_schedulers={k: o.state_dict() for k, o in self.aux_schedulers.items()},
            rng=checkpoint.rng_state(self.device),
            world_transform=torch.from_numpy(np.asarray(self.scene.transform, dtype=np.float64)),  # exports
            config=json.loads(json.dumps(_plain(self.cfg))),
            raster=self.raster,  # the step this run took ("fused" / "unfused"), whatever --raster said
        )

    def load_state_dict(self, state: dict, restore_rng: bool = True) -> None:
        self.shard.load_state_dict(state, self.device)
        for k, module in self.aux.items():
            if k in state.get("aux", {}):  # checkpoints before the fix keep DDP's "module." prefix
                saved = {n.removeprefix("module."): v for n, v in state["aux"][k].items()}
                _unwrapped(module).load_state_dict(saved)
                self.aux_optimizers[k].load_state_dict(state["aux_optimizers"][k])
                if k in self.aux_schedulers and k in state.get("aux_schedulers", {}):
                    self.aux_schedulers[k].load_state_dict(state["aux_schedulers"][k])
        self.step = self._stats_step = int(state["step"])
        self.shard_sizes_changed()
        if restore_rng and "rng" in state:
            checkpoint.set_rng_state(state["rng"], self.device)

    # ------------------------------------------------------------------ one step
    def camera_batch(self, batch: dict) -> CameraBatch:
        return self.setup.camera_batch(batch)

    def sh_degree_at(self, step: int) -> int:
        return min(step // self.cfg.schedule.sh_degree_interval, self.cfg.sh_degree)

    def shard_sizes_changed(self) -> None:
        """Say that the shards may have changed size on some rank (densification, pruning, a
        loaded checkpoint): the next step gathers every rank's Gaussian count again. Every rank
        calls it at the same points of the run."""
        self.shard.sizes_changed()

    def windows(self, step: int, rank: int, items: list[int]) -> list[tuple[int, int, int, int]]:
        """The part (x0, y0, w, h) of each image of rank ``rank``'s batch ``items`` that step
        ``step`` trains: the whole image, or the --patch_size crop (data.sampler.patch_window)."""
        sizes = [self.trainset.size(i) for i in items]
        if self.cfg.patch_size is None:
            return [(0, 0, w, h) for w, h in sizes]
        return [patch_window(self.cfg.seed, step, rank, j, w, h, self.cfg.patch_size) for j, (w, h) in enumerate(sizes)]

    def pass_layout(self, step: int, items: list[int], origin: tuple[int, int]) -> PassLayout:
        """Step ``step``'s sizes and cameras of every rank (render.PassLayout), from this rank's
        ``items``, the other ranks' samplers and the shard sizes gathered after the last step
        that could change them."""
        n = int(self.params["means"].shape[0])
        if self.ctx.world_size == 1:
            self.shard.world_sizes = [n]
        elif self.shard.world_sizes is None:  # a host synchronization, only after a change
            self.shard.world_sizes = exchange.gather_metadata(self.ctx, [n])[:, 0].tolist()
        every = [items if r == self.ctx.rank else sampler.batch_at(step) for r, sampler in enumerate(self.samplers)]
        windows = [win for r, batch in enumerate(every) for win in self.windows(step, r, batch)]
        ox, oy = origin
        sizes = [(w + ox, h + oy) for _, _, w, h in windows]
        layout = PassLayout(self.shard.world_sizes, [len(b) for b in every], sizes)
        if "pose" not in self.aux:  # cameras not learned: every rank has them all
            flat = [i for batch in every for i in batch]
            layout.viewmats = rows_of(self.viewmats, flat)
            c2w, Ks = self.views.cameras(flat)
            layout.Ks = self._window_intrinsics(Ks, windows, origin)
            layout.campos = c2w[:, :3, 3]
        return layout

    def _window_intrinsics(self, Ks: torch.Tensor, windows: list, origin: tuple[int, int]) -> torch.Tensor:
        """[C, 3, 3] intrinsics of the images' ``windows`` (crops move the principal point by
        -x0, -y0; one small asynchronous upload per step with --patch_size), shifted by the tile ``origin``."""
        if self.cfg.patch_size is not None:
            offsets = _upload([[-x0, -y0] for x0, y0, _, _ in windows], Ks.dtype, Ks.device)
            Ks = shift_intrinsics(Ks, offsets[:, 0], offsets[:, 1])
        return shift_intrinsics(Ks, *origin) if origin != (0, 0) else Ks

    def train_step(self, step: int) -> dict:
        """Run training step ``step`` (0-based) on this rank; returns its scalars (device tensors;
        a step replayed by step_graphs.GraphedStep returns its capture's buffers, which the next
        step overwrites: read them before it)."""
        cfg = self.cfg
        items = self.sampler.batch_at(step)
        batch = self.views.images_of(items, step)  # uint8 [C, H, W, 3 (+ mask)], on the device
        self.views.prefetch(self.sampler.batch_at(step + 1))
        camtoworlds, Ks = self.views.cameras(items)
        item_ids = self.views.item_ids(items) if self.aux else None  # aux modules only
        if "pose" in self.aux:
            viewmats = rigid_inverse(self.aux["pose"](camtoworlds, item_ids))
        else:
            viewmats = rows_of(self.viewmats, items)
        windows = self.windows(step, self.ctx.rank, items)
        width, height = windows[0][2:]
        if cfg.patch_size is not None:  # the crops of the images and their cameras
            batch = torch.stack([image[y0 : y0 + h, x0 : x0 + w] for image, (x0, y0, w, h) in zip(batch, windows)])
            Ks = self._window_intrinsics(Ks, windows, (0, 0))
        gts, keep = (batch[..., :3], batch[..., 3:]) if batch.shape[-1] == 4 else (batch, None)
        cams = CameraBatch(viewmats, Ks, width, height)
        C = len(items)
        origin = self.tile_shift(step)
        if origin != (0, 0):
            cams = shift_cameras(cams, *origin)
        layout = self.pass_layout(step, items, origin) if cfg.pipeline == "ours" else None
        backgrounds = torch.rand(C, 3, device=self.device) if cfg.random_bkgd else None
        self.ctx.stats.phase = "forward"
        timer = self.timer
        graphed = None
        if (
            self.graphed_step is not None
            and keep is None
            and layout is not None
            and layout.viewmats is not None
            and graphable(self.device, cfg.packed, layout.sizes)
        ):
            graphed = self.graphed_step(
                self.params,
                layout.viewmats,
                layout.Ks,
                layout.campos,
                width,
                height,
                self.sh_degree_at(step),
                gts,
                backgrounds,
                timer,
            )  # None: this step runs eagerly (step_graphs.py)
        if graphed is not None:
            loss, parts, info = graphed.loss, graphed.parts, graphed.info
            if self.raster == "fused":  # every tile in the kernel
                tiles = C * math.ceil(width / TILE_SIZE) * math.ceil(height / TILE_SIZE)
                self.last_fused_stats = dict(fraction_fused=1.0, fraction_isects_fused=1.0, num_tiles=tiles)
        else:
            loss, parts, info = self._eager_forward_backward(
                step, cams, layout, items, item_ids, windows, gts, keep, backgrounds, origin
            )
        timer.begin("optimizer")
        # the Gaussians' Adams (one launch on a GPU); --visible_adam / --sparse_grad: visible ones only
        optimizer_step(self.optimizers, visible_gaussians(info) if self.selective_adam else None)
        for opt in self.aux_optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        for scheduler in self.aux_schedulers.values():
            scheduler.step()
        self.scheduler.step()
        timer.begin("densification")
        densify.post_backward(self.shard, cfg, step, info)
        self.last_phases = timer.end_step()
        # tensors stay on the device: converting them here would synchronize every step
        return dict(
            loss=loss.detach(),
            l1=parts["l1"],
            ssim=parts["ssim"],
            num_gaussians=int(self.params["means"].shape[0]),
            num_isects=info.num_isects,
            **({"depth": parts["depth"].detach()} if "depth" in parts else {}),
        )

    def _eager_forward_backward(self, step, cams, layout, items, item_ids, windows, gts, keep, backgrounds, origin):
        """The forward pass, loss and backward of :meth:`train_step` through autograd (what
        step_graphs.GraphedStep replays where it applies); returns (loss, its parts, the pass's
        RenderInfo)."""
        cfg, timer, C = self.cfg, self.timer, len(items)
        fused = self.raster == "fused"
        if cfg.pipeline == "gsplat-dist":
            result = self._render_gsplat_dist(cams, self.sh_degree_at(step), backgrounds)
        else:
            head = None
            if (
                self.graphed_head is not None
                and layout is not None
                and graphable(self.device, cfg.packed, layout.sizes)
            ):
                head = self.graphed_head.head(self.params)  # activates the parameters itself
            result = render(
                self.params if head is not None else activated(self.params),
                cams,
                self.ctx,
                self.ops,
                self.sh_degree_at(step),
                packed=cfg.packed,
                near=cfg.near_plane,
                far=cfg.far_plane,
                backgrounds=backgrounds,
                keep_means2d_grad=True,
                timer=timer,
                rasterize=not fused,
                layout=layout,
                absgrad=cfg.densify.absgrad,
                render_depth=cfg.depth_loss,
                sparse_grad_comm=cfg.sparse_grad_comm,
                head=head,
                **self.render_options,
            )
        if origin != (0, 0):  # densification sees the images, not the padded renders: their size
            # (NDC scaling of the 2D-mean gradients) and only the projections that reach them
            info = result.info
            info.widths = [w - origin[0] for w in info.widths]
            info.heights = [h - origin[1] for h in info.heights]
            info.radii = padding_only_radii(info.radii, info.means2d, *origin)
        if fused:
            loss, parts = self._fused_loss(result, uint8_to_unit(gts), backgrounds, origin)
        else:
            timer.begin("loss")
            colors = result.colors
            if "app" in self.aux:
                colors = self.aux["app"](colors, item_ids)
            if "bilagrid" in self.aux:
                colors = self.aux["bilagrid"](colors, item_ids)
            if keep is not None:  # masked pixels: 0 in render and ground truth (data/masks.py)
                colors, gts = colors * keep, gts * keep
            result.colors = colors
            loss, parts = self.photometric(colors, gts)
            if cfg.depth_loss:
                parts["depth"] = self._depth_loss(result.depths, items, windows)
                loss = loss + cfg.depth_lambda * parts["depth"]
            if cfg.tb_save_image and self.report.active and (step + 1) % cfg.schedule.log_every == 0:
                self._tb_image = torch.cat([uint8_to_unit(gts), colors.detach().clamp(0, 1)], dim=2)
        # The loss of the global batch is the mean over every rank's images, and a regularizer is
        # a mean over every rank's Gaussians; this rank contributes its share of each, so that the
        # gradients summed at the owners equal those of one process holding everything.
        weight = C / sum(result.info.C_world)
        total = loss if weight == 1.0 else loss * weight
        shard_share = self.params["means"].shape[0] / sum(result.info.N_world)
        if cfg.opacity_reg > 0:
            total = total + opacity_reg(torch.sigmoid(self.params["opacities"]), cfg.opacity_reg) * shard_share
        if cfg.scale_reg > 0:
            total = total + scale_reg(torch.exp(self.params["scales"]), cfg.scale_reg) * shard_share
        if "bilagrid" in self.aux:  # replicated: each rank adds 1/W of the regularizer
            grid = _unwrapped(self.aux["bilagrid"])
            assert isinstance(grid, BilateralGrid)
            total = total + TV_WEIGHT * grid.tv_loss() / self.ctx.world_size
        self.ctx.stats.phase = "backward"
        timer.begin("backward_raster")
        total.backward()
        return loss, parts, result.info

    def photometric(self, colors: torch.Tensor, gts: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The training loss of renders ``colors`` [C, H, W, 3] against uint8 ``gts``:
        (1 - --ssim_lambda) L1 + --ssim_lambda D-SSIM (valid-padded SSIM, as gsplat
        simple_trainer's fused_ssim call), and its parts {"l1", "ssim"}."""
        if self.loss_backend == "fused_l1_ssim":  # L1 + D-SSIM in two kernels, uint8 ground truth
            return fused_l1_ssim_loss(colors, gts, self.cfg.ssim_lambda, padding="valid")
        return photometric_loss(
            colors,
            uint8_to_unit(gts),
            self.cfg.ssim_lambda,
            ssim_padding="valid",
            ssim_backend_name=None if self.loss_backend == "auto" else self.loss_backend,
        )

    def _depth_loss(self, rendered: torch.Tensor, items: list[int], windows: list) -> torch.Tensor:
        """--depth_loss of this rank's images (trainer/depth.py), the targets moved into the
        trained windows and those outside dropped (weight 0)."""
        assert self.depth_targets is not None  # --depth_loss
        pixels, depths, image = self.depth_targets.batch(items)
        weights = None
        if self.cfg.patch_size is not None:
            origins = _upload([[x0, y0] for x0, y0, _, _ in windows], pixels.dtype, pixels.device)
            pixels = pixels - origins[image]
            h, w = rendered.shape[1:3]
            weights = ((pixels[:, 0] >= 0) & (pixels[:, 0] < w) & (pixels[:, 1] >= 0) & (pixels[:, 1] < h)).float()
        return depth_loss(rendered, pixels, depths, image, self.scene_scale, weights)

    def _raster_mode(self, cfg, masked: bool) -> str:
        """:func:`raster_mode` of this run; rank 0 prints kernels/native.py's one line when the
        native kernel cannot be built."""

        def kernel_ready() -> bool:  # every rank takes the same step: unfused if any rank lacks the kernel
            from ..kernels import native

            here = native.load(quiet=True) is not None
            if not exchange.any_rank(self.ctx, [not here])[0]:
                return True
            self.report.warn(
                native.unavailable_warning(cfg.raster)
                if not here
                else f"warning: --raster {cfg.raster}: the native kernel is unavailable on another rank; "
                "every rank takes the unfused step"
            )
            return False

        mode = raster_mode(cfg, self.device.type, masked, kernel_ready)
        if cfg.random_tile_shift and mode != "fused":
            self.report.warn(
                "warning: --random_tile_shift moves the fused step's tiles, and this run takes the unfused step "
                "(on the CPU only --raster fused runs it); the images are not shifted"
            )
        return mode

    def tile_shift(self, step: int) -> tuple[int, int]:
        """(ox, oy) pixels the images of step ``step`` move against the tile grid: uniform in
        [0, 16)^2 with --random_tile_shift (a function of --seed and the step, so every rank and a
        resumed run draw the same), else (0, 0)."""
        if not self.cfg.random_tile_shift or self.raster != "fused":
            return (0, 0)
        rng = random.Random(f"tile-shift/{self.cfg.seed}/{step}")
        return (rng.randrange(TILE_SIZE), rng.randrange(TILE_SIZE))

    def _fused_tail_loss(self):
        """The fused kernel as a graphed step's rasterizer and loss (step_graphs.tail_function)."""
        from ..kernels.fused_raster import fused_raster_loss

        return functools.partial(fused_raster_loss, ssim_lambda=self.cfg.ssim_lambda, fallback=self.ops)

    def _fused_loss(self, result, gts, backgrounds, origin=(0, 0)):
        """ByteSplat's fused step: forward compositing, the tile-local loss and the backward
        compositing in one native kernel per tile (kernels/fused_raster.py); its autograd node
        hands the record gradients to the exchange's backward. With --absgrad the kernel's
        absolute 2D-mean gradients ride back through the same relay as the unfused
        rasterizer's. The timer's "rasterization" phase covers all of it."""
        from ..kernels.fused_raster import fused_raster_loss
        from .render import relay_absgrad

        info, rec, tiles = result.info, result.info.records, result.info.tiles
        assert rec is not None and tiles is not None  # render(..., rasterize=False) of the ours pipeline
        absgrad = self.cfg.densify.absgrad
        means2d = rec.means2d
        if absgrad:
            assert rec.absgrad_lanes is not None
            means2d = relay_absgrad(means2d, rec.absgrad_lanes)
            info.raster_means2d = means2d  # the relay finds its output here until backward
        loss, stats = fused_raster_loss(
            means2d,
            rec.conics,
            rec.colors,
            rec.opacities,
            tiles.offsets,
            tiles.flatten_ids,
            gts,
            info.width,
            info.height,
            self.cfg.ssim_lambda,
            backgrounds=backgrounds,
            packed=self.cfg.packed,
            budget=self.cfg.prune.tile_budget or None,
            fallback=self.ops,
            origin=origin,
            absgrad=absgrad,
        )
        if absgrad and stats["absgrad"] is not None:
            means2d.absgrad = stats["absgrad"].view(means2d.shape)
        self.timer.begin("loss")
        self.last_fused_stats = {
            k: v for k, v in stats.items() if k in ("fraction_fused", "fraction_isects_fused", "num_tiles")
        }
        return loss, {"l1": stats["l1"], "ssim": stats["ssim"]}  # the kernel's terms (tile-local SSIM)

    def _render_gsplat_dist(self, cams: CameraBatch, sh_degree: int, backgrounds):
        """The baseline pass: gsplat's ``rasterization(distributed=True)`` (dense), whose info is
        translated for the densification strategy. Needs CUDA, equal camera counts and sizes."""
        from gsplat.rendering import rasterization

        from .exchange import gather_metadata
        from .render import RenderInfo, RenderResult

        self.timer.begin("projection")  # gsplat's pass is one opaque forward
        g = activated(self.params)
        colors, alphas, meta = rasterization(
            g["means"],
            g["quats"],
            g["scales"],
            g["opacities"],
            g["colors"],
            cams.viewmats,
            cams.Ks,
            cams.width,
            cams.height,
            sh_degree=sh_degree,
            packed=False,
            near_plane=self.cfg.near_plane,
            far_plane=self.cfg.far_plane,
            backgrounds=backgrounds,
            distributed=self.ctx.world_size > 1,
            camera_model=self.cfg.camera_model,
            rasterize_mode="antialiased" if self.cfg.antialiased else "classic",
        )
        means2d = meta["means2d"]  # the local, pre-exchange [C_all, N, 2]
        means2d.retain_grad()
        C_all, n = means2d.shape[0], means2d.shape[1]
        C = cams.viewmats.shape[0]
        N_world = (
            [n] * self.ctx.world_size
            if not (self.cfg.opacity_reg or self.cfg.scale_reg)
            else gather_metadata(self.ctx, [n])[:, 0].tolist()
        )
        info = RenderInfo(
            means2d=means2d,
            radii=meta["radii"],
            packed=False,
            n_cameras=C_all,
            widths=[cams.width] * C_all,
            heights=[cams.height] * C_all,
            num_isects=int(meta["isect_ids"].numel()),
            N_world=N_world,
            C_world=[C] * self.ctx.world_size,
            width=cams.width,
            height=cams.height,
            num_local_cameras=C,
        )
        return RenderResult(colors, alphas, info)

    # ------------------------------------------------------------------ the run
    def train(self) -> dict:
        """Train from ``self.step`` to ``max_steps``; evaluate, save and export on schedule."""
        cfg, s = self.cfg, self.cfg.schedule
        self.report.start_run(dump_yaml(cfg))  # the folder, cfg.yml, TensorBoard
        self._print_memory_model()
        bar = self.report.progress(range(self.step, s.max_steps), initial=self.step, total=s.max_steps)
        out: dict[str, Any] = {}
        written: list[Path] = []
        if self.step == 0 and 0 in s.eval_steps:
            self.evaluation.run(self.shard, 0)  # the initial model, before any step
        profiler = self._start_profiler() if cfg.profile else None
        viewer = start_training_viewer(  # --no_disable_viewer: rank 0 of a one-process run
            cfg,
            self.report,
            lambda: (self.shard.activated(), self.sh_degree_at(self.step)),
            self.device,
            self.ops,
            self.result_dir,
            self.scene.cameras[self.trainset.indices[0]].camtoworld,
            self.scene.points,
        )
        first_step = self.step
        self._last_save = time.monotonic()
        try:
            with self.ctx.stop.deferred():  # SIGTERM: a checkpoint at the next step boundary, then the end
                out, written, loop_seconds = self._steps(bar, profiler, viewer)
        finally:  # also when a step raises: the viewer's lock and server, the image loader's threads
            if viewer is not None:
                viewer.stop()
            self.views.close()
        bar.close()
        if s.max_steps > first_step:
            steps = s.max_steps - first_step
            peak = (
                f", peak memory {torch.cuda.max_memory_allocated(self.device) / 2**30:.2f} GiB on rank 0"
                if self.device.type == "cuda"
                else ""
            )
            self.report.print(
                f"train loop: {steps} steps in {loop_seconds:.1f} s ({1000 * loop_seconds / steps:.2f} ms/step, "
                f"evaluation excluded, {self.raster} rasterization), {out.get('num_gaussians', 0):,} Gaussians on rank 0{peak}"
            )
            if self.graphed_head is not None:
                g = self.graphed_head
                self.report.print(
                    f"cuda graphs: {g.captures} captures in {g.capture_seconds:.2f} s, {g.failures} failed"
                    + (" (then stopped: the shapes changed too often)" if g.stopped else "")
                    + (
                        f"; whole steps: {self.graphed_step.captures} tail captures in "
                        f"{self.graphed_step.capture_seconds:.2f} s, {self.graphed_step.failures} failed"
                        + (
                            f", {self.graphed_step.declined} steps too large for one fused launch ran eagerly"
                            if self.graphed_step.declined
                            else ""
                        )
                        if self.graphed_step is not None
                        else ""
                    )
                )
            streamed = self.views.stream_summary()  # None unless the images were streamed
            if streamed:
                self.report.print(streamed)
        if profiler is not None:
            profiler.stop()
            self._phase_log += self.timer.collect()
            self._write_phase_table()
        self.report.close()
        if s.max_steps > first_step:
            self.print_outputs(written)
        else:
            self.report.print(
                f"nothing to train: the run is at step {first_step} and --max_steps is {s.max_steps} "
                "(raise --max_steps to train on; --ckpt evaluates and exports a checkpoint)"
            )
        return out

    def _steps(self, bar, profiler, viewer=None) -> tuple[dict, list[Path], float]:
        """The step loop of :meth:`train`: (the last logged scalars, the files the last
        write_outputs wrote, seconds of training before the final evaluation). ``viewer``: the
        live viewer (viewer.py), told when a step begins and ends."""
        s = self.cfg.schedule
        window_start, window_steps = time.perf_counter(), 0
        loop_start, loop_seconds = time.perf_counter(), 0.0
        out, written = {}, []
        for step in bar:
            if profiler is not None and not self._device_only_profile():
                # no synchronization per step in the profiled window
                self.timer.switch(
                    s.profile_start_step <= step < s.profile_start_step + s.profile_num_steps, deferred=True
                )
            if viewer is not None:
                viewer.before_step()  # holds the viewer's lock: frames show the model between steps
            out = self.train_step(step)
            if profiler is not None:
                profiler.step()
                if self.timer.enabled and self.last_phases:  # a CPU run's phases come at once
                    self._phase_log.append(self.last_phases)
            self.step = done = step + 1
            window_steps += 1
            prune.run_stages(
                self.shard, self.setup, self.trainset, self.testset, self.cfg, self.report, done
            )  # ByteSplat pruning stages 2 and 3 at their steps (prune.py)
            if viewer is not None:
                viewer.after_step(done, sum(w * h for w, h in map(self.trainset.size, self.sampler.batch_at(step))))
            if done % s.log_every == 0 or done == s.max_steps:
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                ms = (time.perf_counter() - window_start) * 1000.0 / window_steps
                window_start, window_steps = time.perf_counter(), 0
                out = {k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in out.items()}
                out["ms_per_step"] = ms
                self.last_stats = out
                bar.set_postfix(loss=f"{out['loss']:.4f}", gs=out["num_gaussians"], its=f"{1000.0 / ms:.1f}")
                self.report.scalars(
                    {k: out[k] for k in ("loss", "l1", "ssim", "depth", "num_gaussians", "ms_per_step") if k in out},
                    done,
                    prefix="train/",
                )
                if self._tb_image is not None:  # --tb_save_image: ground truth | render, one row per image
                    self.report.image(
                        "train/render", self._tb_image.reshape(-1, *self._tb_image.shape[2:]).float().cpu(), done
                    )
                    self._tb_image = None
                self.report.scalars(
                    {k: v for k, v in self.last_fused_stats.items() if k.startswith("fraction")}, done, prefix="fused/"
                )
            if done == s.max_steps:
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                loop_seconds = time.perf_counter() - loop_start  # training only: before eval/export
            last = done == s.max_steps
            saved = done in s.save_steps or last
            written = self.write_outputs(
                done, save=saved, ply=done in s.ply_steps or last, evaluation=done in s.eval_steps or last
            )
            self._answer_requests(done, saved)
        return out, written, loop_seconds

    def _answer_requests(self, done: int, saved: bool) -> None:
        """At a step boundary: write a checkpoint when ``--save_every`` or ``--save_every_minutes``
        is due, and on a deferred SIGTERM or SIGINT write one and end the run
        (:class:`launch.Interrupted`). Every rank answers at the same step: with W > 1 the ranks
        combine their requests at the boundaries launch.StopRequest schedules (one small
        collective, read on the host, that also takes the slowest rank's seconds per step: at most
        STOP_CHECK_EVERY steps apart, fewer when steps are slow, down to every step, so that a
        request waits about launch.STOP_AGREE_BUDGET_S at most, or one step), at W = 1 every step."""
        every = self.cfg.schedule.save_every
        if every > 0 and done % every == 0 and not saved:  # --save_every: the same steps on every rank
            self.save_checkpoint()
            saved = True
        due = self.cfg.save_every_minutes > 0 and time.monotonic() - self._last_save >= 60 * self.cfg.save_every_minutes
        request = self.ctx.stop
        signum = request.signum
        if saved:  # a scheduled checkpoint restarts the clock on every rank, also between agreements
            self._last_save = time.monotonic()
            due = False
        if self.ctx.world_size > 1:
            if not request.check_due(done):
                return
            agreed = exchange.max_over_ranks(self.ctx, [signum, due, request.seconds_per_step(done)])
            signum, due = int(agreed[0]), agreed[1] > 0
            request.schedule(done, agreed[2], most=STOP_CHECK_EVERY)
        if (signum or due) and not saved:
            self.save_checkpoint()
            self._last_save = time.monotonic()
        if signum:
            self.report.stop_progress(done)  # the bar shows the checkpoint's step, not the one before
            self.report.close()
            raise Interrupted(request.signum or signum)

    def write_outputs(self, step: int, save: bool, ply: bool, evaluation: bool) -> list[Path]:
        """What a run writes after ``step`` steps, the model first: checkpoint, PLY, test metrics;
        then the optional outputs (test renders, --export_formats, trajectory video), whose
        failure is one warning line (evaluate.optional). Every rank calls this. Returns the files written (rank 0: all of
        them but the other ranks' checkpoints)."""
        written: list[Optional[Path]] = []
        if save:
            written.append(self.save_checkpoint())
        if ply and self.cfg.save_ply:
            self.last_export = export.export_merged(
                self.shard, self.ctx, self.cfg, self.scene.transform, self.result_dir, step
            )
            written.append(self.last_export["path"] if self.last_export else None)
        if evaluation:
            if self.evaluation.run(self.shard, step) is not None:
                written.append(self.result_dir / "stats" / f"val_step{step}.json")
                written.append(self.result_dir / "renders" / f"val_step{step}_*.png")
        if ply:  # Inria layout, web formats (rank 0 holds the export)
            made, self.last_export = self.last_export, None
            written += export.export_formats(
                made, self.cfg, self.result_dir, lambda: [self.scene.cameras[i] for i in self.trainset.indices]
            )
        if evaluation:
            written.append(self.evaluation.render_trajectory(self.shard, step))
        return [p for p in written if p is not None and any(p.parent.glob(p.name))]

    def print_outputs(self, written: list[Path]) -> None:
        """Rank 0: the last line of a run, ``outputs: ...``, naming the files of the final step (a
        checkpoint of every rank, the PLY, metrics, renders, video) and the TensorBoard folder."""
        self.report.outputs(written, self.ctx.world_size)

    def _device_only_profile(self) -> bool:
        """--profile_mode device on a GPU run: the trace records device activity only."""
        return self.cfg.profile_mode == "device" and self.device.type == "cuda"

    def _start_profiler(self):
        """torch profiler over the --profile window; the trace goes to profile/trace_rank<r>.json."""
        s = self.cfg.schedule
        out_dir = self.result_dir / "profile"
        out_dir.mkdir(parents=True, exist_ok=True)
        self._phase_log: list = []
        first = max(s.profile_start_step, self.step)
        steps = min(s.profile_num_steps, s.max_steps - first)  # the window's steps this run reaches
        if steps < 1:  # resumed past the window
            self.report.warn(f"--profile: this run starts at step {self.step}, after the window; nothing is profiled")
            return None
        if steps < s.profile_num_steps:
            self.report.warn(
                f"--profile: the window covers steps {first}-{first + steps - 1}, {steps} of --profile_num_steps "
                f"{s.profile_num_steps} (the run ends at step {s.max_steps})"
            )
        if self.cfg.profile_mode == "device" and self.device.type != "cuda":
            self.report.warn("--profile_mode device: a CPU run has no device activity; its host operators are recorded")
        activities = [] if self._device_only_profile() else [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        rank = self.ctx.rank

        def save(prof):
            from .profiling import format_trace_summary, summarize_trace

            trace_path = out_dir / f"trace_rank{rank}.json"
            prof.export_chrome_trace(str(trace_path))
            summary = summarize_trace(json.loads(trace_path.read_text()), steps)
            checkpoint.atomic_write(
                out_dir / f"summary_rank{rank}.json", lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2))
            )
            self.report.print(format_trace_summary(summary))

        wait = max(s.profile_start_step - self.step - 1, 0)
        prof = torch.profiler.profile(
            activities=activities,
            on_trace_ready=save,
            schedule=torch.profiler.schedule(
                wait=wait,
                warmup=1 if wait or self.step < s.profile_start_step else 0,
                active=steps,
                repeat=1,
            ),
        )
        prof.start()
        return prof

    def _write_phase_table(self) -> None:
        """profile/phases_rank<r>.json and a printed table: median ms of each phase over the window."""
        from .profiling import PHASES

        log = self._phase_log
        if not log:
            return
        table = {p: float(np.median([row.get(p, 0.0) for row in log])) for p in (*PHASES, "total")}
        path = self.result_dir / "profile" / f"phases_rank{self.ctx.rank}.json"
        checkpoint.atomic_write(
            path,
            lambda tmp: Path(tmp).write_text(json.dumps(dict(steps=len(log), median_ms=table, per_step=log), indent=2)),
        )
        total = table["total"] or 1.0
        lines = [f"{'phase':<22}{'ms':>9}{'share':>8}"]
        lines += [f"{p:<22}{table[p]:>9.3f}{100 * table[p] / total:>7.1f}%" for p in PHASES]
        lines.append(f"{'total':<22}{table['total']:>9.3f}")
        self.report.print("\n".join(lines))

    def save_checkpoint(self) -> Path:
        path = checkpoint.save(
            self.result_dir / "ckpts", self.step, self.ctx.rank, self.ctx.world_size, self.state_dict()
        )
        self._write_train_stats()
        return path

    def _write_train_stats(self) -> None:
        """stats/train_step<step>_rank<r>.json; collectives and bytes are per step, averaged over
        the steps since the previous stats file (evaluation renders included)."""
        steps = max(self.step - self._stats_step, 1)
        self._stats_step = self.step
        comm = self.ctx.stats.reset()
        stats = dict(
            step=self.step,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            num_gaussians=int(self.params["means"].shape[0]),
            ms_per_step=self.last_stats.get("ms_per_step"),
            mem_peak_gib=(torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None),
            comm_per_step={k: {op: v / steps for op, v in d.items()} for k, d in comm.items()},
            raster=self.raster,  # the step taken: "fused" or "unfused"
            fused_tiles=self.last_fused_stats or None,
        )
        path = self.result_dir / "stats" / f"train_step{self.step}_rank{self.ctx.rank}.json"
        checkpoint.atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(stats, indent=2)))

    def _print_memory_model(self) -> None:
        """Print the memory model at start (profiling.memory_model); the benchmark checks it
        against the measured peak."""
        from .profiling import memory_model

        m = memory_model(self.cfg.sh_degree, self.ctx.world_size, self.device)
        line = (
            f"splat-train: {self.backend} backend on {self.device}, world size {self.ctx.world_size}, "
            f"{int(self.params['means'].shape[0]):,} Gaussians on rank 0; {m['bytes_per_gaussian']} bytes "
            f"per Gaussian (params + grad + Adam, SH degree {self.cfg.sh_degree})"
        )
        if m["predicted_capacity_per_gpu"]:
            line += (
                f"; predicted capacity {m['predicted_capacity_per_gpu'] / 1e6:.0f} M per GPU, "
                f"{m['predicted_capacity_per_job'] / 1e6:.0f} M per job (before per-step buffers)"
            )
        self.report.print(line)


def _plain(obj):
    from .config import to_dict

    return to_dict(obj)


def evaluate_only(trainer: Trainer, files: list[Path]) -> list[Path]:
    """``--ckpt``: load the checkpoint shards; export the PLY, evaluate, render the video (in the
    order of Trainer.write_outputs); no training. Returns the files written (rank 0)."""
    state = checkpoint.load_shard(files, trainer.ctx.rank, trainer.ctx.world_size)
    trainer.load_state_dict(state, restore_rng=False)
    _say_loaded("loaded", trainer, files)
    trainer.report.open_tensorboard()
    written = trainer.write_outputs(trainer.step, save=False, ply=True, evaluation=True)
    trainer.report.close()
    trainer.print_outputs(written)
    return written


def resume_from(trainer: Trainer, ckpt_dir: Path) -> Optional[int]:
    # rank 0 picks the set (main() checked it exists and named skipped sets): on nodes that see the
    # folder at different moments of a concurrent write, every rank still loads the same step
    found = exchange.main_decides(trainer.ctx, lambda: checkpoint.latest_complete(ckpt_dir))
    if found is None:
        raise ValueError(f"--resume: no complete set of checkpoints in {ckpt_dir}")
    step, files = found
    state = checkpoint.load_shard(files, trainer.ctx.rank, trainer.ctx.world_size)
    trainer.load_state_dict(state)
    _say_loaded("resumed from", trainer, files)
    # checkpoints before --raster auto record only the flag, then "fused" or "unfused"
    before = state.get("raster") or state.get("config", {}).get("raster")
    if before in ("fused", "unfused") and before != trainer.raster:
        trainer.report.warn(
            f"warning: --resume: steps 1-{step} took the {before} step and the rest take the {trainer.raster} "
            f"step (its loss differs); --raster {before} keeps the first"
        )
    return step


def _say_loaded(verb: str, trainer: Trainer, files: list[Path]) -> None:
    """Rank 0: '<verb> step N (world size W -> W', Gaussians re-sharded) from <folder>'."""
    old, new = len(files), trainer.ctx.world_size
    world = f"world size {old}" if old == new else f"world size {old} -> {new}, Gaussians re-sharded"
    trainer.report.print(f"{verb} step {trainer.step} ({world}) from {Path(files[0]).parent}")

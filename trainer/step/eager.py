"""A training step's forward, loss and backward through autograd: :class:`EagerStep`.

What the whole-step replay (step/graphed.py) runs where it cannot, and every step of a run whose
plan has no whole-step graphs: render (render.py: projection, SH, exchange, tile intersection and,
unfused, rasterization; or gsplat's own distributed pass), the loss (the fused kernel's tile-local
loss, or the photometric loss with the appearance, bilateral-grid and mask corrections and the
depth term), the regularizers, and ``backward()``, whose reverse exchange brings every partial
gradient to its Gaussian's owner.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from ...kernels.fused_ssim import uint8_to_unit
from ..bilagrid import TV_WEIGHT, BilateralGrid
from ..depth import depth_loss
from ..losses import opacity_reg, scale_reg
from ..model import activated
from ..render import CameraBatch, RenderInfo, RenderResult, RenderSetup
from .batch import StepBatch, _upload
from .graphed import StepOutputs
from .plan import StepPlan


def unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel wrapper (--pose_opt / --app_opt with W > 1)."""
    return getattr(module, "module", module)


def fused_loss_function(ssim_lambda: float, fallback, scratch_mb: Optional[float] = None) -> Callable:
    """kernels.fused_raster.fused_raster_loss with the run's --ssim_lambda, unfused fallback ops
    and checkpoint scratch (StepPlan.fused_scratch_mb) bound: the fused step's rasterizer and loss
    (eager and graphed)."""
    from ...kernels.fused_raster import fused_raster_loss

    return functools.partial(fused_raster_loss, ssim_lambda=ssim_lambda, fallback=fallback, scratch_mb=scratch_mb)


class EagerStep:
    """Forward, loss and backward of one step on this rank, through autograd.

    ``plan``: the run's StepPlan; ``cfg``: its Config (loss weights, regularizers, depth, images
    for TensorBoard); ``setup``: the training passes' RenderSetup (absgrad and the zero-eliding
    exchange set); ``loss``: losses.TrainingLoss; ``aux``: the auxiliary modules by name ("pose",
    "app", "bilagrid"; trainer/aux_modules.py); ``depth_targets``: depth.DepthTargets or None;
    ``scene_scale``: scene units of the depth loss; ``tb_wanted(step)``: whether step ``step``'s
    render goes to TensorBoard (then :attr:`tb_image` holds ground truth | render)."""

    def __init__(
        self,
        plan: StepPlan,
        cfg,
        setup: RenderSetup,
        loss: Callable,
        aux: dict,
        depth_targets=None,
        scene_scale: float = 1.0,
        tb_wanted: Callable[[int], bool] = lambda step: False,
    ):
        self.plan, self.cfg, self.setup, self.loss, self.aux = plan, cfg, setup, loss, aux
        self.depth_targets, self.scene_scale, self.tb_wanted = depth_targets, scene_scale, tb_wanted
        self.fused_loss = (
            fused_loss_function(cfg.step.ssim_lambda, setup.ops, plan.fused_scratch_mb) if plan.fused else None
        )
        self.tb_image: Optional[torch.Tensor] = None

    def __call__(self, batch: StepBatch, params, sh_degree: int, timer, head=None) -> StepOutputs:
        """Step ``batch``'s forward, loss and backward for the raw parameters ``params`` at SH
        degree ``sh_degree``; ``timer``: profiling.PhaseTimer; ``head``: a graphs-bound
        GraphedHead (capture.GraphedHead.head of the parameters) replaying the projection, or None."""
        ctx = self.setup.ctx
        if self.plan.pipeline == "gsplat-dist":
            result = self._render_gsplat_dist(batch.cams, params, sh_degree, batch.backgrounds, timer)
        else:
            result = self.setup(
                params if head is not None else activated(params),
                batch.cams,
                sh_degree,
                backgrounds=batch.backgrounds,
                keep_means2d_grad=True,
                timer=timer,
                rasterize=not self.plan.fused,
                layout=batch.layout,
                render_depth=self.cfg.step.depth_loss,
                head=head,
            )
        if self.plan.fused:
            loss, parts = self._fused(result, uint8_to_unit(batch.gts), batch, timer)
        else:
            loss, parts = self._photometric(result, batch, timer)
        total = self._regularized(loss, result.info, params, batch.num_cameras)
        ctx.stats.phase = "backward"
        timer.begin("backward_raster")
        total.backward()
        return StepOutputs(loss, parts, result.info)

    def _photometric(self, result: RenderResult, batch: StepBatch, timer) -> tuple[torch.Tensor, dict]:
        """The unfused step's loss: the render corrected by --app_opt / --use_bilateral_grid,
        masked pixels set to 0 in render and ground truth (data/masks.py), the photometric loss,
        and --depth_loss."""
        timer.begin("loss")
        colors, gts = result.colors, batch.gts
        assert colors is not None  # rasterized
        if "app" in self.aux:
            colors = self.aux["app"](colors, batch.item_ids)
        if "bilagrid" in self.aux:
            colors = self.aux["bilagrid"](colors, batch.item_ids)
        if batch.keep is not None:
            colors, gts = colors * batch.keep, gts * batch.keep
        loss, parts = self.loss(colors, gts)
        if self.cfg.step.depth_loss:
            assert result.depths is not None  # render_depth
            parts["depth"] = self._depth_loss(result.depths, batch)
            loss = loss + self.cfg.step.depth_lambda * parts["depth"]
        if self.tb_wanted(batch.step):
            self.tb_image = torch.cat([uint8_to_unit(gts), colors.detach().clamp(0, 1)], dim=2)
        return loss, parts

    def _regularized(self, loss: torch.Tensor, info: RenderInfo, params, num_cameras: int) -> torch.Tensor:
        """This rank's share of the global batch's objective. The loss of the global batch is the
        mean over every rank's images, and a regularizer is a mean over every rank's Gaussians;
        this rank contributes its share of each, so that the gradients summed at the owners equal
        those of one process holding everything."""
        cfg, world_size = self.cfg, self.setup.ctx.world_size
        weight = num_cameras / sum(info.C_world)
        total = loss if weight == 1.0 else loss * weight
        shard_share = params["means"].shape[0] / sum(info.N_world)
        if cfg.step.opacity_reg > 0:
            total = total + opacity_reg(torch.sigmoid(params["opacities"]), cfg.step.opacity_reg) * shard_share
        if cfg.step.scale_reg > 0:
            total = total + scale_reg(torch.exp(params["scales"]), cfg.step.scale_reg) * shard_share
        if "bilagrid" in self.aux:  # replicated: each rank adds 1/W of the regularizer
            grid = unwrapped(self.aux["bilagrid"])
            assert isinstance(grid, BilateralGrid)
            total = total + TV_WEIGHT * grid.tv_loss() / world_size
        return total

    def _depth_loss(self, rendered: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """--depth_loss of this rank's images (trainer/depth.py), the targets moved into the
        trained windows and those outside dropped (weight 0)."""
        assert self.depth_targets is not None  # --depth_loss
        pixels, depths, image = self.depth_targets.batch(batch.items)
        weights = None
        if self.cfg.data.patch_size is not None:
            origins = _upload([[x0, y0] for x0, y0, _, _ in batch.windows], pixels.dtype, pixels.device)
            pixels = pixels - origins[image]
            h, w = rendered.shape[1:3]
            weights = ((pixels[:, 0] >= 0) & (pixels[:, 0] < w) & (pixels[:, 1] >= 0) & (pixels[:, 1] < h)).float()
        return depth_loss(rendered, pixels, depths, image, self.scene_scale, weights)

    def _fused(self, result: RenderResult, gts: torch.Tensor, batch: StepBatch, timer) -> tuple[torch.Tensor, dict]:
        """ByteSplat's fused step: forward compositing, the tile-local loss and the backward
        compositing in one native kernel per tile (kernels/fused_raster.py); its autograd node
        hands the record gradients to the exchange's backward. With --absgrad the kernel's
        absolute 2D-mean gradients ride back through the render's relay (info.raster_means2d),
        as the unfused rasterizer's do. The timer's "rasterization" phase covers all of it."""
        info, rec, tiles = result.info, result.info.records, result.info.tiles
        assert rec is not None and tiles is not None and info.raster_means2d is not None  # rasterize=False
        assert self.fused_loss is not None
        loss, stats = self.fused_loss(
            info.raster_means2d,
            rec.conics,
            rec.colors,
            rec.opacities,
            tiles.offsets,
            tiles.flatten_ids,
            gts,
            info.width,
            info.height,
            backgrounds=batch.backgrounds,
            packed=self.plan.packed,
            origin=batch.origin,
            absgrad=self.setup.absgrad,
        )
        timer.begin("loss")
        return loss, {"l1": stats["l1"], "ssim": stats["ssim"]}  # the kernel's terms (tile-local SSIM)

    def _render_gsplat_dist(self, cams: CameraBatch, params, sh_degree: int, backgrounds, timer) -> RenderResult:
        """The baseline pass: gsplat's ``rasterization(distributed=True)`` (dense), whose info is
        translated for the densification strategy. Needs CUDA, equal camera counts and sizes."""
        from gsplat.rendering import rasterization

        from ..exchange import gather_metadata

        ctx, cfg = self.setup.ctx, self.cfg
        timer.begin("projection")  # gsplat's pass is one opaque forward
        g = activated(params)
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
            near_plane=cfg.step.near_plane,
            far_plane=cfg.step.far_plane,
            backgrounds=backgrounds,
            distributed=ctx.distributed,
            camera_model=cfg.data.camera_model,
            rasterize_mode="antialiased" if cfg.model.antialiased else "classic",
        )
        means2d = meta["means2d"]  # the local, pre-exchange [C_all, N, 2]
        means2d.retain_grad()
        C_all, n = means2d.shape[0], means2d.shape[1]
        C = cams.viewmats.shape[0]
        N_world: Any = (
            [n] * ctx.world_size
            if not (cfg.step.opacity_reg or cfg.step.scale_reg)
            else gather_metadata(ctx, [n])[:, 0].tolist()
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
            C_world=[C] * ctx.world_size,
            width=cams.width,
            height=cams.height,
            num_local_cameras=C,
        )
        return RenderResult(colors, alphas, info)

"""Densification: gsplat's DefaultStrategy and MCMCStrategy, run locally on each rank's shard.

Two adaptations, both documented where they happen:

* gsplat 1.5.3's DefaultStrategy never resets opacities: its condition
  ``step % self.reset_every == 0 & step > 0`` parses as the chained comparison
  ``(step % reset_every == (0 & step)) and ((0 & step) > 0)``, whose second half is always False.
  :class:`DefaultStrategy` below performs the reset at ``reset_every`` as intended (the reset is
  idempotent, so it stays right if gsplat fixes the condition).
* The strategy reads image-plane gradients normalized to NDC by one ``width``/``height``; our
  cameras may differ in size (portrait and landscape in one batch, or across ranks), so each
  camera's gradient is normalized by its own size (:func:`ndc_scales`).
* :meth:`DefaultStrategy._update_state` accumulates the statistics without gsplat's
  ``torch.where`` over the visibility mask (a host synchronization in every step): a masked sum
  over cameras (dense) or an index_add over the records (packed), all on the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from gsplat.strategy import DefaultStrategy as _GsplatDefault
from gsplat.strategy import MCMCStrategy
from gsplat.strategy.ops import reset_opa

from ..kernels import densify_stats
from ..kernels.reference import densify_stats_update
from .config import Config

if TYPE_CHECKING:  # pragma: no cover
    from .render import RenderInfo
    from .shard import GaussianShard


class DefaultStrategy(_GsplatDefault):
    """gsplat's DefaultStrategy with the opacity reset firing at every ``reset_every`` steps and
    its running statistics accumulated without a host synchronization."""

    def _update_state(self, params, state, info, packed=False):
        """Add this step's visible 2D-mean gradient norms (NDC) to ``state["grad2d"]`` [N] and the
        views that saw each Gaussian to ``state["count"]`` [N] (gsplat's update, the same sums),
        in one launch on a GPU (kernels/densify_stats.py). ``info`` is :func:`strategy_info`'s."""
        assert self.refine_scale2d_stop_iter == 0, "the 2D-scale statistics (refine_scale2d_stop_iter) are not kept"
        means2d = info[self.key_for_gradient]
        grads = means2d.absgrad if self.absgrad else means2d.grad
        n = len(params["means"])
        for key in ("grad2d", "count"):
            if state[key] is None:
                state[key] = torch.zeros(n, device=grads.device)
        scales = self._ndc_scales(info, grads.device)
        args = (state["grad2d"], state["count"], grads, scales) + (
            (None, info["gaussian_ids"], info["camera_ids"]) if packed else (info["radii"],)
        )
        if grads.device.type == "cuda" and densify_stats.available():
            densify_stats.accumulate(*args)
        else:
            densify_stats_update(*args)

    def _ndc_scales(self, info, device) -> torch.Tensor:
        """[C, 2] float32 on ``device``: :func:`ndc_scales`, made once per camera layout (a
        host-to-device copy every step would cost an upload)."""
        key = (tuple(info["widths"]), tuple(info["heights"]), info["n_cameras"], str(device))
        cache = self.__dict__.setdefault("_scale_cache", {})
        if key not in cache:
            cache.clear()
            cache[key] = ndc_scales(info).to(device)
        return cache[key]

    def step_post_backward(self, params, optimizers, state, step, info, packed=False):
        super().step_post_backward(params, optimizers, state, step, info, packed=packed)
        if 0 < step < self.refine_stop_iter and step % self.reset_every == 0:
            reset_opa(params=params, optimizers=optimizers, state=state, value=self.prune_opa * 2.0)


def make_strategy(cfg: Config):
    """The densification strategy of ``cfg`` (step fields from cfg.schedule)."""
    s, d = cfg.schedule, cfg.densify
    if d.strategy == "mcmc":
        return MCMCStrategy(
            cap_max=d.cap_max,
            noise_lr=d.noise_lr,
            refine_start_iter=s.refine_start_iter,
            refine_stop_iter=s.refine_stop_iter,
            refine_every=s.refine_every,
            min_opacity=d.min_opacity,
        )
    return DefaultStrategy(
        prune_opa=d.prune_opa,
        grow_grad2d=d.grow_grad2d,
        grow_scale3d=d.grow_scale3d,
        prune_scale3d=d.prune_scale3d,
        refine_start_iter=s.refine_start_iter,
        refine_stop_iter=s.refine_stop_iter,
        reset_every=s.reset_every,
        refine_every=s.refine_every,
        pause_refine_after_reset=s.pause_refine_after_reset,
        absgrad=d.absgrad,
    )


def initialize_state(strategy, scene_scale: float) -> dict[str, Any]:
    """The strategy's running state: DefaultStrategy takes the scene scale (its grow / prune
    scale thresholds are fractions of it); gsplat 1.5.3's ``MCMCStrategy.initialize_state()``
    takes no argument (passing one raises TypeError)."""
    if isinstance(strategy, MCMCStrategy):
        return strategy.initialize_state()
    return strategy.initialize_state(scene_scale=scene_scale)


def ndc_scales(info: dict[str, Any]) -> torch.Tensor:
    """[C, 2] float32 factors from pixel to NDC gradients of the pass's cameras: x by width / 2,
    y by height / 2 of each camera, both by the number of cameras of the pass (gsplat normalizes
    by ``n_cameras`` because the loss averages over the batch)."""
    n = info["n_cameras"]
    return torch.tensor([info["widths"], info["heights"]], dtype=torch.float32).T * (0.5 * n)


class _GradHolder:
    """Stands in for the 2D-means tensor: the strategy reads ``.grad`` (and ``.absgrad``)."""

    def __init__(self, grad: torch.Tensor, absgrad: "torch.Tensor | None" = None):
        self.grad, self.absgrad = grad, absgrad


def strategy_info(info: "RenderInfo") -> dict[str, Any]:
    """The info dict gsplat's strategies read, from a render's :class:`render.RenderInfo` after
    backward: the local 2D means (their ``.grad``, and with absgrad ``.absgrad``, the absolute
    gradients the exchange brought back to this owner, render.AbsGradRelay; zeros when none
    arrived), radii, ids, and each camera's size for :func:`ndc_scales` (``width = height = 2``,
    ``n_cameras = 1`` are what gsplat's own normalization would need to be the identity)."""
    means2d: Any = info.means2d
    lanes = info.absgrad
    if means2d.grad is None or lanes is not None:
        zeros = torch.zeros_like(means2d)
        absgrad = None if lanes is None else (zeros if lanes.grad is None else lanes.grad)
        means2d = _GradHolder(zeros if means2d.grad is None else means2d.grad, absgrad)
    return {
        "means2d": means2d,
        "radii": info.radii,
        "gaussian_ids": info.gaussian_ids,
        "camera_ids": info.camera_ids,
        "packed": info.packed,
        "widths": info.widths,
        "heights": info.heights,
        "n_cameras": info.n_cameras,
        "width": 2.0,
        "height": 2.0,
    }


def refines_at(strategy, step: int) -> bool:
    """Whether ``strategy`` (gsplat's DefaultStrategy or MCMCStrategy, or one built by
    :func:`make_strategy`) may grow, prune or relocate Gaussians at ``step``: gsplat's condition for
    both, ``refine_start_iter < step < refine_stop_iter`` and a multiple of ``refine_every``, read
    from the strategy itself (the bytesplat preset lowers its stop step to the second pruning
    stage, trainer/prune.py). The default strategy's pause after an opacity reset is not read: a
    paused step counts as one that may refine."""
    return strategy.refine_start_iter < step < strategy.refine_stop_iter and step % strategy.refine_every == 0


def post_backward(shard: "GaussianShard", cfg: Config, step: int, render_info: "RenderInfo") -> None:
    """The strategy's step after backward on ``shard`` (grow, prune, relocate at its steps;
    gsplat's ops do the parameter and Adam surgery), from the render's info (:func:`strategy_info`).
    MCMC reads the means' current learning rate; the default strategy the packed flag."""
    info = strategy_info(render_info)
    if cfg.densify.strategy == "mcmc":
        shard.strategy.step_post_backward(
            shard.params, shard.optimizers, shard.strategy_state, step, info, lr=shard.scheduler.get_last_lr()[0]
        )
    else:
        shard.strategy.step_post_backward(
            shard.params, shard.optimizers, shard.strategy_state, step, info, packed=cfg.step.packed
        )
    if step % cfg.schedule.refine_every == 0:  # the strategies grow, prune or relocate only here
        shard.sizes_changed()

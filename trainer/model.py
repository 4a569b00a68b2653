"""A rank's shard of the Gaussians: parameters, their activations, initialization, optimizers.

Rank r of W owns Gaussians ``r::W`` of the initial point set (gsplat simple_trainer's strided
round-robin split). The split happens on the points, before any parameter or optimizer state
exists, so a rank allocates memory for its own shard only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional, Union, cast

import numpy as np
import torch

from .config import Config
from .data import Scene
from .data.images import no_points_error

if TYPE_CHECKING:  # pragma: no cover
    from ..kernels.adam import SeenRows

SH_C0 = 0.28209479177387814
"""Degree-0 real spherical harmonic, 1 / (2 sqrt(pi)) (3DGS utils/sh_utils.py)."""

PARAM_NAMES = ("means", "scales", "quats", "opacities", "sh0", "shN")


def rgb_to_sh(rgb: torch.Tensor) -> torch.Tensor:
    """Degree-0 SH coefficient whose colour (after the renderer's +0.5) is ``rgb`` in [0, 1]."""
    return (rgb - 0.5) / SH_C0


def num_sh_bases(degree: int) -> int:
    return (degree + 1) ** 2


@dataclass
class InitPoints:
    """The whole initial point set, identical on every rank (the shard is cut from it)."""

    means: np.ndarray  # [P, 3] float32, scene units
    rgbs: np.ndarray  # [P, 3] float32 in [0, 1]
    knn_rms: Optional[np.ndarray] = None  # [P] RMS distance to the 3 nearest others, when known


def initial_points(scene: Scene, cfg: Config, scene_scale: float) -> InitPoints:
    """The initial Gaussian centres and colours.

    ``--init_type sfm``: the scene's SfM points (DataError when there are none, suggesting
    ``--init_type random``). ``--init_type random``: ``init_num_pts`` points uniform in a cube of
    half-size ``init_extent * scene_scale`` around the cameras' centroid, random colours, drawn
    from ``cfg.seed`` so every rank draws the same set (gsplat simple_trainer draws from [-1, 1]^3
    scaled the same way, centred at the origin).
    """
    if cfg.model.init_type == "sfm":
        if scene.points is None or len(scene.points) == 0:
            raise no_points_error(cfg.data.data_dir if cfg.data.data_dir is not None else "the synthetic scene")
        assert scene.points_rgb is not None  # loaded with the points
        rgbs = scene.points_rgb.astype(np.float32) / 255.0
        return InitPoints(scene.points.astype(np.float32), rgbs, scene.points_knn_rms)
    rng = np.random.default_rng(cfg.seed)
    centres = np.stack([c.camtoworld[:3, 3] for c in scene.cameras])
    centre = centres.mean(axis=0)
    half = cfg.model.init_extent * scene_scale
    means = centre + (rng.random((cfg.model.init_num_pts, 3)) * 2.0 - 1.0) * half
    rgbs = rng.random((cfg.model.init_num_pts, 3))
    return InitPoints(means.astype(np.float32), rgbs.astype(np.float32))


def knn_mean_distance(points: np.ndarray, query: np.ndarray, k: int = 3) -> np.ndarray:
    """Mean distance from each query point to its ``k`` nearest other points of ``points``.

    points [P, 3], query [Q, 3] (a subset of points) -> [Q] (scene units). 3DGS initializes scales
    from the mean squared distance to the 3 nearest neighbours (simple-knn); gsplat uses the root
    of the mean squared distance; we follow gsplat.
    """
    if len(points) < 2:
        return np.full(len(query), 0.01, dtype=np.float32)
    from scipy.spatial import cKDTree  # here: a GPU run takes the Morton form and skips scipy's import (about 1 s)

    k_eff = min(k, len(points) - 1)
    dists, _ = cKDTree(points).query(query, k=k_eff + 1, workers=-1)  # first neighbour: the point itself
    dists = np.asarray(dists, dtype=np.float64).reshape(len(query), -1)[:, 1:]
    rms = np.sqrt((dists**2).mean(axis=1))
    return np.maximum(rms, 1e-7).astype(np.float32)


MORTON_BITS = 21  # bits per axis of the Morton codes (3 x 21 = 63 bits of an int64)
# grid offsets, fractions of the box (orders x window against exactness: docs/design-measurements.md)
MORTON_SHIFTS = (
    (0.0, 0.0, 0.0),
    (0.37, 0.23, 0.11),
    (0.13, 0.41, 0.29),
    (0.71, 0.53, 0.83),
    (0.29, 0.89, 0.61),
    (0.57, 0.07, 0.47),
    (0.91, 0.67, 0.19),
)


def _morton_codes(cells: torch.Tensor) -> torch.Tensor:
    """int64 [P, 3] cell coordinates in [0, 2^21) -> int64 [P] Morton (Z-order) codes, the bits of
    x, y, z interleaved (the "magic bits" spread of Morton 1966 / Karras 2012)."""

    def spread(v):
        v = v & 0x1FFFFF
        v = (v | (v << 32)) & 0x1F00000000FFFF
        v = (v | (v << 16)) & 0x1F0000FF0000FF
        v = (v | (v << 8)) & 0x100F00F00F00F00F
        v = (v | (v << 4)) & 0x10C30C30C30C30C3
        return (v | (v << 2)) & 0x1249249249249249

    return spread(cells[:, 0]) | (spread(cells[:, 1]) << 1) | (spread(cells[:, 2]) << 2)


def _cell_codes(offsets: torch.Tensor, scale) -> torch.Tensor:
    """float [P, 3] positions from a box's low corner (scene units) -> int64 [P] Morton codes of
    their cells, ``scale`` cells per unit (clamped to the :data:`MORTON_BITS` grid)."""
    return _morton_codes((offsets * scale).long().clamp(0, 2**MORTON_BITS - 1))


def morton_order(means: torch.Tensor) -> torch.Tensor:
    """The order of ``means`` [N, 3] (any float dtype and device) along a Morton (Z-order) curve of
    their bounding box, :data:`MORTON_BITS` bits per axis: int64 [N], sorted position -> row, ties
    in row order (a stable sort). Rows near each other in space come near each other in memory,
    which is what the rasterizer's gathers of a tile's records and its gradient atomics want
    (LiteGS reorders its Gaussians the same way). An empty input gives an empty order."""
    n = means.shape[0]
    if n == 0:
        return torch.empty(0, dtype=torch.long, device=means.device)
    pts = means.detach().float()
    lo, hi = pts.min(dim=0).values, pts.max(dim=0).values
    scale = (2**MORTON_BITS - 1) / (hi - lo).max().clamp_min(1e-12)
    return torch.sort(_cell_codes(pts - lo, scale), stable=True).indices


def keeps_morton_order(cfg: Config) -> bool:
    """Whether the shard is kept in :func:`morton_order` (``cfg.model.morton_order``; never for
    --pipeline gsplat-dist, gsplat's own pass that the benchmark compares against)."""
    return cfg.model.morton_order and cfg.step.pipeline == "ours"


def knn_mean_distance_morton(
    points: torch.Tensor, query_ids: torch.Tensor, k: int = 3, window: int = 16, chunk: int = 1 << 20
) -> torch.Tensor:
    """Approximate :func:`knn_mean_distance` on any device in a few sorts: RMS distance from each
    query point ``points[query_ids]`` to its ``k`` nearest other points.

    points [P, 3] float, query_ids int64 [Q] -> float32 [Q] (scene units). The points are sorted
    along a Morton curve (as 3DGS's simple-knn does) for each of :data:`MORTON_SHIFTS` (the grid
    moved by a fraction of the bounding box, so that neighbours the curve separates in one order
    meet in another), and each query's candidates are the ``window`` points on either side of it
    in every order; the result is the k nearest distinct candidates. Exact whenever the true
    neighbours are among them, which the tests check on uniform and clustered clouds; where not,
    the distance is an over-estimate (a farther neighbour). Memory: chunk x (2 window + k) floats
    and indices.
    """
    n = points.shape[0]
    device = points.device
    if n < 2:
        return torch.full((query_ids.shape[0],), 0.01, dtype=torch.float32, device=device)
    k = min(k, n - 1)
    pts = points.float()
    lo, hi = pts.min(dim=0).values, pts.max(dim=0).values
    extent = (hi - lo).max().clamp_min(1e-12)
    scale = (2**MORTON_BITS - 1) / (2.0 * extent)  # the shifted grids need room: the box spans half
    offsets = torch.arange(-window, window + 1, device=device)
    offsets = offsets[offsets != 0]  # [2 window]
    best_d = torch.full((query_ids.shape[0], k), float("inf"), device=device)
    best_i = torch.full((query_ids.shape[0], k), -1, dtype=torch.long, device=device)
    for shift in MORTON_SHIFTS:
        shifted = pts - lo + torch.tensor(shift, device=device) * extent  # within 2 extents: no cell clamped
        order = torch.argsort(_cell_codes(shifted, scale))  # sorted position -> point
        rank_of = torch.empty_like(order)
        rank_of[order] = torch.arange(n, device=device)  # point -> sorted position
        for start in range(0, query_ids.shape[0], chunk):
            q = query_ids[start : start + chunk]
            cand = order[(rank_of[q][:, None] + offsets).clamp(0, n - 1)]  # [q, 2 window]
            d2 = ((pts[cand] - pts[q][:, None]) ** 2).sum(-1)
            d2 = torch.where(cand == q[:, None], float("inf"), d2)  # not the point itself
            ids = torch.cat([best_i[start : start + chunk], cand], dim=1)
            dist = torch.cat([best_d[start : start + chunk], d2], dim=1)
            dist, pos = torch.sort(dist, dim=1)
            ids = torch.gather(ids, 1, pos)
            dup = torch.zeros_like(ids, dtype=torch.bool)  # a candidate seen in an earlier order or
            dup[:, 1:] = ids[:, 1:] == ids[:, :-1]  # clamped twice: equal distances sort together
            dist = torch.where(dup, float("inf"), dist)
            dist, pos = torch.topk(dist, k, dim=1, largest=False, sorted=True)
            best_d[start : start + chunk], best_i[start : start + chunk] = dist, torch.gather(ids, 1, pos)
    return best_d.mean(dim=1).sqrt().clamp_min(1e-7)


def create_shard(
    points: InitPoints, cfg: Config, rank: int, world_size: int, device: torch.device
) -> torch.nn.ParameterDict:
    """Parameters of rank ``rank``'s shard: Gaussians ``rank::world_size`` of ``points``, in that
    order, or in :func:`morton_order` with ``cfg.model.morton_order`` (not for --pipeline gsplat-dist).

    Returns a ParameterDict with means [N, 3] (scene units), scales [N, 3] (log scene units),
    quats [N, 4] (unit, w first), opacities [N] (logit), sh0 [N, 1, 3], shN [N, K-1, 3] with
    K = (sh_degree + 1)^2.
    """
    shard = slice(rank, None, world_size)
    means = points.means[shard]
    if points.knn_rms is not None:  # computed once for several trainers (the benchmark's variants)
        dist = np.asarray(points.knn_rms[shard], dtype=np.float32)
    elif device.type == "cuda":  # neighbours from the whole set; seconds for tens of millions of points
        dist = (
            knn_mean_distance_morton(
                torch.from_numpy(points.means).to(device),
                torch.arange(rank, len(points.means), world_size, device=device),
            )
            .cpu()
            .numpy()
        )
    else:
        dist = knn_mean_distance(points.means, means)
    rgbs = torch.from_numpy(np.ascontiguousarray(points.rgbs[shard]))
    n = len(means)
    scales = torch.log(torch.from_numpy(dist) * cfg.model.init_scale)[:, None].repeat(1, 3)
    quats = torch.zeros(n, 4)
    quats[:, 0] = 1.0
    opacities = torch.full((n,), math.log(cfg.model.init_opa / (1.0 - cfg.model.init_opa)))
    sh0 = rgb_to_sh(rgbs)[:, None, :]
    shN = torch.zeros(n, num_sh_bases(cfg.model.sh_degree) - 1, 3)
    tensors = dict(
        means=torch.from_numpy(np.ascontiguousarray(means)),
        scales=scales,
        quats=quats,
        opacities=opacities,
        sh0=sh0,
        shN=shN,
    )
    tensors = {k: v.float().to(device) for k, v in tensors.items()}
    if keeps_morton_order(cfg):
        order = morton_order(tensors["means"])
        tensors = {k: v[order] for k, v in tensors.items()}
    return torch.nn.ParameterDict({k: torch.nn.Parameter(v.contiguous()) for k, v in tensors.items()})


def batch_rule(batch_size: int, world_size: int) -> tuple[float, float, tuple[float, float]]:
    """(lr multiplier, Adam eps, Adam betas) for the global batch BS = batch_size x world_size.

    lr x sqrt(BS) and eps = 1e-15 / sqrt(BS) as gsplat simple_trainer. For the betas gsplat uses
    1 - BS (1 - beta), which reaches beta1 = 0 at BS = 10 and goes negative beyond; we use
    beta^BS instead: the same first-order behaviour for small BS (1 - BS(1-beta) is the first-order
    expansion of beta^BS), it keeps the averaging window equal in *images* (BS steps of beta
    average as many images as one step of beta^BS), and it stays in (0, 1) at every BS.
    """
    bs = batch_size * world_size
    return math.sqrt(bs), 1e-15 / math.sqrt(bs), (0.9**bs, 0.999**bs)


def create_optimizers(
    params: torch.nn.ParameterDict, cfg: Config, world_size: int, scene_scale: float
) -> dict[str, torch.optim.Adam]:
    """One Adam per parameter (gsplat's densification swaps parameters and their Adam state one
    at a time). :func:`optimizer_step` steps them: on a GPU all in one launch of
    kernels/adam.py (the Adams hold the learning rates and state), elsewhere each with PyTorch's
    fused implementation where the device has one (the same update, elementwise, float32)."""
    lr_mult, eps, betas = batch_rule(cfg.step.batch_size, world_size)
    o = cfg.optim
    lrs = dict(
        means=o.means_lr * scene_scale,
        scales=o.scales_lr,
        quats=o.quats_lr,
        opacities=o.opacities_lr,
        sh0=o.sh0_lr,
        shN=o.shN_lr,
    )
    return {
        name: torch.optim.Adam(
            [{"params": params[name], "lr": lrs[name] * lr_mult, "name": name}],
            eps=eps,
            betas=betas,
            **_adam_impl(params[name].device),
        )
        for name in PARAM_NAMES
    }


def _uses_adam_kernel(device: torch.device) -> bool:
    from ..kernels import adam

    return device.type == "cuda" and adam.available()


def _adam_impl(device: torch.device) -> dict:
    """{"fused": True} where torch.optim.Adam steps with its fused kernel on ``device``; {} where
    kernels/adam.py steps it (the Adam only holds state, in torch's format) or no fused kernel
    exists (foreach)."""
    if _uses_adam_kernel(device):
        return {}
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        supported = _get_fused_kernels_supported_devices()
    except ImportError:  # pragma: no cover - a torch that moved the helper
        supported = ["cuda"]
    return {"fused": True} if device.type in supported else {}


def optimizer_step(
    optimizers: dict[str, torch.optim.Optimizer],
    visible: Optional[torch.Tensor] = None,
    lazy_rows: Optional[SeenRows] = None,
) -> None:
    """One step of every optimizer, then their gradients dropped (set to None). The Gaussians'
    Adams on a GPU run in one launch (kernels/adam.py); anything else through its own step().
    ``visible`` (bool [N]; --visible_adam): gsplat's SelectiveAdam update instead, only the visible
    Gaussians' rows (kernels/adam.py on a GPU, kernels.reference.selective_adam_update elsewhere).
    ``lazy_rows`` (kernels/adam.SeenRows; --lazy_sh_adam): sh0 and shN step only the rows it
    lists (kernels/adam.py only: RuntimeError where it does not run)."""
    opts = list(optimizers.values())
    from ..kernels import adam

    params = [p for o in opts for g in o.param_groups for p in g["params"]]
    if params and _uses_adam_kernel(params[0].device) and all(adam.supported(o) for o in opts):
        adam.adam_step(cast(list[torch.optim.Adam], opts), visible, lazy_rows)  # adam.supported checked each
        mark_stepped(opts)
    elif lazy_rows is not None:
        raise RuntimeError("the deferred SH Adam (--lazy_sh_adam) needs kernels/adam.py's launch on a GPU")
    elif visible is not None:
        _selective_adam_reference(cast(list[torch.optim.Adam], opts), visible)
        mark_stepped(opts)
    else:
        for opt in opts:
            opt.step()
    for p in params:  # Optimizer.zero_grad(set_to_none=True), without its per-call hooks and profiling
        p.grad = None


def mark_stepped(optimizers: list[torch.optim.Optimizer]) -> None:
    """Record that the optimizers stepped without their step(): torch's LR schedulers read this
    flag (set by step()'s wrapper) and warn of a scheduler step before an optimizer step."""
    for opt in optimizers:
        opt._opt_called = True  # type: ignore[attr-defined]  # torch's private flag, set as step() does


@torch.no_grad()
def _selective_adam_reference(optimizers: list[torch.optim.Adam], visible: torch.Tensor) -> None:
    """The selective step of :func:`optimizer_step` in PyTorch, on the Adams' own state (torch's
    format; the step count is not advanced, as gsplat's SelectiveAdam)."""
    from ..kernels.adam import params_with_state
    from ..kernels.reference import selective_adam_update

    for p, state, group in params_with_state(optimizers):
        beta1, beta2 = group["betas"]
        new = selective_adam_update(
            p, p.grad, state["exp_avg"], state["exp_avg_sq"], visible, float(group["lr"]), beta1, beta2, group["eps"]
        )
        for target, value in zip((p, state["exp_avg"], state["exp_avg_sq"]), new):
            target.copy_(value)


def means_lr_scheduler(optimizer: torch.optim.Optimizer, max_steps: int) -> torch.optim.lr_scheduler.ExponentialLR:
    """The means' learning rate decays exponentially to 1% over ``max_steps`` (gsplat simple_trainer)."""
    return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.01 ** (1.0 / max_steps))


def activated(
    params: Union[torch.nn.ParameterDict, Mapping[str, torch.Tensor]], sh_degree: Optional[int] = None
) -> dict[str, torch.Tensor]:
    """Render-ready tensors: means [N,3], quats [N,4] (unnormalized), scales = exp [N,3],
    opacities = sigmoid [N], colors = SH coefficients [N, K, 3] (all degrees stored)."""
    return dict(
        means=params["means"],
        quats=params["quats"],
        scales=torch.exp(params["scales"]),
        opacities=torch.sigmoid(params["opacities"]),
        colors=torch.cat([params["sh0"], params["shN"]], dim=1),
    )


def bytes_per_gaussian(sh_degree: int) -> int:
    """Parameter + Adam state bytes of one Gaussian in float32: 3+3+4+1+3K floats, times 3 (value,
    exp_avg, exp_avg_sq). SH degree 3: 59 floats -> 708 bytes (the reference write-up's figure)."""
    floats = 3 + 3 + 4 + 1 + 3 * num_sh_bases(sh_degree)
    return floats * 4 * 3

"""A rank's shard of the Gaussians: parameters, their activations, initialization, optimizers.

Rank r of W owns Gaussians ``r::W`` of the initial point set (gsplat simple_trainer's strided
round-robin split). The split happens on the points, before any parameter or optimizer state
exists, so a rank allocates memory for its own shard only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from scipy.spatial import cKDTree

from .config import Config
from .data import DataError, Scene

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


def initial_points(scene: Scene, cfg: Config, scene_scale: float) -> InitPoints:
    """The initial Gaussian centres and colours.

    ``--init_type sfm``: the scene's SfM points (DataError when there are none, suggesting
    ``--init_type random``). ``--init_type random``: ``init_num_pts`` points uniform in a cube of
    half-size ``init_extent * scene_scale`` around the cameras' centroid, random colours, drawn
    from ``cfg.seed`` so every rank draws the same set (gsplat simple_trainer draws from [-1, 1]^3
    scaled the same way, centred at the origin).
    """
    if cfg.init_type == "sfm":
        if scene.points is None or len(scene.points) == 0:
            where = cfg.data_dir if cfg.data_dir is not None else "the synthetic scene"
            raise DataError(
                f"{where} has no 3D points to initialize from (--init_type sfm); "
                "use --init_type random"
            )
        rgbs = scene.points_rgb.astype(np.float32) / 255.0
        return InitPoints(scene.points.astype(np.float32), rgbs)
    rng = np.random.default_rng(cfg.seed)
    centres = np.stack([c.camtoworld[:3, 3] for c in scene.cameras])
    centre = centres.mean(axis=0)
    half = cfg.init_extent * scene_scale
    means = centre + (rng.random((cfg.init_num_pts, 3)) * 2.0 - 1.0) * half
    rgbs = rng.random((cfg.init_num_pts, 3))
    return InitPoints(means.astype(np.float32), rgbs.astype(np.float32))


def knn_mean_distance(points: np.ndarray, query: np.ndarray, k: int = 3) -> np.ndarray:
    """Mean distance from each query point to its ``k`` nearest other points of ``points``.

    points [P, 3], query [Q, 3] (a subset of points) -> [Q] (scene units). 3DGS initializes scales
    from the mean squared distance to the 3 nearest neighbours (simple-knn); gsplat uses the root
    of the mean squared distance; we follow gsplat.
    """
    if len(points) < 2:
        return np.full(len(query), 0.01, dtype=np.float32)
    k_eff = min(k, len(points) - 1)
    dists, _ = cKDTree(points).query(query, k=k_eff + 1)  # first neighbour is the point itself
    dists = np.asarray(dists, dtype=np.float64).reshape(len(query), -1)[:, 1:]
    rms = np.sqrt((dists**2).mean(axis=1))
    return np.maximum(rms, 1e-7).astype(np.float32)


def create_shard(
    points: InitPoints, cfg: Config, rank: int, world_size: int, device: torch.device
) -> torch.nn.ParameterDict:
    """Parameters of rank ``rank``'s shard: Gaussians ``rank::world_size`` of ``points``.

    Returns a ParameterDict with means [N, 3] (scene units), scales [N, 3] (log scene units),
    quats [N, 4] (unit, w first), opacities [N] (logit), sh0 [N, 1, 3], shN [N, K-1, 3] with
    K = (sh_degree + 1)^2.
    """
    shard = slice(rank, None, world_size)
    means = points.means[shard]
    dist = knn_mean_distance(points.means, means)  # neighbours from the whole set
    rgbs = torch.from_numpy(np.ascontiguousarray(points.rgbs[shard]))
    n = len(means)
    scales = torch.log(torch.from_numpy(dist) * cfg.init_scale)[:, None].repeat(1, 3)
    quats = torch.zeros(n, 4)
    quats[:, 0] = 1.0
    opacities = torch.full((n,), math.log(cfg.init_opa / (1.0 - cfg.init_opa)))
    sh0 = rgb_to_sh(rgbs)[:, None, :]
    shN = torch.zeros(n, num_sh_bases(cfg.sh_degree) - 1, 3)
    tensors = dict(
        means=torch.from_numpy(np.ascontiguousarray(means)),
        scales=scales,
        quats=quats,
        opacities=opacities,
        sh0=sh0,
        shN=shN,
    )
    return torch.nn.ParameterDict(
        {k: torch.nn.Parameter(v.float().to(device).contiguous()) for k, v in tensors.items()}
    )


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
    at a time), each PyTorch's fused implementation where the device has one (CUDA, ROCm, CPU):
    one kernel per parameter and step instead of a dozen (the same Adam update, elementwise,
    float32)."""
    lr_mult, eps, betas = batch_rule(cfg.batch_size, world_size)
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


def _adam_impl(device: torch.device) -> dict:
    """{"fused": True} where torch.optim.Adam has a fused kernel for ``device``, else {} (foreach)."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices
        supported = _get_fused_kernels_supported_devices()
    except ImportError:  # pragma: no cover - a torch that moved the helper
        supported = ["cuda"]
    return {"fused": True} if device.type in supported else {}


def means_lr_scheduler(optimizer: torch.optim.Optimizer, max_steps: int) -> torch.optim.lr_scheduler.ExponentialLR:
    """The means' learning rate decays exponentially to 1% over ``max_steps`` (gsplat simple_trainer)."""
    return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.01 ** (1.0 / max_steps))


def activated(params: torch.nn.ParameterDict, sh_degree: Optional[int] = None) -> dict[str, torch.Tensor]:
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

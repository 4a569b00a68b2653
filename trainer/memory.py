"""The memory of the first training step, estimated before it runs, and the guard that refuses a
run that cannot fit (rather than the kernel's out-of-memory killer ending it mid-step: exit 137,
no message).

The estimate is the peak of one rank over its first step, in bytes: on the CPU its peak resident
memory (what ``ru_maxrss`` reports), on a GPU the peak of ``torch.cuda.max_memory_allocated``.
With N initial Gaussians in all, N_r of them on this rank, W ranks, C = ``--batch_size`` cameras
per rank, K = (sh_degree + 1)^2 SH coefficients, and per camera P pixels, T tiles, I tile
intersections and M composited (pixel, Gaussian) pairs (:func:`footprint`; the camera with the
largest total among up to MAX_CAMERAS training cameras):

    runtime        measured (CPU)               this process's resident memory at the check: the
                                                interpreter, torch and the libraries (those a run
                                                imports later imported first), the scene's tables
    state          N_r x bytes_per_gaussian     value, gradient, 2 Adam moments (profiling.memory_model)
    projection     C W x N_r x (384 + 24 K)     dense projection outputs, SH inputs and outputs, gradients
    exchange       C x N x 192                  W > 1: received 48-byte records, their gradients, copies
    intersections  C x I x 96 (reference)       isect_tiles' ids, keys and sort order
                   C x I x 32 (gsplat)          isect and flatten ids, doubled by the radix sort
    pairs          C x M x 176 (reference)      per pair, what autograd saves and the backward's gradients
    chunk          min(CHUNK_ELEMENTS,          one chunk of candidate pairs (kernels/reference.py): a
                   C x min(I, 128 T) x 256)     wave of at most 128 Gaussians per tile, 256 pixels each
                   x 48 (reference)
    pixels         C x P x 512                  render, ground truth, loss and SSIM buffers, gradients
    images         3 x sum(w h) over all views  the decoded uint8 images: host memory on the CPU; on a GPU
                                                the training views, when they go to the device (data/views.py);
                                                4 x with loss masks (their fourth channel)

gsplat's rasterizer keeps no per-pair state (forward and backward walk each tile's list), so the
pairs and chunk terms belong to the reference rasterizer only; its constants are the sizes of
gsplat 1.5's buffers. The reference's constants are fitted to measured peaks, rounded up; the
runtime term is read, not modelled (how well the estimate held: docs/large-scenes.md).

Available memory: host RAM for the CPU (:func:`available_memory`: MemAvailable, capped by a
cgroup's limit), free device memory for a GPU. CPU ranks on one host share its RAM, so the
estimate is multiplied by the ranks on this host, less the runtime this process already holds
(it is no longer available). A run is refused when that need exceeds the available memory less
a MARGIN share of it. Densification grows the model later; this guards the start only.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..kernels import reference
from ..kernels.constants import TILE_SIZE

MAX_CAMERAS = 16  # training cameras sampled for the largest footprint
MAX_ESTIMATE_GAUSSIANS = 200_000  # larger initial models are measured on a strided sample
PROJECTION_BYTES_BASE, PROJECTION_BYTES_PER_COEFF = 384, 24  # per (camera, local Gaussian)
EXCHANGE_BYTES = 192  # per (local camera, Gaussian of the job), W > 1
ISECT_BYTES = {"reference": 96, "gsplat": 32}  # per tile intersection
PAIR_BYTES = 176  # per composited (pixel, Gaussian) pair, reference rasterizer
CANDIDATE_BYTES = 48  # per candidate pair of one reference chunk
PIXEL_BYTES = 512  # per pixel of a rendered camera
MARGIN = 0.1  # a run is refused when its need exceeds (1 - MARGIN) of the available memory
TAU_STOP = -math.log(reference.TRANSMITTANCE_MIN)  # a pixel stops once its ln(1 / T) reaches this
GIB = 2**30


@dataclass
class Footprint:
    """What one camera's render of a model costs: P pixels, Gaussians in view, tile
    intersections (exactly as isect_tiles counts them), estimated composited pairs."""

    width: int
    height: int
    visible: int
    isects: int
    pairs: float

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def tiles(self) -> int:
        return math.ceil(self.width / TILE_SIZE) * math.ceil(self.height / TILE_SIZE)


def _optical_depth(opacities: torch.Tensor, extent: torch.Tensor, samples: int = 16) -> torch.Tensor:
    """Mean of -ln(1 - alpha) over a Gaussian's footprint, [G]. Within the footprint (alpha >= 1/255)
    sigma is uniform in area over [0, extent] with extent = ln(255 opacity), alpha = opacity exp(-sigma):
    the mean is (1 / extent) times the integral of -ln(1 - opacity exp(-s)) ds over [0, extent]
    (midpoint rule)."""
    s = (torch.arange(samples, dtype=opacities.dtype) + 0.5) / samples  # [S]
    return -torch.log1p(-opacities[:, None] * torch.exp(-s[None] * extent[:, None])).mean(1)


def _box_add(grid: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, values: torch.Tensor) -> None:
    """Add values[g] to every tile of the box [lo[g], hi[g]) of a difference grid [th + 1, tw + 1]
    (summed by a 2D cumsum afterwards). lo, hi [G, 2] tile (x, y); values [G]."""
    for (x, y), sign in (
        ((lo[:, 0], lo[:, 1]), 1.0),
        ((hi[:, 0], lo[:, 1]), -1.0),
        ((lo[:, 0], hi[:, 1]), -1.0),
        ((hi[:, 0], hi[:, 1]), 1.0),
    ):
        grid.index_put_((y, x), sign * values, accumulate=True)


@torch.no_grad()
def footprint(
    gaussians: dict,
    viewmat: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
    near: float = 0.01,
    far: float = 1e10,
    chunk: int = 1 << 18,
) -> Footprint:
    """The cost of rendering activated ``gaussians`` (model.activated: means [N, 3], quats [N, 4],
    scales [N, 3], opacities [N]) into one pinhole camera (viewmat [4, 4], K [3, 3] pixels,
    width x height pixels). Projects with the reference (CPU), ``chunk`` Gaussians at a time.

    Intersections: each visible Gaussian's bounding box in tiles, as isect_tiles computes it.
    Pairs: a Gaussian composites where alpha >= 1/255, an ellipse of area 2 pi ln(255 o) / sqrt(det
    conic) pixels (clipped to its box in the image). Spread uniformly over the tiles of its box, it
    adds a coverage density d (pairs per pixel) and an optical-depth density d e (e: the mean of
    -ln(1 - alpha) over its footprint) to each. A pixel stops once its optical depth reaches
    ln(1e4) (the rasterizer's transmittance floor), so a tile holds pixels x d x min(1, ln(1e4) /
    (sum of d e)) pairs; summed over tiles.
    """
    tw, th = math.ceil(width / TILE_SIZE), math.ceil(height / TILE_SIZE)
    grid = torch.tensor([tw, th])
    size = torch.tensor([width, height], dtype=torch.float32)
    density = torch.zeros(2, th + 1, tw + 1, dtype=torch.float64)  # coverage, optical depth
    visible = isects = 0
    for start in range(0, gaussians["means"].shape[0], chunk):
        part = {k: v[start : start + chunk].float().cpu() for k, v in gaussians.items() if k != "colors"}
        radii, means2d, _, conics, _ = reference.fully_fused_projection(
            part["means"],
            None,
            part["quats"],
            part["scales"],
            viewmat[None].float().cpu(),
            K[None].float().cpu(),
            width,
            height,
            near_plane=near,
            far_plane=far,
            opacities=part["opacities"],
        )
        seen = (radii[0] > 0).all(-1)
        r, m, q, o = radii[0][seen].float(), means2d[0][seen], conics[0][seen], part["opacities"][seen]
        lo = torch.minimum(torch.floor((m - r) / TILE_SIZE).clamp(min=0).long(), grid)  # [G, 2] inclusive
        hi = torch.minimum(torch.ceil((m + r) / TILE_SIZE).clamp(min=0).long(), grid)  # exclusive
        span = hi - lo
        visible += int(seen.sum())
        isects += int((span[:, 0] * span[:, 1]).sum())
        extent = torch.log(o * 255.0).clamp(min=0.0)
        det = (q[:, 0] * q[:, 2] - q[:, 1] ** 2).clamp(min=1e-12)
        box = (torch.minimum(m + r, size) - torch.maximum(m - r, torch.zeros(2))).clamp(min=0).prod(-1)
        area = torch.minimum(2.0 * math.pi * extent / det.sqrt(), box)  # pixels
        span_pixels = (torch.minimum(hi * TILE_SIZE, size.long()) - lo * TILE_SIZE).clamp(min=0).prod(-1)
        d = (area / span_pixels.clamp(min=1)).double()
        _box_add(density[0], lo, hi, d)
        _box_add(density[1], lo, hi, d * _optical_depth(o, extent).double())
    coverage, depth = density.cumsum(1).cumsum(2)[:, :th, :tw]
    cols = (torch.clamp((torch.arange(tw) + 1) * TILE_SIZE, max=width) - torch.arange(tw) * TILE_SIZE).double()
    rows = (torch.clamp((torch.arange(th) + 1) * TILE_SIZE, max=height) - torch.arange(th) * TILE_SIZE).double()
    stop = torch.clamp(TAU_STOP / depth.clamp(min=1e-12), max=1.0)
    pairs = float((rows[:, None] * cols[None] * coverage.clamp(min=0) * stop).sum())
    return Footprint(width, height, visible, isects, pairs)


@dataclass
class StepEstimate:
    """Bytes of one rank's training step, by term (see the module docstring)."""

    terms: dict
    footprint: Footprint
    num_gaussians: int
    backend: str

    @property
    def total(self) -> int:
        return int(sum(self.terms.values()))

    def describe(self) -> str:
        f = self.footprint
        text = (
            f"{self.num_gaussians:,} initial Gaussians at {f.width}x{f.height} on the "
            f"{'CPU reference' if self.backend == 'reference' else 'gsplat'} rasterizer"
        )
        if self.backend == "reference":
            text += f": {f.pairs / 1e6:,.1f} M pixel-Gaussian pairs x {PAIR_BYTES} B per camera"
        else:
            text += f": {f.isects / 1e6:,.1f} M tile intersections per camera"
        return text


def estimate_step(
    backend: str,
    fp: Footprint,
    num_gaussians: int,
    world_size: int,
    batch_size: int,
    sh_degree: int,
    image_bytes: int = 0,
    runtime_bytes: int = 0,
) -> StepEstimate:
    """The per-rank peak bytes of a step that renders ``batch_size`` cameras like ``fp`` from a
    model of ``num_gaussians`` split over ``world_size`` ranks (module docstring's formula).
    ``backend``: "reference" | "gsplat"; ``image_bytes``: decoded images held in host memory (0 on
    a GPU); ``runtime_bytes``: what the process holds before the run's own buffers (0 on a GPU)."""
    from .profiling import memory_model

    local = math.ceil(num_gaussians / world_size)
    C, K = batch_size, (sh_degree + 1) ** 2
    wave = min(fp.isects, reference.WAVE_DEPTH * fp.tiles) * TILE_SIZE * TILE_SIZE  # candidates of one wave
    terms = dict(
        runtime=runtime_bytes,
        state=local * memory_model(sh_degree, world_size, torch.device("cpu"))["bytes_per_gaussian"],
        projection=C * world_size * local * (PROJECTION_BYTES_BASE + PROJECTION_BYTES_PER_COEFF * K),
        exchange=C * num_gaussians * EXCHANGE_BYTES if world_size > 1 else 0,
        intersections=C * fp.isects * ISECT_BYTES[backend],
        pairs=int(C * fp.pairs * PAIR_BYTES) if backend == "reference" else 0,
        chunk=min(reference.CHUNK_ELEMENTS, C * wave) * CANDIDATE_BYTES if backend == "reference" else 0,
        pixels=C * fp.pixels * PIXEL_BYTES,
        images=image_bytes,
    )
    return StepEstimate(terms, fp, num_gaussians, backend)


def resident_bytes() -> int:
    """This process's resident memory now: VmRSS of /proc/self/status (Linux), else the peak so
    far (``resource.getrusage``'s ru_maxrss: kilobytes on Linux, bytes on macOS), else 0."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except (ImportError, OSError):  # pragma: no cover - no resource module (Windows)
        return 0


def runtime_resident() -> int:
    """:func:`resident_bytes` after importing what a training run imports after this check:
    torch._dynamo (the first torch.optim optimizer imports it, and sympy with it) and TensorBoard's
    writer. Importing them now costs nothing the run would not pay, and puts them in the figure."""
    import torch._dynamo  # noqa: F401
    from torch.utils.tensorboard import SummaryWriter  # noqa: F401

    return resident_bytes()


def _cgroup_available() -> Optional[int]:
    """Bytes left under this process's cgroup memory limit (v2, else v1; reclaimable page cache
    counted as free), or None without a limit."""
    for limit_file, usage_file, inactive_key in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "inactive_file"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
            "total_inactive_file",
        ),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text())
            stat = Path(limit_file).with_name("memory.stat").read_text().split("\n")
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # no limit
            return None
        inactive = next((int(line.split()[1]) for line in stat if line.startswith(inactive_key + " ")), 0)
        return max(int(limit) - usage + inactive, 0)
    return None


def available_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what) a run on ``device`` may still allocate.

    CUDA/ROCm: torch.cuda.mem_get_info's free bytes of the device. CPU: MemAvailable of
    /proc/meminfo (the kernel's estimate of what can be allocated without swapping; else
    os.sysconf's available pages), capped by the cgroup's limit minus its usage."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0]), f"free memory on {device}"
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cgroup = _cgroup_available()
    return (min(available, cgroup) if cgroup is not None else available), "available host memory"


def local_ranks(world_size: int, device: torch.device) -> int:
    """Ranks sharing this host's memory: 1 per GPU; on the CPU the external launcher's ranks on
    this host (launch.local_processes_of_launcher), else every rank (spawned here)."""
    from .launch import detect_external, local_processes_of_launcher

    if device.type == "cuda":
        return 1
    try:
        external = detect_external() is not None
    except Exception:  # an incomplete launcher environment: launch() reports it
        external = False
    return local_processes_of_launcher() if external else world_size


def _sampled_model(points, cfg, device: torch.device):
    """(activated Gaussians on the CPU, factor): the initial model, or for more than
    MAX_ESTIMATE_GAUSSIANS points an evenly strided sample of it with the scales the whole set
    gives (neighbours from every point: on a GPU the Morton k-NN, else the KD-tree), and the
    factor by which the sample's counts scale to the whole model."""
    import numpy as np

    from .model import InitPoints, activated, create_shard, knn_mean_distance, knn_mean_distance_morton

    n = len(points.means)
    stride = max(1, math.ceil(n / MAX_ESTIMATE_GAUSSIANS))
    if stride == 1:
        sample = points
    else:
        ids = np.arange(0, n, stride)
        if device.type == "cuda":
            dist = (
                knn_mean_distance_morton(torch.from_numpy(points.means).to(device), torch.from_numpy(ids).to(device))
                .cpu()
                .numpy()
            )
        else:
            dist = knn_mean_distance(points.means, points.means[ids])
        sample = InitPoints(points.means[ids], points.rgbs[ids], dist)
    with torch.no_grad():
        return activated(create_shard(sample, cfg, 0, 1, torch.device("cpu"))), n / len(sample.means)


def first_step_estimate(cfg, scene, world_size: int, device: torch.device) -> StepEstimate:
    """The estimate for ``cfg``'s initial model of ``scene`` (model.initial_points, the whole set)
    at the largest of up to MAX_CAMERAS training cameras, evenly spaced in name order. Models of
    more than MAX_ESTIMATE_GAUSSIANS are measured on an evenly strided sample and the counts
    scaled up (an upper bound for the pairs, which the transmittance floor caps). On the CPU the
    runtime term is this process's resident memory, read first (:func:`runtime_resident`)."""
    from .data import split_indices
    from .model import initial_points
    from .render import resolve_backend, rigid_inverse

    runtime = runtime_resident() if device.type != "cuda" else 0  # before this function's own buffers
    train, _ = split_indices(len(scene.cameras), cfg.data.test_every)
    points = initial_points(scene, cfg, scene.scene_scale * 1.1 * cfg.model.global_scale)  # Trainer's scene scale
    gaussians, factor = _sampled_model(points, cfg, device)
    num = min(MAX_CAMERAS, len(train))
    picks = sorted({train[round(j * (len(train) - 1) / max(num - 1, 1))] for j in range(num)})
    backend = resolve_backend(cfg.step.backend, device)
    from .data import has_masks

    channels = 4 if has_masks(scene, cfg.data.alpha_as_mask) else 3  # data/views.py
    train_image_bytes = channels * sum(scene.cameras[i].width * scene.cameras[i].height for i in train)
    if device.type == "cuda":  # uint8 training images on the device when they fit (data/views.py)
        total = torch.cuda.get_device_properties(device).total_memory if torch.cuda.is_available() else None
        on_device = total is None or train_image_bytes <= cfg.data.device_images_share * total
        image_bytes = train_image_bytes if on_device else 0
    else:
        image_bytes = channels * sum(c.width * c.height for c in scene.cameras)
        if cfg.data.image_cache_gb > 0:  # decoded as needed into a bounded cache (data/views.py)
            image_bytes = min(image_bytes, int(cfg.data.image_cache_gb * 2**30))
    estimates = []
    for i in picks:
        camera = scene.cameras[i]
        viewmat = rigid_inverse(torch.from_numpy(camera.camtoworld).float())
        fp = footprint(
            gaussians,
            viewmat,
            torch.from_numpy(camera.K).float(),
            camera.width,
            camera.height,
            cfg.step.near_plane,
            cfg.step.far_plane,
        )
        if factor != 1.0:
            fp = Footprint(
                fp.width, fp.height, round(fp.visible * factor), round(fp.isects * factor), fp.pairs * factor
            )
        estimates.append(
            estimate_step(
                backend,
                fp,
                len(points.means),
                world_size,
                cfg.step.batch_size,
                cfg.model.sh_degree,
                image_bytes,
                runtime,
            )
        )
    return max(estimates, key=lambda e: e.total)


def check_first_step(
    cfg, scene, world_size: int, device: torch.device, available: Optional[tuple[int, str]] = None
) -> str:
    """Refuse a run whose first step cannot fit: ValueError naming the estimate, the memory left
    and the flags that lower it. Otherwise return a line saying both. ``available``: (bytes,
    what), default :func:`available_memory`; the estimate counts every rank sharing it, less the
    runtime this process holds already, and must stay below (1 - MARGIN) of it."""
    estimate = first_step_estimate(cfg, scene, world_size, device)
    ranks = local_ranks(world_size, device)
    need = estimate.total * ranks - estimate.terms["runtime"]  # what this process holds is not available
    free, what = available if available is not None else available_memory(device)
    shared = f", {ranks} ranks on this host" if ranks > 1 else ""
    per_rank = " per rank" if ranks > 1 else ""
    runtime = estimate.terms["runtime"]
    parts = (
        f"{runtime / GIB:.1f} GiB runtime and scene, measured, + {(estimate.total - runtime) / GIB:.1f} GiB for the step"
        if runtime
        else "the step's buffers"
    )
    if need <= (1 - MARGIN) * free:
        return (
            f"memory: the first step needs about {estimate.total / GIB:.1f} GiB{per_rank} ({parts}) of the "
            f"{free / GIB:.1f} GiB of {what} ({estimate.describe()}{shared}; trainer/memory.py)"
        )
    size = (
        f"--data_factor (now {cfg.data.data_factor}; doubling it quarters the pixels)"
        if cfg.data.data_dir is not None
        else f"--synthetic_image_size (now {cfg.data.synthetic_image_size})"
    )
    fewer = (
        f"--init_num_pts (now {cfg.model.init_num_pts:,})"
        if cfg.model.init_type == "random"
        else f"--init_type random --init_num_pts N (fewer than the {estimate.num_gaussians:,} SfM points)"
    )
    other = (
        "--backend gsplat on a GPU (--device cuda)"
        if estimate.backend == "reference"
        else "more GPUs (--nproc_per_node)"
    )
    if estimate.terms["images"] * 2 >= estimate.total - runtime and cfg.data.image_cache_gb == 0:
        other = f"--image_cache_gb (the images alone take {estimate.terms['images'] / GIB:.1f} GiB), or " + other
    raise ValueError(
        f"the first training step needs about {need / GIB:.1f} GiB more but {free / GIB:.1f} GiB of {what} "
        f"is left, less a {MARGIN:.0%} margin ({estimate.describe()}{shared}; trainer/memory.py gives the "
        f"formula); lower it with {size}, {fewer}"
        + (f", --batch_size (now {cfg.step.batch_size})" if cfg.step.batch_size > 1 else "")
        + f", or {other}"
    )

"""One rendering pass: projection -> SH -> exchange -> rasterization.

The shape of the pass is gsplat's distributed ``rasterization()`` (rendering.py), written so that
the exchange is explicit and each backend is a swappable module of five ops with gsplat's
signatures: ``gsplat.cuda._wrapper`` (CUDA) or ``splat_train.kernels.reference`` (plain PyTorch).

Per rank, with N local Gaussians and C local cameras (C_all over all ranks, N_all likewise):

  projection of the N local Gaussians against all C_all cameras     [C_all, N, ...] (or packed)
  SH -> RGB on the owner (+0.5, clamped at 0)                         [C_all, N, 3]
  exchange: records for camera c go to the rank that renders c        [C, N_all, ...] (or packed)
  tile intersection + rasterization of the C local cameras            [C, H, W, 3]

One record = radii (2) + means2d (2) + depth (1) + conic (3) + opacity (1) + colour (3) = 12
float32 lanes (48 bytes); packed records add the local camera id and global Gaussian id (2 lanes).
The reverse exchange carries the gradients of the last 10 lanes; with ``absgrad`` also the radii
lanes, whose "gradient" is the absolute 2D-mean gradient of the record (:class:`AbsGradRelay`),
so it reaches the owner as the other gradients do and densification reads it there.
"""

from __future__ import annotations

import importlib
import math
import weakref
from dataclasses import dataclass, field
from types import ModuleType
from typing import Optional

import torch

from ..kernels.reference import composite_background
from ..kernels.constants import RECORD_FIELDS, RECORD_LANES, TILE_SIZE
from . import exchange
from .launch import DistContext
from .profiling import PhaseTimer, boundary


def ops_for(backend: str, device: torch.device) -> ModuleType:
    """The op module of a backend ("gsplat" | "reference" | "auto": gsplat on CUDA)."""
    if backend == "auto":
        backend = "gsplat" if device.type == "cuda" else "reference"
    if backend == "gsplat":
        if device.type != "cuda":
            raise ValueError("--backend gsplat needs a CUDA/ROCm device; use --backend reference on the CPU")
        return importlib.import_module("gsplat.cuda._wrapper")
    return importlib.import_module("splat_train.kernels.reference")


def resolve_backend(backend: str, device: torch.device) -> str:
    if backend == "auto":
        return "gsplat" if device.type == "cuda" else "reference"
    return backend


def rigid_inverse(transforms: torch.Tensor) -> torch.Tensor:
    """Inverse of rigid transforms [..., 4, 4] ([R t; 0 1] -> [R^T, -R^T t]).

    Used instead of torch.linalg.inv, whose singularity check synchronizes the device every call.
    Valid for camera-to-world / world-to-camera matrices (orthonormal R), which is all we invert.
    """
    rot_t = transforms[..., :3, :3].transpose(-1, -2)
    out = torch.zeros_like(transforms)
    out[..., :3, :3] = rot_t
    out[..., :3, 3] = -(rot_t @ transforms[..., :3, 3:])[..., 0]
    out[..., 3, 3] = 1.0
    return out


@dataclass
class CameraBatch:
    """A rank's cameras for one pass; all of one image size. ``origin`` (ox, oy): the images were
    moved that many pixels right and down against the tile grid and padded by as much
    (:func:`shift_cameras`): ``width`` x ``height`` is the padded render's size."""

    viewmats: torch.Tensor  # [C, 4, 4] world-to-camera
    Ks: torch.Tensor  # [C, 3, 3] pixels
    width: int
    height: int
    origin: tuple[int, int] = (0, 0)


@dataclass
class PassLayout:
    """What every rank knows about a training pass without asking the others: the shard sizes
    (they change only at densification and pruning steps, after which the trainer gathers them
    once), every rank's cameras (the sampler is a pure function of (seed, rank, step) and every
    rank holds every training camera), so a steady-state pass needs no metadata collective and
    no host synchronization.

    ``viewmats`` / ``Ks`` / ``campos`` are None when the cameras depend on learned state
    (``--pose_opt``): then render() all-gathers the cameras (a differentiable collective).
    """

    N_world: list[int]  # Gaussians per rank
    C_world: list[int]  # cameras per rank
    sizes: list[tuple[int, int]]  # (width, height) per camera of the pass, rank-major, pixels
    viewmats: Optional[torch.Tensor] = None  # [C_all, 4, 4]
    Ks: Optional[torch.Tensor] = None  # [C_all, 3, 3]
    campos: Optional[torch.Tensor] = None  # [C_all, 3] camera centres


def camera_centres(viewmats: torch.Tensor) -> torch.Tensor:
    """[C, 4, 4] world-to-camera -> [C, 3] camera centres in the world, -R^T t."""
    return -(viewmats[:, :3, :3].transpose(-1, -2) @ viewmats[:, :3, 3:])[..., 0]


def shift_intrinsics(Ks: torch.Tensor, ox, oy) -> torch.Tensor:
    """[C, 3, 3] intrinsics with the principal point moved by (ox, oy) pixels (see shift_cameras):
    numbers, or [C] tensors (one shift per camera)."""
    Ks = Ks.clone()
    Ks[:, 0, 2] += ox
    Ks[:, 1, 2] += oy
    return Ks


def shift_cameras(cams: CameraBatch, ox: int, oy: int) -> CameraBatch:
    """The cameras with their images moved ``ox`` pixels right and ``oy`` down and padded by as
    much at the left and top: principal point (cx + ox, cy + oy), size (width + ox, height + oy).
    Image pixel (x, y) is then render pixel (x + ox, y + oy) (pinhole model: u = fx X / Z + cx).
    Exact for the means; the EWA Jacobian's clamp of off-screen Gaussians (gsplat's persp_proj,
    limits from cx and width with a 30% margin) moves with the larger image, so the 2D
    covariance of a Gaussian that far outside the view can differ slightly."""
    return CameraBatch(
        cams.viewmats,
        shift_intrinsics(cams.Ks, ox, oy),
        cams.width + ox,
        cams.height + oy,
        (cams.origin[0] + ox, cams.origin[1] + oy),
    )


def padding_only_radii(radii: torch.Tensor, means2d: torch.Tensor, ox: int, oy: int) -> torch.Tensor:
    """``radii`` [..., 2] (pixels, int) with 0 for the projections whose footprint
    (means2d +- radii) lies wholly in the padding of :func:`shift_cameras` (x < ox or y < oy):
    they are rendered but outside the image, so densification must not count them as seen
    (gsplat's strategies average gradients over the views where radii > 0)."""
    reach = means2d.detach() + radii
    padding_only = (reach[..., 0] <= ox) | (reach[..., 1] <= oy)
    return torch.where(padding_only[..., None], torch.zeros_like(radii), radii)


@dataclass
class Records:
    """The records this rank received for its C cameras: [C, N_all, ...] (dense) or [R, ...]
    (packed, one per visible (camera, Gaussian) pair). Units: pixels (radii, means2d), camera-z
    depth in scene units, conics in px^-2, colours after SH (+0.5, clamped at 0)."""

    radii: torch.Tensor  # [..., 2] int32
    means2d: torch.Tensor  # [..., 2]
    depths: torch.Tensor  # [...]
    conics: torch.Tensor  # [..., 3]
    opacities: torch.Tensor  # [...]
    colors: torch.Tensor  # [..., 3]
    absgrad_lanes: Optional[torch.Tensor] = None  # [..., 2] the radii as differentiable lanes (absgrad)
    image_ids: Optional[torch.Tensor] = None  # packed: [R] the receiver's local camera of each record
    gaussian_ids: Optional[torch.Tensor] = None  # packed: [R] the global Gaussian id of each record


@dataclass(frozen=True)
class ExchangeLayout:
    """How a pass's records travelled, for :func:`route_to_owners`: rows sent to / received from
    each rank, the shard sizes, and (packed) the local Gaussian of each sent record."""

    packed: bool
    N_local: int
    N_world: list[int]
    send_rows: list[int]
    recv_rows: list[int]
    sent_gaussian_ids: Optional[torch.Tensor] = None  # packed: [nnz] int


@dataclass(frozen=True)
class TileLists:
    """gsplat's tile lists of the received records (isect_tiles / isect_offset_encode)."""

    offsets: torch.Tensor  # [C, tile_height, tile_width] int32: first list position of each tile
    flatten_ids: torch.Tensor  # [n_isects] int32: record index per list position, depth-sorted per tile
    tile_width: int  # tiles per image row
    tile_height: int  # tiles per image column


@dataclass
class RenderInfo:
    """What a pass leaves for the loss, densification, pruning and SelectiveAdam.

    The owner's side: ``means2d`` (the local, pre-exchange 2D means, [C_all, N, 2] or [nnz, 2],
    pixels; their ``.grad`` after backward), ``radii`` ([C_all, N, 2] or [nnz, 2] int),
    ``gaussian_ids`` / ``camera_ids`` (packed), ``absgrad`` (the radii lanes whose ``.grad`` is
    the absolute 2D-mean gradient; :class:`AbsGradRelay`), ``widths`` / ``heights`` (per camera of
    the pass, pixels), ``n_cameras`` (C_all). The renderer's side: ``records``, ``tiles``,
    ``layout``, ``width`` / ``height`` (this rank's image size), ``num_local_cameras``,
    ``raster_means2d`` (the relay's output, kept alive until backward). ``records``, ``tiles`` and
    ``layout`` are None for gsplat's own distributed pass (``--pipeline gsplat-dist``).
    """

    means2d: torch.Tensor
    radii: torch.Tensor
    packed: bool
    n_cameras: int
    widths: list[int]
    heights: list[int]
    N_world: list[int] = field(default_factory=list)  # Gaussians per rank
    C_world: list[int] = field(default_factory=list)  # cameras per rank
    num_isects: int = 0
    gaussian_ids: Optional[torch.Tensor] = None
    camera_ids: Optional[torch.Tensor] = None
    absgrad: Optional[torch.Tensor] = None
    width: int = 0
    height: int = 0
    num_local_cameras: int = 0
    records: Optional[Records] = None
    layout: Optional[ExchangeLayout] = None
    tiles: Optional[TileLists] = None
    raster_means2d: Optional[torch.Tensor] = None


@dataclass
class RenderResult:
    colors: Optional[torch.Tensor]  # [C, H, W, 3]; None when called with rasterize=False
    alphas: Optional[torch.Tensor]  # [C, H, W, 1]; None likewise
    info: RenderInfo
    depths: Optional[torch.Tensor] = None  # [C, H, W, 1] expected depth (render_depth=True)


def _project(ops, gaussians, viewmats, Ks, width, height, near, far, packed, camera_model="pinhole", antialiased=False):
    """Both backends share gsplat's fully_fused_projection signature (covars=None: from quats,
    scales); opacities tighten the bounding box (arXiv 2402.00525, as gsplat's rasterization).
    ``antialiased``: the compensations of the 2D blur are returned too (gsplat's
    rasterize_mode="antialiased")."""
    out = ops.fully_fused_projection(
        gaussians["means"],
        None,
        gaussians["quats"],
        gaussians["scales"],
        viewmats,
        Ks,
        width,
        height,
        near_plane=near,
        far_plane=far,
        packed=packed,
        opacities=gaussians["opacities"],
        calc_compensations=antialiased,
        camera_model=camera_model,
    )
    if packed:
        _, camera_ids, gaussian_ids, radii, means2d, depths, conics, compensations = out
        return dict(
            camera_ids=camera_ids.long(),
            gaussian_ids=gaussian_ids.long(),
            radii=radii,
            means2d=means2d,
            depths=depths,
            conics=conics,
            compensations=compensations,
        )
    radii, means2d, depths, conics, compensations = out
    return dict(radii=radii, means2d=means2d, depths=depths, conics=conics, compensations=compensations)


def project_all(
    ops,
    gaussians,
    viewmats,
    Ks,
    sizes: list[tuple[int, int]],
    near,
    far,
    packed,
    camera_model="pinhole",
    antialiased=False,
):
    """Project the local Gaussians against every camera; cameras may differ in size.

    Cameras are grouped by (width, height) (one group in the common case) so the projection's
    image-bounds culling uses each camera's own size. Dense outputs are [C_all, N, ...]; packed
    outputs are records sorted by global camera id. ``compensations`` is None unless
    ``antialiased``.
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for c, size in enumerate(sizes):
        groups.setdefault(size, []).append(c)
    if len(groups) == 1:
        ((w, h),) = groups
        return _project(ops, gaussians, viewmats, Ks, w, h, near, far, packed, camera_model, antialiased)
    parts, order = [], []
    for (w, h), cams in groups.items():
        idx = torch.tensor(cams, device=viewmats.device)
        part = _project(ops, gaussians, viewmats[idx], Ks[idx], w, h, near, far, packed, camera_model, antialiased)
        if packed:
            part["camera_ids"] = idx[part["camera_ids"]]
        parts.append(part)
        order.extend(cams)
    keys = [k for k, v in parts[0].items() if v is not None]
    if not packed:
        inverse = torch.empty(len(order), dtype=torch.long, device=viewmats.device)
        inverse[torch.tensor(order, device=viewmats.device)] = torch.arange(len(order), device=viewmats.device)
        out = {k: torch.cat([p[k] for p in parts], dim=0)[inverse] for k in keys}
        return {"compensations": None, **out}
    merged = {k: torch.cat([p[k] for p in parts], dim=0) for k in keys}
    perm = torch.sort(merged["camera_ids"] * (1 << 32) + merged["gaussian_ids"]).indices
    return {"compensations": None, **{k: v[perm] for k, v in merged.items()}}


def project_and_shade(
    ops,
    gaussians: dict,
    viewmats: torch.Tensor,
    Ks: torch.Tensor,
    campos: torch.Tensor,
    sizes: list[tuple[int, int]],
    sh_degree: int,
    near: float,
    far: float,
    packed: bool,
    camera_model: str = "pinhole",
    antialiased: bool = False,
) -> dict[str, torch.Tensor]:
    """The owner's half of a pass: the local Gaussians (activated, see model.activated) projected
    against all C_all cameras (viewmats [C_all, 4, 4], Ks [C_all, 3, 3], camera centres campos
    [C_all, 3], sizes: (width, height) per camera, pixels) and coloured by their SH (degree
    ``sh_degree``, +0.5 and clamped at 0, as gsplat's rasterization).

    Returns {"radii" int32 [C_all, N, 2], "means2d" [.., 2], "depths" [..], "conics" [.., 3],
    "opacities" [..] (times the compensations when ``antialiased``), "colors" [.., 3]}, dense
    [C_all, N, ...] or, ``packed``, [nnz, ...] with "camera_ids" and "gaussian_ids" (int64 [nnz]).
    Static shapes when dense and every camera has one size: trainer/step/capture.py replays it as a
    CUDA graph."""
    proj = project_all(ops, gaussians, viewmats, Ks, sizes, near, far, packed, camera_model, antialiased)
    coeffs = gaussians["colors"][:, : (sh_degree + 1) ** 2]
    if packed:
        cam_ids, gs_ids = proj["camera_ids"], proj["gaussian_ids"]
        dirs = gaussians["means"][gs_ids] - campos[cam_ids]  # [nnz, 3]
        colors = ops.spherical_harmonics(sh_degree, dirs, coeffs[gs_ids])
        opacities = gaussians["opacities"][gs_ids]  # [nnz]
    else:
        C_all, N = viewmats.shape[0], gaussians["means"].shape[0]
        dirs = gaussians["means"][None] - campos[:, None]  # [C_all, N, 3]
        masks = (proj["radii"] > 0).all(dim=-1)
        colors = ops.spherical_harmonics(sh_degree, dirs, coeffs[None].expand(C_all, -1, -1, -1), masks=masks)
        opacities = gaussians["opacities"][None].expand(C_all, N)
    compensations = proj.pop("compensations")
    if compensations is not None:  # antialiased: gsplat's rasterization scales them the same way
        opacities = opacities * compensations
    return dict(proj, colors=torch.clamp_min(colors + 0.5, 0.0), opacities=opacities)


class AbsGradRelay(torch.autograd.Function):
    """Carries a rasterizer's absolute 2D-mean gradient back through the exchange.

    Forward: ``means2d`` [..., 2] -> a contiguous copy (the tensor handed to
    ``rasterize_to_pixels(absgrad=True)``, which attaches ``.absgrad``: per record, the sum over
    pixels of |dL/dmean2d| per axis, gsplat's rasterize_to_pixels and AbsGS, Ye et al. 2024);
    ``lanes`` [..., 2] (the records' radii lanes) is not used. Backward: the gradient of
    ``means2d`` passes; ``lanes`` receives that ``.absgrad``, so the reverse all_to_all takes it to
    the owning rank, summed there per (camera, Gaussian) record like every other gradient.
    ``holder``: a weakref.ref set to the output after apply (render keeps the output alive)."""

    @staticmethod
    def forward(ctx, means2d, lanes, holder):
        ctx.holder = holder
        return means2d.contiguous().clone()

    @staticmethod
    def backward(ctx, grad):
        out = ctx.holder[0]() if ctx.holder else None
        absgrad = getattr(out, "absgrad", None)
        return grad, (torch.zeros_like(grad) if absgrad is None else absgrad.reshape(grad.shape)), None


def relay_absgrad(means2d: torch.Tensor, lanes: torch.Tensor) -> torch.Tensor:
    """:class:`AbsGradRelay` applied; the returned tensor must stay referenced until backward."""
    holder: list = []
    out = AbsGradRelay.apply(means2d, lanes, holder)
    holder.append(weakref.ref(out))
    return out


def render(
    gaussians: dict,
    cams: CameraBatch,
    ctx: DistContext,
    ops,
    sh_degree: int,
    packed: bool = False,
    near: float = 0.01,
    far: float = 1e10,
    backgrounds: Optional[torch.Tensor] = None,
    keep_means2d_grad: bool = False,
    timer: Optional[PhaseTimer] = None,
    rasterize: bool = True,
    layout: Optional[PassLayout] = None,
    camera_model: str = "pinhole",
    antialiased: bool = False,
    absgrad: bool = False,
    sparse_grad_comm: bool = False,
    render_depth: bool = False,
    head=None,
) -> RenderResult:
    """Render this rank's cameras from every rank's Gaussians.

    gaussians: this rank's shard, activated (see model.activated): means [N,3], quats [N,4],
    scales [N,3], opacities [N], colors (SH coefficients) [N,K,3]. backgrounds [C,3] or None.
    Every rank must call this collectively. ``keep_means2d_grad`` keeps the gradient of the local
    (pre-exchange) 2D means for densification (``info.means2d.grad`` after backward).
    ``timer`` (profiling.PhaseTimer) is told where each phase begins, forward and backward.
    ``rasterize=False`` stops after tile intersection (colors/alphas None): ``info.records``
    (the received records), ``info.raster_means2d`` (their 2D means as a rasterizer must take them:
    through :class:`AbsGradRelay` with ``absgrad``) and ``info.tiles`` feed a fused rasterize+loss
    kernel instead. ``cams.origin`` (render.shift_cameras): ``info`` describes the images, not the
    padded renders (widths and heights less the origin, radii 0 where a projection reaches only
    the padding).
    ``info.layout`` describes the exchange, for :func:`route_to_owners`.
    ``layout`` (:class:`PassLayout`): the pass's sizes and cameras as every rank knows them;
    None gathers them (one all_gather of four ints per rank, read on the host, and one of the
    cameras).
    gsplat's rasterization options: ``camera_model`` ("pinhole" | "ortho" | "fisheye"),
    ``antialiased`` (opacities times the projection's compensations), ``absgrad`` (after
    backward, ``info.absgrad.grad`` holds each local record's absolute 2D-mean gradient, the
    shape of ``info.means2d``; :class:`AbsGradRelay`), ``render_depth`` (``result.depths``
    [C, H, W, 1]: the expected camera-z depth, accumulated depth / alpha, gsplat's "ED").
    ``sparse_grad_comm``: the backward exchange elides zero gradient rows (sparse_exchange.py).
    ``head``: replaces :func:`project_and_shade` of ``gaussians`` (called with viewmats, Ks,
    campos, sizes, sh_degree; a :class:`graphs.GraphedHead` bound to the raw parameters, which
    activates them itself); ``gaussians`` is then read only for its count and device ("means").
    """
    timer = timer or PhaseTimer(gaussians["means"].device)
    timer.begin("forward_exchange")  # shard sizes and cameras
    N, C = gaussians["means"].shape[0], cams.viewmats.shape[0]
    campos = None
    if layout is None:
        meta = exchange.gather_metadata(ctx, [N, C, cams.width, cams.height])  # [W, 4]
        N_world, C_world = meta[:, 0].tolist(), meta[:, 1].tolist()
        sizes = [(int(w), int(h)) for w, h, c in zip(meta[:, 2], meta[:, 3], C_world) for _ in range(c)]
    else:
        N_world, C_world, sizes = layout.N_world, layout.C_world, layout.sizes
        assert N_world[ctx.rank] == N and C_world[ctx.rank] == C, "stale pass layout: shard sizes changed"
    if layout is not None and layout.viewmats is not None and layout.Ks is not None:
        viewmats, Ks, campos = layout.viewmats, layout.Ks, layout.campos
    else:
        viewmats, Ks = exchange.all_gather_cameras(ctx, cams.viewmats, cams.Ks, C_world)
    C_all = viewmats.shape[0]

    timer.begin("projection")
    if campos is None:
        campos = camera_centres(viewmats)  # [C_all, 3]
    if head is not None:
        proj = head(viewmats, Ks, campos, sizes, sh_degree)
    else:
        proj = project_and_shade(
            ops, gaussians, viewmats, Ks, campos, sizes, sh_degree, near, far, packed, camera_model, antialiased
        )
    if packed:
        cam_ids, gs_ids = proj["camera_ids"], proj["gaussian_ids"]
    means2d, opacities, colors = proj["means2d"], proj["opacities"], proj["colors"]
    if keep_means2d_grad and means2d.requires_grad:
        means2d.retain_grad()
    # absgrad: the radii lanes carry the absolute gradients back (their values stay the radii)
    absgrad_lanes = proj["radii"].float().requires_grad_() if absgrad else None

    fields = [proj["radii"], means2d, proj["depths"][..., None], proj["conics"], opacities[..., None], colors]
    timer.begin("forward_exchange")
    if packed:
        recv, xlayout = _exchange_packed(
            ctx, fields, cam_ids, gs_ids, N_world, C_world, timer, absgrad_lanes, sparse_grad_comm
        )
    else:
        recv, xlayout = _exchange_dense(ctx, fields, N, N_world, C_world, timer, absgrad_lanes, sparse_grad_comm)
    timer.begin("rasterization")

    tile_w, tile_h = math.ceil(cams.width / TILE_SIZE), math.ceil(cams.height / TILE_SIZE)
    _, isect_ids, flatten_ids = ops.isect_tiles(
        recv.means2d,
        recv.radii,
        recv.depths,
        TILE_SIZE,
        tile_w,
        tile_h,
        packed=packed,
        n_images=C,
        image_ids=recv.image_ids,
        gaussian_ids=recv.gaussian_ids,
    )
    offsets = ops.isect_offset_encode(isect_ids, C, tile_w, tile_h)
    render_colors = render_alphas = render_depths = None
    raster_means2d = recv.means2d  # what the rasterizer (or a fused loss) takes
    if absgrad:
        assert recv.absgrad_lanes is not None
        raster_means2d = relay_absgrad(recv.means2d, recv.absgrad_lanes)
    if rasterize:
        channels = torch.cat([recv.colors, recv.depths[..., None]], -1) if render_depth else recv.colors
        render_colors, render_alphas = ops.rasterize_to_pixels(
            raster_means2d,
            recv.conics,
            channels,
            recv.opacities,
            cams.width,
            cams.height,
            TILE_SIZE,
            offsets,
            flatten_ids,
            packed=packed,
            absgrad=absgrad,
        )
        if render_depth:  # gsplat's "ED": accumulated depth over accumulated alpha
            render_colors, render_depths = render_colors[..., :3], render_colors[..., 3:]
            render_depths = render_depths / render_alphas.clamp_min(1e-10)
        # composited here: gsplat 1.5.3 rejects per-image [C, 3] backgrounds when packed
        render_colors = composite_background(render_colors, render_alphas, backgrounds)
    ox, oy = cams.origin
    # the images, not the padded renders, for densification: their size (NDC scaling of the 2D-mean
    # gradients) and only the projections that reach them (padding_only_radii)
    radii = proj["radii"] if (ox, oy) == (0, 0) else padding_only_radii(proj["radii"], means2d, ox, oy)
    info = RenderInfo(
        means2d=means2d,
        radii=radii,
        packed=packed,
        n_cameras=C_all,
        gaussian_ids=proj["gaussian_ids"] if packed else None,
        camera_ids=proj["camera_ids"] if packed else None,
        widths=[s[0] - ox for s in sizes],
        heights=[s[1] - oy for s in sizes],
        num_isects=int(isect_ids.numel()),
        N_world=N_world,
        C_world=C_world,
        tiles=TileLists(offsets, flatten_ids, tile_w, tile_h),
        records=recv,
        layout=xlayout,
        width=cams.width,
        height=cams.height,
        num_local_cameras=C,
        absgrad=absgrad_lanes,
        raster_means2d=raster_means2d,
    )
    return RenderResult(render_colors, render_alphas, info, render_depths)


@dataclass(frozen=True)
class RenderSetup:
    """What every render of a run shares besides the Gaussians and the cameras: the ranks
    (``ctx``), the rasterizer ops, the full SH degree, packed mode, near/far planes and the
    camera model options; the training step's also absgrad and the zero-eliding exchange.
    Evaluation and pruning take one instead of the Trainer."""

    ctx: DistContext
    ops: ModuleType
    sh_degree: int
    packed: bool = False
    near: float = 0.01
    far: float = 1e10
    options: dict = field(default_factory=dict)  # camera_model, antialiased
    absgrad: bool = False  # training passes of --absgrad
    sparse_grad_comm: bool = False  # training passes of --sparse_grad_comm

    def __call__(self, gaussians: dict, cams: CameraBatch, sh_degree: Optional[int] = None, **kwargs) -> RenderResult:
        """:func:`render` with this setup (SH degree ``sh_degree``, default the full one);
        ``kwargs``: the pass's own arguments (backgrounds, layout, timer, head, rasterize, ...)."""
        return render(
            gaussians,
            cams,
            self.ctx,
            self.ops,
            self.sh_degree if sh_degree is None else sh_degree,
            packed=self.packed,
            near=self.near,
            far=self.far,
            absgrad=self.absgrad,
            sparse_grad_comm=self.sparse_grad_comm,
            **self.options,
            **kwargs,
        )

    def camera_batch(self, batch: dict) -> CameraBatch:
        """The CameraBatch of a dataset batch (data.Dataset.batch), on this rank's device."""
        device = self.ctx.device
        return CameraBatch(
            rigid_inverse(batch["camtoworld"].to(device)),
            batch["K"].to(device),
            int(batch["width"]),
            int(batch["height"]),
        )


def visibility_counts(info: RenderInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """(local Gaussians with a nonzero radius in some camera of the pass, such (camera, Gaussian)
    records), int64 scalars on the device (no synchronization): what the bytes model of the
    per-Gaussian stages (profiling.stage_traffic) takes for visible ones."""
    if info.packed:
        assert info.gaussian_ids is not None and info.layout is not None
        seen = torch.zeros(info.layout.N_local, dtype=torch.bool, device=info.radii.device)
        seen.index_fill_(0, info.gaussian_ids, True)
        return seen.sum(), torch.tensor(info.gaussian_ids.numel(), device=seen.device)
    records = (info.radii > 0).any(dim=-1)
    return records.any(dim=0).sum(), records.sum()


def visible_gaussians(info: RenderInfo) -> torch.Tensor:
    """bool [N_local]: the local Gaussians that some camera of the pass sees (radii > 0 on both
    axes in a dense projection, or a packed record), gsplat simple_trainer's visibility mask for
    SelectiveAdam. The owner projects its Gaussians against every camera of the global batch, so
    this needs no collective and equals one process's mask."""
    radii = info.radii
    if not info.packed:
        return (radii > 0).all(dim=-1).any(dim=0)
    assert info.gaussian_ids is not None and info.layout is not None
    visible = torch.zeros(info.layout.N_local, dtype=torch.bool, device=radii.device)
    return visible.index_fill_(0, info.gaussian_ids, True)


def check_camera_model(scene, camera_model: str) -> Optional[str]:
    """Whether ``--camera_model`` can project ``scene``'s cameras: fisheye and ortho cameras
    (COLMAP / nerfstudio fisheyes after data/fisheye.py's remap, the synthetic scene's) need their
    own model; pinhole-type cameras take any, their intrinsics then read as that model's (gsplat
    does the same), said in the returned line (None for pinhole). Raises ValueError naming the
    flag otherwise."""
    models = sorted({c.model for c in scene.cameras})
    special = [m for m in models if m != "pinhole"]
    if len(special) > 1 or (special and "pinhole" in models):
        raise ValueError(f"the views mix {' and '.join(models)} cameras; one --camera_model projects them all")
    if special and special[0] != camera_model:
        count = sum(c.model == special[0] for c in scene.cameras)
        raise ValueError(
            f"--camera_model {camera_model}: the {count} views are {special[0]} cameras "
            f"({scene.source} scene): add --camera_model {special[0]}"
        )
    if camera_model != "pinhole" and not special:
        unit = "pixels per scene unit" if camera_model == "ortho" else "pixels per radian"
        return (
            f"camera model: {camera_model}: the cameras' intrinsics are read as {camera_model} ones (fx, fy in {unit})"
        )
    return None


def route_to_owners(ctx: DistContext, info: RenderInfo, values: torch.Tensor) -> torch.Tensor:
    """Send per-record values measured where the records were rendered back to the Gaussians'
    owners, the way gradients travel (the reverse all_to_all), and sum them per local Gaussian.

    values: [C, N_all, K] (dense) or [R_recv, K] (packed), aligned with ``info.records``.
    Returns [N_local, K] on this rank: the sum over every camera of every rank. Collective.
    Non-differentiable (used for pruning statistics).
    """
    layout, K = info.layout, values.shape[-1]
    if layout is None:
        raise ValueError("route_to_owners needs a pass of this trainer's exchange (--pipeline ours)")
    rows = values.reshape(-1, K).detach().contiguous()
    if not ctx.distributed:
        back = rows
    else:
        if not layout.packed:
            C = info.num_local_cameras
            chunks = torch.split(values.detach(), layout.N_world, dim=1)  # per owner: [C, N_j, K]
            rows = torch.cat([c.reshape(-1, K) for c in chunks], dim=0).contiguous()
            assert rows.shape[0] == sum(layout.recv_rows) and C * sum(layout.N_world) == rows.shape[0]
        back = exchange.all_to_all_rows(ctx, rows, layout.recv_rows, layout.send_rows)
    n_local = layout.N_local
    if layout.packed:
        assert layout.sent_gaussian_ids is not None
        out = torch.zeros(n_local, K, dtype=values.dtype, device=values.device)
        return out.index_add_(0, layout.sent_gaussian_ids, back)
    return back.reshape(-1, n_local, K).sum(dim=0)  # [C_all, N_local, K] -> [N_local, K]


def _split_fields(rows: torch.Tensor, lead_shape, **ids) -> Records:
    """[..., 12] record lanes -> :class:`Records` (radii back to int32; ``absgrad_lanes`` the radii
    lanes themselves, differentiable, for :class:`AbsGradRelay`); ``ids``: image_ids /
    gaussian_ids (packed)."""
    rows = rows.reshape(*lead_shape, RECORD_LANES)
    parts, start = {}, 0
    for name, lanes in RECORD_FIELDS:
        part = rows[..., start : start + lanes]
        parts[name] = part[..., 0] if lanes == 1 else part
        start += lanes
    radii = parts.pop("radii")
    return Records(radii=radii.detach().round().to(torch.int32), absgrad_lanes=radii, **parts, **ids)


def _exchange_dense(
    ctx, fields, N, N_world, C_world, timer, absgrad_lanes=None, sparse=False
) -> tuple[Records, ExchangeLayout]:
    """Dense all_to_all: rank r sends all N local records of every camera rank j renders.
    ``absgrad_lanes``: the radii as float lanes that require grad (absgrad), sent in their place.
    One process off the distributed path (not ``ctx.distributed``): the fields are the records."""
    if not ctx.distributed:
        return (
            _local_records(fields, timer, absgrad_lanes),
            ExchangeLayout(False, N, N_world, send_rows=[N * c for c in C_world], recv_rows=[C_world[0] * N]),
        )
    lanes = fields[0].float() if absgrad_lanes is None else absgrad_lanes
    payload = torch.cat([lanes, *fields[1:]], dim=-1).reshape(-1, RECORD_LANES)  # [C_all * N, 12]
    C = C_world[ctx.rank]
    send_rows = [c * N for c in C_world]
    recv_rows = [C * n for n in N_world]
    recv = _timed_all_to_all(ctx, payload, send_rows, recv_rows, timer, absgrad_lanes is not None, sparse)
    chunks = [chunk.reshape(C, n, RECORD_LANES) for chunk, n in zip(torch.split(recv, recv_rows), N_world)]
    return (
        _split_fields(torch.cat(chunks, dim=1), (C, sum(N_world))),
        ExchangeLayout(False, N, N_world, send_rows, recv_rows),
    )


def _local_records(fields, timer, absgrad_lanes, **ids) -> Records:
    """One process off the distributed path: the projected fields are the records (radii stay int32); the 2D means get
    the backward phase boundaries the exchange would have put around them."""
    radii, means2d, depths, conics, opacities, colors = fields
    means2d = boundary(boundary(means2d, timer, "backward_projection"), timer, "backward_exchange")
    return Records(radii, means2d, depths[..., 0], conics, opacities[..., 0], colors, absgrad_lanes, **ids)


def _timed_all_to_all(ctx, payload, send_rows, recv_rows, timer, absgrad=False, sparse=False):
    """The record all_to_all, with the backward phase boundaries on both sides of it. Only the
    last 10 lanes (means2d, depth, conic, opacity, colour) carry gradient back; with
    ``absgrad`` the radii lanes before them too (AbsGradRelay); with ``sparse`` their zero rows
    do not travel (--sparse_grad_comm)."""
    payload = boundary(payload, timer, "backward_projection")
    grad_cols = (payload.shape[1] - (RECORD_LANES if absgrad else RECORD_LANES - 2), payload.shape[1])
    recv = exchange.all_to_all(ctx, payload, send_rows, recv_rows, grad_cols=grad_cols, sparse=sparse)
    return boundary(recv, timer, "backward_exchange")


def _exchange_packed(
    ctx, fields, cam_ids, gs_ids, N_world, C_world, timer, absgrad_lanes=None, sparse=False
) -> tuple[Records, ExchangeLayout]:
    """Packed all_to_all: only visible records travel, with the indices the receiver needs.

    Camera ids are rebased global -> the receiver's local ids and Gaussian ids local -> global
    before sending (gsplat rendering.py does the same with two more all_to_alls; here they ride
    in the payload buffer, bit-cast into float lanes)."""
    if not ctx.distributed:  # local ids are global ids: nothing to rebase, nothing to send
        return (
            _local_records(fields, timer, absgrad_lanes, image_ids=cam_ids, gaussian_ids=gs_ids),
            ExchangeLayout(True, N_world[0], N_world, [cam_ids.shape[0]], [cam_ids.shape[0]], gs_ids),
        )
    device = cam_ids.device
    cam_offsets = torch.tensor([0] + C_world, device=device).cumsum(0)  # [W + 1]
    dest = torch.searchsorted(cam_offsets[1:], cam_ids, right=True)  # rank rendering each record
    send_counts = torch.bincount(dest, minlength=ctx.world_size)
    local_cam = cam_ids - cam_offsets[dest]
    global_gs = gs_ids + sum(N_world[: ctx.rank])
    send_rows = send_counts.tolist()
    recv_rows = exchange.exchange_counts(ctx, send_counts)
    lanes = fields[0].float() if absgrad_lanes is None else absgrad_lanes
    payload = torch.cat(
        [exchange.ids_to_float_lanes(local_cam), exchange.ids_to_float_lanes(global_gs), lanes, *fields[1:]], dim=-1
    )  # [nnz, 14]
    recv = _timed_all_to_all(ctx, payload, send_rows, recv_rows, timer, absgrad_lanes is not None, sparse)
    records = _split_fields(
        recv[:, 2:],
        (recv.shape[0],),
        image_ids=exchange.float_lanes_to_ids(recv[:, 0]),
        gaussian_ids=exchange.float_lanes_to_ids(recv[:, 1]),
    )
    return records, ExchangeLayout(True, N_world[ctx.rank], N_world, send_rows, recv_rows, gs_ids)

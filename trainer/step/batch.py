"""What one training step trains on: :class:`StepBatch`, built in one call by :class:`Batches`.

Every rank's sampler is a pure function of (seed, rank, step) and every rank holds every training
camera, so a rank knows the whole step without asking the others: the views of every rank, the
part of each image the step trains (the whole image, or the ``--patch_size`` crop), their
cameras (intrinsics moved with the crop and the tile origin) and sizes. The batch holds them once,
for all ranks (``layout``, render.PassLayout); this rank's cameras are its rows of the same
tensors, so the two can never disagree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

import torch

from ...kernels.constants import TILE_SIZE
from ..data.sampler import patch_window
from ..data.views import rows_of
from ..render import CameraBatch, PassLayout, rigid_inverse, shift_intrinsics

Window = tuple[int, int, int, int]  # (x0, y0, width, height) of an image, pixels


@dataclass
class StepBatch:
    """One step's data on this rank.

    ``items``: this rank's dataset items; ``every``: every rank's (rank-major); ``gts`` uint8
    [C, h, w, 3] the trained windows of this rank's images, ``keep`` uint8 [C, h, w, 1] their loss
    masks or None; ``windows``: (x0, y0, w, h) per image of this rank; ``origin``: (ox, oy) pixels
    the images move against the tile grid (``--random_tile_shift``; the renders are w + ox by
    h + oy); ``cams``: this rank's cameras, shifted so; ``layout``: every rank's sizes and
    cameras (None for gsplat's distributed pass, which gathers them itself); ``item_ids`` int64
    [C] (the auxiliary modules' rows) or None; ``backgrounds`` [C, 3] (``--random_bkgd``) or None.
    """

    step: int
    items: list[int]
    every: list[list[int]]
    gts: torch.Tensor
    keep: Optional[torch.Tensor]
    windows: list[Window]
    origin: tuple[int, int]
    cams: CameraBatch
    layout: Optional[PassLayout]
    item_ids: Optional[torch.Tensor] = None
    backgrounds: Optional[torch.Tensor] = None

    @property
    def num_cameras(self) -> int:
        return len(self.items)

    @property
    def width(self) -> int:
        """The trained images' width (before the tile origin's padding), pixels."""
        return self.windows[0][2]

    @property
    def height(self) -> int:
        return self.windows[0][3]

    def one_size(self) -> bool:
        """Whether every camera of the pass (all ranks') renders one image size."""
        return self.layout is not None and len(set(self.layout.sizes)) == 1


def tile_origin(seed: int, step: int) -> tuple[int, int]:
    """(ox, oy) of ``--random_tile_shift`` at step ``step``: uniform in [0, 16)^2, a function of the
    seed and the step, so every rank and a resumed run draw the same."""
    rng = random.Random(f"tile-shift/{seed}/{step}")
    return (rng.randrange(TILE_SIZE), rng.randrange(TILE_SIZE))


def _upload(rows: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host table on ``device`` without a host synchronization: staged in pinned memory
    and copied asynchronously on a GPU (a copy from pageable memory waits for the device)."""
    if device.type == "cpu":
        return torch.tensor(rows, dtype=dtype)
    return torch.tensor(rows, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


class Batches:
    """Builds each step's :class:`StepBatch` of rank ``rank`` of ``world_size``.

    ``trainset``: the training Dataset (image sizes); ``views``: its data.views.TrainViews (images
    and cameras on the device); ``samplers``: every rank's data.CameraSampler; ``viewmats`` [V, 4, 4]:
    the training views' world-to-camera matrices; ``poses``: the --pose_opt module (learned
    corrections: this rank's cameras then come from it, and the other ranks' are gathered by the
    render) or None; ``patch_size``, ``seed``, ``random_bkgd``: the flags; ``tile_shift``: the plan's
    (StepPlan.tile_shift); ``with_layout``: False for gsplat's distributed pass; ``with_item_ids``:
    the auxiliary modules need the items' ids."""

    def __init__(
        self,
        rank: int,
        trainset,
        views,
        samplers: list,
        viewmats: torch.Tensor,
        seed: int,
        patch_size: Optional[int] = None,
        random_bkgd: bool = False,
        tile_shift: bool = False,
        poses: Optional[torch.nn.Module] = None,
        with_layout: bool = True,
        with_item_ids: bool = False,
    ):
        self.rank, self.trainset, self.views, self.samplers = rank, trainset, views, samplers
        self.viewmats, self.seed, self.patch_size = viewmats, seed, patch_size
        self.random_bkgd, self.tile_shift, self.poses = random_bkgd, tile_shift, poses
        self.with_layout, self.with_item_ids = with_layout, with_item_ids

    def items_at(self, step: int, rank: Optional[int] = None) -> list[int]:
        """The dataset items rank ``rank`` (default this one) trains at step ``step``."""
        return self.samplers[self.rank if rank is None else rank].batch_at(step)

    def origin(self, step: int) -> tuple[int, int]:
        """(ox, oy) of step ``step``: :func:`tile_origin` under the plan's tile shift, else (0, 0)."""
        return tile_origin(self.seed, step) if self.tile_shift else (0, 0)

    def windows(self, step: int, rank: int, items: list[int]) -> list[Window]:
        """The part (x0, y0, w, h) of each image of rank ``rank``'s batch ``items`` that step
        ``step`` trains: the whole image, or the --patch_size crop (data.sampler.patch_window)."""
        sizes = [self.trainset.size(i) for i in items]
        if self.patch_size is None:
            return [(0, 0, w, h) for w, h in sizes]
        return [patch_window(self.seed, step, rank, j, w, h, self.patch_size) for j, (w, h) in enumerate(sizes)]

    def window_intrinsics(self, Ks: torch.Tensor, windows: list[Window], origin: tuple[int, int]) -> torch.Tensor:
        """[C, 3, 3] intrinsics of the images' ``windows`` (crops move the principal point by
        -x0, -y0; one small asynchronous upload per step with --patch_size), shifted by the tile ``origin``."""
        if self.patch_size is not None:
            offsets = _upload([[-x0, -y0] for x0, y0, _, _ in windows], Ks.dtype, Ks.device)
            Ks = shift_intrinsics(Ks, offsets[:, 0], offsets[:, 1])
        return shift_intrinsics(Ks, *origin) if origin != (0, 0) else Ks

    def build(self, step: int, n_world: list[int]) -> StepBatch:
        """Step ``step``'s batch; ``n_world``: every rank's Gaussian count (render.PassLayout).
        Starts copying the next step's images (data.views.TrainViews.prefetch)."""
        items = self.items_at(step)
        images = self.views.images_of(items, step)  # uint8 [C, H, W, 3 (+ mask)], on the device
        self.views.prefetch(self.items_at(step + 1))
        every = [items if r == self.rank else self.items_at(step, r) for r in range(len(self.samplers))]
        all_windows = [self.windows(step, r, batch) for r, batch in enumerate(every)]
        windows = all_windows[self.rank]
        if self.patch_size is not None:  # the crops of the images
            images = torch.stack([im[y0 : y0 + h, x0 : x0 + w] for im, (x0, y0, w, h) in zip(images, windows)])
        gts, keep = (images[..., :3], images[..., 3:]) if images.shape[-1] == 4 else (images, None)
        origin = self.origin(step)
        ox, oy = origin
        width, height = windows[0][2:]
        item_ids = self.views.item_ids(items) if self.with_item_ids or self.poses is not None else None
        first = sum(len(b) for b in every[: self.rank])
        C = len(items)
        layout = None
        if self.poses is None:  # every rank's cameras, known here; this rank's are its rows
            flat = [i for batch in every for i in batch]
            flat_windows = [win for wins in all_windows for win in wins]
            c2w, Ks = self.views.cameras(flat)
            Ks = self.window_intrinsics(Ks, flat_windows, origin)
            viewmats = rows_of(self.viewmats, flat)
            cams = CameraBatch(viewmats[first : first + C], Ks[first : first + C], width + ox, height + oy, origin)
            if self.with_layout:
                sizes = [(w + ox, h + oy) for _, _, w, h in flat_windows]
                layout = PassLayout(n_world, [len(b) for b in every], sizes, viewmats, Ks, c2w[:, :3, 3])
        else:  # learned poses: this rank's cameras only; the render gathers the others'
            camtoworlds, Ks = self.views.cameras(items)
            viewmats = rigid_inverse(self.poses(camtoworlds, item_ids))
            cams = CameraBatch(viewmats, self.window_intrinsics(Ks, windows, origin), width + ox, height + oy, origin)
            if self.with_layout:
                sizes = [(w + ox, h + oy) for wins in all_windows for _, _, w, h in wins]
                layout = PassLayout(n_world, [len(b) for b in every], sizes)
        backgrounds = torch.rand(C, 3, device=gts.device) if self.random_bkgd else None
        return StepBatch(step, items, every, gts, keep, windows, origin, cams, layout, item_ids, backgrounds)

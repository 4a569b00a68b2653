"""Small replicated modules: per-camera pose correction (``--pose_opt``) and per-image appearance
(``--app_opt``). Unlike the Gaussians they are identical on every rank, so with W > 1 they are
wrapped in DistributedDataParallel, whose gradient all_reduce is the only all_reduce of a
training step (gsplat simple_trainer does the same for its CameraOptModule and
AppearanceOptModule). The wrapping is :func:`splat_train.trainer.exchange.replicate`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rotation_6d_to_matrix(d6: torch.Tensor) -> torch.Tensor:
    """[..., 6] -> [..., 3, 3] by Gram-Schmidt on the two columns (Zhou et al. 2019, "On the
    Continuity of Rotation Representations in Neural Networks")."""
    a1, a2 = d6[..., :3], d6[..., 3:]
    b1 = F.normalize(a1, dim=-1)
    b2 = F.normalize(a2 - (b1 * a2).sum(-1, keepdim=True) * b1, dim=-1)
    b3 = torch.cross(b1, b2, dim=-1)
    return torch.stack([b1, b2, b3], dim=-2)


class PoseOptModule(torch.nn.Module):
    """A learned rigid correction per training image: 3 translation + 6D rotation offsets,
    zero-initialized (identity). ``forward(camtoworlds [C,4,4], image_ids [C]) -> [C,4,4]``
    returns camtoworld @ delta (gsplat examples/utils.py CameraOptModule)."""

    def __init__(self, num_images: int):
        super().__init__()
        self.embeds = torch.nn.Embedding(num_images, 9)
        torch.nn.init.zeros_(self.embeds.weight)
        self.register_buffer("identity", torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]))

    def forward(self, camtoworlds: torch.Tensor, image_ids: torch.Tensor) -> torch.Tensor:
        d = self.embeds(image_ids)  # [C, 9]
        delta = torch.eye(4, device=camtoworlds.device, dtype=camtoworlds.dtype).repeat(len(image_ids), 1, 1)
        delta[:, :3, :3] = rotation_6d_to_matrix(d[:, 3:] + self.identity)
        delta[:, :3, 3] = d[:, :3]
        return camtoworlds @ delta


def pose_perturbation(num_images: int, std: float, seed: int, device: torch.device) -> PoseOptModule:
    """``--pose_noise``: a PoseOptModule whose offsets are drawn once from N(0, std^2) (gsplat's
    CameraOptModule.random_init), from a generator seeded with ``seed``, so every rank draws the
    same perturbation and a resumed run the same again."""
    module = PoseOptModule(num_images)
    with torch.no_grad():
        module.embeds.weight.normal_(0.0, std, generator=torch.Generator().manual_seed(int(seed)))
    return module.to(device)


class AppearanceModule(torch.nn.Module):
    """A learned affine colour correction per training image, identity-initialized:
    ``forward(images [C,H,W,3], image_ids [C]) -> [C,H,W,3]`` = image @ A_i^T + b_i.

    This is a deliberately small stand-in for gsplat's AppearanceOptModule (a per-image embedding
    fed with per-Gaussian features through an MLP): it absorbs per-image exposure and white-balance
    changes on the rendering rank, needs no per-Gaussian state, and test views (which have no
    embedding) render without it.
    """

    def __init__(self, num_images: int):
        super().__init__()
        self.affine = torch.nn.Embedding(num_images, 12)
        with torch.no_grad():
            self.affine.weight.zero_()
            self.affine.weight[:, [0, 4, 8]] = 1.0

    def forward(self, images: torch.Tensor, image_ids: torch.Tensor) -> torch.Tensor:
        p = self.affine(image_ids)  # [C, 12]
        A, b = p[:, :9].view(-1, 3, 3), p[:, 9:]
        return torch.einsum("chwj,cij->chwi", images, A) + b[:, None, None, :]


def make_aux_modules(cfg, num_images: int, ctx) -> tuple[dict, dict, dict]:
    """The run's --pose_opt / --app_opt / --use_bilateral_grid modules (DDP-wrapped when W > 1,
    exchange.replicate), their Adams at the batch rule's learning rates (model.batch_rule), and
    the grids' learning-rate schedule (trainer/bilagrid.py): (modules, optimizers, schedulers),
    each a dict keyed "pose", "app", "bilagrid"."""
    from .bilagrid import LR as BILAGRID_LR
    from .bilagrid import BilateralGrid
    from .bilagrid import lr_lambda as bilagrid_lr_lambda
    from .exchange import replicate
    from .model import batch_rule

    aux: dict = {}
    opts: dict = {}
    schedulers: dict = {}
    lr_mult = batch_rule(cfg.step.batch_size, ctx.world_size)[0]
    for name, enabled, cls, lr, reg in (
        ("pose", cfg.step.pose_opt, PoseOptModule, cfg.optim.pose_opt_lr, cfg.optim.pose_opt_reg),
        ("app", cfg.step.app_opt, AppearanceModule, cfg.optim.app_opt_lr, cfg.optim.app_opt_reg),
    ):
        if enabled:
            aux[name] = replicate(cls(num_images), ctx)
            opts[name] = torch.optim.Adam(aux[name].parameters(), lr=lr * lr_mult, weight_decay=reg)
    if cfg.step.use_bilateral_grid:
        aux["bilagrid"] = replicate(BilateralGrid(num_images, *cfg.step.bilateral_grid_shape), ctx)
        opts["bilagrid"] = torch.optim.Adam(aux["bilagrid"].parameters(), lr=BILAGRID_LR * lr_mult, eps=1e-15)
        schedulers["bilagrid"] = torch.optim.lr_scheduler.LambdaLR(
            opts["bilagrid"], bilagrid_lr_lambda(cfg.schedule.bilateral_grid_warmup, cfg.schedule.max_steps)
        )
    return aux, opts, schedulers

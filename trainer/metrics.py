"""Evaluation metrics: PSNR, SSIM and (when its weights are on disk) LPIPS, each per image.

Images are channels-last [B, H, W, 3] floats in [0, 1]; clamp renders to [0, 1] before calling
(gsplat's evaluation does). Every function returns one value per image, [B]; the caller reports
the mean over the test images. These functions are pure: the rank-0 decision (who evaluates,
who logs) belongs to the caller.

LPIPS (Zhang et al., "The Unreasonable Effectiveness of Deep Features as a Perceptual Metric",
CVPR 2018) needs torchmetrics or the lpips package, torchvision, and the ImageNet backbone
weights already on disk (the torch hub cache, or --lpips_weights); :class:`LPIPSMetric` never
downloads anything.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import tempfile
from typing import Any

import torch

from splat_train.trainer import losses

# torchvision's file names for the ImageNet backbones LPIPS uses, in <hub>/checkpoints/.
LPIPS_BACKBONE_FILES = {
    "alex": "alexnet-owt-7be5be79.pth",
    "vgg": "vgg16-397923af.pth",
    "squeeze": "squeezenet1_1-b8a52dc0.pth",
}


def psnr(pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
    """Peak signal-to-noise ratio per image, in dB, for data range 1: -10 log10(MSE).

    Args:
        pred, gt: [B, H, W, C] float images in [0, 1].
    Returns [B]; +inf for an image identical to its ground truth.
    Raises ValueError when shapes differ or an image has no pixels.
    """
    if pred.shape != gt.shape or pred.dim() < 2 or pred[0].numel() == 0:
        raise ValueError(
            f"psnr: expected equal, non-empty [B, ...] shapes, got {tuple(pred.shape)} and {tuple(gt.shape)}"
        )
    mse = (pred - gt).square().flatten(1).mean(dim=1)  # [B]
    return -10.0 * torch.log10(mse)


def ssim(pred: torch.Tensor, gt: torch.Tensor, padding: str = "valid") -> torch.Tensor:
    """SSIM per image, [B], through :func:`splat_train.trainer.losses.ssim` (11x11, sigma 1.5).

    Default padding "valid" averages only windows fully inside the image, which is what
    torchmetrics' StructuralSimilarityIndexMeasure (gsplat's evaluation metric) computes after
    cropping its reflect padding; pass "same" for the 3DGS reference's metrics.py convention.
    Raises ValueError as losses.ssim does.
    """
    if pred.shape != gt.shape or pred.dim() != 4:
        raise ValueError(f"ssim: expected equal [B, H, W, 3] shapes, got {tuple(pred.shape)} and {tuple(gt.shape)}")
    values = [losses.ssim(pred[i : i + 1], gt[i : i + 1], padding=padding) for i in range(pred.shape[0])]
    return torch.stack(values)


class LPIPSMetric:
    """LPIPS distance per image, built only from weights already on this machine.

    ``net`` "alex" is gsplat's evaluation (images scaled from [0, 1] to [-1, 1], normalize=True);
    "vgg" is the original 3DGS evaluation (graphdeco-inria metrics.py, lpipsPyTorch with the VGG
    backbone), which feeds the [0, 1] images as they are (normalize=False), as gsplat's
    simple_trainer does for vgg: numbers comparable with papers that report either.

    Construction never raises for a missing dependency or missing weights (nor for a failure
    while building the network): it sets ``available = False`` and ``reason`` to a sentence
    saying what is missing and where it was looked for. It raises ValueError only for an
    unknown ``net``. The backbone file is ``weights`` when given (any path: torchvision finds it
    through a temporary hub folder that links it under its own name, the process's hub folder is
    restored afterwards), else ``<torch.hub.get_dir()>/checkpoints/<LPIPS_BACKBONE_FILES[net]>``;
    its existence is checked first, so torchvision never reaches for the network.

    Backends, first found wins: torchmetrics' LearnedPerceptualImagePatchSimilarity, then the
    lpips package (their linear-layer weights ship inside the packages).

    Attributes:
        available: whether ``__call__`` works.
        reason: why it is unavailable ("" when available).
        backend: "torchmetrics", "lpips", or None.
        net, normalize: the backbone, and whether [0, 1] images are scaled to [-1, 1] first.
    """

    def __init__(
        self, net: str = "alex", device: torch.device | str = "cpu", weights: "str | os.PathLike | None" = None
    ) -> None:
        if net not in LPIPS_BACKBONE_FILES:
            raise ValueError(f"LPIPS net must be one of {sorted(LPIPS_BACKBONE_FILES)}, got {net!r}")
        self.net = net
        self.normalize = net != "vgg"
        self.device = torch.device(device)
        self.weights = None if weights is None else os.path.abspath(weights)
        self.available = False
        self.reason = ""
        self.backend: str | None = None
        self._model: Any = None
        try:
            self._build()
        except Exception as error:  # never crash an evaluation over an optional metric
            self._model, self.backend = None, None
            self.reason = f"building LPIPS ({self.net}) failed: {type(error).__name__}: {error}"
        self.available = self._model is not None

    def _build(self) -> None:
        # find the packages without importing them: torchmetrics' import pulls in transformers
        # where that is installed (seconds), and without the backbone file nothing is built
        backends = [name for name in ("torchmetrics", "lpips") if _installed(name)]
        if not backends:
            self.reason = (
                "LPIPS unavailable: neither torchmetrics nor lpips is installed (splat-train does not depend on them)"
            )
            return
        if not _installed("torchvision"):
            self.reason = f"LPIPS unavailable: {backends[0]} is installed but torchvision is not"
            return
        weights = self.backbone_file()
        if not os.path.isfile(weights):
            self.reason = (
                f"LPIPS unavailable: backbone weights {weights} are not on disk and "
                "splat-train never downloads them; copy the file there (or pass "
                "--lpips_weights FILE) to enable LPIPS"
            )
            return
        with _hub_folder_holding(weights, LPIPS_BACKBONE_FILES[self.net]) if self.weights else contextlib.nullcontext():
            for backend in backends:  # first importable wins (an installed package may still fail to import)
                try:
                    if backend == "torchmetrics":
                        module = importlib.import_module("torchmetrics.image.lpip")
                        model = module.LearnedPerceptualImagePatchSimilarity(
                            net_type=self.net, normalize=self.normalize
                        )
                    else:
                        model = importlib.import_module("lpips").LPIPS(net=self.net, verbose=False)
                except ImportError:
                    if backend == backends[-1]:
                        raise
                else:
                    break
        self._model = model.to(self.device).eval()
        self.backend = backend

    def backbone_file(self) -> str:
        """The backbone weights this metric loads: ``weights``, or torchvision's file in the hub cache."""
        return self.weights or os.path.join(torch.hub.get_dir(), "checkpoints", LPIPS_BACKBONE_FILES[self.net])

    def describe(self) -> dict:
        """What produced the numbers, for the stats file: net, backbone file, input scaling, backend."""
        return dict(
            lpips_net=self.net,
            lpips_normalize=self.normalize,
            lpips_backend=self.backend,
            lpips_weights=self.backbone_file(),
        )

    @torch.no_grad()
    def __call__(self, pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        """LPIPS per image, [B] (lower is more similar), for [B, H, W, 3] images in [0, 1].

        Raises RuntimeError (with ``reason``) when unavailable; ValueError on shape mismatch.
        """
        if not self.available:
            raise RuntimeError(self.reason)
        if pred.shape != gt.shape or pred.dim() != 4 or pred.shape[-1] != 3:
            raise ValueError(
                f"LPIPS: expected equal [B, H, W, 3] shapes, got {tuple(pred.shape)} and {tuple(gt.shape)}"
            )
        x = pred.permute(0, 3, 1, 2).to(self.device)  # [B, 3, H, W]
        y = gt.permute(0, 3, 1, 2).to(self.device)
        if self.backend == "lpips":
            return self._model(x, y, normalize=self.normalize).reshape(-1)
        values = [self._model(x[i : i + 1], y[i : i + 1]).reshape(()) for i in range(x.shape[0])]
        self._model.reset()  # torchmetrics accumulates running state; per-image values suffice
        return torch.stack(values)


@contextlib.contextmanager
def _hub_folder_holding(path: str, name: str):
    """Point torch.hub at a temporary folder whose checkpoints/<name> links to ``path`` (so that
    torchvision loads ``path`` as its cached weights), and restore the previous folder after."""
    previous = torch.hub.get_dir()
    with tempfile.TemporaryDirectory(prefix="splat_train_hub_") as folder:
        os.makedirs(os.path.join(folder, "checkpoints"))
        os.symlink(path, os.path.join(folder, "checkpoints", name))
        torch.hub.set_dir(folder)
        try:
            yield
        finally:
            torch.hub.set_dir(previous)


def _installed(name: str) -> bool:
    """Whether the top-level module ``name`` can be found, without importing it (a module set to
    None in sys.modules counts as absent, as it does for import)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False

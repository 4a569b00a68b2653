"""The outputs other tools open, beside the run's own PLY: the original 3DGS (Inria) layout and the
web formats.

Inria layout (what graphdeco-inria/gaussian-splatting's train.py writes into its model path, and
what its render.py / metrics.py, the SIBR viewers and many other tools read):
    point_cloud/iteration_<step>/point_cloud.ply   the model (the same bytes as ply/point_cloud_<step>.ply:
                                                  a hard link where the file system allows, else a copy)
    cameras.json   a list of {id, img_name, width, height, position [3], rotation [3][3], fx, fy}:
                   position is the camera centre and rotation the camera-to-world rotation (rows),
                   OpenCV axes (x right, y down, z forward); fx, fy in pixels at width x height
                   (utils/camera_utils.py camera_to_JSON); here the training cameras at the size
                   they were trained at, in the export frame
    cfg_args       one line, ``Namespace(...)``: the text of an argparse Namespace that
                   arguments/__init__.py get_combined_args eval()s and the SIBR viewer scans for
                   source_path, sh_degree and white_background
The Inria scripts read the cameras of ``source_path`` (the input data's frame), so the folder lines
up with them under ``--export_frame original`` (the default).

Web formats, written by gsplat's exporter (gsplat.exporter.export_splats; plain PyTorch, runs on
the CPU): ``splat`` (antimatter15's viewer: 32 bytes per Gaussian, no higher SH) and
``ply_compressed`` (SuperSplat / PlayCanvas: chunks of 256 Gaussians quantized against their
bounds; Gaussians with opacity <= 1/255 are left out).
"""

from __future__ import annotations

import json
import os
import shutil
from argparse import Namespace
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from .data.normalize import transform_cameras
from .fileio import atomic_write, atomic_write_bytes

WEB_SUFFIXES = {"splat": ".splat", "ply_compressed": ".compressed.ply"}
INRIA_RESOLUTIONS = (1, 2, 4, 8)  # Inria's --resolution divides by these; other values are a width


def web_export_path(ply_path: Path, fmt: str) -> Path:
    """``ply/point_cloud_<step>.ply`` -> ``ply/point_cloud_<step>.splat`` / ``.compressed.ply``."""
    return ply_path.with_name(ply_path.name.removesuffix(".ply") + WEB_SUFFIXES[fmt])


def write_web_format(path: Path, params: dict[str, torch.Tensor], fmt: str) -> Path:
    """Write ``params`` (pre-activation, CPU: means [N, 3], scales [N, 3], quats [N, 4],
    opacities [N], sh0 [N, 1, 3], shN [N, K-1, 3]) as ``fmt`` ("splat" or "ply_compressed")
    through gsplat's export_splats, atomically. Returns ``path``. Raises ValueError for another
    format; gsplat's own errors (AssertionError on shapes) pass through."""
    if fmt not in WEB_SUFFIXES:
        raise ValueError(f"web format must be one of {sorted(WEB_SUFFIXES)}, got {fmt!r}")
    from gsplat.exporter import export_splats

    tensors = {
        k: params[k].detach().to("cpu", torch.float32) for k in ("means", "scales", "quats", "opacities", "sh0", "shN")
    }
    atomic_write_bytes(path, export_splats(**tensors, format=fmt))
    return path


def inria_cameras(cameras, transform: np.ndarray) -> list[dict]:
    """Inria cameras.json entries of ``cameras`` (data.Camera, normalized-world camtoworlds),
    moved into the export frame by the similarity ``transform`` [4, 4] (x_export = transform @
    x_normalized). ids are positions in the list; img_name is the file name without folders and
    extension, as the Inria readers name images."""
    c2ws = transform_cameras(
        np.asarray(transform, dtype=np.float64), np.stack([c.camtoworld for c in cameras])
    )  # [C, 4, 4]
    return [
        dict(
            id=i,
            img_name=PurePosixPath(c.name).name.split(".")[0],
            width=int(c.width),
            height=int(c.height),
            position=c2w[:3, 3].tolist(),
            rotation=c2w[:3, :3].tolist(),
            fy=float(c.K[1, 1]),
            fx=float(c.K[0, 0]),
        )
        for i, (c, c2w) in enumerate(zip(cameras, c2ws))
    ]


def cfg_args_text(cfg, result_dir: Path, width: int) -> str:
    """The Namespace line of Inria's cfg_args for this run: ModelParams' keys (sh_degree,
    source_path, model_path, images, depths, resolution, white_background, train_test_exp,
    data_device, eval) with this run's values. ``resolution`` is --data_factor when Inria's
    loader divides by it (1, 2, 4, 8), else the trained image width (``width``, pixels), which is
    how Inria reads other values."""
    factor = int(cfg.data.data_factor)
    return str(
        Namespace(
            sh_degree=int(cfg.model.sh_degree),
            source_path=str(Path(cfg.data.data_dir).resolve()) if cfg.data.data_dir is not None else "",
            model_path=str(Path(result_dir).resolve()),
            images="images",
            depths="",
            resolution=factor if factor in INRIA_RESOLUTIONS else int(width),
            white_background=False,
            train_test_exp=False,
            data_device="cuda",
            eval=cfg.data.test_every > 0,
        )
    )


def link_or_copy(src: Path, dst: Path) -> None:
    """Make ``dst`` hold ``src``'s bytes, atomically: a hard link (no extra disk), or a copy where
    the file system refuses links. An existing ``dst`` is replaced."""

    def write(tmp: str) -> None:
        os.remove(tmp)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)

    atomic_write(dst, write)


def write_inria_layout(result_dir: Path, step: int, ply_path: Path, cameras, transform: np.ndarray, cfg) -> Path:
    """``point_cloud/iteration_<step>/point_cloud.ply`` (from ``ply_path``), ``cameras.json`` of
    ``cameras`` (:func:`inria_cameras` with ``transform``) and ``cfg_args`` under ``result_dir``.
    Returns the iteration folder. Raises OSError from the file system."""
    result_dir = Path(result_dir)
    folder = result_dir / "point_cloud" / f"iteration_{step}"
    link_or_copy(Path(ply_path), folder / "point_cloud.ply")
    entries = inria_cameras(cameras, transform)
    atomic_write(result_dir / "cameras.json", lambda tmp: Path(tmp).write_text(json.dumps(entries)))
    text = cfg_args_text(cfg, result_dir, cameras[0].width if cameras else 0)
    atomic_write(result_dir / "cfg_args", lambda tmp: Path(tmp).write_text(text))
    return folder

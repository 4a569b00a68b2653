"""Loss masks: which pixels of a view the loss reads.

A view's mask is the AND of up to three sources, each optional:

* a file of the same name in the scene's ``masks/`` folder (COLMAP scenes: ``masks/<name>`` or
  ``masks/<name stem>.png``; nerfstudio's ``transforms.json``: the frame's ``mask_path``), the
  layout gsplat's and nerfstudio's parsers read; grey or colour, its first channel is read;
* the image's own alpha channel (PNG RGBA / LA), with ``--alpha_as_mask`` (on by default);
* the valid region of a fisheye camera remapped to an ideal equidistant fisheye (fisheye.py):
  output pixels whose source lies outside the captured image.

A pixel is kept where the mask or alpha value is >= 128 of 255 (white keeps, black excludes, as
nerfstudio's 0/1 masks; the midpoint makes JPEG-compressed masks safe). With ``--data_factor``
the masks are downscaled like the images (``masks_<f>/`` when present, else INTER_AREA into the
downscale cache, images.locate_images), so a downscaled pixel is kept when at least half of the
full-resolution pixels under it are; an alpha channel read from the cache is downscaled the same
way (``<name>.alpha.png`` beside the cached image). Undistortion warps the mask with the image.
Views without any source have no mask (every pixel kept).

How the trainer uses a mask (trainer/loop.py): rendered and ground-truth pixels outside it are
both set to 0 before the loss, as gsplat simple_trainer zeroes its renders where ``masks`` is
False, so they add nothing to the L1 term and nothing to the SSIM term (an all-zero window pair
has SSIM 1), and no gradient reaches the model through them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import cv2
import numpy as np

from ..fileio import atomic_write_bytes
from .images import (
    Camera,
    DataError,
    Scene,
    _cache_folder_name,
    cache_dir,
    cache_root,
    downscaled_size,
    has_alpha,
    read_rgba,
)

MASKS_FOLDER = "masks"
KEEP_THRESHOLD = 128  # of 255: a mask or alpha value at or above it keeps the pixel


def find_mask_names(data_dir: Path, names: list[str]) -> list[Optional[str]]:
    """The ``masks/`` file of each image name, relative to ``data_dir/masks``: ``<name>`` or
    ``<name stem>.png``; None where there is none (or no masks folder)."""
    folder = data_dir / MASKS_FOLDER
    if not folder.is_dir():
        return [None] * len(names)
    found = []
    for name in names:
        png = str(Path(name).with_suffix(".png"))
        found.append(name if (folder / name).is_file() else png if (folder / png).is_file() else None)
    return found


def _write_grey_png(path: Path, grey: np.ndarray) -> None:
    ok, encoded = cv2.imencode(".png", grey)
    assert ok, path
    atomic_write_bytes(path, encoded.tobytes())


def alpha_sources(
    data_dir: Path,
    folder: str,
    names: list[str],
    originals: list[Path],
    located: list[tuple[Path, int, int]],
    factor: int,
) -> list[Optional[Path]]:
    """Per image, the file whose alpha channel is the alpha of the image as loaded (None when it
    has none): the file read itself when it is the original or a prebuilt ``<folder>_<f>/``; for
    an image read from the downscale cache (RGB, composited), ``<name>.alpha.png`` beside it,
    made from the original's alpha with INTER_AREA once and remade when the original is newer.
    Reads file headers only, except to make those files."""
    out = []
    cache = cache_dir(data_dir) / _cache_folder_name(folder, factor)
    for name, original, (path, w, h) in zip(names, originals, located):
        if not Path(path).is_relative_to(cache_root()):
            out.append(path if has_alpha(path) else None)
            continue
        if not has_alpha(original):
            out.append(None)
            continue
        alpha_path = cache / (name + ".alpha.png")
        if not alpha_path.is_file() or alpha_path.stat().st_mtime < original.stat().st_mtime:
            _, alpha = read_rgba(original)
            assert alpha is not None  # alpha_sources lists only files with an alpha channel
            _write_grey_png(
                alpha_path,
                cv2.resize(
                    alpha, downscaled_size(alpha.shape[1], alpha.shape[0], factor), interpolation=cv2.INTER_AREA
                ),
            )
        out.append(alpha_path)
    return out


def _grey(path: Path, size: tuple[int, int], what: str) -> np.ndarray:
    """First channel (or alpha when ``what`` is "alpha" and there is one) of ``path`` as uint8
    [H, W]; DataError naming the file when its size is not ``size`` (width, height)."""
    rgb, alpha = read_rgba(path)
    grey = alpha if (what == "alpha" and alpha is not None) else rgb[:, :, 0]
    if (grey.shape[1], grey.shape[0]) != size:
        raise DataError(
            f"{what} {path} is {grey.shape[1]}x{grey.shape[0]}, expected {size[0]}x{size[1]} (the size of its image)"
        )
    return grey


def load_keep(camera: Camera, alpha: Optional[np.ndarray], alpha_as_mask: bool) -> Optional[np.ndarray]:
    """The kept pixels of ``camera``'s view as loaded: bool [height, width] (after undistortion),
    or None when every pixel is kept (an opaque alpha channel, an all-white mask: no mask to
    carry). ``alpha``: the decoded image's own alpha channel (uint8 [H, W] before undistortion) or
    None. Raises DataError naming a mask file of the wrong size."""
    dist = camera.dist
    size = (dist.src_width, dist.src_height) if dist is not None else (camera.width, camera.height)
    keep = None
    if alpha_as_mask and camera.alpha_path is not None:
        a = (
            alpha
            if (alpha is not None and camera.alpha_path == camera.image_path)
            else _grey(camera.alpha_path, size, "alpha")
        )
        keep = a >= KEEP_THRESHOLD
    if camera.mask_path is not None:
        m = _grey(camera.mask_path, size, "mask") >= KEEP_THRESHOLD
        keep = m if keep is None else keep & m
    if dist is not None:
        if keep is not None:
            keep = dist.apply(keep.astype(np.uint8) * 255) >= KEEP_THRESHOLD
        valid = dist.valid_region()
        if valid is not None:
            keep = valid if keep is None else keep & valid
    return None if keep is None or keep.all() else keep


def load_view(scene: Scene, index: int, alpha_as_mask: bool = True) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Camera ``index``'s image (uint8 [H, W, 3], as images.load_image) and its kept pixels (bool
    [H, W] or None), from one decode. Raises DataError naming a bad image or mask file."""
    from .images import load_image

    camera = scene.cameras[index]
    if scene.images is not None:
        keep = None if scene.masks is None else scene.masks[index]
        return load_image(scene, index), keep
    rgb, alpha = read_rgba(camera.image_path)
    image = load_image(scene, index, decoded=rgb)
    return image, load_keep(camera, alpha, alpha_as_mask)


def mask_lines(scene: Scene, alpha_as_mask: bool) -> list[str]:
    """One line per mask source of ``scene`` that some view has (none when no view has a mask)."""
    cams = scene.cameras
    lines = []
    with_alpha = sum(c.alpha_path is not None for c in cams)
    if with_alpha and alpha_as_mask:
        lines.append(
            f"masks: the alpha channel of {with_alpha} of {len(cams)} images is their loss mask "
            f"(alpha < {KEEP_THRESHOLD} left out of the loss; --no-alpha_as_mask composites them "
            "onto black and trains on every pixel)"
        )
    elif with_alpha:
        lines.append(
            f"masks: {with_alpha} of {len(cams)} images have an alpha channel, composited onto black "
            "(--no-alpha_as_mask); every pixel trains"
        )
    with_file = sum(c.mask_path is not None for c in cams)
    if with_file:
        lines.append(
            f"masks: {with_file} of {len(cams)} views have a mask file ({MASKS_FOLDER}/ or mask_path): "
            f"pixels below {KEEP_THRESHOLD} are left out of the loss"
        )
    if scene.masks is not None:
        lines.append(f"masks: {sum(m is not None for m in scene.masks)} of {len(cams)} views have a loss mask")
    return lines


def has_masks(scene: Scene, alpha_as_mask: bool) -> bool:
    """Whether any view of ``scene`` has a loss mask (without decoding anything)."""
    return any(
        (c.alpha_path is not None and alpha_as_mask)
        or c.mask_path is not None
        or (c.dist is not None and c.dist.fisheye)
        for c in scene.cameras
    ) or (scene.masks is not None and any(m is not None for m in scene.masks))

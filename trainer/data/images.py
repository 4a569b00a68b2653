"""Scene types and image access: decoding, the downscale cache, undistortion.

Pixel convention: intrinsics K are in COLMAP's convention (pixel (0, 0) covers [0, 1) x [0, 1), so
its centre is at 0.5), which is also gsplat's rasterizer convention and instant-ngp's (cx = w / 2 is
the image centre). OpenCV puts pixel centres at integers, so K is shifted by 0.5 px around every
cv2 call here. Downscaling by s maps a corner-convention coordinate u to s * u exactly, so K scales
by the per-axis size ratio with no offset.

Errors: every user-facing problem (missing, unreadable or wrongly sized file) raises `DataError`
naming the file.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Optional

import cv2
import numpy as np
from PIL import Image

from ..fileio import atomic_write_bytes
from .fisheye import remap_tables

CACHE_ENV = "SPLAT_TRAIN_CACHE"


class DataError(ValueError):
    """A user error in the input data; the message names the file, folder or flag at fault."""


def no_points_error(where) -> DataError:
    """The error of ``--init_type sfm`` on a scene (``where``: its folder) without 3D points."""
    return DataError(f"{where} has no 3D points to initialize from (--init_type sfm); use --init_type random")


@dataclass
class Undistortion:
    """How to undistort one camera's (downscaled) image with OpenCV, and the result's pinhole.

    Built by `make_undistortion`; the output image is the undistorted image cropped to the valid
    region that cv2.getOptimalNewCameraMatrix(alpha=0) reports (as gsplat's COLMAP parser does).
    """

    K_distorted: np.ndarray  # [3, 3] float64 pixels, of the distorted file as read
    coeffs: np.ndarray  # [4] or [5] float64: OpenCV k1, k2, p1, p2[, k3]
    src_width: int  # pixels of the distorted file as read
    src_height: int
    K: np.ndarray  # [3, 3] float64 pixels, of the undistorted, cropped output
    width: int  # pixels of the output
    height: int
    cache_maps: bool = False  # keep the remap tables (worth it when several images share the camera)
    model: str = ""  # what is undone, for the loading message: "COLMAP OPENCV", "transforms.json k1/k2/p1/p2"
    fisheye: bool = False  # coeffs are OpenCV fisheye k1..k4; the output is an ideal equidistant fisheye (fisheye.py)
    _maps: Optional[tuple] = field(default=None, init=False, repr=False, compare=False)

    def maps(self) -> tuple[np.ndarray, np.ndarray]:
        """cv2.remap tables from output pixels to source pixels (pinhole: fixed point, CV_16SC2;
        fisheye: float32 x and y, fisheye.remap_tables)."""
        if self._maps is not None:
            return self._maps
        if self.fisheye:
            maps = remap_tables(self.K_distorted, self.coeffs, self.K, self.width, self.height)
        else:
            maps = cv2.initUndistortRectifyMap(
                _to_opencv(self.K_distorted),
                self.coeffs,
                None,
                _to_opencv(self.K),
                (self.width, self.height),
                cv2.CV_16SC2,
            )
        if self.cache_maps:
            self._maps = maps
        return maps

    def valid_region(self) -> Optional[np.ndarray]:
        """bool [height, width]: output pixels whose source lies inside the captured image (both
        bilinear neighbours), for fisheye cameras; None for pinhole ones (their crop is valid)."""
        if not self.fisheye:
            return None
        mapx, mapy = self.maps()
        return (mapx >= 0) & (mapy >= 0) & (mapx <= self.src_width - 1) & (mapy <= self.src_height - 1)

    def apply(self, image: np.ndarray) -> np.ndarray:
        """[src_height, src_width, 3] uint8 -> [height, width, 3] uint8 undistorted, cropped."""
        assert image.shape[:2] == (self.src_height, self.src_width), image.shape
        map1, map2 = self.maps()
        return cv2.remap(image, map1, map2, interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


@dataclass
class Camera:
    name: str  # image file name (relative path under the images folder); the sort key
    image_path: Path  # the file actually read (images_<f>/..., or the downscale cache)
    camtoworld: np.ndarray  # [4, 4] float32, OpenCV axes (x right, y down, z forward), normalized world
    K: np.ndarray  # [3, 3] float32 pinhole intrinsics in pixels at (width, height), after undistortion
    width: int  # pixels of the loaded (downscaled, undistorted) image
    height: int
    dist: Optional[Undistortion] = None  # None when the camera is a pinhole
    model: str = "pinhole"  # "pinhole", or "fisheye" (ideal equidistant after undistortion, fisheye.py)
    mask_path: Optional[Path] = None  # a loss mask from the masks folder, at the file's size (masks.py)
    alpha_path: Optional[Path] = None  # a file whose alpha (or grey) channel is the image's alpha (masks.py)
    point_ids: Optional[np.ndarray] = None  # int64 [M] indices into Scene.points seen in this image (SfM tracks)


@dataclass
class Scene:
    cameras: list[Camera]  # sorted by name
    points: Optional[np.ndarray]  # [P, 3] float32 normalized-world SfM points; None when the format has none
    points_rgb: Optional[np.ndarray]  # [P, 3] uint8
    scene_scale: float  # max distance of camera centres from their mean, normalized world units
    transform: np.ndarray  # [4, 4] float32 world normalization applied (identity if none)
    source: str  # "colmap" | "nerf" | "synthetic"
    images: Optional[list] = None  # synthetic: uint8 [H, W, 3] per camera; None when read from files
    masks: Optional[list] = None  # with in-memory images: bool [H, W] kept pixels or None, per camera
    points_knn_rms: Optional[np.ndarray] = None  # [P] RMS distance of each point to its 3 nearest, when precomputed
    visible_fraction: Optional[np.ndarray] = None  # synthetic: [C] share of the true Gaussians each camera keeps


# ----------------------------------------------------------------------------------------------
# Undistortion


def _to_opencv(K: np.ndarray) -> np.ndarray:
    """Corner-convention K -> OpenCV (pixel centres at integers) K, float64 [3, 3]."""
    K = np.asarray(K, dtype=np.float64).copy()
    K[:2, 2] -= 0.5
    return K


def _from_opencv(K: np.ndarray) -> np.ndarray:
    K = np.asarray(K, dtype=np.float64).copy()
    K[:2, 2] += 0.5
    return K


def make_undistortion(
    K: np.ndarray, coeffs, width: int, height: int, what: str, cache_maps: bool = False, model: str = ""
) -> Undistortion:
    """Plan undistortion of a [height, width] image with pinhole K [3, 3] and OpenCV coeffs.

    The new pinhole is cv2.getOptimalNewCameraMatrix(alpha=0) (every output pixel sees the source),
    cropped to its valid ROI, as in gsplat examples/datasets/colmap.py; zero distortion gives
    back K and the same size. `what` names the camera in
    the DataError raised when the distortion is so strong that no valid region remains; `model`
    names the distortion model for the loading message (Undistortion.model).
    """
    coeffs = np.asarray(coeffs, dtype=np.float64)
    K_cv = _to_opencv(K)
    K_new, (x, y, w, h) = cv2.getOptimalNewCameraMatrix(K_cv, coeffs, (width, height), 0.0)
    # OpenCV measures the ROI between pixel centres (a full row spans width - 1), so it holds
    # w + 1 pixels; with alpha 0 that is the whole image. (gsplat crops to w: one row and column
    # fewer, even for zero distortion.)
    w, h = min(w + 1, width - x), min(h + 1, height - y)
    if w <= 1 or h <= 1:
        raise DataError(
            f"{what}: distortion {coeffs.tolist()} leaves no valid image region "
            f"after undistortion of a {width}x{height} image"
        )
    K_new = np.array(K_new, dtype=np.float64)
    K_new[0, 2] -= x
    K_new[1, 2] -= y
    return Undistortion(
        K_distorted=np.asarray(K, dtype=np.float64),
        coeffs=coeffs,
        src_width=width,
        src_height=height,
        K=_from_opencv(K_new),
        width=int(w),
        height=int(h),
        cache_maps=cache_maps,
        model=model,
    )


# ----------------------------------------------------------------------------------------------
# Reading files


def make_fisheye_undistortion(
    K: np.ndarray, coeffs, width: int, height: int, what: str, cache_maps: bool = False, model: str = ""
) -> Undistortion:
    """Plan the remap of a [height, width] OpenCV-fisheye image with intrinsics K [3, 3] (pixels)
    and coeffs k1..k4 to an ideal equidistant fisheye of the same focal lengths, cropped to the
    valid pixels' bounding box. ``what`` names the camera in the DataError raised when no output
    pixel sees the image (a malformed camera)."""
    K = np.asarray(K, dtype=np.float64)
    coeffs = np.asarray(coeffs, dtype=np.float64)
    mapx, mapy = remap_tables(K, coeffs, K, width, height)
    valid = (mapx >= 0) & (mapy >= 0) & (mapx <= width - 1) & (mapy <= height - 1)
    rows, cols = np.nonzero(valid.any(axis=1))[0], np.nonzero(valid.any(axis=0))[0]
    if len(rows) < 2 or len(cols) < 2:
        raise DataError(f"{what}: fisheye coefficients {coeffs.tolist()} leave no valid image region")
    x0, y0 = int(cols[0]), int(rows[0])
    out_w, out_h = int(cols[-1]) + 1 - x0, int(rows[-1]) + 1 - y0
    K_new = K.copy()
    K_new[0, 2] -= x0
    K_new[1, 2] -= y0
    return Undistortion(
        K_distorted=K,
        coeffs=coeffs,
        src_width=width,
        src_height=height,
        K=K_new,
        width=out_w,
        height=out_h,
        cache_maps=cache_maps,
        model=model,
        fisheye=True,
    )


def image_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from the file header (no decode); DataError if unreadable."""
    try:
        with Image.open(path) as im:
            return int(im.size[0]), int(im.size[1])
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read image header of {path}: {exc}") from exc


def read_rgb(path: Path) -> np.ndarray:
    """Decode an image file to uint8 [H, W, 3] RGB.

    EXIF orientation is ignored (COLMAP's pixels are the stored pixels). Grey is expanded to RGB,
    16-bit is scaled to 8-bit, and an alpha channel is composited onto black (RGB * alpha).
    Raises DataError naming the file when it is missing or cannot be decoded.
    """
    return read_rgba(path)[0]


def read_rgba(path: Path) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Decode an image file once: (uint8 [H, W, 3] RGB as :func:`read_rgb` returns it, uint8
    [H, W] alpha or None when the file has none). Raises DataError as read_rgb."""
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise DataError(f"cannot read image {path}: {exc}") from exc
    image = cv2.imdecode(data, cv2.IMREAD_UNCHANGED) if data.size else None
    if image is None:
        raise DataError(f"cannot decode image {path} (corrupt or not an image)")
    if image.dtype == np.uint16:
        image = (image.astype(np.float32) / 257.0).round().astype(np.uint8)
    elif image.dtype != np.uint8:
        raise DataError(f"image {path} has unsupported pixel type {image.dtype} (need 8 or 16 bit)")
    if image.ndim == 2:
        return cv2.cvtColor(image, cv2.COLOR_GRAY2RGB), None
    alpha = None
    if image.shape[2] in (2, 4):  # grey + alpha, BGRA
        alpha = np.ascontiguousarray(image[:, :, -1])
        colour = image[:, :, :1].repeat(3, axis=2) if image.shape[2] == 2 else image[:, :, :3]
        image = (colour.astype(np.float32) * (alpha[:, :, None] / np.float32(255.0))).round().astype(np.uint8)
    return cv2.cvtColor(image[:, :, :3], cv2.COLOR_BGR2RGB), alpha


def has_alpha(path: Path) -> bool:
    """Whether the image file carries an alpha channel, from its header (no decode): PIL modes
    RGBA, LA, PA, or a palette / grey image with a transparency entry."""
    try:
        with Image.open(path) as im:
            return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info
    except (OSError, ValueError):
        return False


def load_image(scene: Scene, index: int, decoded: Optional[np.ndarray] = None) -> np.ndarray:
    """Camera `index`'s image: uint8 [height, width, 3] RGB, downscaled and undistorted.
    ``decoded``: its file already decoded by :func:`read_rgb` (masks.load_view decodes once).

    Raises DataError naming the file when it is unreadable or not of the size the scene expects.
    """
    camera = scene.cameras[index]
    if scene.images is not None:
        image = np.asarray(scene.images[index])
        if image.shape != (camera.height, camera.width, 3) or image.dtype != np.uint8:
            raise DataError(
                f"in-memory image {index} ({camera.name}) is {image.dtype} {image.shape}, "
                f"expected uint8 {(camera.height, camera.width, 3)}"
            )
        return image
    image = read_rgb(camera.image_path) if decoded is None else decoded
    dist = camera.dist
    expected = (dist.src_width, dist.src_height) if dist is not None else (camera.width, camera.height)
    if (image.shape[1], image.shape[0]) != expected:
        raise DataError(
            f"image {camera.image_path} is {image.shape[1]}x{image.shape[0]}, expected {expected[0]}x{expected[1]}"
        )
    return dist.apply(image) if dist is not None else image


# ----------------------------------------------------------------------------------------------
# Downscaling: an existing <folder>_<f>/ in the data dir, else a cache outside it


def cache_root() -> Path:
    """$SPLAT_TRAIN_CACHE if set, else ~/.cache/splat_train."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "splat_train"


def cache_dir(data_dir: Path) -> Path:
    """This data dir's cache folder: cache_root() / first 16 hex of sha1(absolute data dir)."""
    key = hashlib.sha1(str(Path(data_dir).resolve()).encode()).hexdigest()[:16]
    return cache_root() / key


def downscaled_size(width: int, height: int, factor: int) -> tuple[int, int]:
    """round(w / f) x round(h / f), halves rounded up, at least 1 pixel."""
    return max(1, int(width / factor + 0.5)), max(1, int(height / factor + 0.5))


def _cache_folder_name(folder: str, factor: int) -> str:
    parts = PurePosixPath(folder).parts
    if folder in ("", ".") or ".." in parts or PurePosixPath(folder).is_absolute():
        return f"folder-{hashlib.sha1(folder.encode()).hexdigest()[:8]}_{factor}"
    return f"{PurePosixPath(folder).as_posix()}_{factor}"


def write_png(path: Path, rgb: np.ndarray) -> None:
    """Write uint8 [H, W, 3] RGB ``rgb`` to ``path`` as a PNG, atomically (a temporary name, then a
    rename). OpenCV's encoder at its default compression: several times faster than Pillow's
    (imageio) for the same lossless pixels and about the same size. OSError when it cannot encode."""
    ok, encoded = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    if not ok:
        raise OSError(f"{path}: OpenCV could not encode a PNG of shape {rgb.shape}")
    atomic_write_bytes(path, encoded.tobytes())


def locate_images(
    data_dir: Path,
    folder: str,
    names: list[str],
    sizes: list[tuple[int, int]],
    factor: int,
    log: Optional[Callable[[str], None]] = None,
) -> list[tuple[Path, int, int]]:
    """The file to read for each image, and its (width, height) in pixels.

    data_dir / folder / name must exist (callers check, to word the error for their format);
    sizes[i] is its full-resolution (width, height) as the camera model states it.
    - factor 1: the original; its header must match sizes[i].
    - data_dir / f"{folder}_{factor}" exists: read from it; each file must exist and be within
      1 px of sizes[i] / factor (callers scale K by the actual ratio).
    - else: cv2.INTER_AREA downscale to downscaled_size() into
      cache_dir(data_dir) / f"{folder}_{factor}" / (name + ".png"), written once atomically,
      remade only when the original is newer. The data dir itself is never written. ``log``, when
      given, is called with one line before that work starts (it decodes every original).
    Raises DataError naming the offending file or folder.
    """
    located = []
    if factor == 1:
        for name, (w, h) in zip(names, sizes):
            path = data_dir / folder / name
            fw, fh = image_size(path)
            if (fw, fh) != (w, h):
                raise DataError(f"image {path} is {fw}x{fh}, but the camera model says {w}x{h}")
            located.append((path, w, h))
        return located

    prebuilt = data_dir / f"{folder}_{factor}"
    if folder not in ("", ".") and prebuilt.is_dir():
        missing = [n for n in names if not (prebuilt / n).is_file()]
        if missing:
            raise DataError(
                f"{prebuilt} lacks {len(missing)} of the {len(names)} images "
                f"(e.g. {', '.join(missing[:3])}); complete it or remove the folder"
            )
        for name, (w, h) in zip(names, sizes):
            path = prebuilt / name
            fw, fh = image_size(path)
            if abs(fw - w / factor) > 1 or abs(fh - h / factor) > 1:
                raise DataError(
                    f"{path} is {fw}x{fh}, but a 1/{factor} downscale of the "
                    f"{w}x{h} original should be about {w / factor:g}x{h / factor:g}"
                )
            located.append((path, fw, fh))
        return located

    target = cache_dir(data_dir) / _cache_folder_name(folder, factor)
    stale = [
        not (target / (n + ".png")).is_file()
        or (target / (n + ".png")).stat().st_mtime < (data_dir / folder / n).stat().st_mtime
        for n in names
    ]
    if log is not None and any(stale):
        log(
            f"downscaling {sum(stale)} images of {data_dir / folder} by {factor} into the cache {target} "
            "(once: later runs read them from there)"
        )
    for name, (w, h), remake in zip(names, sizes, stale):
        source = data_dir / folder / name
        path = target / (name + ".png")
        fw, fh = downscaled_size(w, h, factor)
        if remake:
            image = read_rgb(source)
            if (image.shape[1], image.shape[0]) != (w, h):
                raise DataError(
                    f"image {source} is {image.shape[1]}x{image.shape[0]}, but the camera model says {w}x{h}"
                )
            write_png(path, cv2.resize(image, (fw, fh), interpolation=cv2.INTER_AREA))
        located.append((path, fw, fh))
    return located

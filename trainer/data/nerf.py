"""NeRF / instant-ngp / nerfstudio `transforms.json` -> Scene.

Keys read (per frame, falling back to the top level): `file_path`, `transform_matrix`
(camera-to-world, OpenGL axes: x right, y up, z back), `w`, `h`, `fl_x`, `fl_y`, `cx`, `cy`,
`camera_angle_x`, `camera_angle_y`, `k1`, `k2`, `k3`, `k4`, `p1`, `p2`, `camera_model`, `mask_path`
(nerfstudio: a loss mask, masks.py).
Focal from an angle: f = 0.5 * w / tan(0.5 * camera_angle_x) (the Blender/NeRF convention);
fy defaults to fx, cx/cy to w/2, h/2 (image centre, pixel-corner convention).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from ..log import get_logger
from .images import (
    Camera,
    DataError,
    Scene,
    image_size,
    locate_images,
    make_fisheye_undistortion,
    make_undistortion,
    no_points_error,
)
from .masks import alpha_sources
from .normalize import normalize_world, scene_scale

log_warning = get_logger(__name__).warning

SUFFIXES = ("", ".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG")  # Blender paths lack one
OPENGL_TO_OPENCV = np.diag([1.0, -1.0, -1.0, 1.0])  # flips the camera's y and z axes
PINHOLE_MODELS = ("OPENCV", "PINHOLE", "SIMPLE_PINHOLE")
FISHEYE_MODEL = "OPENCV_FISHEYE"  # nerfstudio's name; remapped to an ideal equidistant fisheye (fisheye.py)


def _find_file(base: Path, file_path: str) -> Path | None:
    for suffix in SUFFIXES:
        candidate = base / (file_path + suffix)
        if candidate.is_file():
            return candidate
    return None


def _relative_name(path: Path, data_dir: Path) -> str:
    try:
        return path.relative_to(data_dir).as_posix()
    except ValueError:
        return path.as_posix()


def _pinhole(meta: dict, frame: dict, width: int, height: int, where: str) -> np.ndarray:
    """[3, 3] float64 K in pixels at (width, height) from fl_*/c* or camera_angle_*."""
    get: Callable[[str], Any] = lambda key: frame.get(key, meta.get(key))  # noqa: E731
    if get("fl_x") is not None:
        fx = float(get("fl_x"))
    elif get("camera_angle_x") is not None:
        fx = 0.5 * width / math.tan(0.5 * float(get("camera_angle_x")))
    else:
        raise DataError(f"{where}: no focal length (need fl_x or camera_angle_x)")
    if get("fl_y") is not None:
        fy = float(get("fl_y"))
    elif get("camera_angle_y") is not None:
        fy = 0.5 * height / math.tan(0.5 * float(get("camera_angle_y")))
    else:
        fy = fx
    cx = float(get("cx")) if get("cx") is not None else width / 2.0
    cy = float(get("cy")) if get("cy") is not None else height / 2.0
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])


def _distortion(meta: dict, frame: dict, where: str) -> tuple[np.ndarray | None, bool]:
    """(coeffs, fisheye): OpenCV coeffs [5] (k1, k2, p1, p2, k3), or None when all are zero or
    absent; for nerfstudio's OPENCV_FISHEYE, OpenCV fisheye k1..k4 [4] and fisheye True."""
    model = frame.get("camera_model", meta.get("camera_model"))
    if model is not None and model not in PINHOLE_MODELS + (FISHEYE_MODEL,):
        raise DataError(
            f"{where}: camera_model {model} is not supported; supported: "
            f"{', '.join(PINHOLE_MODELS)} (with optional k1, k2, k3, p1, p2) and {FISHEYE_MODEL} "
            "(k1..k4, with --camera_model fisheye)"
        )
    keys = ("k1", "k2", "k3", "k4") if model == FISHEYE_MODEL else ("k1", "k2", "p1", "p2", "k3")
    coeffs = np.array([float(frame.get(k, meta.get(k, 0.0)) or 0.0) for k in keys])
    if model == FISHEYE_MODEL:
        return coeffs, True
    return (coeffs if np.any(coeffs) else None), False


def _mask_file(base: Path, frame: dict, where: str) -> Path | None:
    """The frame's nerfstudio ``mask_path`` (relative to the json's folder), or None; DataError
    when it is given but missing."""
    if frame.get("mask_path") is None:
        return None
    path = _find_file(base, str(frame["mask_path"]))
    if path is None:
        raise DataError(f"{where}: mask_path {frame['mask_path']} does not exist under {base}")
    return path


def _camtoworld(frame: dict, where: str) -> np.ndarray:
    """[4, 4] float64 OpenCV camtoworld from the frame's OpenGL transform_matrix."""
    try:
        matrix = np.asarray(frame["transform_matrix"], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{where}: missing or malformed transform_matrix") from exc
    if matrix.shape == (3, 4):
        matrix = np.vstack([matrix, [0.0, 0.0, 0.0, 1.0]])
    if matrix.shape != (4, 4) or not np.all(np.isfinite(matrix)):
        raise DataError(f"{where}: transform_matrix must be a finite 4x4 (or 3x4) matrix")
    return matrix @ OPENGL_TO_OPENCV


def load_nerf(
    json_path: Path,
    data_factor: int,
    normalize: bool,
    log: Optional[Callable[[str], None]] = None,
    warn: Optional[Callable[[str], None]] = None,
    need_points: bool = False,
) -> Scene:
    """Read json_path (frames' file_path relative to its folder) -> Scene (source "nerf").
    ``log``: see images.locate_images; ``warn``: given the warning lines (default: the package
    logger, on stderr). ``need_points`` (--init_type sfm): a DataError at once, as the format
    holds no 3D points.

    Camera names are the image paths relative to the json's folder (posix), sorted.

    Frames whose image is missing are skipped with one warning line naming them. Raises DataError on
    malformed json, no usable frame, missing intrinsics, or an unsupported camera_model.
    points / points_rgb are None (the format has none).
    """
    try:
        meta = json.loads(json_path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot parse {json_path}: {exc}") from exc
    frames = meta.get("frames") if isinstance(meta, dict) else None
    if not frames:
        raise DataError(f"{json_path} has no frames")

    base = json_path.parent
    found, missing = [], []
    for i, frame in enumerate(frames):
        if not isinstance(frame, dict) or "file_path" not in frame:
            raise DataError(f"{json_path}: frame {i} has no file_path")
        path = _find_file(base, str(frame["file_path"]))
        if path is None:
            missing.append(str(frame["file_path"]))
        else:
            found.append((frame, path))
    if missing:
        (warn or log_warning)(
            f"warning: {json_path}: skipping {len(missing)} of {len(frames)} frames whose image is "
            f"missing: {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")
        )
    if not found:
        raise DataError(f"{json_path}: none of the {len(frames)} frames' images exist under {base}")
    found.sort(key=lambda item: _relative_name(item[1], base))
    if need_points:  # before any image is read or downscaled
        raise no_points_error(f"{json_path} (a transforms.json scene holds none)")

    # Full-resolution size, pinhole and distortion per frame.
    records = []
    for frame, path in found:
        where = f"{json_path} frame {frame['file_path']}"
        w, h = frame.get("w", meta.get("w")), frame.get("h", meta.get("h"))
        size = (int(w), int(h)) if w is not None and h is not None else image_size(path)
        records.append(
            (
                path,
                size,
                _pinhole(meta, frame, *size, where),
                _distortion(meta, frame, where),
                _camtoworld(frame, where),
                _mask_file(base, frame, where),
            )
        )

    # Downscaled files, one images_<f> / cache lookup per folder (images, then mask files).
    located: dict = {}
    alphas: dict = {}
    folders = sorted({_relative_name(path.parent, base) for path, *_ in records})
    for folder in folders:
        group = [(path, size) for path, size, *_ in records if _relative_name(path.parent, base) == folder]
        files = locate_images(base, folder, [p.name for p, _ in group], [s for _, s in group], data_factor, log)
        located.update({path: file for (path, _), file in zip(group, files)})
        sources = alpha_sources(base, folder, [p.name for p, _ in group], [p for p, _ in group], files, data_factor)
        alphas.update({path: a for (path, _), a in zip(group, sources)})
    masks = {}
    mask_folders = sorted({_relative_name(m.parent, base) for *_, m in records if m is not None})
    for folder in mask_folders:
        group = [(m, size) for _, size, *_, m in records if m is not None and _relative_name(m.parent, base) == folder]
        files = locate_images(base, folder, [m.name for m, _ in group], [s for _, s in group], data_factor, log)
        masks.update({m: file[0] for (m, _), file in zip(group, files)})

    camtoworlds = np.stack([record[4] for record in records])  # [C, 4, 4]
    transform = np.eye(4)
    if normalize:
        camtoworlds, _, transform = normalize_world(camtoworlds, None)

    # Frames with identical intrinsics share one Undistortion (and its remap tables).
    scaled = []
    for path, (w, h), K, (coeffs, fisheye), _, mask in records:
        image_path, file_w, file_h = located[path]
        K = np.diag([file_w / w, file_h / h, 1.0]) @ K
        key = None if coeffs is None else (K.tobytes(), coeffs.tobytes(), file_w, file_h, fisheye)
        scaled.append((path, image_path, file_w, file_h, K, coeffs, fisheye, mask, key))
    keys = [item[-1] for item in scaled]
    undistortions = {}
    cameras = []
    for (path, image_path, file_w, file_h, K, coeffs, fisheye, mask, key), camtoworld in zip(scaled, camtoworlds):
        dist = None
        if key is not None:
            if key not in undistortions:
                plan = make_fisheye_undistortion if fisheye else make_undistortion
                undistortions[key] = plan(
                    K,
                    coeffs,
                    file_w,
                    file_h,
                    what=f"{json_path} frame {path.name}",
                    cache_maps=keys.count(key) > 1,
                    model=f"{json_path.name} {FISHEYE_MODEL if fisheye else 'k1/k2/p1/p2/k3'}",
                )
            dist = undistortions[key]
            K, file_w, file_h = dist.K, dist.width, dist.height
        cameras.append(
            Camera(
                name=_relative_name(path, base),
                image_path=image_path,
                camtoworld=camtoworld.astype(np.float32),
                K=K.astype(np.float32),
                width=int(file_w),
                height=int(file_h),
                dist=dist,
                model="fisheye" if fisheye else "pinhole",
                mask_path=None if mask is None else masks[mask],
                alpha_path=alphas[path],
            )
        )
    return Scene(
        cameras=cameras,
        points=None,
        points_rgb=None,
        scene_scale=scene_scale(camtoworlds),
        transform=transform.astype(np.float32),
        source="nerf",
    )

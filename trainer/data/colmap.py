"""COLMAP sparse model (binary or text) -> Scene.

Layout: data_dir/images/<name> for each registered image, the model in data_dir/sparse/0
(preferred) or data_dir/sparse, optional prebuilt downscales in data_dir/images_<f>/.
COLMAP poses are world-to-camera in OpenCV axes (x right, y down, z forward); we invert them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pycolmap

from .images import (
    Camera,
    DataError,
    Scene,
    locate_images,
    make_fisheye_undistortion,
    make_undistortion,
    no_points_error,
)
from .masks import MASKS_FOLDER, alpha_sources, find_mask_names
from .normalize import normalize_world, scene_scale

IMAGES_FOLDER = "images"
MODEL_FILES = ("cameras", "images", "points3D")


def find_model(data_dir: Path) -> Optional[Path]:
    """data_dir/sparse/0 if it holds a model (.bin or .txt), else data_dir/sparse if it does, else None."""
    for candidate in (data_dir / "sparse" / "0", data_dir / "sparse"):
        for ext in (".bin", ".txt"):
            if all((candidate / f"{name}{ext}").is_file() for name in MODEL_FILES):
                return candidate
    return None


def _model_file(model_dir: Path, name: str) -> Path:
    binary = model_dir / f"{name}.bin"
    return binary if binary.is_file() else model_dir / f"{name}.txt"


FISHEYE_MODELS = ("SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE", "OPENCV_FISHEYE")


def pinhole_and_distortion(camera, cameras_file: Path) -> tuple[np.ndarray, Optional[np.ndarray], bool]:
    """pycolmap Camera -> (K [3, 3] float64 pixels, coeffs [4] or None when there are none,
    whether the camera is a fisheye).

    Parameter orders are COLMAP's (src/colmap/sensor/models.h); RADIAL's and OPENCV's radial and
    tangential terms are OpenCV's k1, k2, p1, p2; the fisheye models' are OpenCV fisheye k1..k4
    (SIMPLE_RADIAL_FISHEYE: k1; RADIAL_FISHEYE: k1, k2; OPENCV_FISHEYE: k1..k4), always returned
    for a fisheye (fisheye.py remaps even k = 0, to crop and mask). Raises DataError for any
    other model.
    """
    model = camera.model.name
    p = np.asarray(camera.params, dtype=np.float64)
    if model in ("SIMPLE_PINHOLE", "SIMPLE_RADIAL", "RADIAL", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE"):
        fx = fy = p[0]
        cx, cy = p[1], p[2]
    elif model in ("PINHOLE", "OPENCV", "OPENCV_FISHEYE"):
        fx, fy, cx, cy = p[:4]
    else:
        raise DataError(
            f"{cameras_file}: camera {camera.camera_id} has model {model}; supported: "
            "SIMPLE_PINHOLE, PINHOLE, SIMPLE_RADIAL, RADIAL, OPENCV, and with --camera_model "
            f"fisheye {', '.join(FISHEYE_MODELS)} (undistort the images with `colmap "
            "image_undistorter` first)"
        )
    coeffs = np.zeros(4)  # k1, k2, p1, p2 (fisheye: k1..k4)
    if model in ("SIMPLE_RADIAL", "SIMPLE_RADIAL_FISHEYE"):
        coeffs[0] = p[3]
    elif model in ("RADIAL", "RADIAL_FISHEYE"):
        coeffs[:2] = p[3:5]
    elif model in ("OPENCV", "OPENCV_FISHEYE"):
        coeffs[:] = p[4:8]
    K = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
    fisheye = model in FISHEYE_MODELS
    return K, (coeffs if np.any(coeffs) or fisheye else None), fisheye


def load_colmap(
    data_dir: Path,
    model_dir: Path,
    data_factor: int,
    normalize: bool,
    log: Optional[Callable[[str], None]] = None,
    tracks: bool = False,
    need_points: bool = False,
) -> Scene:
    """Read the model in model_dir and the images under data_dir -> Scene (source "colmap").
    ``log``: see images.locate_images. Loss masks (masks.py): ``masks/`` files of the images'
    names and the images' alpha channels. ``tracks``: fill each Camera's ``point_ids`` with the
    3D points its image observes (the SfM tracks; --depth_loss).

    Registered images are sorted by name. Raises DataError when the model cannot be read, has no
    registered image, uses an unsupported camera model, or lists images missing on disk.
    Zero 3D points is allowed (points is then [0, 3]) unless ``need_points`` (--init_type sfm):
    then a DataError, before any image is downscaled.
    """
    try:
        reconstruction = pycolmap.Reconstruction(str(model_dir))
    except Exception as exc:  # pycolmap raises ValueError / RuntimeError with its own text
        raise DataError(f"cannot read COLMAP model {model_dir}: {exc}") from exc
    images = sorted((im for im in reconstruction.images.values() if im.has_pose), key=lambda im: im.name)
    if not images:
        raise DataError(f"COLMAP model {model_dir} has no registered images")
    if need_points and not len(reconstruction.points3D):
        raise no_points_error(data_dir)

    cameras_file = _model_file(model_dir, "cameras")
    intrinsics = {
        cid: pinhole_and_distortion(reconstruction.cameras[cid], cameras_file)
        for cid in sorted({im.camera_id for im in images})
    }

    images_dir = data_dir / IMAGES_FOLDER
    if data_factor > 1 and (data_dir / f"{IMAGES_FOLDER}_{data_factor}").is_dir():
        images_dir = data_dir / f"{IMAGES_FOLDER}_{data_factor}"  # the originals are not needed
    missing = [im.name for im in images if not (images_dir / im.name).is_file()]
    if missing:
        raise DataError(
            f"{len(missing)} of the {len(images)} images registered in {model_dir} "
            f"are missing from {images_dir}: {', '.join(missing[:5])}"
            + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
        )

    sizes = [(reconstruction.cameras[im.camera_id].width, reconstruction.cameras[im.camera_id].height) for im in images]
    located = locate_images(data_dir, IMAGES_FOLDER, [im.name for im in images], sizes, data_factor, log)

    names = [im.name for im in images]
    mask_names = find_mask_names(data_dir, names)
    with_mask = [i for i, m in enumerate(mask_names) if m is not None]
    mask_files = locate_images(
        data_dir, MASKS_FOLDER, [str(mask_names[i]) for i in with_mask], [sizes[i] for i in with_mask], data_factor, log
    )
    mask_paths: list[Optional[Path]] = [None] * len(images)
    for i, (path, _, _) in zip(with_mask, mask_files):
        mask_paths[i] = path
    alphas = alpha_sources(
        data_dir, IMAGES_FOLDER, names, [data_dir / IMAGES_FOLDER / n for n in names], located, data_factor
    )

    camtoworlds = np.stack([np.linalg.inv(_cam_from_world(im)) for im in images])  # [C, 4, 4]
    point_rows = {pid: row for row, pid in enumerate(reconstruction.points3D)}
    points: Any = np.array([p.xyz for p in reconstruction.points3D.values()], dtype=np.float64).reshape(-1, 3)
    points_rgb = np.array([p.color for p in reconstruction.points3D.values()], dtype=np.uint8).reshape(-1, 3)
    transform: Any = np.eye(4)
    if normalize:
        camtoworlds, points, transform = normalize_world(camtoworlds, points)

    num_users: dict[int, int] = {}
    for im in images:
        num_users[im.camera_id] = num_users.get(im.camera_id, 0) + 1
    undistortions = {}  # (camera_id, file width, file height) -> Undistortion, shared by its images
    cameras = []
    observed = _observations(reconstruction, point_rows) if tracks else {}
    for i, (im, (path, file_w, file_h), (w, h), camtoworld) in enumerate(zip(images, located, sizes, camtoworlds)):
        K, coeffs, fisheye = intrinsics[im.camera_id]
        K = np.diag([file_w / w, file_h / h, 1.0]) @ K  # actual downscale ratio per axis
        dist = None
        if coeffs is not None:
            key = (im.camera_id, file_w, file_h)
            if key not in undistortions:
                plan = make_fisheye_undistortion if fisheye else make_undistortion
                undistortions[key] = plan(
                    K,
                    coeffs,
                    file_w,
                    file_h,
                    what=f"{cameras_file} camera {im.camera_id}",
                    cache_maps=num_users[im.camera_id] > 1,
                    model=f"COLMAP {reconstruction.cameras[im.camera_id].model.name}",
                )
            dist = undistortions[key]
            K, file_w, file_h = dist.K, dist.width, dist.height
        cameras.append(
            Camera(
                name=im.name,
                image_path=path,
                camtoworld=camtoworld.astype(np.float32),
                K=K.astype(np.float32),
                width=int(file_w),
                height=int(file_h),
                dist=dist,
                model="fisheye" if fisheye else "pinhole",
                mask_path=mask_paths[i],
                alpha_path=alphas[i],
                point_ids=np.asarray(observed.get(im.image_id, []), dtype=np.int64) if tracks else None,
            )
        )

    return Scene(
        cameras=cameras,
        points=points.astype(np.float32),
        points_rgb=points_rgb,
        scene_scale=scene_scale(camtoworlds),
        transform=transform.astype(np.float32),
        source="colmap",
    )


def _observations(reconstruction, point_rows: dict) -> dict:
    """image_id -> rows of Scene.points the image observes (each 3D point's track), once per
    point even when a track visits an image twice."""
    seen: dict = {}
    for pid, point in reconstruction.points3D.items():
        row = point_rows[pid]
        for image_id in {el.image_id for el in point.track.elements}:
            seen.setdefault(image_id, []).append(row)
    return seen


def _cam_from_world(image) -> np.ndarray:
    """[4, 4] float64 world-to-camera of a pycolmap Image (a method in pycolmap >= 3.12)."""
    pose = image.cam_from_world
    pose = pose() if callable(pose) else pose
    viewmat = np.eye(4)
    viewmat[:3, :] = pose.matrix()
    return viewmat

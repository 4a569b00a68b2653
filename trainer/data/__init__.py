"""The data layer: scenes (COLMAP, NeRF transforms.json, synthetic), images, split, sampling.

    scene = load_scene(data_dir, data_factor=4)
    train, test = split_indices(len(scene.cameras), test_every=8)
    dataset = Dataset(scene, train)
    sampler = CameraSampler(dataset, batch_size=1, seed=42, rank=rank)
    batch = dataset.batch(sampler.batch_at(step))

Conventions: camtoworlds are OpenCV axes (x right, y down, z forward) in the normalized world
(normalize.py); K is a pinhole in pixels at the loaded resolution, after downscaling and
undistortion; cameras are sorted by name.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

from .colmap import find_model, load_colmap
from .images import Camera, DataError, Scene, Undistortion, cache_root, load_image
from .masks import has_masks, load_view, mask_lines
from .nerf import load_nerf
from .sampler import CameraSampler, Dataset, split_indices

__all__ = [
    "Camera",
    "CameraSampler",
    "DataError",
    "Dataset",
    "Scene",
    "Undistortion",
    "describe_views",
    "has_masks",
    "load_image",
    "load_scene",
    "load_view",
    "split_indices",
]


def load_scene(
    data_dir: Path,
    data_factor: int = 1,
    normalize: bool = True,
    log: Optional[Callable[[str], None]] = None,
    tracks: bool = False,
    warn: Optional[Callable[[str], None]] = None,
    need_points: bool = False,
) -> Scene:
    """Load the scene in data_dir, images downscaled by data_factor.

    Dispatch: a COLMAP model in data_dir/sparse/0 or data_dir/sparse (binary or text), else
    data_dir/transforms.json. Raises DataError when data_dir is not a folder, data_factor is not a
    positive integer, neither format is found, or the data is malformed (see colmap.py, nerf.py).
    ``log``, when given, is called with one line before slow work (downscaling into the cache).
    ``tracks``: each camera's ``point_ids`` (the SfM points its image sees; COLMAP only).
    ``warn``: given each warning line (NeRF frames skipped; default: the package logger).
    ``need_points`` (--init_type sfm): a scene without 3D points is a DataError, raised before
    any image is downscaled.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"data dir {data_dir} does not exist or is not a folder")
    if int(data_factor) != data_factor or data_factor < 1:
        raise DataError(f"data_factor={data_factor} must be a positive integer")
    model_dir = find_model(data_dir)
    if model_dir is not None:
        return load_colmap(
            data_dir, model_dir, int(data_factor), normalize, log, tracks=tracks, need_points=need_points
        )
    if (data_dir / "transforms.json").is_file():
        return load_nerf(data_dir / "transforms.json", int(data_factor), normalize, log, warn, need_points)
    raise DataError(
        f"{data_dir} holds neither a COLMAP model (sparse/0/ or sparse/ with cameras, "
        "images, points3D as .bin or .txt) nor a transforms.json"
    )


def _sizes(pairs: list[tuple[int, int]]) -> str:
    """ "480x270", or "480x360 (39), 360x480 (17)" for several sizes (most common first)."""
    counts = Counter(pairs).most_common()
    if len(counts) == 1:
        return f"{counts[0][0][0]}x{counts[0][0][1]}"
    return ", ".join(f"{w}x{h} ({n})" for (w, h), n in counts)


def describe_views(
    scene: Scene, train: list[int], test: list[int], alpha_as_mask: bool = True, cache_bytes: int = 0
) -> list[str]:
    """One line on the images about to be decoded (count, size, where they are read from, the
    memory they take as uint8, or the bounded cache they stream through when ``cache_bytes`` is
    set), one on undistortion when a camera has distortion, and one per kind of loss mask the
    views have (masks.mask_lines)."""
    cameras = scene.cameras
    channels = 4 if has_masks(scene, alpha_as_mask) else 3  # a mask travels as a fourth channel (views.py)
    num_bytes = channels * sum(c.width * c.height for c in cameras)
    sizes = _sizes([(c.width, c.height) for c in cameras])
    size = f"{len(cameras)} views ({len(train)} train, {len(test)} test), {sizes}"
    if scene.images is not None:
        lines = [f"images: {size}, rendered ({scene.source} scene), {num_bytes / 2**20:,.1f} MB in memory"]
    else:
        folders = sorted({str(c.image_path.parent) for c in cameras})
        cached = [f for f in folders if Path(f).is_relative_to(cache_root())]
        source = ("the downscale cache " if cached else "") + (
            folders[0] if len(folders) == 1 else f"{len(folders)} folders under {Path(folders[0]).parent}"
        )
        if cache_bytes > 0:
            lines = [
                f"images: {size}, read from {source}: {num_bytes / 2**20:,.1f} MB decoded as needed into a "
                f"cache of {cache_bytes / 2**30:g} GiB (--image_cache_gb)"
            ]
        else:
            lines = [f"images: {size}, read from {source}: decoding {num_bytes / 2**20:,.1f} MB into memory"]
    distorted = [c for c in cameras if c.dist is not None and not c.dist.fisheye]
    fisheyes = [c for c in cameras if c.dist is not None and c.dist.fisheye]
    dist: dict[int, Any] = {id(c): c.dist for c in distorted + fisheyes}  # none of them None
    if fisheyes:
        models = ", ".join(sorted({dist[id(c)].model for c in fisheyes}))
        lines.append(
            f"fisheye: {models} remapped to an ideal equidistant fisheye for {len(fisheyes)} of "
            f"{len(cameras)} views, cropped to the pixels that see the image "
            f"({_sizes([(dist[id(c)].src_width, dist[id(c)].src_height) for c in fisheyes])} -> "
            f"{_sizes([(c.width, c.height) for c in fisheyes])}); the rest of the crop is masked"
        )
    if distorted:
        models = ", ".join(sorted({dist[id(c)].model or "distortion" for c in distorted}))
        before = _sizes([(dist[id(c)].src_width, dist[id(c)].src_height) for c in distorted])
        after = _sizes([(c.width, c.height) for c in distorted])
        lines.append(
            f"distortion: {models} undone with OpenCV for {len(distorted)} of {len(cameras)} views, "
            f"cropped to the valid region: {before} -> {after}"
        )
    return lines + mask_lines(scene, alpha_as_mask)


def scene_from_config(cfg, log: Optional[Callable[[str], None]] = None) -> Scene:
    """The scene of ``cfg``: the data dir's, or the embedded synthetic one. ``log``: a callable
    given one line before slow loading work (data.load_scene); warnings are said where it is
    given (the process that speaks for the job) and dropped elsewhere. The synthetic scene's ground truth
    is rendered on the GPU when the run trains on one (gsplat's ops; the CPU reference renderer
    takes minutes for millions of Gaussians at full-HD sizes). ``--synthetic_layout city``: the
    city of data/city.py rendered with the run's near and far planes; DataError when the run
    needs what it has not (a camera model other than pinhole, SfM tracks for --depth_loss)."""
    import torch

    from .city import make_city_scene
    from .synthetic import make_synthetic_scene

    if cfg.data.data_dir is None:
        device = "cuda" if cfg.distributed.device != "cpu" and torch.cuda.is_available() else "cpu"
        width, height = cfg.data.synthetic_image_size, cfg.data.synthetic_image_height or cfg.data.synthetic_image_size
        if cfg.data.synthetic_layout == "city":
            if cfg.data.camera_model != "pinhole":
                raise DataError(f"--camera_model {cfg.data.camera_model}: the city's cameras are pinholes")
            if cfg.step.depth_loss:
                raise DataError("--depth_loss needs SfM tracks, which the city has not; use --synthetic_layout orbit")
            return make_city_scene(
                cfg.data.synthetic_num_gaussians,
                cfg.data.synthetic_num_cameras,
                width,
                height,
                device=device,
                near_plane=cfg.step.near_plane,
                far_plane=cfg.step.far_plane,
            )
        return make_synthetic_scene(
            cfg.data.synthetic_num_gaussians,
            cfg.data.synthetic_num_cameras,
            width,
            height=height,
            seed=0,
            camera_model=cfg.data.camera_model,
            tracks=cfg.step.depth_loss,
            device=device,
        )
    if not Path(cfg.data.data_dir).is_dir():
        raise DataError(f"--data_dir: no such folder: {cfg.data.data_dir}")
    return load_scene(
        Path(cfg.data.data_dir),
        cfg.data.data_factor,
        normalize=cfg.data.normalize_world_space,
        log=log,
        tracks=cfg.step.depth_loss,
        warn=None if log is not None else (lambda line: None),
        need_points=cfg.model.init_type == "sfm",
    )

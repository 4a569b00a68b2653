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

from pathlib import Path

from .colmap import find_model, load_colmap
from .images import Camera, DataError, Scene, Undistortion, load_image
from .nerf import load_nerf
from .sampler import CameraSampler, Dataset, split_indices

__all__ = ["Camera", "CameraSampler", "DataError", "Dataset", "Scene", "Undistortion",
           "load_image", "load_scene", "split_indices"]


def load_scene(data_dir: Path, data_factor: int = 1, normalize: bool = True) -> Scene:
    """Load the scene in data_dir, images downscaled by data_factor.

    Dispatch: a COLMAP model in data_dir/sparse/0 or data_dir/sparse (binary or text), else
    data_dir/transforms.json. Raises DataError when data_dir is not a folder, data_factor is not a
    positive integer, neither format is found, or the data is malformed (see colmap.py, nerf.py).
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"data dir {data_dir} does not exist or is not a folder")
    if int(data_factor) != data_factor or data_factor < 1:
        raise DataError(f"data_factor={data_factor} must be a positive integer")
    model_dir = find_model(data_dir)
    if model_dir is not None:
        return load_colmap(data_dir, model_dir, int(data_factor), normalize)
    if (data_dir / "transforms.json").is_file():
        return load_nerf(data_dir / "transforms.json", int(data_factor), normalize)
    raise DataError(f"{data_dir} holds neither a COLMAP model (sparse/0/ or sparse/ with cameras, "
                    "images, points3D as .bin or .txt) nor a transforms.json")

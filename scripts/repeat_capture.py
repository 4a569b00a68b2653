"""Make a large capture from a small one: every image of a COLMAP capture repeated with jittered
poses, for testing datasets that do not fit in memory (a streaming loader, bounded host memory).

    python -m splat_train.scripts.repeat_capture SRC OUT --frames 20000 --data_factor 2

OUT gets a COLMAP text model (``sparse/0``: the source cameras, ``frames`` images whose poses are
the source poses turned by up to ``--jitter_deg`` degrees and moved by up to ``--jitter`` times
the cameras' spread, the source points with empty tracks) and ``images_<f>/`` holding one
symbolic link per frame to the source's ``images_<f>/`` file (nothing is copied: 20,000 frames of
juicebox at f = 2 decode to 31 GB but take no disk). Train it with ``--data_factor <f>``.
Raises SystemExit (2) naming the folder when the source has no model or no ``images_<f>/``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def _quat_wxyz(R: np.ndarray) -> np.ndarray:
    from scipy.spatial.transform import Rotation

    x, y, z, w = Rotation.from_matrix(R).as_quat()
    return np.array([w, x, y, z])


def repeat_capture(
    src: Path, out: Path, frames: int, data_factor: int, jitter: float = 0.01, jitter_deg: float = 0.5, seed: int = 0
) -> int:
    """Write the repeated capture (module docstring); returns the number of frames written."""
    import pycolmap
    from scipy.spatial.transform import Rotation

    from splat_train.trainer.data.colmap import find_model

    model_dir = find_model(src)
    if model_dir is None:
        raise SystemExit(f"error: {src} has no COLMAP model (sparse/0 or sparse)")
    folder = "images" if data_factor == 1 else f"images_{data_factor}"
    if not (src / folder).is_dir():
        raise SystemExit(f"error: {src / folder} does not exist; pass the --data_factor of an existing folder")
    rec = pycolmap.Reconstruction(str(model_dir))
    images = sorted((im for im in rec.images.values() if im.has_pose), key=lambda im: im.name)
    poses = []
    for im in images:
        pose = im.cam_from_world() if callable(im.cam_from_world) else im.cam_from_world
        poses.append((np.asarray(pose.rotation.matrix()), np.asarray(pose.translation)))
    centres = np.stack([-R.T @ t for R, t in poses])
    spread = float(np.linalg.norm(centres - centres.mean(0), axis=1).max()) or 1.0
    rng = np.random.default_rng(seed)
    sparse = out / "sparse" / "0"
    sparse.mkdir(parents=True, exist_ok=True)
    (out / folder).mkdir(exist_ok=True)
    with open(sparse / "cameras.txt", "w") as f:
        for cam in rec.cameras.values():
            params = " ".join(repr(float(v)) for v in cam.params)
            f.write(f"{cam.camera_id} {cam.model.name} {cam.width} {cam.height} {params}\n")
    width = len(str(frames - 1))
    with open(sparse / "images.txt", "w") as f:
        for i in range(frames):
            j = i % len(images)
            R, t = poses[j]
            turn = Rotation.from_rotvec(rng.normal(size=3) * np.radians(jitter_deg) / np.sqrt(3)).as_matrix()
            centre = centres[j] + rng.uniform(-1, 1, size=3) * jitter * spread
            R_new = turn @ R
            t_new = -R_new @ centre
            q = _quat_wxyz(R_new)
            name = f"{i:0{width}d}{Path(images[j].name).suffix}"
            f.write(
                f"{i + 1} {' '.join(repr(float(v)) for v in q)} {' '.join(repr(float(v)) for v in t_new)} "
                f"{images[j].camera_id} {name}\n\n"
            )
            link = out / folder / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to((src / folder / images[j].name).resolve())
    with open(sparse / "points3D.txt", "w") as f:
        for pid, p in rec.points3D.items():
            x, y, z = (repr(float(v)) for v in p.xyz)
            r, g, b = (int(v) for v in p.color)
            f.write(f"{pid} {x} {y} {z} {r} {g} {b} 0\n")
    return frames


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m splat_train.scripts.repeat_capture", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("src", type=Path, help="a COLMAP capture (sparse/0, images_<f>/)")
    p.add_argument("out", type=Path, help="where the repeated capture goes")
    p.add_argument("--frames", type=int, default=20000)
    p.add_argument("--data_factor", type=int, default=2, help="the image folder images_<f>/ to link (1: images/)")
    p.add_argument("--jitter", type=float, default=0.01, help="camera centre jitter, fraction of the cameras' spread")
    p.add_argument("--jitter_deg", type=float, default=0.5, help="rotation jitter, degrees")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.frames < 1 or args.data_factor < 1:
        p.error("--frames and --data_factor must be >= 1")
    n = repeat_capture(args.src, args.out, args.frames, args.data_factor, args.jitter, args.jitter_deg, args.seed)
    print(f"{n} frames in {args.out} (train it with --data_factor {args.data_factor})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

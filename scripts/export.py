"""Convert a run's checkpoints (any world size) into the formats other tools open, offline.

    python -m splat_train.scripts.export RESULT_DIR [--format ply inria splat ply_compressed]
                                         [--step N] [--frame original|normalized] [--out DIR]

Reads ``RESULT_DIR/ckpts/ckpt_<step>_rank<r>.pt`` of every rank of the newest complete step (or
``--step``), concatenates the shards in rank order (as the trainer's own export does), moves the
Gaussians into the frame (``--frame``; by default the run's own ``--export_frame``) and writes,
under ``--out`` (default RESULT_DIR), the PLY (``ply/point_cloud_<step>[_distributed_merged].ply``,
always: the other formats derive from it) and each ``--format`` as the trainer names them
(trainer/formats.py). Everything runs on the CPU (gsplat's exporter is plain PyTorch).

The frame comes from the world transform the checkpoint records; for checkpoints written before
it did, and for the Inria layout's cameras.json, the run's scene is loaded again from its config
(``--data_dir``, or the synthetic scene), which must still be readable.
Exit status 2 with one ``error:`` line when the checkpoints, the scene or a format cannot be had.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from splat_train.trainer import checkpoint
from splat_train.trainer.config import Config, apply_overrides
from splat_train.trainer.export import merge_shards, ply_name, save_ply, to_export_frame, write_formats

FORMATS = ("ply", "inria", "splat", "ply_compressed")


def _scene(cfg: Config):
    """The run's scene, loaded as the trainer loads it; ValueError naming the data dir otherwise."""
    from splat_train.trainer.data import scene_from_config

    try:
        return scene_from_config(cfg)
    except ValueError as e:  # data.DataError too
        raise ValueError(
            f"cannot load the run's scene ({e}); it is needed for the frame of checkpoints that "
            "predate the recorded world transform and for the Inria cameras.json"
        ) from e


def convert(
    result_dir: Path,
    formats=("ply",),
    step: Optional[int] = None,
    frame: Optional[str] = None,
    out_dir: Optional[Path] = None,
    ply_out: Optional[Path] = None,
) -> list[Path]:
    """Write the PLY and ``formats`` of ``result_dir``'s checkpoints (see the module docstring);
    ``ply_out`` overrides the PLY's path. Returns the paths written. Raises ValueError naming what
    is missing (checkpoints, scene, an unknown format or frame); OSError from the file system."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or frame not in (None, "original", "normalized"):
        raise ValueError(
            f"unknown format(s) {unknown} or frame {frame!r}; formats: {FORMATS}, frames: original, normalized"
        )
    result_dir = Path(result_dir)
    step, files = checkpoint.step_files(result_dir / "ckpts", step)
    states = [checkpoint.read(f) for f in files]
    cfg = apply_overrides(Config(), states[0].get("config") or {}, str(files[0]))
    frame = frame or cfg.outputs.export_frame
    scene = None
    transform = states[0].get("world_transform")
    if transform is None and frame == "original":
        scene = _scene(cfg)
        transform = scene.transform
    params, to_frame = to_export_frame(
        merge_shards([s["params"] for s in states]),
        np.eye(4) if transform is None else np.asarray(transform, dtype=np.float64),
        frame,
    )
    out_dir = Path(out_dir) if out_dir else result_dir
    path = Path(ply_out) if ply_out else out_dir / "ply" / ply_name(step, len(files))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_ply(
        path, params["means"], params["scales"], params["quats"], params["opacities"], params["sh0"], params["shN"]
    )

    def training_cameras():
        from splat_train.trainer.data import split_indices

        loaded = scene or _scene(cfg)
        return [loaded.cameras[i] for i in split_indices(len(loaded.cameras), cfg.data.test_every)[0]]

    export = dict(step=step, path=path, params=params, to_frame=to_frame)
    return [path, *write_formats(formats, export, out_dir, training_cameras, cfg)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m splat_train.scripts.export", description=__doc__.split("\n\n")[0])
    p.add_argument("result_dir", type=Path, help="a run's --result_dir (holding ckpts/)")
    p.add_argument("--format", nargs="+", default=["ply"], choices=FORMATS, help="formats to write (default: ply)")
    p.add_argument("--step", type=int, help="the checkpoint step (default: the newest complete one)")
    p.add_argument(
        "--frame",
        choices=("original", "normalized"),
        help="the input data's frame or the trainer's normalized world (default: the run's --export_frame)",
    )
    p.add_argument("--out", type=Path, help="folder to write into (default: RESULT_DIR)")
    args = p.parse_args(argv)
    try:
        written = convert(args.result_dir, args.format, args.step, args.frame, args.out)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

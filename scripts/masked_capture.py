"""The masked-capture experiment: a COLMAP capture whose training images are painted
over in a region, with masks covering the paint, and the test PSNR inside that region.

    python -m splat_train.scripts.masked_capture make SRC DST [--region X0 Y0 X1 Y1] [--moving] [--test_every 8]
    python -m splat_train.scripts.masked_capture score RUN_DIR --step 7000 [--region X0 Y0 X1 Y1] [--moving]

``make`` writes two captures next to each other, sharing SRC's model (copied) and its test views
(copied unchanged, unpainted, without masks):

* ``DST/``: every training view (name order, ``i % test_every != 0``, the trainer's split) has the
  rectangle ``--region`` (fractions of the width and height) painted ``--colour`` (solid red by
  default) and a ``masks/<name>`` file, black over the rectangle grown by ``--margin`` pixels
  (JPEG's 8x8 blocks spread the paint: the margin covers them), white elsewhere;
* ``DST-unmasked/``: the same painted images without ``masks/``: what training on them without
  masks sees.

With ``--moving`` the rectangle keeps the size of ``--region`` but its centre visits the centres of
the frame's four quadrants in turn (the k-th training view: quadrant k mod 4, row-major), so every
part of the frame is painted in at most a quarter of the training views. A forward-facing capture
(juicebox) sees nearly the same content in the middle of every view: a fixed rectangle there hides
that content from every training view, and no masking can bring it back; a moving one leaves it
visible in the other views, which is the case masks are for.

``score`` reads a run's side-by-side test renders (``renders/val_step<step>_<name>.png``,
ground truth | render, trainer/evaluate.py) and prints the PSNR over the whole images and inside
the rectangle (the region the training views had painted; with ``--moving``, the union of its
four positions), each the mean over the test views of the per-view PSNR, and writes them to ``RUN_DIR/stats/region_psnr_step<step>.json``.
Errors (a missing folder, no renders of that step) are one line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np

from ..trainer.data.colmap import find_model
from ..trainer.data.sampler import split_indices

DEFAULT_REGION = (0.35, 0.3, 0.65, 0.7)  # x0 y0 x1 y1 as fractions: the middle of the frame


def _pixels(region, width: int, height: int, margin: int = 0) -> tuple[int, int, int, int]:
    """The region's pixel box (x0, y0, x1, y1), grown by ``margin`` and clipped to the image."""
    x0, y0, x1, y1 = region
    return (
        max(int(x0 * width) - margin, 0),
        max(int(y0 * height) - margin, 0),
        min(int(round(x1 * width)) + margin, width),
        min(int(round(y1 * height)) + margin, height),
    )


def make(src: Path, dst: Path, region, colour, margin: int, test_every: int, moving: bool = False) -> list[str]:
    """Write DST and DST-unmasked from the COLMAP capture SRC (module docstring); returns the
    painted image names. Raises ValueError naming the folder when SRC is not a COLMAP capture or
    DST exists."""
    model = find_model(src)
    if model is None or not (src / "images").is_dir():
        raise ValueError(f"{src} is not a COLMAP capture (images/ and sparse/0 or sparse)")
    unmasked = dst.with_name(dst.name + "-unmasked")
    for out in (dst, unmasked):
        if out.exists():
            raise ValueError(f"{out} exists; remove it or choose another DST")
    import pycolmap

    names = sorted(im.name for im in pycolmap.Reconstruction(str(model)).images.values())
    train, _ = split_indices(len(names), test_every)
    painted = [names[i] for i in train]
    for out in (dst, unmasked):
        shutil.copytree(model, out / model.relative_to(src))
        (out / "images").mkdir(parents=True)
    (dst / "masks").mkdir()
    for name in names:
        source = src / "images" / name
        if name not in painted:
            for out in (dst, unmasked):
                (out / "images" / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, out / "images" / name)
            continue
        image = cv2.imread(str(source), cv2.IMREAD_COLOR)
        if image is None:
            raise ValueError(f"cannot read {source}")
        h, w = image.shape[:2]
        boxes = _regions(region, moving)
        here = boxes[painted.index(name) % len(boxes)]
        x0, y0, x1, y1 = _pixels(here, w, h)
        image[y0:y1, x0:x1] = colour[::-1]  # OpenCV stores BGR
        ok, encoded = cv2.imencode(Path(name).suffix or ".png", image, [cv2.IMWRITE_JPEG_QUALITY, 95])
        assert ok, name
        for out in (dst, unmasked):
            (out / "images" / name).parent.mkdir(parents=True, exist_ok=True)
            (out / "images" / name).write_bytes(encoded.tobytes())
        mask = np.full((h, w), 255, np.uint8)
        mx0, my0, mx1, my1 = _pixels(here, w, h, margin)
        mask[my0:my1, mx0:mx1] = 0
        (dst / "masks" / name).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str((dst / "masks" / name).with_suffix(".png")), mask)
    return painted


def _regions(region, moving: bool) -> list:
    """The rectangles (fractions) the training views are painted with: ``region`` itself, or with
    ``moving`` its size centred on each quadrant's centre (the module docstring)."""
    if not moving:
        return [tuple(region)]
    x0, y0, x1, y1 = region
    hw, hh = (x1 - x0) / 2, (y1 - y0) / 2
    return [(cx - hw, cy - hh, cx + hw, cy + hh) for cy in (0.25, 0.75) for cx in (0.25, 0.75)]


def _psnr(a: np.ndarray, b: np.ndarray, keep: np.ndarray | None = None) -> float:
    if keep is not None:  # the pixels of a bool [H, W] mask
        a, b = a[keep], b[keep]
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)) / 255.0**2
    return float("inf") if mse == 0 else -10.0 * np.log10(mse)


def score(run_dir: Path, step: int, region, moving: bool = False) -> dict:
    """The PSNRs of the module docstring from RUN_DIR's renders of ``step``; ValueError naming
    the folder when there are none."""
    files = sorted((run_dir / "renders").glob(f"val_step{step}_*.png"))
    if not files:
        raise ValueError(f"no test renders {run_dir / 'renders'}/val_step{step}_*.png (was --save_eval_images on?)")
    whole, inside = [], []
    for path in files:
        pair = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if pair is None:
            raise ValueError(f"cannot read {path}")
        w = pair.shape[1] // 2
        gt, render = pair[:, :w], pair[:, w:]
        keep = np.zeros(pair.shape[:2], dtype=np.bool_)[:, :w]
        for box in _regions(region, moving):
            x0, y0, x1, y1 = _pixels(box, w, pair.shape[0])
            keep[y0:y1, x0:x1] = True
        whole.append(_psnr(gt, render))
        inside.append(_psnr(gt, render, keep))
    out = dict(
        step=step,
        num_views=len(files),
        region=list(region),
        moving=moving,
        psnr=float(np.mean(whole)),
        psnr_in_region=float(np.mean(inside)),
        per_view_in_region=inside,
    )
    (run_dir / "stats").mkdir(exist_ok=True)
    (run_dir / "stats" / f"region_psnr_step{step}.json").write_text(json.dumps(out, indent=2))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m splat_train.scripts.masked_capture", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_make = sub.add_parser("make", help="write the painted capture with masks, and one without them")
    p_make.add_argument("src", type=Path)
    p_make.add_argument("dst", type=Path)
    p_make.add_argument("--colour", type=int, nargs=3, default=(255, 0, 0), help="paint, RGB 0..255")
    p_make.add_argument("--margin", type=int, default=16, help="mask margin around the paint, pixels")
    p_make.add_argument("--test_every", type=int, default=8, help="the trainer's --test_every (views left clean)")
    p_score = sub.add_parser("score", help="test PSNR inside the painted region of a run's renders")
    p_score.add_argument("run_dir", type=Path)
    p_score.add_argument("--step", type=int, required=True)
    for p in (p_make, p_score):
        p.add_argument("--moving", action="store_true", help="the rectangle visits the four quadrants in turn")
        p.add_argument(
            "--region",
            type=float,
            nargs=4,
            default=DEFAULT_REGION,
            metavar=("X0", "Y0", "X1", "Y1"),
            help="the painted rectangle, fractions of the width and height",
        )
    args = parser.parse_args(argv)
    try:
        if args.command == "make":
            painted = make(
                args.src, args.dst, args.region, tuple(args.colour), args.margin, args.test_every, args.moving
            )
            print(f"painted {len(painted)} training views; {args.dst} (masks/) and {args.dst}-unmasked")
        else:
            out = score(args.run_dir, args.step, args.region, args.moving)
            print(
                f"{args.run_dir}: test PSNR {out['psnr']:.3f}, inside the region {out['psnr_in_region']:.3f} "
                f"({out['num_views']} views)"
            )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

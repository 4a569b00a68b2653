"""Evaluation on the test views: every rank renders, rank 0 scores and writes.

Test views are dealt round-robin to the ranks (view i to rank i mod W); each round every rank
renders one view collectively (a rank with none left re-renders its last one and discards it,
so the collectives line up). Rank 0 gathers the renders, computes PSNR / SSIM / LPIPS (when its
weights are available offline), writes ``stats/val_step<step>.json``, side-by-side PNGs
``renders/val_step<step>_<name>.png`` (ground truth | render), TensorBoard scalars and, as gsplat
does, a video along the ``--render_traj_path`` camera path (trajectory.py; ``videos/traj_<step>.mp4``).
A test view's loss mask (data/masks.py) zeroes its render and ground truth before scoring.

The PNGs and the video are optional outputs: written after the metrics (and by the trainer
after the checkpoint and the PLY), and a failure to write one is a warning line (:func:`optional`),
never the end of a run that has its model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import torch

from . import exchange, metrics
from .fileio import atomic_write
from .render import CameraBatch, RenderSetup, rigid_inverse
from .trajectory import trajectory

if TYPE_CHECKING:  # pragma: no cover
    from .config import Config
    from .data import Dataset, Scene
    from .report import Reporter
    from .shard import GaussianShard


@torch.no_grad()
def render_views(
    shard: "GaussianShard", setup: RenderSetup, cams: list[CameraBatch], progress: Optional[Callable[[], None]] = None
) -> list[np.ndarray]:
    """Render ``cams`` (this rank's share) collectively at the full SH degree; returns float32
    [H, W, 3] arrays. ``progress``: called after each round.

    Every rank must call this with the same number of rounds: pass the same ``len(cams)`` (pad
    this rank's share of exchange.deal_views)."""
    gaussians = shard.activated()
    out = []
    for cam in cams:
        res = setup(gaussians, cam)
        assert res.colors is not None
        out.append(res.colors[0].clamp(0, 1).float().cpu().numpy())
        if progress is not None:
            progress()
    return out


def optional(what: str, write: Callable[[], Optional[Path]]) -> Optional[Path]:
    """Run ``write`` (one optional output, rank 0's part only: no collective inside) and return its
    result; if it raises an Exception, print one warning line naming ``what`` and the error, and
    return None."""
    from tqdm import tqdm

    try:
        return write()
    except Exception as e:  # an optional output never ends a run that has its model
        reason = (str(e).strip().splitlines() or [""])[0]
        tqdm.write(f"warning: {what} not written ({type(e).__name__}: {reason}); the model and metrics are saved")
        return None


def require_lpips(cfg) -> Optional[metrics.LPIPSMetric]:
    """With --lpips_weights: the metric, built now (before any image is decoded); ValueError naming
    the flag and the file when it cannot be built from it (a file the user named is an error, not
    a note). None without the flag (the metric is then built at the first evaluation)."""
    if cfg.outputs.lpips_weights is None:
        return None
    metric = metrics.LPIPSMetric(cfg.outputs.lpips_net, weights=cfg.outputs.lpips_weights)
    if not metric.available:
        raise ValueError(f"--lpips_weights {cfg.outputs.lpips_weights}: {metric.reason}")
    return metric


PNG_BATCH = 4  # side-by-side test renders a rank keeps before writing them


def _write_some(folder: Path, step: int, pngs: list) -> None:
    """Write and forget the pending test renders (an optional output: a failure is one warning)."""
    batch = list(pngs)
    pngs.clear()
    optional(f"test renders {folder}/val_step{step}_*.png", lambda: _write_pngs(folder, step, batch))


def _write_pngs(folder: Path, step: int, images: list[tuple[str, np.ndarray]]) -> Path:
    """``folder/val_step<step>_<name stem>.png`` for each (camera name, float [H, W, 3] image)."""
    for name, image in images:
        _write_png(folder / f"val_step{step}_{Path(name).stem}.png", image)
    return folder


def _write_png(path: Path, image: np.ndarray) -> None:
    """A float [H, W, 3] image in [0, 1] as an 8-bit PNG (data/images.write_png)."""
    from .data.images import write_png

    path.parent.mkdir(parents=True, exist_ok=True)
    write_png(path, (np.clip(image, 0, 1) * 255.0 + 0.5).astype(np.uint8))


def even_size(frame: np.ndarray) -> np.ndarray:
    """[H, W, 3] -> [H + H % 2, W + W % 2, 3]: the last row / column repeated where the size is
    odd. H.264 in yuv420p (what players decode) stores colour at half resolution, so libx264
    refuses odd sizes; padding keeps every pixel (a crop would drop one)."""
    return np.pad(frame, ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0)), mode="edge")


def write_video(path: Path, frames: list[np.ndarray], fps: int = 30) -> Path:
    """Encode float [H, W, 3] frames in [0, 1] as an H.264 MP4 at ``path`` (imageio-ffmpeg), any
    size (:func:`even_size`). The file is written under a temporary name and renamed when complete
    (fileio.atomic_write): a failed encode leaves nothing behind. ffmpeg's own messages are
    silenced; a failure raises (OSError from the pipe, RuntimeError ...)."""
    import imageio_ffmpeg

    frames = [even_size((np.clip(f, 0, 1) * 255.0 + 0.5).astype(np.uint8)) for f in frames]

    def encode(tmp: str) -> None:  # the temporary name has no .mp4 suffix: name the container
        height, width = frames[0].shape[:2]
        writer = imageio_ffmpeg.write_frames(
            tmp, (width, height), fps=fps, macro_block_size=1, ffmpeg_log_level="quiet", output_params=["-f", "mp4"]
        )
        writer.send(None)  # start ffmpeg
        try:
            for frame in frames:
                writer.send(np.ascontiguousarray(frame))
        finally:
            writer.close()

    atomic_write(path, encode)
    return path


def _can_write_mp4() -> bool:
    import importlib.util

    return importlib.util.find_spec("imageio_ffmpeg") is not None


class Evaluation:
    """A run's test metrics and trajectory video: what they read of the run (config, render
    setup, scene, training and test views, the reporter), with the Gaussians handed in at each
    call (a :class:`shard.GaussianShard`). ``lpips_metric``: the LPIPS metric, when built at
    start (:func:`require_lpips`); else built at the first evaluation."""

    def __init__(
        self,
        cfg: "Config",
        setup: RenderSetup,
        scene: "Scene",
        scene_scale: float,
        trainset: "Dataset",
        testset: "Dataset",
        report: "Reporter",
        lpips_metric: Optional[metrics.LPIPSMetric] = None,
    ):
        self.cfg, self.setup, self.scene, self.scene_scale = cfg, setup, scene, scene_scale
        self.trainset, self.testset, self.report = trainset, testset, report
        self.lpips_metric = lpips_metric

    def lpips(self) -> metrics.LPIPSMetric:
        """The run's LPIPS metric (--lpips_net, --lpips_weights), built at its first evaluation
        (with --lpips_weights :func:`require_lpips` built it at start); when it is unavailable,
        the reason is printed then, once per run."""
        if self.lpips_metric is None:
            self.lpips_metric = metrics.LPIPSMetric(self.cfg.outputs.lpips_net, weights=self.cfg.outputs.lpips_weights)
            if not self.lpips_metric.available:
                self.report.line(f"note: {self.lpips_metric.reason}; test metrics are PSNR and SSIM")
        return self.lpips_metric

    def run(self, shard: "GaussianShard", step: int) -> Optional[dict]:
        """Score the test views after ``step`` steps; returns the metrics on rank 0 (None elsewhere).

        Each rank renders its share of the views one at a time (collectively: every rank runs the
        same number of rounds), scores each against its ground truth (decoded when needed) and, with
        ``--save_eval_images``, writes its side-by-side PNG itself; only the scores travel, to rank 0,
        which writes ``stats/val_step<step>.json``, TensorBoard and the line. No image of the test set
        is ever gathered, so evaluating a large test set costs a rank one view of memory."""
        ctx, testset, cfg = self.setup.ctx, self.testset, self.cfg
        if len(testset) == 0:
            return None
        mine, rounds = exchange.deal_views(len(testset), ctx)
        picks = exchange.padded_rounds(mine, rounds)  # a rank without views left repeats one
        lpips = self.lpips()
        gaussians = shard.activated()
        folder = self.report.result_dir / "renders"
        rows, pngs, elapsed = [], [], 0.0
        for r in range(rounds):
            i = picks[r]
            t0 = time.perf_counter()
            with torch.no_grad():
                res = self.setup(gaussians, self.setup.camera_batch(testset.batch([i], images=False)))
                assert res.colors is not None
                pred = res.colors[0].clamp(0, 1).float().cpu()
            elapsed += time.perf_counter() - t0
            if r >= len(mine):
                continue
            item = testset[i]
            gt = item["image"]  # [H, W, 3] float
            if "mask" in item:  # a test view's loss mask (data/masks.py) zeroes render and ground truth alike, as in
                keep = item["mask"][..., None].float()  # training (gsplat zeroes its masked renders at evaluation too)
                pred, gt = pred * keep, gt * keep
            name = self.scene.cameras[testset.indices[i]].name
            row = dict(
                index=i,
                name=name,
                psnr=float(metrics.psnr(pred[None], gt[None]).mean()),
                ssim=float(metrics.ssim(pred[None], gt[None]).mean()),
            )
            if lpips.available:
                row["lpips"] = float(lpips(pred[None], gt[None]))
            rows.append(row)
            if cfg.outputs.save_eval_images:
                pngs.append((name, np.concatenate([gt.numpy(), pred.numpy()], axis=1)))
                if len(pngs) >= PNG_BATCH:  # written as they come: a rank holds at most a few
                    _write_some(folder, step, pngs)
        if pngs:
            _write_some(folder, step, pngs)
        gathered = exchange.gather_to_main(ctx, (shard.num, rows, elapsed, len(mine)))
        if gathered is None:  # rank 0 scores
            return None
        num_gaussians = sum(n for n, _, _, _ in gathered)
        per_view = [
            {k: v for k, v in row.items() if k != "index"}
            for row in sorted((row for _, part, _, _ in gathered for row in part), key=lambda row: row["index"])
        ]
        # LPIPS is reported when every rank could score it (its weights are read per host)
        scored = lpips.available and all("lpips" in row for row in per_view)
        reason = lpips.reason if not lpips.available else "LPIPS unavailable on another rank's host"
        if not scored:
            per_view = [{k: v for k, v in row.items() if k != "lpips"} for row in per_view]
        summary = dict(
            step=step,
            psnr=float(np.mean([r["psnr"] for r in per_view])),
            ssim=float(np.mean([r["ssim"] for r in per_view])),
            lpips=(float(np.mean([r["lpips"] for r in per_view])) if scored else None),
            lpips_unavailable_reason=None if scored else reason,
            **(lpips.describe() if scored else {}),  # which net produced the number
            ms_per_image=gathered[0][2] * 1000.0 / max(gathered[0][3], 1),
            num_gaussians=num_gaussians,
            num_views=len(per_view),
            per_view=per_view,
        )
        self.report.write_json(f"stats/val_step{step}.json", summary)
        self.report.scalars({k: summary[k] for k in ("psnr", "ssim", "lpips")}, step, prefix="val/")
        lpips_text = f" LPIPS({lpips.net}) {summary['lpips']:.4f}" if scored else ""
        self.report.line(
            f"step {step}: test PSNR {summary['psnr']:.3f} SSIM {summary['ssim']:.4f}{lpips_text} "
            f"({len(per_view)} views)"
        )
        return summary

    def depth_bounds(self) -> tuple[float, float]:
        """(near, far) scene depths for the spiral: the 1st and 99th percentiles of the SfM points'
        depths in the training cameras (points in front of them), else 1% and 100% of the scene scale
        (gsplat's default bounds without poses_bounds.npy)."""
        points = self.scene.points
        depths: Any = []
        if points is not None and len(points):
            for i in self.trainset.indices[:: max(1, len(self.trainset) // 16)]:
                w2c = np.linalg.inv(self.scene.cameras[i].camtoworld.astype(np.float64))
                z = points @ w2c[2, :3] + w2c[2, 3]
                depths.append(z[z > 0])
        depths = np.concatenate(depths) if depths else np.zeros(0)
        if len(depths) < 2:
            return 0.01 * self.scene_scale, self.scene_scale
        near, far = np.percentile(depths, [1, 99])
        return float(max(near, 1e-3)), float(max(far, near * 1.01))

    def render_trajectory(self, shard: "GaussianShard", step: int) -> Optional[Path]:
        """Render ``num_traj_frames`` frames along :func:`trajectory.trajectory` collectively; rank 0 writes
        ``videos/traj_<step>.mp4`` (:func:`write_video`, 30 fps; an optional output). Returns the path
        on rank 0 when written."""
        n = self.cfg.outputs.num_traj_frames
        if n <= 0 or self.cfg.outputs.disable_video or len(self.trainset) == 0:
            return None
        ctx = self.setup.ctx
        if not _can_write_mp4():
            self.report.print(
                "warning: video not written: imageio-ffmpeg is not installed (pip install imageio-ffmpeg)"
            )
            return None
        first = self.trainset.camera(0)
        path = self.report.result_dir / "videos" / f"traj_{step}.mp4"
        self.report.line(
            f"video: rendering {n} frames at {first['width']}x{first['height']} along the "
            f"{self.cfg.outputs.render_traj_path} path for {path} (--disable_video skips it)"
        )
        c2ws = np.stack([self.scene.cameras[i].camtoworld for i in self.trainset.indices])
        bounds = self.depth_bounds() if self.cfg.outputs.render_traj_path == "spiral" else (0.0, 0.0)
        poses = torch.from_numpy(trajectory(self.cfg.outputs.render_traj_path, c2ws, n, bounds)).to(ctx.device)
        mine, rounds = exchange.deal_views(n, ctx)
        picks = exchange.padded_rounds(mine, rounds)
        cams = [
            CameraBatch(
                rigid_inverse(poses[i : i + 1]),
                first["K"][None].to(ctx.device),
                int(first["width"]),
                int(first["height"]),
            )
            for i in picks
        ]
        from tqdm import tqdm

        # rank 0's bar below the training bar: the frames of every rank, one round of W at a time
        bar = tqdm(total=n, desc="video", unit="frame", leave=False, disable=not self.report.active, dynamic_ncols=True)
        try:
            frames = render_views(
                shard, self.setup, cams, progress=lambda: bar.update(min(ctx.world_size, bar.total - bar.n))
            )[: len(mine)]
            gathered = exchange.gather_to_main(ctx, list(zip(mine, frames)))
            if gathered is None:  # rank 0 writes the video
                return None
            ordered = [f for _, f in sorted((x for part in gathered for x in part), key=lambda x: x[0])]
            bar.set_description("video: encoding")
            return optional(f"video {path}", lambda: write_video(path, ordered))
        finally:
            bar.close()

"""A browser viewer of the Gaussians: live during a single-process run, or of a run's latest export.

    splat-train default --no_disable_viewer [--port 8080] ...    # the model being trained, between steps
    splat-train view RESULT_DIR|FILE.ply [--port 8080]           # a finished or running run's newest PLY

Both serve viser's web client (``viser.ViserServer``) with nerfview's viewer (``nerfview.Viewer``:
camera handling, adaptive resolution, the training tab with pause / resume), the same pair
gsplat's examples/simple_trainer.py uses; they are the optional extra ``.[viewer]``. Each view is
rendered with the trainer's own pass (render.render: gsplat's CUDA ops on a GPU, the plain-PyTorch
reference on a CPU), so the viewer shows what evaluation would render.

Training: nerfview's lock is held by every training step and by every viewer render, so a frame is
always of a model between two steps. A multi-process run has no single process holding the whole
model: ``splat-train view RESULT_DIR`` is how it is watched; it shows the newest PLY under
RESULT_DIR (each --ply_steps export, merged over ranks) and reloads it when a newer one appears.

The run never waits on the viewer: when training ends the server stops (gsplat's trainer instead
keeps the process alive for the viewer).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

PLY_RE = re.compile(r"point_cloud_(\d+)(_distributed_merged)?\.ply$")
CPU_VIEWER_RES = 512  # the longest side of a still frame on a CPU (the reference renderer), pixels


def require_viewer(what: str) -> None:
    """Raise ValueError naming ``what`` and the install command when viser or nerfview is missing."""
    try:
        import nerfview  # noqa: F401
        import viser  # noqa: F401
    except ImportError as e:
        raise ValueError(f"{what} needs the viewer packages ({e}): pip install -e '.[viewer]'") from e


class SplatViewer:
    """A viser server and nerfview viewer rendering ``gaussians_fn()`` (activated Gaussians:
    means, quats, scales, opacities, colors [N, K, 3]; and the SH degree to use) on ``device``.

    mode "training" adds nerfview's training tab; call :meth:`before_step` / :meth:`after_step`
    around each training step. Raises ValueError when the packages are missing (require_viewer)
    and OSError when the port cannot be bound.
    """

    def __init__(
        self,
        port: int,
        gaussians_fn: Callable[[], tuple[dict, int]],
        device: torch.device,
        ops,
        mode: str = "rendering",
        output_dir: Optional[Path] = None,
        near: float = 0.01,
        far: float = 1e10,
    ) -> None:
        require_viewer("the viewer")
        import nerfview
        import viser

        self.gaussians_fn, self.device, self.ops, self.near, self.far = gaussians_fn, device, ops, near, far
        self.server = viser.ViserServer(port=port, verbose=False)
        self.viewer = nerfview.Viewer(
            server=self.server, render_fn=self._render, output_dir=Path(output_dir or "."), mode=mode
        )
        self.viewer.rerender = self._rerender  # nerfview's, for the clients it has a renderer for
        if device.type != "cuda":  # nerfview's still frames are 2048 px: minutes on a CPU
            self.viewer.render_tab_state.viewer_res = CPU_VIEWER_RES
            self.viewer._rendering_tab_handles["viewer_res_slider"].value = CPU_VIEWER_RES
        self._tic = 0.0

    def _rerender(self, _event=None) -> None:
        """nerfview's ``Viewer.rerender`` (a new frame for each client after a setting changed) for
        the clients whose renderer is registered: nerfview registers it on viser's worker thread
        when a client connects, so a client can be listed before it has one (a setting changed at
        that moment raised KeyError and ended the process); such a client is drawn at the
        settings of the moment its camera first reports, as every new client is."""
        from nerfview._renderer import RenderTask

        for client_id, client in self.server.get_clients().items():
            renderer = self.viewer._renderers.get(client_id)
            if renderer is not None:
                renderer.submit(RenderTask("rerender", self.viewer.get_camera_state(client)))

    @property
    def port(self) -> int:
        return int(self.server.get_port())

    def look_from(self, camtoworld: np.ndarray, target: np.ndarray) -> None:
        """Open new browser views at the [4, 4] OpenCV camtoworld (e.g. a training camera),
        looking at ``target`` [3], with the camera's up (-y) as up."""
        camera = self.server.initial_camera
        camera.up = tuple(-np.asarray(camtoworld, dtype=np.float64)[:3, 1])
        camera.position = tuple(np.asarray(camtoworld, dtype=np.float64)[:3, 3])
        camera.look_at = tuple(np.asarray(target, dtype=np.float64))

    @torch.no_grad()
    def _render(self, camera_state, render_tab_state) -> np.ndarray:
        """nerfview's render_fn: uint8 [H, W, 3] of the camera (OpenCV c2w, vertical fov)."""
        from .launch import DistContext
        from .render import CameraBatch, render

        if render_tab_state.preview_render:
            width, height = render_tab_state.render_width, render_tab_state.render_height
        else:
            width, height = render_tab_state.viewer_width, render_tab_state.viewer_height
        K = torch.from_numpy(camera_state.get_K((width, height))).float().to(self.device)
        viewmat = torch.linalg.inv(torch.from_numpy(camera_state.c2w).float()).to(self.device)
        gaussians, sh_degree = self.gaussians_fn()
        result = render(
            gaussians,
            CameraBatch(viewmat[None], K[None], width, height),
            DistContext(device=self.device),
            self.ops,
            sh_degree,
            near=self.near,
            far=self.far,
        )
        assert result.colors is not None
        return (result.colors[0].clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()

    def before_step(self) -> None:
        """Training: wait while the user paused, then hold the viewer lock for the step."""
        while self.viewer.state == "paused":
            time.sleep(0.01)
        self.viewer.lock.acquire()
        self._holding = True
        self._tic = time.perf_counter()

    def after_step(self, step: int, num_rays: int) -> None:
        """Training: release the lock after step ``step`` (``num_rays`` = pixels rendered by the
        step) and let nerfview schedule a frame (its train-util slider balances the two)."""
        seconds = max(time.perf_counter() - self._tic, 1e-10)
        self._holding = False
        self.viewer.lock.release()
        self.viewer.render_tab_state.num_train_rays_per_sec = num_rays / seconds
        self.viewer.update(step, num_rays)

    def stop(self) -> None:
        """Mark training complete (when training) and stop the server (its port is free after).
        Releases the viewer's lock when a step raised while holding it."""
        if getattr(self, "_holding", False):
            self._holding = False
            self.viewer.lock.release()
        if self.viewer.mode == "training":
            self.viewer.state = "completed"
        self.server.stop()


def check_training_viewer(cfg, world_size: int) -> None:
    """Every rank, before any data is loaded: with --no_disable_viewer, ValueError naming the flag
    for a multi-process run (no process holds the whole model) or when the packages are missing."""
    if cfg.outputs.disable_viewer:
        return
    if world_size > 1:
        raise ValueError(
            f"--no_disable_viewer serves the model from one process, and this run has {world_size}; "
            f"watch it with `splat-train view {cfg.outputs.result_dir}` (it shows the newest --ply_steps export)"
        )
    require_viewer("--no_disable_viewer")


def start_training_viewer(
    cfg, report, model: Callable[[], tuple], device, ops, result_dir: Path, camtoworld, points: Optional[np.ndarray]
) -> Optional[SplatViewer]:
    """Rank 0 (``report.active``) with --no_disable_viewer: the live viewer (None otherwise).
    ``model()`` gives (activated Gaussians, SH degree) of the model between steps; the view opens
    at ``camtoworld`` [4, 4] looking at the median of ``points`` [P, 3] (the origin without them).
    Says where it is served through ``report``. Raises OSError when the port cannot be bound."""
    if cfg.outputs.disable_viewer or not report.active:
        return None
    viewer = SplatViewer(
        cfg.outputs.port,
        model,
        device,
        ops,
        mode="training",
        output_dir=result_dir,
        near=cfg.step.near_plane,
        far=cfg.step.far_plane,
    )
    viewer.look_from(camtoworld, np.median(points, axis=0) if points is not None and len(points) else np.zeros(3))
    report.print(f"viewer: http://localhost:{viewer.port} (the model between steps; it stops with the run)")
    return viewer


# ------------------------------------------------------------------ splat-train view


def newest_export(path: Path) -> Optional[Path]:
    """The PLY to show for ``path``: the file itself, or in a result dir the newest
    ``ply/point_cloud_<step>[_distributed_merged].ply`` (else the newest Inria
    ``point_cloud/iteration_<step>/point_cloud.ply``); None when there is none yet."""
    path = Path(path)
    if path.is_file():
        return path
    ours = [(int(m.group(1)), p) for p in (path / "ply").glob("point_cloud_*.ply") if (m := PLY_RE.match(p.name))]
    inria = [
        (int(p.parent.name.removeprefix("iteration_")), p)
        for p in (path / "point_cloud").glob("iteration_*/point_cloud.ply")
        if p.parent.name.removeprefix("iteration_").isdigit()
    ]
    found = ours or inria
    return max(found, key=lambda sp: sp[0])[1] if found else None


class _Model:
    """The Gaussians shown by ``view``, swapped under the viewer lock when a newer export appears."""

    def __init__(self, device: torch.device):
        self.device, self.sh_degree = device, 0
        self.gaussians: dict = {}  # empty until load()
        self.source: Optional[Path] = None
        self.stamp: Optional[int] = None

    def load(self, ply: Path) -> None:
        from .export import load_ply
        from .model import activated

        params = {k: v.to(self.device) for k, v in load_ply(ply).items()}
        self.gaussians = activated(params)
        self.sh_degree = int(round((params["shN"].shape[1] + 1) ** 0.5)) - 1
        self.source, self.stamp = ply, ply.stat().st_mtime_ns


def _initial_view(viewer: SplatViewer, result_dir: Path, gaussians: dict) -> None:
    """Open at the first camera of ``result_dir/cameras.json`` (the Inria layout, the export's
    frame), looking at the median of the means, when there is one."""
    cameras = result_dir / "cameras.json"
    if not cameras.is_file():
        return
    entry = json.loads(cameras.read_text())[0]
    c2w = np.eye(4)
    c2w[:3, :3], c2w[:3, 3] = np.asarray(entry["rotation"]), np.asarray(entry["position"])
    viewer.look_from(c2w, gaussians["means"].median(dim=0).values.cpu().numpy())


def view_main(argv=None) -> int:
    """``splat-train view``: serve the newest export of a run (or a PLY) until Ctrl-C / SIGTERM;
    exit 0 then, 2 with one ``error:`` line for a path that does not exist or missing packages."""
    from .render import ops_for

    p = argparse.ArgumentParser(
        prog="splat-train view",
        description="Browse a run's newest PLY (or a PLY file) in "
        "a web viewer; a running run's newer exports are loaded as they appear.",
    )
    p.add_argument("path", type=Path, help="a run's --result_dir, or a 3DGS .ply file")
    p.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080; the next free one when taken)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where to render")
    p.add_argument("--reload_every", type=float, default=5.0, help="seconds between looks for a newer export")
    args = p.parse_args(argv)
    try:
        if not args.path.exists():
            raise ValueError(f"no such run folder or PLY: {args.path}")
        if not 1 <= args.port <= 65535:
            raise ValueError(f"--port must be in 1..65535, got {args.port}")
        require_viewer("splat-train view")
        device = torch.device(
            "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
        )
        model = _Model(device)
        ply = newest_export(args.path)
        if ply is None:
            print(f"view: no export under {args.path} yet; waiting for the run's first PLY", flush=True)
            while (ply := newest_export(args.path)) is None:
                time.sleep(args.reload_every)
        model.load(ply)
        viewer = SplatViewer(
            args.port,
            lambda: (model.gaussians, model.sh_degree),
            device,
            ops_for("auto", device),
            output_dir=args.path if args.path.is_dir() else args.path.parent,
        )
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.path.is_dir():
        _initial_view(viewer, args.path, model.gaussians)
    print(
        f"viewer: http://localhost:{viewer.port} showing {ply} ({model.gaussians['means'].shape[0]:,} Gaussians); "
        "Ctrl-C stops it",
        flush=True,
    )
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(args.reload_every):
            newest = newest_export(args.path)
            if newest is not None and (newest != model.source or newest.stat().st_mtime_ns != model.stamp):
                with viewer.viewer.lock:
                    model.load(newest)
                viewer.viewer.rerender(None)
                print(f"view: loaded {newest}", flush=True)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        viewer.stop()
    print("viewer stopped", flush=True)
    return 0

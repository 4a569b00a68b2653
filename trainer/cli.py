"""``splat-train``: parse (tyro), launch (one process per GPU, or the external launcher's), run.

    splat-train default [--data_dir DIR] [--data_factor 4] [--result_dir DIR] [flags]
    splat-train mcmc ...
    splat-train --config results/x/cfg.yml --result_dir results/y [flags]   # rerun a run's config
    splat-train default --help                          # every flag, documented
    splat-train view RESULT_DIR|FILE.ply [--port 8080]  # browse a run's newest export (viewer.py)

User errors (bad flag, bad data, an occupied result dir, a first step that cannot fit in memory)
print one ``error:`` line naming the flag or file and exit with status 2. SIGTERM and SIGINT
(Ctrl-C) during training write a checkpoint at the next step boundary, then end the run with one
line and status 143 / 130 (128 + the signal number), the spawned ranks stopped; a second Ctrl-C
stops at once; before training either ends the run at once.
"""

from __future__ import annotations

import dataclasses
import signal
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from ..configs import preset_names
from .config import Config, from_argv, resolve_packed
from .launch import DistContext, Interrupted, LaunchError, detect_external, interruptible, launch, loopback_group
from .log import get_logger

log = get_logger(__name__)


def _usage() -> str:
    return (
        "usage: splat-train PRESET [--config FILE] [FLAGS]\n"
        "       splat-train --config FILE [FLAGS]\n"
        "       splat-train bench [--help]     (benchmark variants side by side)\n"
        "       splat-train bench-raster [--help]  (rasterization + loss + backward: unfused vs fused)\n"
        "       splat-train view RESULT_DIR|FILE.ply [--port 8080]  (browse a run's newest export)\n\n"
        "Train a 3D Gaussian Splatting scene on every visible GPU (or the CPU).\n\n"
        f"presets: {', '.join(preset_names())}\n"
        "  `splat-train PRESET --help` lists every flag with its default.\n"
        "  Without --data_dir the embedded synthetic scene is trained.\n"
        "  Ctrl-C or SIGTERM: a checkpoint at the next step boundary, then the run ends (Ctrl-C twice:\n"
        "  at once); the same command with --resume auto continues it.\n"
    )


def parse_args(argv: Sequence[str]) -> Config:
    """Command line -> validated, resolved Config (config.from_argv), with the CLI's usage:
    exits 0 after printing help, and 2 after printing the usage to stderr when no argument names
    what to run. Raises ValueError naming the flag or file on bad input."""
    args = list(argv)
    if not args:  # a bare `splat-train` trains nothing: say how to call it, and fail
        print(_usage(), file=sys.stderr)
        raise SystemExit(2)
    if args[0] in ("-h", "--help"):
        print(_usage())
        raise SystemExit(0)
    return from_argv(args)


def build_scene(cfg: Config, log=None):
    """The scene of ``cfg`` (data.scene_from_config)."""
    from .data import scene_from_config

    return scene_from_config(cfg, log=log)


def _say(line: str) -> None:
    print(line, flush=True)


def _warn(line: str) -> None:
    log.warning(line)


def run(ctx: DistContext, cfg: Config) -> None:
    """What every rank runs. Rank 0 checks, for a new run, that the first step fits in memory
    (memory.check_first_step; ValueError otherwise) and says what it loads, before any image is
    decoded; its estimate stands for every rank (they differ by at most one Gaussian)."""
    from . import exchange
    from .data import describe_views, split_indices
    from .evaluate import require_lpips
    from .loop import Trainer
    from .resume import evaluate_only, resume_from
    from .memory import check_first_step
    from .render import check_camera_model
    from .viewer import check_training_viewer

    # after the imports: pycolmap's native SIGTERM handler is replaced; --loopback: a group of one rank
    with interruptible(ctx.stop), loopback_group(ctx, cfg.distributed.loopback) as ctx:
        # under an external launcher every process decided on its own (main); rank 0's decision stands
        resume = exchange.from_main(ctx, cfg.distributed.resume)
        cfg = dataclasses.replace(cfg, distributed=dataclasses.replace(cfg.distributed, resume=resume))
        cfg, packed_line = resolve_packed(cfg, ctx.world_size)  # the bytesplat preset's exchange
        check_training_viewer(cfg, ctx.world_size)
        lpips = require_lpips(cfg) if ctx.is_main else None  # a named backbone file fails here, not at evaluation
        scene = build_scene(cfg, log=_say if ctx.is_main else None)
        camera_line = check_camera_model(scene, cfg.data.camera_model)  # ValueError before any decode
        if ctx.is_main:
            if packed_line:
                _say(packed_line)
            if not (cfg.distributed.ckpt or cfg.distributed.resume):  # a loaded model is not the initial one
                _say(check_first_step(cfg, scene, ctx.world_size, ctx.device))
            for line in describe_views(
                scene,
                *split_indices(len(scene.cameras), cfg.data.test_every),
                cfg.data.alpha_as_mask,
                cache_bytes=int(cfg.data.image_cache_gb * 2**30),
            ):
                _say(line)  # just before the Trainer decodes them
            if camera_line:
                _say(camera_line)
        trainer = Trainer(cfg, ctx, scene)
        trainer.evaluation.lpips_metric = lpips
        try:
            if cfg.distributed.ckpt:
                evaluate_only(trainer, list(cfg.distributed.ckpt))
                return
            if cfg.distributed.resume:
                resume_from(trainer, Path(cfg.outputs.result_dir) / "ckpts")
            trainer.train()
        finally:  # a step's captured collectives must be gone before the process group (loopback_group)
            trainer.forward_backward.release()


def stopped_message(cfg: Optional[Config], signum: int) -> str:
    """The one line printed when a signal ends a run: which signal, and what the folder holds."""
    from .checkpoint import list_checkpoints, run_outputs

    line = f"stopped by {signal.Signals(signum).name}"
    if cfg is None or cfg.distributed.ckpt:
        return line
    result_dir = Path(cfg.outputs.result_dir)
    steps = list_checkpoints(result_dir / "ckpts")
    if steps:
        return (
            f"{line}; the newest checkpoint is step {max(steps)} in {result_dir / 'ckpts'} (--resume, or the "
            "same command with --resume auto, continues it)"
        )
    if run_outputs(result_dir):
        return f"{line} before the first checkpoint; {result_dir} needs --overwrite to start again"
    return line


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``splat-train`` command; returns its exit status. A reader that goes away (``splat-train
    default --help | head``) ends it quietly with status 1, Python's own for a broken pipe, instead
    of a traceback."""
    try:
        return _main(argv)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # the interpreter's final flush must not raise again
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: Optional[Sequence[str]] = None) -> int:
    from .checkpoint import check_readable, prepare_result_dir

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "bench":
        from ..scripts.bench import main as bench_main

        return bench_main(list(argv[1:]))
    if argv and argv[0] == "view":
        from .viewer import view_main

        return view_main(list(argv[1:]))
    if argv and argv[0] == "bench-raster":
        from ..scripts.bench_raster import main as bench_raster_main

        return bench_raster_main(list(argv[1:]))
    cfg = None
    try:
        cfg = parse_args(argv)
        if cfg.data.data_dir is not None and not Path(cfg.data.data_dir).is_dir():
            raise ValueError(f"--data_dir: no such folder: {cfg.data.data_dir}")
        for f in cfg.distributed.ckpt or []:
            if not Path(f).is_file():
                raise ValueError(f"--ckpt: no such file: {f}")
            check_readable(f)
        external = detect_external()  # under torchrun / mpirun / srun every process gets here
        resume = prepare_result_dir(
            Path(cfg.outputs.result_dir),
            cfg.distributed.resume,
            cfg.distributed.overwrite,
            evaluating=bool(cfg.distributed.ckpt),
            auto_resume=cfg.distributed.auto_resume,
            mutate=external is None or external["rank"] == 0,
            log=_warn if external is None or external["rank"] == 0 else None,
        )
        cfg = dataclasses.replace(cfg, distributed=dataclasses.replace(cfg.distributed, resume=resume))
        return launch(
            run,
            (cfg,),
            nproc_per_node=1 if cfg.distributed.loopback else cfg.distributed.nproc_per_node,
            device=cfg.distributed.device,
            dist_timeout_s=cfg.distributed.dist_timeout_s,
        )
    except (ValueError, LaunchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (Interrupted, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, Interrupted) else int(signal.SIGINT)
    # out of the handler: the interrupted frames are gone, so the progress bar has closed its line
    print(stopped_message(cfg, signum), file=sys.stderr, flush=True)
    return 128 + signum


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

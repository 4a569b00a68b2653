"""Starting a run from checkpoint shards: ``--resume`` (continue training) and ``--ckpt``
(evaluate and export, no training). The shards of any world size load into any other
(checkpoint.load_shard re-shards them)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from . import checkpoint, exchange
from .config import saved_setting

if TYPE_CHECKING:
    from .loop import Trainer


def evaluate_only(trainer: "Trainer", files: list[Path]) -> list[Path]:
    """``--ckpt``: load the checkpoint shards; export the PLY, evaluate, render the video (in the
    order of Trainer.write_outputs); no training. Returns the files written (rank 0)."""
    state = checkpoint.load_shard(files, trainer.ctx.rank, trainer.ctx.world_size)
    trainer.load_state_dict(state, restore_rng=False)
    _say_loaded("loaded", trainer, files)
    trainer.report.open_tensorboard()
    written = trainer.write_outputs(trainer.step, save=False, ply=True, evaluation=True)
    trainer.report.close()
    trainer.print_outputs(written)
    return written


def resume_from(trainer: "Trainer", ckpt_dir: Path) -> Optional[int]:
    # rank 0 picks the set (main() checked it exists and named skipped sets): on nodes that see the
    # folder at different moments of a concurrent write, every rank still loads the same step
    found = exchange.main_decides(trainer.ctx, lambda: checkpoint.latest_complete(ckpt_dir))
    if found is None:
        raise ValueError(f"--resume: no complete set of checkpoints in {ckpt_dir}")
    step, files = found
    state = checkpoint.load_shard(files, trainer.ctx.rank, trainer.ctx.world_size)
    trainer.load_state_dict(state)
    _say_loaded("resumed from", trainer, files)
    trainer.defer_sh_adam_if_large(step)  # --lazy_sh_adam auto: the checkpoint's shard may be large
    # checkpoints before --raster auto record only the flag (flat in the older ones), then "fused" or "unfused"
    before = state.get("raster") or saved_setting(state.get("config") or {}, "raster")
    if before in ("fused", "unfused") and before != trainer.raster:
        trainer.report.warn(
            f"warning: --resume: steps 1-{step} took the {before} step and the rest take the {trainer.raster} "
            f"step (its loss differs); --raster {before} keeps the first"
        )
    return step


def _say_loaded(verb: str, trainer: "Trainer", files: list[Path]) -> None:
    """Rank 0: '<verb> step N (world size W -> W', Gaussians re-sharded) from <folder>'."""
    old, new = len(files), trainer.ctx.world_size
    world = f"world size {old}" if old == new else f"world size {old} -> {new}, Gaussians re-sharded"
    trainer.report.print(f"{verb} step {trainer.step} ({world}) from {Path(files[0]).parent}")

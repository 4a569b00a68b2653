"""Merge a distributed run's per-rank checkpoints into one standard 3DGS PLY, offline.

    python -m splat_train.scripts.merge_shards RESULT_DIR [--step N] [--out FILE.ply]

Reads ``RESULT_DIR/ckpts/ckpt_<step>_rank<r>.pt`` for every rank of the newest complete step (or
``--step``), concatenates the shards in rank order (the order the trainer's own export uses) and
writes ``RESULT_DIR/ply/point_cloud_<step>_distributed_merged.ply`` (or ``--out``) atomically.
Exit status 2 with one ``error:`` line when the checkpoints are missing or incomplete.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from splat_train.trainer.checkpoint import latest_complete, list_checkpoints
from splat_train.trainer.export import merge_shards, ply_name, save_ply


def merge(result_dir: Path, step: int | None = None, out: Path | None = None) -> Path:
    """Write the merged PLY; returns its path. Raises ValueError naming what is missing."""
    ckpt_dir = Path(result_dir) / "ckpts"
    if step is None:
        found = latest_complete(ckpt_dir)
        if found is None:
            raise ValueError(f"no complete set of checkpoints in {ckpt_dir}")
        step, files = found
    else:
        ranks = list_checkpoints(ckpt_dir).get(step)
        if not ranks:
            raise ValueError(f"no checkpoints for step {step} in {ckpt_dir}")
        world = torch.load(next(iter(ranks.values())), map_location="cpu", weights_only=False)["world_size"]
        missing = sorted(set(range(world)) - set(ranks))
        if missing:
            raise ValueError(f"step {step} in {ckpt_dir} lacks the shards of rank(s) {missing}")
        files = [ranks[r] for r in range(world)]
    shards = [torch.load(f, map_location="cpu", weights_only=False)["params"] for f in files]
    merged = merge_shards(shards)
    path = Path(out) if out else Path(result_dir) / "ply" / ply_name(step, len(files))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_ply(path, merged["means"], merged["scales"], merged["quats"], merged["opacities"], merged["sh0"],
             merged["shN"])
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m splat_train.scripts.merge_shards", description=__doc__.split("\n\n")[0])
    p.add_argument("result_dir", type=Path)
    p.add_argument("--step", type=int)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    try:
        path = merge(args.result_dir, args.step, args.out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

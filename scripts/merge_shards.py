"""Merge a distributed run's per-rank checkpoints into one standard 3DGS PLY, offline.

    python -m splat_train.scripts.merge_shards RESULT_DIR [--step N] [--out FILE.ply]

Reads ``RESULT_DIR/ckpts/ckpt_<step>_rank<r>.pt`` for every rank of the newest complete step (or
``--step``), concatenates the shards in rank order (the order the trainer's own export uses) and
writes ``RESULT_DIR/ply/point_cloud_<step>_distributed_merged.ply`` (or ``--out``) atomically, in
the run's ``--export_frame`` as the trainer writes it. ``scripts/export.py`` does the same and
writes the other formats too.
Exit status 2 with one ``error:`` line when the checkpoints are missing or incomplete.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from splat_train.scripts.export import convert


def merge(result_dir: Path, step: int | None = None, out: Path | None = None) -> Path:
    """Write the merged PLY; returns its path. Raises ValueError naming what is missing."""
    return convert(result_dir, ("ply",), step, ply_out=out)[0]


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

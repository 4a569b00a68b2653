"""Peak memory of rank 0 while it writes the merged PLY of a W = 2 model, gathered (still the
path when web formats are asked for) against streamed (export.stream_shards).

    python docs/bench/large-scenes/export-memory/export_memory.py N_GAUSSIANS OUT_DIR

Each rank builds its shard (N / 2 Gaussians, SH degree 3) and records its peak RSS
(resource.getrusage) before and after one export; the difference is the export's own."""

import json
import resource
import sys
from pathlib import Path

import torch

from splat_train.trainer.export import gather_params, ply_rows, save_ply, stream_shards
from splat_train.trainer.launch import launch


def _rank(ctx, n, out, mode):
    gen = torch.Generator().manual_seed(ctx.rank)
    shard = {
        "means": torch.randn(n, 3, generator=gen),
        "scales": torch.randn(n, 3, generator=gen),
        "quats": torch.randn(n, 4, generator=gen),
        "opacities": torch.randn(n, generator=gen),
        "sh0": torch.randn(n, 1, 3, generator=gen),
        "shN": torch.randn(n, 15, 3, generator=gen),
    }
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    path = Path(out) / f"{mode}.ply"
    if mode == "gathered":
        merged = gather_params(ctx, shard)
        if merged is not None:
            save_ply(path, **merged)
    else:
        stream_shards(ctx, ply_rows(**shard), path, 15)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    Path(out, f"{mode}_rank{ctx.rank}.json").write_text(
        json.dumps(
            dict(
                rank=ctx.rank,
                gaussians_per_rank=n,
                peak_rss_before_gib=before / 2**20,
                peak_rss_after_gib=after / 2**20,
                shard_gib=sum(v.numel() * 4 for v in shard.values()) / 2**30,
            )
        )
    )


if __name__ == "__main__":
    total, out = int(sys.argv[1]), sys.argv[2]
    Path(out).mkdir(parents=True, exist_ok=True)
    for mode in ("streamed", "gathered"):
        assert launch(_rank, (total // 2, out, mode), nproc_per_node=2, device="cpu") == 0
        rank0 = json.loads(Path(out, f"{mode}_rank0.json").read_text())
        print(
            f"{mode}: rank 0 peak RSS {rank0['peak_rss_before_gib']:.2f} -> {rank0['peak_rss_after_gib']:.2f} GiB "
            f"(its shard {rank0['shard_gib']:.2f} GiB), PLY {Path(out, mode + '.ply').stat().st_size / 2**30:.2f} GiB"
        )
    assert Path(out, "streamed.ply").read_bytes() == Path(out, "gathered.ply").read_bytes()
    print("the two files are identical")

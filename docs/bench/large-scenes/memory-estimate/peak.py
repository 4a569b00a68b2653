"""What is allocated at the peak of tests/test_memory.py's GPU run (a 3-view 640x480 COLMAP scene,
200,000 random initial Gaussians, 5 steps, --raster RASTER): the run under the CUDA caching
allocator's history, then the allocations alive at the peak of allocated bytes, grouped by the
innermost frame of this package or gsplat that made them (MiB, largest first), and the estimate's
terms beside the peak.

python3 peak.py OUT RASTER   (from the repository root, tests/ on sys.path)
"""

import collections
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, "tests")
from test_memory import _colmap_scene  # noqa: E402

from splat_train.trainer import memory  # noqa: E402
from splat_train.trainer.cli import build_scene, main, parse_args  # noqa: E402

out, raster = Path(sys.argv[1]), sys.argv[2]
data = _colmap_scene(out / f"scene-{raster}", 640, 480, num_points=300)
flags = ["default", "--data_dir", str(data), "--data_factor", "1", "--init_type", "random", "--init_num_pts",
         "200000", "--test_every", "0", "--max_steps", "5", "--num_traj_frames", "0", "--raster", raster,
         "--device", "cuda", "--nproc_per_node", "1", "--result_dir", str(out / f"r-{raster}")]  # fmt: skip
cfg = parse_args(flags)
estimate = memory.first_step_estimate(cfg, build_scene(cfg), 1, torch.device("cuda", 0))
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
torch.cuda.memory._record_memory_history(max_entries=200_000)
assert main(flags) == 0
peak = torch.cuda.max_memory_allocated()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)

alive, total, best, at_best = {}, 0, -1, {}
for e in snap["device_traces"][0]:
    if e["action"] == "alloc":
        alive[e["addr"]] = e
        total += e["size"]
        if total > best:
            best, at_best = total, dict(alive)
    elif e["action"] in ("free_requested",) and e["addr"] in alive:
        total -= alive.pop(e["addr"])["size"]


def where(e):
    for f in e.get("frames", []):
        name = f["filename"]
        if "splat_train" in name or "/gsplat/" in name or "/pkg/" in name:
            return f"{Path(name).name}:{f['line']} {f['name']}"
    return "(other)"


groups = collections.Counter()
counts = collections.Counter()
for e in at_best.values():
    groups[where(e)] += e["size"]
    counts[where(e)] += 1
result = dict(
    raster=raster,
    peak_allocated_mib=peak / 2**20,
    traced_peak_mib=best / 2**20,
    note="traced peak counts allocations from the start of the history (the allocator's own peak may include blocks alive before it)",
    estimate_mib={k: v / 2**20 for k, v in estimate.terms.items()},
    estimate_total_mib=estimate.total / 2**20,
    alive_at_peak=[dict(where=k, mib=v / 2**20, n=counts[k]) for k, v in groups.most_common(40)],
)
(out / f"peak-{raster}.json").write_text(json.dumps(result, indent=1))
print(json.dumps(result, indent=1))

"""The projection backward over the list of seen Gaussians (--lazy_sh_adam's LISTED form) against
the size of its fixed grid: N Gaussians of which a run of S consecutive rows is seen by the one
camera (a camera of the city-like scene sees 0.6-7% of a shard in Morton order, in runs); the
kernel launched 20 times inside one CUDA graph, timed by events around its replay (no host launch
in the time), the median of 5 replays after one, for each grid; JSON to stdout.

python3 grid.py N S [S ...]   (after `source .whl/gpu-prelude.sh`; grid.json, grid.log: N = 20000000,
S = 119000 600000 1400000 20000000, on the H100 of gpu.txt)
"""

import json
import statistics
import sys

import torch

from splat_train.kernels import constants
from splat_train.kernels import projection as pj
from splat_train.kernels.adam import SeenRows

N = int(sys.argv[1])
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
params = dict(
    means=torch.rand(N, 3, device=dev, generator=g) * 20 - 10 + torch.tensor([0.0, 0.0, 15.0], device=dev),
    quats=torch.randn(N, 4, device=dev, generator=g),
    scales=torch.rand(N, 3, device=dev, generator=g) * 2 - 5,
    opacities=torch.randn(N, device=dev, generator=g),
    sh0=torch.randn(N, 1, 3, device=dev, generator=g) * 0.3,
    shN=torch.randn(N, 15, 3, device=dev, generator=g) * 0.05,
)
viewmats = torch.eye(4, device=dev)[None]
Ks = torch.tensor([[[1000.0, 0, 960], [0, 1000.0, 540], [0, 0, 1]]], device=dev)
campos = torch.zeros(1, 3, device=dev)
setup = pj.Setup(1920, 1080, 3, 0.01, 1e10, False)
out = pj.empty_outputs(N, 1, dev)
pj.forward_into(params, viewmats, Ks, campos, setup, out)
grads = {k: torch.randn_like(out[k]) * 1e-3 for k in ("means2d", "depths", "conics", "opacities", "colors")}
sms = torch.cuda.get_device_properties(dev).multi_processor_count
result = dict(device=torch.cuda.get_device_name(dev), sms=sms, N=N, runs={})
for S in (int(s) for s in sys.argv[2:]):
    bits = torch.zeros(N, dtype=torch.int32, device=dev)
    start = (N - S) // 2
    bits[start : start + S] = 1
    seen = SeenRows.from_mask(bits != 0)
    g_out = {k: torch.empty_like(v) for k, v in params.items()}
    row = {}
    for programs in (4096, sms, 2 * sms, 3 * sms, 4 * sms, 8 * sms, 16 * sms):
        constants.LISTED_PROGRAMS = programs
        call = lambda: pj.backward_into(params, viewmats, Ks, campos, bits, setup, grads, g_out, seen_sh=True,
                                        listed=seen, unseen_zeros=False)  # fmt: skip
        call()
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                call()
        times = []
        for _ in range(6):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 20)
        row[programs] = statistics.median(times[1:])
        del graph
    result["runs"][S] = row
    print(S, {k: round(v * 1000, 1) for k, v in row.items()}, "us", file=sys.stderr)
print(json.dumps(result, indent=1))

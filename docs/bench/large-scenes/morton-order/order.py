"""The fused kernel's time against the order of the Gaussians in memory and of the tiles in the launch.

python3 order.py time N WxH LAYOUT OUT [save]: one batch of the synthetic scene's records (the
bench-raster capture, its Gaussians kept in input order), relabelled into Morton order as well;
for each order the fused kernel (all phases, the tiles in tile order and longest list first,
alternating twice), its forward alone and the unfused step (gsplat's rasterizer and the Triton
SSIM), medians of 10 calls after 3, into OUT/order_LAYOUT.json; "save" keeps both inputs for
python3 order.py ncu 0 0 LAYOUT OUT (one fused call per order, under ncu).
"""

import json
import statistics
import sys

import torch

from splat_train.kernels import fused_raster as fr
from splat_train.scripts import bench_raster as br
from splat_train.trainer import loop
from splat_train.trainer import model as model_mod

mode, n, res, layout, out = sys.argv[1:6]
save = sys.argv[6:] == ["save"]

if mode == "time":
    holder = {}
    orig_init = loop.Trainer.__init__

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        holder["t"] = self

    loop.Trainer.__init__ = init
    morton_order = model_mod.morton_order
    model_mod.morton_order = lambda m: torch.arange(m.shape[0], device=m.device)  # input order
    args = br.parse(["--synthetic_gaussians", n, "--resolution", res, "--synthetic_layout", layout])
    inputs = br.capture_inputs(args)
    means = holder["t"].params["means"].detach()
    dev = means.device
    N = means.shape[0]
    assert inputs["means2d"].shape[:2] == (1, N), inputs["means2d"].shape

    orders = {"orig": None, "morton": morton_order(means)}
    results = {}
    for name, order in orders.items():
        inp = dict(inputs)
        if order is not None:
            inv = torch.empty_like(order)
            inv[order] = torch.arange(N, device=dev)
            for k in br.GRAD_FIELDS:
                inp[k] = inputs[k][:, order].contiguous()
            inp["flatten_ids"] = inv[inputs["flatten_ids"].long()].to(inputs["flatten_ids"].dtype)
        row = {}
        for rnd in range(2):  # the two tile orders alternating, twice
            for tile_order in (False, True):
                fr.TILE_ORDER = tile_order
                t, o = br.time_calls(lambda: br.fused_step(inp, 0.2, {}), dev, 3, 10)
                row.setdefault(f"fused_tile_order_{tile_order}", []).append(statistics.median(t))
                row.setdefault(f"loss_tile_order_{tile_order}", []).append(float(o[0]))
        fr.TILE_ORDER, fr.TIMING_PHASES = True, 1
        t, _ = br.time_calls(lambda: br.fused_step(inp, 0.2, {}), dev, 3, 10)
        row["fused_forward_only"] = statistics.median(t)
        fr.TIMING_PHASES = 3
        t, _ = br.time_calls(
            lambda: br.unfused_step(inp, 0.2, "triton" if dev.type == "cuda" else "pytorch"), dev, 2, 6
        )
        row["unfused_triton"] = statistics.median(t)
        results[name] = row
        print(name, json.dumps(row), flush=True)
        if save:
            torch.save(
                {
                    k: (v.cpu() if torch.is_tensor(v) else v)
                    for k, v in inp.items()
                    if k not in ("ops", "device", "backend")
                },
                f"{out}/inputs_{name}.pt",
            )
    # list stats
    offs = inputs["isect_offsets"].reshape(-1).long()
    lens = torch.diff(torch.cat([offs, torch.tensor([inputs["num_isects"]], device=dev)]))
    results["tile_list_len"] = dict(
        mean=float(lens.float().mean()), max=int(lens.max()), median=float(lens.float().median())
    )
    results["num_isects"] = inputs["num_isects"]
    json.dump(results, open(f"{out}/order_{layout}.json", "w"), indent=1)
else:  # ncu: one fused call per saved order
    dev = torch.device("cuda")
    from splat_train.kernels import native

    native.load()
    for name in ("orig", "morton"):
        d = torch.load(f"{out}/inputs_{name}.pt")
        inp = {k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in d.items()}
        inp["ops"] = None
        inp["device"] = dev
        for _ in range(2):
            br.fused_step(inp, 0.2, {})
        torch.cuda.synchronize()
        print("ncu target", name, flush=True)
        br.fused_step(inp, 0.2, {})
        torch.cuda.synchronize()

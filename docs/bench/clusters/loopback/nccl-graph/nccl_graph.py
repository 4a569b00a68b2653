"""Where the captured record exchange's time goes at loopback: CUDA-graph replays of (a) one NCCL
all_to_all_single of a juicebox-sized and a 2 M-sized record payload over a process group of one
rank, (b) a plain device copy of the same bytes, (c) trainer/step/graphed_exchange.py's pieces for
that many Gaussians (one camera): the head's records packed into the payload (HeadBinding.pack), the
forward collective with the records' join, the reverse collective with the gradients' pack, and the
gradients unpacked into the head's buffers (HeadBinding.unpack). Per variant: the device time per replay
(events around 200 back-to-back replays) and the latency of one replay (host launch to a host
synchronization returning, median of 200). Run from the project root on a GPU: python nccl_graph.py"""

import json
import statistics
import time

import torch

from splat_train.trainer.launch import DistContext, loopback_group
from splat_train.trainer.exchange import _all_to_all_rows
from splat_train.trainer.step.graphed_exchange import GraphedExchange, HeadBinding
from splat_train.trainer.step.capture import CapturedCall


def timed(replay, n=200):
    for _ in range(10):
        replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        replay()
    end.record()
    torch.cuda.synchronize()
    per = start.elapsed_time(end) / n
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        replay()
        torch.cuda.synchronize()
        lat.append((time.perf_counter() - t) * 1e3)
    return round(per, 4), round(statistics.median(lat), 4)


def graph_of(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


rows = []
with loopback_group(DistContext(device=torch.device("cuda"))) as ctx:
    for n in (356_000, 2_000_000):
        payload = torch.randn(n * 12, 1, device="cuda")
        out = torch.empty_like(payload)
        _all_to_all_rows(ctx, payload, [n * 12], [n * 12])  # the communicator first
        g_nccl = graph_of(lambda: _all_to_all_rows(ctx, payload, [n * 12], [n * 12]))
        g_copy = graph_of(lambda: out.copy_(payload))
        sources = {
            "radii": torch.randint(0, 9, (1, n, 2), dtype=torch.int32, device="cuda"),
            "means2d": torch.randn(1, n, 2, device="cuda"),
            "depths": torch.rand(1, n, device="cuda"),
            "conics": torch.randn(1, n, 3, device="cuda"),
            "opacities": torch.rand(1, n, device="cuda"),
            "colors": torch.rand(1, n, 3, device="cuda"),
        }
        targets = {k: torch.zeros_like(sources[k]) for k in ("means2d", "depths", "conics", "opacities", "colors")}
        ex = GraphedExchange(ctx, [n], [1], torch.device("cuda"), CapturedCall)
        binding = HeadBinding(ex, sources, targets, CapturedCall)
        row = dict(
            gaussians=n,
            payload_mb=round(n * 48 / 1e6, 1),
            nccl_all_to_all=timed(g_nccl.replay),
            device_copy=timed(g_copy.replay),
            pack=timed(binding.pack),
            forward_collective_and_join=timed(ex._calls["forward"].replay),
            backward_pack_and_collective=timed(ex._calls["backward"].replay),
            unpack=timed(binding.unpack),
        )
        rows.append(row)
        print(json.dumps(row))
        binding.release()
        ex.release()
        g_nccl.reset()
        torch.cuda.synchronize()
print("(ms: device time per replay, latency of one replay)")
json.dump(rows, open("nccl_graph.json", "w"), indent=1)

"""Where the deferred SH Adam's catch-up kernel spends its time: one bench invocation of the default
step with graphs off, each launch of kernels/projection.py's ``_lazy_colors_kernel`` wrapped so that
before it runs the state it will read is summarised (seen rows, waiting rows, their gaps k, and the
coefficients outside the closed form, which take their k steps one at a time), and it is timed with
CUDA events on copies of that state, as it is and with eps = 0 (every coefficient with v > 0 in closed form:
the time without the one-step-at-a-time fallback), in this masked form (one program per block of
Gaussians) and in the list form (``_lazy_colors_listed_kernel``: tiles of listed rows, lanes along
each row's coefficients). Then the real launch (the masked form: run with SPLAT_CATCH_UP=masked).

It ran at 4806135 (``probe/``, on one H100; run.sh), whose SPLAT_CATCH_UP switch chose between the
two forms; the masked one and the switch went after this measurement, so run it from a checkout of
that commit.

Usage (repository root, after ``source .whl/gpu-prelude.sh``):
    python3 probe.py OUT.json -- <splat-train bench arguments>
OUT.json: one record per launch (the bench's own output goes to its --out)."""

import json
import sys

import torch

import splat_train.kernels.projection as projection
from splat_train.scripts import bench

RECORDS = []


def summary(a, block):
    """The waiting rows of one launch and how the fallback would loop over them (host values)."""
    _, sh0, shn, _, _, bits, m0, v0, m1, v1, applied, count, tab, _, _, _, b2, eps = a[:18]
    t = int(count.item())
    seen = bits != 0
    k_all = t - applied.long()
    stale = seen & (k_all > 0)
    idx = stale.nonzero().squeeze(1)
    k = k_all[idx]
    n = idx.numel()
    rec = dict(t=t, seen=int(seen.sum()), waiting=n)
    if n == 0:
        return rec
    m = torch.cat([m0[idx].reshape(n, -1), m1[idx].reshape(n, -1)], 1)
    v = torch.cat([v0[idx].reshape(n, -1), v1[idx].reshape(n, -1)], 1)
    b2k = tab[5][k].float().unsqueeze(1)
    closed = (m == 0) | ((v > 0) & (eps <= 2.0**-12 * torch.sqrt(v * b2k)))
    slow = ~closed
    slow_rows = slow.any(1)
    # the masked kernel: per block of rows and per coefficient, the loop runs max k over its slow lanes
    blk = idx // block
    kk = torch.where(slow, k.unsqueeze(1), torch.zeros_like(k).unsqueeze(1))
    nb = int(blk.max()) + 1
    per = torch.zeros(nb, m.shape[1], dtype=torch.long, device=m.device)
    per.scatter_reduce_(0, blk.unsqueeze(1).expand_as(kk), kk, reduce="amax")
    # the same over a list of the waiting rows in tiles of `block` (the list form)
    tile = torch.arange(n, device=m.device) // block
    per_list = torch.zeros(int(tile.max()) + 1, m.shape[1], dtype=torch.long, device=m.device)
    per_list.scatter_reduce_(0, tile.unsqueeze(1).expand_as(kk), kk, reduce="amax")
    # the list form measured here: tiles of 8 rows, one loop for all coefficients of a tile
    tile16 = torch.arange(n, device=m.device) // 8
    per16 = torch.zeros(int(tile16.max()) + 1, dtype=torch.long, device=m.device)
    per16.scatter_reduce_(0, tile16, kk.amax(1), reduce="amax")
    sv = v[slow]
    rec.update(
        k_mean=float(k.float().mean()),
        k_max=int(k.max()),
        slow_coefs=int(slow.sum()),
        coefs=int(slow.numel()),
        slow_rows=int(slow_rows.sum()),
        slow_k_mean=float(k[slow_rows].float().mean()) if bool(slow_rows.any()) else 0.0,
        slow_v_zero=int((sv == 0).sum()),
        slow_sqrt_v_below_eps=int((sv.sqrt() < eps).sum()),
        blocks_active=int(torch.unique(blk).numel()),
        blocks_with_slow=int((per.amax(1) > 0).sum()),
        masked_loop_steps=int(per.sum()),
        listed_loop_steps=int(per_list.sum()),
        listed8_loop_steps=int(per16.sum()),
    )
    return rec


def timed(launch, a, eps):
    """ms of one ``launch(args)`` on copies of the state it writes (sh0, shN, colors, moments,
    applied, the count of waiting rows), eps replaced."""
    a = list(a)
    for i in (1, 2, 4, 6, 7, 8, 9, 10, 18):
        a[i] = a[i].clone()
    a[17] = eps
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    launch(a)
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1)


def listed(a, kw):
    """The list form (projection._lazy_colors_listed_kernel) over the seen rows of ``a``'s bits."""
    bits, N, C, KR = a[5], a[19], a[20], a[21]
    rows = (bits != 0).nonzero().squeeze(1).int()
    count = torch.tensor([rows.numel()], dtype=torch.int32, device=bits.device)
    lanes = 1 << (3 + 3 * KR - 1).bit_length()
    per = max(1, projection.CATCH_UP_LANES // lanes)
    grid = (min(-(-N // per), projection.constants.LISTED_PROGRAMS),)

    def launch(args):
        projection._lazy_colors_listed_kernel[grid](
            *args[:18], rows, count, args[18], N, C, KR, DEG=kw["DEG"], ROWS=per, LANES=lanes, num_warps=projection.CATCH_UP_WARPS
        )

    return launch


class Probe:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*a, **kw):
            rec = summary(a, kw["BLOCK"])
            if rec["waiting"]:
                masked = lambda args: self.kernel[grid](*args, **kw)  # noqa: E731
                listed_form = listed(a, kw)
                timed(masked, a, a[17])  # the first launches: compilation
                timed(listed_form, a, a[17])
                rec["ms"] = timed(masked, a, a[17])
                rec["ms_eps0"] = timed(masked, a, 0.0)
                rec["ms_listed"] = timed(listed_form, a, a[17])
                rec["ms_listed_eps0"] = timed(listed_form, a, 0.0)
                torch.cuda.empty_cache()
            RECORDS.append(rec)
            print("probe:", json.dumps(rec), flush=True)
            return self.kernel[grid](*a, **kw)

        return launch


if __name__ == "__main__":
    out, sep, *rest = sys.argv[1:]
    assert sep == "--", "usage: probe.py OUT.json -- <bench arguments>"
    projection._lazy_colors_kernel = Probe(projection._lazy_colors_kernel)
    try:
        rc = bench.main(rest)
    finally:
        with open(out, "w") as f:
            json.dump(RECORDS, f, indent=1)
    sys.exit(rc)

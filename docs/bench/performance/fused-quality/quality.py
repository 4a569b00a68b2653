"""The fused step's quality against the unfused one: juicebox f4, 7,000 steps, --raster unfused vs
fused, one run per seed. Reads each run's stats/val_step7000.json under the given folders (runs named
q_<raster>_s<seed>) and prints per-seed PSNR, each raster's mean and standard error, and the
difference of the means with its standard error. Usage: python quality.py DIR [DIR ...]"""

import json
import math
import re
import sys
from pathlib import Path


def main(dirs):
    runs = {}
    for d in dirs:
        for v in sorted(Path(d).glob("q_*_s*/stats/val_step7000.json")):
            m = re.match(r"q_(\w+?)_s(\d+)$", v.parent.parent.name)
            runs[(m.group(1), int(m.group(2)))] = json.loads(v.read_text())
    out = {}
    for raster in ("unfused", "fused"):
        seeds = sorted(s for r, s in runs if r == raster)
        psnr = [runs[(raster, s)]["psnr"] for s in seeds]
        n = len(psnr)
        mean = sum(psnr) / n
        sd = math.sqrt(sum((p - mean) ** 2 for p in psnr) / (n - 1))
        gs = [runs[(raster, s)]["num_gaussians"] for s in seeds]
        ssim = sum(runs[(raster, s)]["ssim"] for s in seeds) / n
        out[raster] = dict(
            seeds=seeds, psnr=psnr, mean=mean, se=sd / math.sqrt(n), ssim=ssim, gaussians=(min(gs), max(gs))
        )
        print(
            f"{raster:8s} n={n} mean PSNR {mean:.3f} (SE {sd / math.sqrt(n):.3f}) SSIM {ssim:.4f} Gaussians {min(gs)}-{max(gs)}"
        )
        print("         " + " ".join(f"s{s}:{p:.3f}" for s, p in zip(seeds, psnr)))
    d = out["fused"]["mean"] - out["unfused"]["mean"]
    se = math.hypot(out["fused"]["se"], out["unfused"]["se"])
    print(f"fused - unfused: {d:+.3f} dB (SE {se:.3f})")
    out["difference"] = dict(mean=d, se=se)
    return out


if __name__ == "__main__":
    json.dump(main(sys.argv[1:]), open("/dev/stderr", "w"), indent=1)

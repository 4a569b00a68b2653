"""Session 17: the fused kernel of main (1baedb4: its sources and its own kernels/fused_raster.py,
from BASE_PKG, built under another module name) against this session's, on the same captured
inputs, in one process. Each kernel is called through its own host code (main's launcher has
another signature), so the times include each one's buffers and fills around the launch.

    python3 kernel_ab.py OUT.json SCENE_ARGS...   (SCENE_ARGS as bench-raster's: --data_dir ... --ckpt ...)

Kernels timed: "base" (main's, absgrad off), "new" (this session's, absgrad off: the training
default), "new_absgrad" (absgrad on, the instantiation with the absolute-gradient sums) and, with
VARIANTS="name=csrc_dir,...", more kernels built from other source folders (absgrad off). For each
and SPLAT_TRAIN_FUSED_PHASES 1 (forward), 2 (+ loss) and 3 (whole kernel): the GPU time per call of
ROUNDS x CALLS back-to-back launches (CUDA events around each round of CALLS calls, so host time
between launches is hidden), rounds interleaved across the kernels; the median round is reported.
Also the loss and the gradients (absgrad included, both kernels with absgrad on) of the two
kernels against each other: max |a - b| / max |b| and ||a - b|| / ||b|| per gradient.
"""

import json
import os
import statistics
import sys
import time

import torch

BASE_PKG = os.environ.get("BASE_PKG", ".gpu/base")  # holds main's kernels/ package
BASE_CSRC = os.path.join(BASE_PKG, "kernels", "csrc")
ROUNDS, CALLS = 7, 10


def load_base(name="base", csrc=BASE_CSRC):
    from torch.utils import cpp_extension

    from splat_train.kernels import native

    build = os.path.join(os.environ.get("BASE_BUILD", "/tmp/base_build"), name)
    os.makedirs(build, exist_ok=True)
    t = time.perf_counter()
    mod = cpp_extension.load(
        name=f"splat_train_fused_raster_{name}",
        sources=[os.path.join(csrc, s) for s in native.SOURCES],
        extra_include_paths=[csrc],
        extra_cflags=["-O3"],
        extra_cuda_cflags=native.device_flags(),
        build_directory=build,
    )
    return mod, time.perf_counter() - t


def base_module():
    """main's kernels/fused_raster.py, imported as the top-level package ``kernels`` of BASE_PKG."""
    import importlib

    sys.path.insert(0, os.path.abspath(BASE_PKG))
    try:
        return importlib.import_module("kernels.fused_raster")
    finally:
        sys.path.pop(0)


def variants():
    """{name: csrc folder} from VARIANTS="name=dir,..."."""
    spec = os.environ.get("VARIANTS", "")
    return dict(item.split("=", 1) for item in spec.split(",") if item)


def main(out_path, argv):
    from splat_train.kernels import fused_raster as fr
    from splat_train.kernels import native
    from splat_train.scripts import bench_raster

    t = time.perf_counter()
    new = native.load()
    t_new = time.perf_counter() - t
    base, t_base = load_base()
    extra = {name: load_base(name, csrc)[0] for name, csrc in variants().items()}
    args = bench_raster.parse(argv)
    inp = bench_raster.capture_inputs(args)
    dev = inp["device"]

    base_fr = base_module()

    def call(ext, absgrad):
        module = base_fr if ext is base else fr
        return module._launch(
            ext, inp["means2d"], inp["conics"], inp["colors"], inp["opacities"], None, inp["gts"],
            inp["isect_offsets"], inp["flatten_ids"], inp["width"], inp["height"], 0.2, False, absgrad,
        )[:3]  # fmt: skip

    kernels = {"base": (base, False), "new": (new, False), "new_absgrad": (new, True)}
    kernels.update({name: (ext, False) for name, ext in extra.items()})
    ref = {"base": call(base, True), "new": call(new, True)}
    lb, gb, sb = ref["base"]
    ln, gn, sn = ref["new"]
    diffs = {"loss_rel": float((ln - lb).abs() / lb.abs())}
    for k in ("means2d", "conics", "colors", "opacities"):
        a, b = gn[k], gb[k]
        diffs[k] = dict(max_rel=float((a - b).abs().max() / b.abs().max()), norm_rel=float((a - b).norm() / b.norm()))
    diffs["absgrad_norm_rel"] = float((sn["absgrad"] - sb["absgrad"]).norm() / sb["absgrad"].norm())
    _, g_off, _ = call(new, False)
    diffs["new_absgrad_off_vs_on_grad_norm_rel"] = max(
        float((g_off[k] - gn[k]).norm() / gn[k].norm()) for k in ("means2d", "conics", "colors", "opacities")
    )
    for name, ext in extra.items():
        _, g_v, _ = call(ext, True)
        diffs[name + "_vs_new_grad_norm_rel"] = max(
            float((g_v[k] - gn[k]).norm() / gn[k].norm()) for k in ("means2d", "conics", "colors", "opacities")
        )
    results = {}
    for phases in ("1", "2", "3"):
        os.environ["SPLAT_TRAIN_FUSED_PHASES"] = phases
        per: dict = {name: [] for name in kernels}

        def rounds(ext, absgrad, calls):
            torch.cuda.synchronize(dev)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(calls):
                call(ext, absgrad)
            e.record()
            e.synchronize()
            return s.elapsed_time(e) / calls

        for ext, absgrad in kernels.values():  # warm-up
            rounds(ext, absgrad, 3)
        for _ in range(ROUNDS):
            for name, (ext, absgrad) in kernels.items():
                per[name].append(rounds(ext, absgrad, CALLS))
        results[phases] = {name: dict(ms_median=statistics.median(v), ms_all=v) for name, v in per.items()}
    os.environ["SPLAT_TRAIN_FUSED_PHASES"] = "3"
    report = dict(
        scene=argv, num_gaussians=inp["num_gaussians"], num_isects=inp["num_isects"], model_step=inp["step"],
        resolution=f"{inp['width']}x{inp['height']}", load_s=dict(new=t_new, base=t_base),
        ms_per_call=results, new_vs_base=diffs, device=torch.cuda.get_device_name(dev),
    )  # fmt: skip
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    for ph, r in results.items():
        b = r["base"]["ms_median"]
        print(
            f"phases {ph}: "
            + ", ".join(f"{n} {v['ms_median']:.3f} ms ({b / v['ms_median']:.2f}x)" for n, v in r.items())
        )
    print("new vs base:", json.dumps(diffs))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

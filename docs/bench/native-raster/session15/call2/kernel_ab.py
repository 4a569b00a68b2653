"""Session 15: the fused kernel before (main at 572b138, built from BASE_CSRC under another module
name) and after this session's changes, on the same captured inputs, in one process. Variants of
the new kernel: "new" (as built by kernels/native.py), "new_nocull" (SPLAT_TRAIN_FUSED_CULL=0) and,
with AB_B3=1, "new_b3" (the same source built with -DST_MIN_BLOCKS=3: 80 registers, 3 blocks per SM).

    python3 kernel_ab.py OUT.json SCENE_ARGS...   (SCENE_ARGS as bench-raster's: --data_dir ... --ckpt ...)

For each kernel and SPLAT_TRAIN_FUSED_PHASES 1 (forward), 2 (+ loss) and 3 (whole kernel): the GPU
time per call of ROUNDS x CALLS back-to-back launches (CUDA events around each round of CALLS
calls, so host time between launches is hidden), rounds interleaved across the kernels; the
median round is reported. Also the loss and gradients of the two kernels against each other
(max |a - b| / max |b| and ||a - b|| / ||b|| per gradient).
"""

import json
import os
import statistics
import sys
import time

import torch

BASE_CSRC = os.environ.get("BASE_CSRC", ".gpu/base/kernels/csrc")
ROUNDS, CALLS = 7, 10


def load_base():
    from torch.utils import cpp_extension

    t = time.perf_counter()
    mod = cpp_extension.load(
        name="splat_train_fused_raster_base",
        sources=[os.path.join(BASE_CSRC, "fused_raster_ext.cu")],
        extra_include_paths=[BASE_CSRC],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", "-std=c++17"],
        build_directory=os.environ.get("BASE_BUILD"),
    )
    return mod, time.perf_counter() - t


def load_b3():
    from torch.utils import cpp_extension

    from splat_train.kernels import native

    t = time.perf_counter()
    mod = cpp_extension.load(
        name="splat_train_fused_raster_b3",
        sources=[str(native.CSRC / f) for f in native.SOURCES],
        extra_include_paths=[str(native.CSRC)],
        extra_cflags=["-O3"],
        extra_cuda_cflags=native.device_flags() + ["-DST_MIN_BLOCKS=3"],
        build_directory=os.environ.get("B3_BUILD"),
    )
    return mod, time.perf_counter() - t


def main(out_path, argv):
    from splat_train.kernels import fused_raster as fr
    from splat_train.kernels import native
    from splat_train.scripts import bench_raster

    t = time.perf_counter()
    new = native.load()
    t_new = time.perf_counter() - t
    base, t_base = load_base()
    args = bench_raster.parse(argv)
    inp = bench_raster.capture_inputs(args)
    dev = inp["device"]

    def call(ext):
        return fr._launch(
            ext, inp["means2d"], inp["conics"], inp["colors"], inp["opacities"], None, inp["gts"],
            inp["isect_offsets"], inp["flatten_ids"], inp["width"], inp["height"], 0.2, False, True,
        )  # fmt: skip

    kernels = {"base": base, "new": new, "new_nocull": new}
    env = {"new_nocull": {"SPLAT_TRAIN_FUSED_CULL": "0"}}
    load_s = dict(new=t_new, base=t_base)
    if os.environ.get("AB_B3") == "1":
        kernels["new_b3"], load_s["new_b3"] = load_b3()

    def with_env(name, fn):
        saved = {k: os.environ.get(k) for k in env.get(name, {})}
        os.environ.update(env.get(name, {}))
        try:
            return fn()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    results = {}
    ref = {name: with_env(name, lambda: call(ext)) for name, ext in kernels.items()}
    lb, gb, _ = ref["base"]
    ln, gn, _ = ref["new"]
    diffs = {"loss_rel": float((ln - lb).abs() / lb.abs())}
    for k in ("means2d", "conics", "colors", "opacities"):
        a, b = gn[k], gb[k]
        diffs[k] = dict(max_rel=float((a - b).abs().max() / b.abs().max()), norm_rel=float((a - b).norm() / b.norm()))
    abs_new, abs_base = ref["new"][2]["absgrad"], ref["base"][2]["absgrad"]
    diffs["absgrad_norm_rel"] = float((abs_new - abs_base).norm() / abs_base.norm())
    for name in kernels:
        if name not in ("base", "new"):
            diffs[name + "_vs_new_grad_norm_rel"] = max(
                float((ref[name][1][k] - gn[k]).norm() / gn[k].norm())
                for k in ("means2d", "conics", "colors", "opacities")
            )
    for phases in ("1", "2", "3"):
        os.environ["SPLAT_TRAIN_FUSED_PHASES"] = phases
        per = {name: [] for name in kernels}

        def rounds(ext, calls):
            torch.cuda.synchronize(dev)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(calls):
                call(ext)
            e.record()
            e.synchronize()
            return s.elapsed_time(e) / calls

        for name, ext in kernels.items():  # warm-up
            with_env(name, lambda: rounds(ext, 3))
        for _ in range(ROUNDS):
            for name, ext in kernels.items():
                per[name].append(with_env(name, lambda: rounds(ext, CALLS)))
        results[phases] = {name: dict(ms_median=statistics.median(v), ms_all=v) for name, v in per.items()}
    os.environ["SPLAT_TRAIN_FUSED_PHASES"] = "3"
    report = dict(
        scene=argv, num_gaussians=inp["num_gaussians"], num_isects=inp["num_isects"], model_step=inp["step"],
        resolution=f"{inp['width']}x{inp['height']}", load_s=load_s,
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

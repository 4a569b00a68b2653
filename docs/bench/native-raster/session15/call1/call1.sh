# session 15, call 1 on one H200: the fused kernel of this session (no checkpoint scan, warp row
# masks in the forward, per-bucket pixel lists in the backward, split build) against main's
# (572b138, from .gpu/base): first-use builds, the GPU tests of the kernel, two trained juicebox f2
# models (default 7,000 steps; bytesplat, pruned), then kernel_ab.py (old vs new, phases 1/2/3) and
# bench-raster (fused vs the fastest unfused) on those two models and the 2 M synthetic image.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
which ncu nsys >> $OUT/gpu.txt 2>&1
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox; R=/tmp/r; mkdir -p $R
# 1. builds (first use), both at once
python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load(verbose=True)
print('native build (first use):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" > $OUT/native_build.txt 2>&1 &
NB=$!
mkdir -p /tmp/base_build && BASE_BUILD=/tmp/base_build python3 -c "
import sys, time; sys.path.insert(0, 'docs/bench/native-raster/session15')
import kernel_ab; m, t = kernel_ab.load_base(); print('base build', round(t, 1), 's')" > $OUT/base_build.txt 2>&1 &
BB=$!
# 2. two trained models meanwhile (GPU shared; not a speed figure)
timeout 300 bash -c "$(declare -f ST); ST default --data_dir $J --data_factor 2 --max_steps 7000 --eval_steps 7000 --save_steps 7000 --ply_steps 30000 --num_traj_frames 0 --result_dir $R/ck_default" > $OUT/train_default.log 2>&1 &
P1=$!
wait $NB; tail -1 $OUT/native_build.txt; el "native build done"
python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native load (cached):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" >> $OUT/native_build.txt 2>&1
timeout 300 bash -c "$(declare -f ST); ST bytesplat --data_dir $J --data_factor 2 --steps_scaler 0.233334 --eval_steps 30000 --ply_steps 99999 --num_traj_frames 0 --result_dir $R/ck_bytesplat" > $OUT/train_bytesplat.log 2>&1 &
P2=$!
# 3. the kernel's GPU tests (new code)
timeout 240 python3 -m pytest -q -m gpu tests/test_gpu_fused_raster.py tests/test_gpu.py::test_fused_raster_kernel_matches_reference_on_gpu > $OUT/gpu_tests.log 2>&1
el "gpu tests rc=$? $(tail -1 $OUT/gpu_tests.log)"
wait $BB; el "base build: $(tail -1 $OUT/base_build.txt)"
wait $P1 $P2
el "training done: $(ls $R/ck_default/ckpts $R/ck_bytesplat/ckpts | tr '\n' ' ')"
for v in default bytesplat; do mkdir -p $OUT/train_$v && cp -r $R/ck_$v/stats $R/ck_$v/cfg.yml $OUT/train_$v/ 2>/dev/null; done
# 4. old vs new kernel, same inputs, one process per scene (GPU alone from here)
CKD=$(ls $R/ck_default/ckpts/ckpt_*_rank0.pt | tail -1); CKB=$(ls $R/ck_bytesplat/ckpts/ckpt_*_rank0.pt | tail -1)
AB="docs/bench/native-raster/session15/kernel_ab.py"
BASE_BUILD=/tmp/base_build timeout 90 python3 $AB $OUT/ab_default.json --data_dir $J --data_factor 2 --ckpt $CKD > $OUT/ab_default.log 2>&1; el "ab default rc=$?"
BASE_BUILD=/tmp/base_build timeout 90 python3 $AB $OUT/ab_bytesplat.json --data_dir $J --data_factor 2 --ckpt $CKB > $OUT/ab_bytesplat.log 2>&1; el "ab bytesplat rc=$?"
BASE_BUILD=/tmp/base_build timeout 120 python3 $AB $OUT/ab_2m.json --synthetic_gaussians 2000000 --resolution 1600x1200 > $OUT/ab_2m.log 2>&1; el "ab 2m rc=$?"
# 5. bench-raster (new code): fused vs the fastest unfused
for v in default bytesplat; do
  ck=$(ls $R/ck_$v/ckpts/ckpt_*_rank0.pt | tail -1)
  timeout 90 bash -c "$(declare -f ST); ST bench-raster --data_dir $J --data_factor 2 --ckpt $ck --repeats 20 --warmup 3 --profile 5 --out $OUT/br_$v" > $OUT/br_$v.log 2>&1
  el "bench-raster $v rc=$?"
done
timeout 100 bash -c "$(declare -f ST); ST bench-raster --synthetic_gaussians 2000000 --resolution 1600x1200 --repeats 20 --warmup 3 --profile 5 --out $OUT/br_2m" > $OUT/br_2m.log 2>&1
el "bench-raster 2m rc=$?"
# the trained checkpoints for later calls are too large to carry back; keep their sizes
ls -la $R/ck_default/ckpts $R/ck_bytesplat/ckpts > $OUT/ckpts.txt
find $OUT -name "*.png" -size +1M -delete
el done

# session 15, call 2 on one H200: this session's kernel (no checkpoint scan; per-bucket pixel lists
# built by a shuffle OR-reduction; denormals flushed) against main's (572b138, .gpu/base), same
# inputs, one process per scene (kernel_ab.py, phases 1/2/3; variants: no cull, 3 blocks per SM);
# the kernel's GPU tests; bench-raster (fused vs the fastest unfused) and whole iterations W = 1.
# Everything it writes is packed into $OUT/call2.tar.gz.
set -o pipefail
O=/tmp/o2; mkdir -p $O
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $O/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; which ncu nsys; } > $O/gpu.txt 2>&1
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox; R=/tmp/r; mkdir -p $R
# 1. two trained models (the GPU to themselves; not a speed figure)
timeout 300 bash -c "$(declare -f ST); ST default --data_dir $J --data_factor 2 --max_steps 7000 --eval_steps 7000 --save_steps 7000 --ply_steps 30000 --num_traj_frames 0 --result_dir $R/ck_default" > $O/train_default.log 2>&1 &
P1=$!
# builds meanwhile (CPU, all three at once): this kernel's first use, then its cached load; main's
# kernel; the 3-block variant
export BASE_CSRC=$PWD/.gpu/base/kernels/csrc BASE_BUILD=/tmp/base_build B3_BUILD=/tmp/b3_build
mkdir -p $BASE_BUILD $B3_BUILD
( cd docs/bench/native-raster/session15 && python3 -c "
import kernel_ab; m, t = kernel_ab.load_base(); print('base build', round(t, 1), 's')" ) > $O/base_build.txt 2>&1 &
BB=$!
( cd docs/bench/native-raster/session15 && python3 -c "
import kernel_ab; m, t = kernel_ab.load_b3(); print('b3 build', round(t, 1), 's')" ) > $O/b3_build.txt 2>&1 &
B3=$!
python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native build (first use):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" > $O/native_build.txt 2>&1
python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native load (second process, cached):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" >> $O/native_build.txt 2>&1
el "native: $(cat $O/native_build.txt | tr '\n' ' ')"
# the bytesplat preset trains with the fused kernel: started once it is built
timeout 300 bash -c "$(declare -f ST); ST bytesplat --data_dir $J --data_factor 2 --steps_scaler 0.233334 --eval_steps 30000 --ply_steps 99999 --num_traj_frames 0 --result_dir $R/ck_bytesplat" > $O/train_bytesplat.log 2>&1 &
P2=$!
wait $BB $B3
el "variants: $(tail -1 $O/base_build.txt) / $(tail -1 $O/b3_build.txt)"
wait $P1 $P2
el "training done: $(ls $R/ck_default/ckpts $R/ck_bytesplat/ckpts | tr '\n' ' ')"
for v in default bytesplat; do mkdir -p $O/train_$v && cp -r $R/ck_$v/stats $R/ck_$v/cfg.yml $O/train_$v/ 2>/dev/null; done
CKD=$(ls $R/ck_default/ckpts/ckpt_*_rank0.pt | tail -1); CKB=$(ls $R/ck_bytesplat/ckpts/ckpt_*_rank0.pt | tail -1)
# 2. the kernel's GPU tests
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_fused_raster.py tests/test_gpu.py::test_fused_raster_kernel_matches_reference_on_gpu > $O/gpu_tests.log 2>&1
el "gpu tests rc=$? $(tail -1 $O/gpu_tests.log)"
# 3. old vs new kernel and variants, same inputs
AB="docs/bench/native-raster/session15/kernel_ab.py"
export AB_B3=1
timeout 90 python3 $AB $O/ab_default.json --data_dir $J --data_factor 2 --ckpt $CKD > $O/ab_default.log 2>&1; el "ab default rc=$?"
timeout 90 python3 $AB $O/ab_bytesplat.json --data_dir $J --data_factor 2 --ckpt $CKB > $O/ab_bytesplat.log 2>&1; el "ab bytesplat rc=$?"
timeout 120 python3 $AB $O/ab_2m.json --synthetic_gaussians 2000000 --resolution 1600x1200 > $O/ab_2m.log 2>&1; el "ab 2m rc=$?"
# 4. bench-raster: fused vs the fastest unfused
for v in default bytesplat; do
  ck=$(ls $R/ck_$v/ckpts/ckpt_*_rank0.pt | tail -1)
  timeout 90 bash -c "$(declare -f ST); ST bench-raster --data_dir $J --data_factor 2 --ckpt $ck --repeats 20 --warmup 3 --profile 5 --out $O/br_$v" > $O/br_$v.log 2>&1
  el "bench-raster $v rc=$?"
done
timeout 100 bash -c "$(declare -f ST); ST bench-raster --synthetic_gaussians 2000000 --resolution 1600x1200 --repeats 20 --warmup 3 --profile 5 --out $O/br_2m" > $O/br_2m.log 2>&1
el "bench-raster 2m rc=$?"
# 5. whole iterations, W = 1: juicebox f2 from the default checkpoint, then the 2 M scene
timeout 150 bash -c "$(declare -f ST); ST bench --data_dir $J --data_factor 2 --ckpt $CKD --world_sizes 1 --variants gsplat-dist ours-dense ours-packed ours-packed-fused --variant 'ours-dense-fused=--raster fused' --steps 200 --warmup 40 --phase_steps 5 --out $O/bench_f2" > $O/bench_f2.log 2>&1
el "bench f2 rc=$?"
timeout 150 bash -c "$(declare -f ST); ST bench --synthetic_gaussians 2000000 --resolution 1600x1200 --world_sizes 1 --variants gsplat-dist ours-dense ours-packed ours-packed-fused --variant 'ours-dense-fused=--raster fused' --steps 40 --warmup 10 --phase_steps 3 --out $O/bench_2m" > $O/bench_2m.log 2>&1
el "bench 2m rc=$?"
ls -la $R/ck_default/ckpts $R/ck_bytesplat/ckpts > $O/ckpts.txt
find $O -name "*.png" -delete
el done
tar -czf $OUT/call2.tar.gz -C /tmp o2

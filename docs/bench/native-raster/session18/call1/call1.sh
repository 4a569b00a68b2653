# session 18, call 1 on one H200. The kernel: session 17's changes (fab0775: base-2 compositing, the
# loss reduced by the kernel's last block, one zeroed gradient buffer, scaling skipped when the
# incoming gradient is 1), the forward's four pairs per iteration (60dab70) and the packed-key rank
# (the commit after it). First-use build and a cached second start; GPU tests; two juicebox f2 models
# trained (default 7,000 steps; bytesplat, pruned); kernel_ab.py (same inputs, phases 1/2/3):
# base = session 16's kernel (1baedb4, .gpu/base), new = this tree, v3 = 60dab70 (.gpu/v3, without
# the packed-key rank); bench-raster (fused vs the fastest unfused) on both models and the 2 M
# synthetic image; whole iterations W = 1 on juicebox f2 and the 2 M scene. Packed into
# $OUT/call1.tar.gz.
set -o pipefail
O=/tmp/o1; mkdir -p $O
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $O/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=32
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site
python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native build (first use):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" > $O/native_build.txt 2>&1 &
NB=$!
ROOT=$PWD
export BASE_PKG=$ROOT/.gpu/base BASE_BUILD=/tmp/base_build VARIANTS="v3=$ROOT/.gpu/v3"; mkdir -p $BASE_BUILD
AB="$PWD/docs/bench/native-raster/session17/kernel_ab.py"
( cd docs/bench/native-raster/session17 && python3 -c "
import kernel_ab; m, t = kernel_ab.load_base(); print('base build', round(t, 1), 's')
m, t = kernel_ab.load_base('v3', '$ROOT/.gpu/v3'); print('v3 build', round(t, 1), 's')" ) > $O/base_build.txt 2>&1 &
BB=$!
source .whl/gpu-prelude.sh > $O/prelude.txt 2>&1 || { cat $O/prelude.txt; exit 1; }
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done: $(tail -2 $O/prelude.txt | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt 2>&1
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox; R=/tmp/r; mkdir -p $R
wait $NB; el "$(cat $O/native_build.txt | tr '\n' ' ')"
timeout 300 bash -c "$(declare -f ST); ST default --data_dir $J --data_factor 2 --max_steps 7000 --eval_steps 7000 --save_steps 7000 --ply_steps 30000 --num_traj_frames 0 --result_dir $R/ck_default" > $O/train_default.log 2>&1 &
P1=$!
timeout 300 bash -c "$(declare -f ST); ST bytesplat --data_dir $J --data_factor 2 --steps_scaler 0.233334 --eval_steps 30000 --ply_steps 99999 --num_traj_frames 0 --result_dir $R/ck_bytesplat" > $O/train_bytesplat.log 2>&1 &
P2=$!
python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native load (second process, cached):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" >> $O/native_build.txt 2>&1
el "$(tail -1 $O/native_build.txt)"
timeout 260 python3 -m pytest -q -m gpu tests/test_gpu_fused_raster.py tests/test_grad_scale.py tests/test_gpu.py -k "fused or whole_step or grad_scale or kernel_matches" -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "gpu tests rc=$? $(tail -1 $O/gpu_tests.log)"
wait $BB; el "$(tail -3 $O/base_build.txt | tr '\n' ' ')"
wait $P1 $P2
el "training done: $(ls $R/ck_default/ckpts $R/ck_bytesplat/ckpts | tr '\n' ' ')"
for v in default bytesplat; do mkdir -p $O/train_$v && cp -r $R/ck_$v/stats $R/ck_$v/cfg.yml $O/train_$v/ 2>/dev/null; done
CKD=$(ls $R/ck_default/ckpts/ckpt_*_rank0.pt | tail -1); CKB=$(ls $R/ck_bytesplat/ckpts/ckpt_*_rank0.pt | tail -1)
timeout 100 python3 $AB $O/ab_2m.json --synthetic_gaussians 2000000 --resolution 1600x1200 > $O/ab_2m.log 2>&1; el "ab 2m rc=$? $(head -3 $O/ab_2m.log | tr '\n' ' ')"
timeout 90 python3 $AB $O/ab_default.json --data_dir $J --data_factor 2 --ckpt $CKD > $O/ab_default.log 2>&1; el "ab default rc=$? $(head -3 $O/ab_default.log | tr '\n' ' ')"
timeout 90 python3 $AB $O/ab_bytesplat.json --data_dir $J --data_factor 2 --ckpt $CKB > $O/ab_bytesplat.log 2>&1; el "ab bytesplat rc=$? $(head -3 $O/ab_bytesplat.log | tr '\n' ' ')"
for v in default bytesplat; do
  ck=$(ls $R/ck_$v/ckpts/ckpt_*_rank0.pt | tail -1)
  timeout 90 bash -c "$(declare -f ST); ST bench-raster --data_dir $J --data_factor 2 --ckpt $ck --repeats 20 --warmup 3 --profile 5 --out $O/br_$v" > $O/br_$v.log 2>&1
  el "bench-raster $v rc=$?"
done
timeout 100 bash -c "$(declare -f ST); ST bench-raster --synthetic_gaussians 2000000 --resolution 1600x1200 --repeats 20 --warmup 3 --profile 5 --out $O/br_2m" > $O/br_2m.log 2>&1
el "bench-raster 2m rc=$?"
timeout 150 bash -c "$(declare -f ST); ST bench --data_dir $J --data_factor 2 --ckpt $CKD --world_sizes 1 --variants gsplat-dist ours-dense ours-packed ours-packed-fused --variant 'ours-dense-fused=--raster fused' --steps 200 --warmup 40 --phase_steps 5 --out $O/bench_f2" > $O/bench_f2.log 2>&1
el "bench f2 rc=$?"
timeout 150 bash -c "$(declare -f ST); ST bench --synthetic_gaussians 2000000 --resolution 1600x1200 --world_sizes 1 --variants gsplat-dist ours-dense ours-packed ours-packed-fused --variant 'ours-dense-fused=--raster fused' --steps 40 --warmup 10 --phase_steps 3 --out $O/bench_2m" > $O/bench_2m.log 2>&1
el "bench 2m rc=$?"
ls -la $R/ck_default/ckpts $R/ck_bytesplat/ckpts > $O/ckpts.txt
find $O -name "*.png" -delete
el done
tar -czf $OUT/call1.tar.gz -C /tmp o1

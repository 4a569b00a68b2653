# session 16, call 2 on one H200: the last round's buckets split into pixel ranges (every warp of a
# tile's block busy), against call 1's kernel (383856c, "base") and a variant that splits only
# tiles of fewer buckets than warps ("v2", .gpu/v2). First-use build; the whole GPU test suite;
# two trained juicebox f2 models; kernel_ab.py; bench-raster on both models and the 2 M synthetic
# image; whole iterations W = 1 on juicebox f2 and the 2 M scene. Output packed into $OUT/call2.tar.gz.
set -o pipefail
O=/tmp/o2; mkdir -p $O
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
export BASE_CSRC=$PWD/.gpu/base/kernels/csrc BASE_BUILD=/tmp/base_build VARIANTS="v2=$PWD/.gpu/v2/kernels/csrc"
( cd docs/bench/native-raster/session16 && python3 -c "
import kernel_ab; m, t = kernel_ab.load_base(); print('base build', round(t, 1), 's')
for n, c in kernel_ab.variants().items(): print(n, 'build', round(kernel_ab.load_base(n, c)[1], 1), 's')" ) > $O/base_build.txt 2>&1 &
BB=$!
source .whl/gpu-prelude.sh > $O/prelude.txt 2>&1 || { cat $O/prelude.txt; exit 1; }
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done: $(tail -1 $O/prelude.txt)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt 2>&1
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox; R=/tmp/r; mkdir -p $R
timeout 300 bash -c "$(declare -f ST); ST default --data_dir $J --data_factor 2 --max_steps 7000 --eval_steps 7000 --save_steps 7000 --ply_steps 30000 --num_traj_frames 0 --result_dir $R/ck_default" > $O/train_default.log 2>&1 &
P1=$!
timeout 300 bash -c "$(declare -f ST); ST bytesplat --data_dir $J --data_factor 2 --steps_scaler 0.233334 --eval_steps 30000 --ply_steps 99999 --num_traj_frames 0 --result_dir $R/ck_bytesplat" > $O/train_bytesplat.log 2>&1 &
P2=$!
wait $NB; el "$(cat $O/native_build.txt | tr '\n' ' ')"
timeout 330 python3 -m pytest -q -m gpu tests -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "gpu suite rc=$? $(tail -1 $O/gpu_tests.log)"
wait $BB; el "$(cat $O/base_build.txt | tr '\n' ' ')"
wait $P1 $P2
el "training done: $(ls $R/ck_default/ckpts $R/ck_bytesplat/ckpts | tr '\n' ' ')"
for v in default bytesplat; do mkdir -p $O/train_$v && cp -r $R/ck_$v/stats $R/ck_$v/cfg.yml $O/train_$v/ 2>/dev/null; done
CKD=$(ls $R/ck_default/ckpts/ckpt_*_rank0.pt | tail -1); CKB=$(ls $R/ck_bytesplat/ckpts/ckpt_*_rank0.pt | tail -1)
AB="docs/bench/native-raster/session16/kernel_ab.py"
timeout 120 python3 $AB $O/ab_2m.json --synthetic_gaussians 2000000 --resolution 1600x1200 > $O/ab_2m.log 2>&1; el "ab 2m rc=$? $(head -3 $O/ab_2m.log | tr '\n' ' ')"
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
find $O -name "*.png" -delete
el done

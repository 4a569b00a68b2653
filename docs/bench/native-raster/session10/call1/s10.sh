# session 10, one call on the H200 at main (fa4b701): issue 16's bench-raster on trained juicebox f2
# models (the default strategy's 7,000-step checkpoint and the ByteSplat preset's pruned one, 7,000
# steps via --steps_scaler), the 2 M synthetic image again (the committed, chunk-capable kernel),
# and whole iterations W = 1 on juicebox f2 from the default checkpoint.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
# the native kernel builds while gsplat's extension builds (both nvcc; 16 cores)
( PYTHONPATH=/tmp/pp python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native build (first use):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" > $OUT/native_build.txt 2>&1 ) &
NB=$!
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
wait $NB; cat $OUT/native_build.txt | tail -2
el "builds done"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox; R=/tmp/r; mkdir -p $R
# 1. two trained models, side by side (not a speed figure)
timeout 240 bash -c "$(declare -f ST); ST default --data_dir $J --data_factor 2 --max_steps 7000 --eval_steps 7000 --save_steps 7000 --ply_steps 30000 --num_traj_frames 0 --result_dir $R/ck_default" > $OUT/train_default.log 2>&1 &
P1=$!
timeout 240 bash -c "$(declare -f ST); ST bytesplat --data_dir $J --data_factor 2 --steps_scaler 0.233334 --eval_steps 30000 --ply_steps 99999 --num_traj_frames 0 --result_dir $R/ck_bytesplat" > $OUT/train_bytesplat.log 2>&1 &
P2=$!
wait $P1 $P2
el "training done: $(ls $R/ck_default/ckpts $R/ck_bytesplat/ckpts | tr '\n' ' ')"
for v in default bytesplat; do mkdir -p $OUT/train_$v && cp -r $R/ck_$v/stats $R/ck_$v/cfg.yml $OUT/train_$v/ 2>/dev/null; done
# 2. bench-raster: one image, median of 20 calls, 5 profiled
for v in default bytesplat; do
  ck=$(ls $R/ck_$v/ckpts/ckpt_7000_rank*.pt 2>/dev/null)
  [ -n "$ck" ] || { el "no 7000 checkpoint for $v"; continue; }
  timeout 90 bash -c "$(declare -f ST); ST bench-raster --data_dir $J --data_factor 2 --ckpt $ck --repeats 20 --warmup 3 --profile 5 --out $OUT/br_$v" > $OUT/br_$v.log 2>&1
  el "bench-raster $v rc=$?"
done
timeout 100 bash -c "$(declare -f ST); ST bench-raster --synthetic_gaussians 2000000 --resolution 1600x1200 --repeats 20 --warmup 3 --profile 5 --out $OUT/br_2m" > $OUT/br_2m.log 2>&1
el "bench-raster 2m rc=$?"
# 3. whole iterations, W = 1, juicebox f2 from the default checkpoint
ck=$(ls $R/ck_default/ckpts/ckpt_7000_rank*.pt 2>/dev/null)
timeout 150 bash -c "$(declare -f ST); ST bench --data_dir $J --data_factor 2 --ckpt $ck --world_sizes 1 --variants gsplat-dist ours-packed ours-packed-fused --steps 100 --warmup 20 --phase_steps 5 --out $OUT/bench_f2" > $OUT/bench_f2.log 2>&1
el "bench f2 rc=$?"
find $OUT -name "*.png" -size +2M -delete
el done

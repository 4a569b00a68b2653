#!/usr/bin/env bash
# Second GPU call for issue 16 (copied to docs/bench/native-raster/run16b.sh): build, GPU tests,
# bench-raster (2 M synthetic: whole kernel and its parts; juicebox f2 after 2,000 steps), bench W = 1.
set -u
cd "$(dirname "$0")"
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export PYTHONPATH=/tmp/pp:$PYTHONPATH SPLAT_TRAIN_CACHE=/tmp/stc
ST="python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))'"
L=$OUT/call2.log
echo "rev $(cat REV)" | tee $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $L
T0=$(date +%s)
timeout 200 python3 -c "
import time;t=time.time()
from splat_train.kernels import native
m=native.load()
print('BUILD first use', round(time.time()-t,1), 's, ok =', m is not None, native.LOAD_ERROR)" 2>&1 | tail -5 | tee -a $L
timeout 60 python3 -c "
import time;t=time.time()
from splat_train.kernels import native
m=native.load()
print('LOAD second start (cache)', round(time.time()-t,2), 's, ok =', m is not None)" 2>&1 | tail -2 | tee -a $L
echo "t=$(( $(date +%s) - T0 ))s after build" | tee -a $L
timeout 120 python3 -m pytest -m gpu tests/test_gpu_fused_raster.py "tests/test_gpu.py::test_fused_raster_kernel_matches_reference_on_gpu" -x -q 2>&1 | tail -25 | tee -a $L
echo "t=$(( $(date +%s) - T0 ))s after tests" | tee -a $L
timeout 90 bash -c "$ST bench-raster --synthetic_gaussians 2000000 --resolution 1600x1200 --repeats 20 --warmup 3 --profile 5 --out /tmp/br2m" 2>&1 | grep -v Warn | tail -16 | tee -a $L
cp /tmp/br2m/bench_raster.json $OUT/bench_raster_2m.json
for ph in 1 2; do
echo "--- SPLAT_TRAIN_FUSED_PHASES=$ph (1: forward only; 2: forward + loss)" | tee -a $L
SPLAT_TRAIN_FUSED_PHASES=$ph timeout 60 bash -c "$ST bench-raster --synthetic_gaussians 2000000 --resolution 1600x1200 --unfused_ssim triton --repeats 10 --warmup 2 --profile 3 --out /tmp/br2m_ph$ph" 2>&1 | grep "fused (default)" | tee -a $L
done
echo "t=$(( $(date +%s) - T0 ))s after bench 2m" | tee -a $L
timeout 80 bash -c "$ST default --data_dir ../.data/juicebox --data_factor 2 --max_steps 2000 --save_steps 2000 --test_every 0 --num_traj_frames 0 --result_dir /tmp/jb2" > /tmp/train_jb2.log 2>&1; tail -2 /tmp/train_jb2.log | tee -a $L
CK=$(ls /tmp/jb2/ckpts/*rank0.pt 2>/dev/null | tail -1)
if [ -n "$CK" ]; then
timeout 50 bash -c "$ST bench-raster --data_dir ../.data/juicebox --data_factor 2 --ckpt $CK --repeats 20 --warmup 3 --profile 5 --out /tmp/brjb" 2>&1 | grep -v Warn | tail -16 | tee -a $L
cp /tmp/brjb/bench_raster.json $OUT/bench_raster_juicebox_f2_step2000.json
fi
echo "t=$(( $(date +%s) - T0 ))s after juicebox" | tee -a $L
timeout 100 bash -c "$ST bench --synthetic_gaussians 2000000 --resolution 1600x1200 --world_sizes 1 --variants gsplat-dist ours-packed ours-packed-fused --steps 30 --warmup 10 --phase_steps 1 --out /tmp/bench2m" > /tmp/bench2m.log 2>&1; tail -14 /tmp/bench2m.log | tee -a $L
cp /tmp/bench2m/bench.json $OUT/bench_w1_2m.json 2>/dev/null
echo "t=$(( $(date +%s) - T0 ))s done" | tee -a $L

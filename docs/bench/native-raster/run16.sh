#!/usr/bin/env bash
# GPU call for issue 16 (not committed): build, correctness tests, bench-raster. Every step guarded.
set -u
cd "$(dirname "$0")"
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export PYTHONPATH=/tmp/pp:$PYTHONPATH SPLAT_TRAIN_CACHE=/tmp/stc
ST="python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))'"
git_rev=$(cat REV 2>/dev/null); echo "rev $git_rev" | tee $OUT/rev.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
which nvcc; nvcc --version | tail -1
python3 -c "import splat_train,torch;print(splat_train.__path__, torch.__version__, torch.version.cuda)"
T0=$(date +%s)
timeout 240 python3 -c "
import time;t=time.time()
from splat_train.kernels import native
m=native.load()
print('BUILD first use', round(time.time()-t,1), 's, ok =', m is not None, native.LOAD_ERROR)" 2>&1 | tail -5 | tee $OUT/build.txt
timeout 60 python3 -c "
import time;t=time.time()
from splat_train.kernels import native
m=native.load()
print('LOAD second start (cache)', round(time.time()-t,2), 's, ok =', m is not None)" 2>&1 | tail -2 | tee -a $OUT/build.txt
echo "t=$(( $(date +%s) - T0 ))s after build"
timeout 170 python3 -m pytest -m gpu tests/test_gpu_fused_raster.py "tests/test_gpu.py::test_fused_raster_kernel_matches_reference_on_gpu" -x -q -rA 2>&1 | tail -45 > $OUT/tests.txt; tail -8 $OUT/tests.txt
echo "t=$(( $(date +%s) - T0 ))s after tests"
timeout 100 bash -c "$ST bench-raster --synthetic_gaussians 2000000 --resolution 1600x1200 --repeats 20 --warmup 3 --profile 5 --out $OUT/bench_raster_2m" > $OUT/bench_raster_2m.log 2>&1; tail -22 $OUT/bench_raster_2m.log
echo "t=$(( $(date +%s) - T0 ))s after bench 2m"
timeout 90 bash -c "$ST default --data_dir ../.data/juicebox --data_factor 2 --max_steps 2000 --save_steps 2000 --test_every 0 --num_traj_frames 0 --result_dir /tmp/jb2" > $OUT/train_jb2.log 2>&1; tail -3 $OUT/train_jb2.log
CK=$(ls /tmp/jb2/ckpts/*rank0.pt 2>/dev/null | tail -1)
echo "ckpt $CK"
if [ -n "$CK" ]; then
timeout 60 bash -c "$ST bench-raster --data_dir ../.data/juicebox --data_factor 2 --ckpt $CK --repeats 20 --warmup 3 --profile 5 --out $OUT/bench_raster_juicebox_f2_step2000" > $OUT/bench_raster_jb2.log 2>&1; tail -22 $OUT/bench_raster_jb2.log
fi
echo "t=$(( $(date +%s) - T0 ))s done"

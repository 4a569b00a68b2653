# session 10, call 2: why ours-packed-fused ran 0.91x ours-packed on juicebox f2 (call 1) while its
# kernel is 1.36x faster: the per-phase split (bench --phase_steps, CUDA events) of both variants,
# from a 2,000-step juicebox f2 checkpoint, two orders (fused first, then unfused first).
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
( PYTHONPATH=/tmp/pp python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native build (first use):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" > /tmp/native_build.txt 2>&1 ) &
NB=$!
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox; R=/tmp/r2; mkdir -p $R/logs
ST default --data_dir $J --data_factor 2 --max_steps 2000 --eval_steps 30000 --save_steps 2000 --ply_steps 30000 --num_traj_frames 0 --result_dir $R/ck > $R/logs/train.log 2>&1
el "trained: $(tail -2 $R/logs/train.log | head -1)"
wait $NB; cp /tmp/native_build.txt $R/logs/; el "$(cat /tmp/native_build.txt | tail -1)"
ck=$(ls $R/ck/ckpts/ckpt_2000_rank*.pt)
B="--data_dir $J --data_factor 2 --ckpt $ck --world_sizes 1 --steps 100 --warmup 20 --phase_steps 20"
timeout 80 bash -c "$(declare -f ST); ST bench $B --variants ours-packed-fused ours-packed --out $R/bench_a" > $R/logs/bench_a.log 2>&1
el "bench a rc=$?"
timeout 80 bash -c "$(declare -f ST); ST bench $B --variants ours-packed ours-packed-fused --out $R/bench_b" > $R/logs/bench_b.log 2>&1
el "bench b rc=$?"
cp $OUT/timeline.txt $R/logs/
rm -rf $R/ck/ckpts $R/ck/tb $R/ck/ply $R/ck/point_cloud $R/*/phases.png
tar -czf $OUT/s10b.tar.gz -C $R .
el done

# session 11, call 3 on one H200: call 2 again after the second capture fix (the garbage collector held
# off during a capture; a refused capture runs eagerly): the GPU tests of the graphs, sync counts and
# densification; juicebox f2 trainings with a --profile window at steps 3,020-3,049 (eager / graphs,
# unfused / fused, one after the other); bench W = 1 on juicebox f2 from the eager run's checkpoint.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
# the native kernel builds (after the prelude: its TORCH_CUDA_ARCH_LIST) while the graph tests run
( python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native build (first use):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" > /tmp/native_build.txt 2>&1 ) &
NB=$!
R=/tmp/r; mkdir -p $R/logs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/logs/gpu.txt
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k "graph or steady or densifies" -p no:cacheprovider > $R/logs/tests_graphs.log 2>&1
el "graph tests rc=$?: $(tail -1 $R/logs/tests_graphs.log)"
wait $NB; cp /tmp/native_build.txt $R/logs/; el "$(tail -1 /tmp/native_build.txt)"
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
P="--data_dir $J --data_factor 2 --max_steps 3050 --eval_steps 3050 --ply_steps 30000 --num_traj_frames 0 --profile --profile_start_step 3020 --profile_num_steps 30"
for v in "eager:" "graphs:--cuda_graphs" "fused:--raster fused" "fused_graphs:--raster fused --cuda_graphs"; do
  name=${v%%:*}; flags=${v#*:}
  extra=""; [ "$name" = eager ] && extra="--save_steps 3050"
  timeout 75 bash -c "$(declare -f ST); ST default $P $flags $extra --result_dir $R/train_$name" > $R/logs/train_$name.log 2>&1
  el "train $name rc=$?: $(grep -a 'train loop' $R/logs/train_$name.log | tail -1)"
  el "  $(grep -a -o "profile: .*host syncs" $R/logs/train_$name.log | tail -1)"
  el "  $(grep -a "cuda graphs:" $R/logs/train_$name.log | tail -1)"
done
ck=$(ls $R/train_eager/ckpts/ckpt_3050_rank*.pt 2>/dev/null)
timeout 110 bash -c "$(declare -f ST); ST bench --data_dir $J --data_factor 2 --ckpt $ck --world_sizes 1 --variants gsplat-dist ours-dense --variant 'ours-dense-graphs=--cuda_graphs' --variant 'ours-dense-fused=--raster fused' --variant 'ours-dense-fused-graphs=--raster fused --cuda_graphs' --steps 120 --warmup 20 --phase_steps 5 --out $R/bench_f2" > $R/logs/bench_f2.log 2>&1
el "bench f2 rc=$?"
cp $OUT/timeline.txt $R/logs/
find $R -name "trace_rank*.json" -delete
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call3.tar.gz -C $R .
ls -la $OUT
el done

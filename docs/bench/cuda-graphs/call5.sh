# session 12, call 1 on one H200 (call 5 of the cuda-graphs series): graphs.GraphedHead on its own
# cycle-free capture (CapturedGraphs instead of torch.cuda.make_graphed_callables, whose superseded
# graphs waited for the garbage collector: peak 1.57 GiB in call 4) and --profile_mode device. The
# GPU tests of the graphs, sync counts and profile modes; juicebox f2 trainings with a --profile
# window at steps 3,020-3,049 (graphs / eager / fused + graphs, full and device profile modes);
# bench W = 1 from the eager run's step-3,050 checkpoint.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
( python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native build (first use):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" > /tmp/native_build.txt 2>&1 ) &
NB=$!
R=/tmp/r; mkdir -p $R/logs
timeout 150 python3 -m pytest -q -s -m gpu tests/test_gpu.py -k "graph or superseded or refused or steady or profile_window" -p no:cacheprovider > $R/logs/tests_graphs.log 2>&1
el "graph tests rc=$?: $(tail -1 $R/logs/tests_graphs.log)"
wait $NB; cp /tmp/native_build.txt $R/logs/; el "$(tail -1 /tmp/native_build.txt)"
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
P="--data_dir $J --data_factor 2 --max_steps 3050 --eval_steps 3050 --ply_steps 30000 --num_traj_frames 0 --profile --profile_start_step 3020 --profile_num_steps 30"
for v in "graphs:--cuda_graphs" "eager:" "graphs_dev:--cuda_graphs --profile_mode device" "eager_dev:--profile_mode device" "fused_graphs_dev:--raster fused --cuda_graphs --profile_mode device"; do
  name=${v%%:*}; flags=${v#*:}
  timeout 75 bash -c "$(declare -f ST); ST default $P $flags --result_dir $R/train_$name" > $R/logs/train_$name.log 2>&1
  el "train $name rc=$?: $(grep -a 'train loop' $R/logs/train_$name.log | tail -1)"
  el "  $(grep -a -o "profile: .*host syncs" $R/logs/train_$name.log | tail -1)"
  el "  $(grep -a "cuda graphs:" $R/logs/train_$name.log | tail -1)"
  el "  its: $(grep -a -o 'its=[0-9.]*' $R/logs/train_$name.log | uniq | tail -12 | tr '\n' ' ')"
done
ck=$(ls $R/train_eager/ckpts/ckpt_*_rank0.pt 2>/dev/null | tail -1)
timeout 150 bash -c "$(declare -f ST); ST bench --data_dir $J --data_factor 2 --ckpt $ck --world_sizes 1 --variants gsplat-dist ours-dense --variant 'ours-dense-graphs=--cuda_graphs' --variant 'ours-dense-fused=--raster fused' --variant 'ours-dense-fused-graphs=--raster fused --cuda_graphs' --steps 120 --warmup 20 --phase_steps 5 --out $R/bench_f2" > $R/logs/bench_f2.log 2>&1
el "bench f2 rc=$?"; tail -12 $R/logs/bench_f2.log
cp $OUT/timeline.txt $R/logs/
find $R -name "trace_rank*.json" -exec gzip -6 {} \;
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call5.tar.gz -C $R .
ls -la $OUT
el done

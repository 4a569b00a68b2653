# session 18, call 3 on one H200: more of issue 16's quality runs (juicebox f4, 7,000 steps, seeds 13-19,
# --raster unfused vs fused, all 14 at once, as call 2 ran seeds 6-12). Packed into $OUT/call3.tar.gz.
set -o pipefail
O=/tmp/o3; mkdir -p $O
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
source .whl/gpu-prelude.sh > $O/prelude.txt 2>&1 || { cat $O/prelude.txt; exit 1; }
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done: $(tail -1 $O/prelude.txt)"
wait $NB; el "$(cat $O/native_build.txt | tr '\n' ' ')"
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox; R=/tmp/r; mkdir -p $R
RUN="--data_factor 4 --max_steps 7000 --eval_steps 7000 --save_steps 30000 --ply_steps 30000 --num_traj_frames 0"
pids=()
for seed in 13 14 15 16 17 18 19; do
  for v in unfused fused; do
    timeout 520 bash -c "$(declare -f ST); ST default $RUN --data_dir $J --raster $v --seed $seed --result_dir $R/q_${v}_s$seed" > $O/q_${v}_s$seed.log 2>&1 &
    pids+=($!)
  done
done
wait "${pids[@]}"
el "runs done"
for d in $R/q_*; do n=$(basename $d); mkdir -p $O/$n && cp -r $d/stats $d/cfg.yml $O/$n/ 2>/dev/null; done
el done
tar -czf $OUT/call3.tar.gz -C /tmp o3

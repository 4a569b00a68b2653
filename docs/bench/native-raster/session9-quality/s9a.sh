# session 9, call A: merged main on the H200. Native kernel build (cache returned), every -m gpu test,
# issue 16's quality runs (juicebox f4, 7,000 steps, 5 seeds unfused vs fused, 10 at once).
set -o pipefail
source .gpu/setup.sh || exit 1
R=/tmp/r; mkdir -p $R/logs
J=.data/juicebox; NEW=$PWD/.gpu/new
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
git log --oneline -1 2>/dev/null | tee $R/logs/commit.txt
# 1. first-use build of the native kernel, timed; then a second process's load
for i in 1 2; do
  PYTHONPATH=/tmp/pp:$BASEPP python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load(verbose=False)
print('native load $i:', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" 2>&1 | tail -2 | tee -a $R/logs/native_build.txt
done
el "build done"
tar -cJf $OUT/torch_ext.tar.xz -C /tmp/cache torch_extensions 2>/dev/null
# 2. quality runs in the background (10 at once)
RUN="--data_factor 4 --max_steps 7000 --eval_steps 7000 --save_steps 30000 --ply_steps 30000 --num_traj_frames 0"
pids=()
for seed in 1 2 3 4 5; do
  for v in unfused fused; do
    timeout 330 $NEW default $RUN --data_dir $J --raster $v --seed $seed --result_dir $R/q_${v}_s$seed > $R/logs/q_${v}_s$seed.log 2>&1 &
    pids+=($!)
  done
done
# 3. GPU tests beside them (correctness only)
PYTHONPATH=/tmp/pp:$BASEPP timeout 300 python3 -m pytest -m gpu tests -q -p no:cacheprovider -rfs > $R/logs/gpu_tests.log 2>&1; echo "rc=$?" >> $R/logs/gpu_tests.log
el "tests: $(tail -2 $R/logs/gpu_tests.log | tr '\n' ' ')"
wait "${pids[@]}"
el "runs done"
for f in $R/q_*/stats/val_step6999.json $R/q_*/stats/*.json; do :; done
grep -h "^train loop\|PSNR" $R/logs/q_*.log | head -40
find $R -name "*.ply" -delete; rm -rf $R/*/ckpts $R/*/point_cloud $R/*/renders $R/*/tb
tar -czf $OUT/s9a.tar.gz -C $R .
el done

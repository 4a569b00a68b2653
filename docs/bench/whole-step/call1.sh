# session 13, call 1 on one H200: the whole-step replay (trainer/step_graphs.py) against
# HEAD-before (3f2f298, session 12's landed code: head graphs only), both on their defaults.
# GPU tests of the new path first, then the issue's measure (a full-mode --profile window at steps
# 3,020-3,049 on juicebox f2), then juicebox f4 7,000 steps, then the wider GPU tests.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp /tmp/ppold && ln -sfn "$PWD" /tmp/pp/splat_train && ln -sfn "$PWD/.gpu/old" /tmp/ppold/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
BASE=$PYTHONPATH
export PYTHONPATH=/tmp/pp:$BASE
el "prelude done"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
R=/tmp/r1; rm -rf $R; mkdir -p $R/logs
timeout 120 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -k "graphed_whole_step or steady_state" > $R/logs/tests_new.log 2>&1
el "new-path gpu tests rc=$?: $(tail -1 $R/logs/tests_new.log)"; grep -a "^FAILED\|^ERROR\|host syncs" $R/logs/tests_new.log | head -20 | tee -a $OUT/timeline.txt
( python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native build (first use):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" > $R/logs/native_build.txt 2>&1 ) &
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
P2="--data_dir $J --data_factor 2 --max_steps 3050 --eval_steps 3050 --ply_steps 30000 --num_traj_frames 0 --profile --profile_start_step 3020 --profile_num_steps 30"
P4="--data_dir $J --data_factor 4 --max_steps 7000 --eval_steps 7000 --ply_steps 30000 --num_traj_frames 0"
run() {  # name, code (new|old), timeout, args...
  local name=$1 code=$2 to=$3; shift 3
  local pp=/tmp/pp; [ "$code" = old ] && pp=/tmp/ppold
  PYTHONPATH=$pp:$BASE timeout $to bash -c "$(declare -f ST); ST default $* --result_dir $R/$name" > $R/logs/$name.log 2>&1
  el "$name rc=$?: $(grep -a 'train loop' $R/logs/$name.log | tail -1)"
  el "  $(grep -a -o "profile: .*host syncs" $R/logs/$name.log | tail -1)"
  el "  $(grep -a "cuda graphs:" $R/logs/$name.log | tail -1)"
  el "  $(grep -a -o "step [0-9]*: test PSNR [0-9.]* SSIM [0-9.]*" $R/logs/$name.log | tail -1)"
}
run f2_new new 70 $P2
run f2_old old 70 $P2
run f4_new1 new 90 $P4
run f4_old1 old 90 $P4
cat $R/logs/native_build.txt | tee -a $OUT/timeline.txt
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -k "densifies or graphed or superseded or refused" > $R/logs/tests_more.log 2>&1
el "more gpu tests rc=$?: $(tail -1 $R/logs/tests_more.log)"; grep -a "^FAILED\|^ERROR" $R/logs/tests_more.log | head -20 | tee -a $OUT/timeline.txt
cp $OUT/timeline.txt $R/logs/
find $R -name "trace_rank*.json" -exec gzip -6 {} \;
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call1.tar.gz -C $R .
el done

# session 12, call 2 on one H200 (call 6 of the cuda-graphs series): --cuda_graphs auto (on for one
# process on CUDA) is the default now, and captures skip torch.cuda.graph's cache emptying. Every GPU
# test (most trainings now run with graphs), then juicebox f2 trainings of 3,050 steps with a
# --profile_mode device window at steps 3,020-3,049, graphs off / default, interleaved twice.
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
R=/tmp/r; mkdir -p $R/logs
timeout 330 python3 -m pytest -q -m gpu tests -p no:cacheprovider > $R/logs/gpu_tests.log 2>&1
el "gpu tests rc=$?: $(tail -1 $R/logs/gpu_tests.log)"; grep -a "^FAILED\|^ERROR" $R/logs/gpu_tests.log | head -20
cp /tmp/native_build.txt $R/logs/
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
P="--data_dir $J --data_factor 2 --max_steps 3050 --eval_steps 3050 --ply_steps 30000 --num_traj_frames 0 --profile --profile_mode device --profile_start_step 3020 --profile_num_steps 30"
for v in "off1:--cuda_graphs off" "auto1:" "off2:--cuda_graphs off" "auto2:"; do
  name=${v%%:*}; flags=${v#*:}
  timeout 60 bash -c "$(declare -f ST); ST default $P $flags --result_dir $R/train_$name" > $R/logs/train_$name.log 2>&1
  el "train $name rc=$?: $(grep -a 'train loop' $R/logs/train_$name.log | tail -1)"
  el "  $(grep -a -o "profile: .*host syncs" $R/logs/train_$name.log | tail -1)"
  el "  $(grep -a "cuda graphs:" $R/logs/train_$name.log | tail -1)"
  el "  $(grep -a "test PSNR" $R/logs/train_$name.log | tail -1)"
  el "  its: $(grep -a -o 'its=[0-9.]*' $R/logs/train_$name.log | uniq | tail -31 | tr '\n' ' ')"
done
cp $OUT/timeline.txt $R/logs/
find $R -name "trace_rank*.json" -exec gzip -6 {} \;
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call6.tar.gz -C $R .
el done

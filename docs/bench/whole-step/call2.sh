# session 13, call 2 on one H200. Since call 1: a capture empties the allocator's cache only when
# more than 1 GiB lies reserved but unused (graphs.release_dead_pools), and skips its eager
# warm-up where the same image size, SH degree and camera count were warmed up before (call 1:
# 75 tail captures took 3.3 s of a 18.9 s f4 train loop). New-path GPU tests, then the issue's
# measure (full-mode --profile window, steps 3,020-3,049, juicebox f2; call 1's f2 runs found no
# images_2), then juicebox f4 7,000 steps new/old interleaved twice, then a W = 1 bench on f2.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp /tmp/ppold && ln -sfn "$PWD" /tmp/pp/splat_train && ln -sfn "$PWD/.gpu/old" /tmp/ppold/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
BASE=$PYTHONPATH
export PYTHONPATH=/tmp/pp:$BASE
el "prelude done"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
R=/tmp/r2; rm -rf $R; mkdir -p $R/logs
timeout 150 python3 -m pytest -q -s -m gpu tests/test_gpu.py -p no:cacheprovider -k "graphed_whole_step or steady_state or superseded" > $R/logs/tests_new.log 2>&1
el "new-path gpu tests rc=$?: $(tail -1 $R/logs/tests_new.log)"; grep -a "^FAILED\|^ERROR\|host syncs" $R/logs/tests_new.log | head -20 | tee -a $OUT/timeline.txt
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
run f4_new2 new 90 $P4
run f4_old2 old 90 $P4
CK=$(ls $R/f2_new/ckpts/*3050*rank0.pt 2>/dev/null | head -1)
timeout 120 python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' bench --data_dir $J --data_factor 2 --ckpt $CK --world_sizes 1 --variants gsplat-dist ours-dense --variant 'ours-dense-off=--cuda_graphs off' --steps 200 --warmup 20 --phase_steps 5 --out $R/bench_f2 > $R/logs/bench_f2.log 2>&1
el "bench f2 rc=$?"; grep -a "ms/iter\|ours\|gsplat" $R/bench_f2/bench.md 2>/dev/null | head -12 | tee -a $OUT/timeline.txt
cp $OUT/timeline.txt $R/logs/
find $R -name "trace_rank*.json" -exec gzip -6 {} \;
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call2.tar.gz -C $R .
el done

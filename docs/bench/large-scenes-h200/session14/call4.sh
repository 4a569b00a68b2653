# session 14, call 4 on one H200 (issue 19): the 20,000-frame capture's steps/s, streamed under
# --image_cache_gb 2, against juicebox f2 with its images device-resident, in the steady state
# and with the same model: `splat-train bench --ckpt` from a juicebox f2 checkpoint (3,000 default
# steps), 2,000 timed steps after 200 warm-up ones, two variants each. (Call 3's 1,000-step run on
# the capture gave only its peak RSS: its loop included 23 s of first-use Triton compilation.)
# bench takes one --data_dir per invocation, so these are two invocations back to back.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
R=/tmp/r14d; rm -rf $R; mkdir -p $R/logs
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
python3 -m splat_train.scripts.repeat_capture $J /tmp/jb20k --frames 20000 --data_factor 2 > $R/logs/capture20k.log 2>&1
el "capture 20k rc=$?"
timeout 100 bash -c "$(declare -f ST); ST default --data_dir $J --data_factor 2 --max_steps 3000 --eval_steps 30000 --save_steps 3000 --no_save_ply --num_traj_frames 0 --result_dir $R/f2" > $R/logs/f2.log 2>&1
el "f2 rc=$?: $(grep -a 'train loop' $R/logs/f2.log | tail -1 | cut -c1-70)"
CK=$(ls $R/f2/ckpts/*.pt | head -1)
B="--data_factor 2 --ckpt $CK --world_sizes 1 --variants none --steps 2200 --warmup 200 --phase_steps 5"
timeout 60 bash -c "$(declare -f ST); ST bench --data_dir $J $B --variant device_1= --variant device_2= --out $R/bench_f2" > $R/logs/bench_f2.log 2>&1
el "bench f2 rc=$?"; grep -a "^| " $R/bench_f2/bench.md 2>/dev/null | cut -d'|' -f2-6 | tee -a $OUT/timeline.txt
S20="--test_every 0 --device_images_share 0 --image_cache_gb 2"
timeout 120 bash -c "$(declare -f ST); ST bench --data_dir /tmp/jb20k $B --variant \"streamed20k_1=$S20\" --variant \"streamed20k_2=$S20\" --out $R/bench_20k" > $R/logs/bench_20k.log 2>&1
el "bench 20k rc=$?"; grep -a "^| " $R/bench_20k/bench.md 2>/dev/null | cut -d'|' -f2-6 | tee -a $OUT/timeline.txt
cp $OUT/timeline.txt $R/logs/
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call4.tar.gz -C $R .
el done

# session 14, call 3 on one H200 (issue 19's remaining measures).
# (1) Rank 0's memory during an evaluation, before issue 19 (2b260ce: every test view's render
#     and ground truth kept as float32 on rank 0) and now (each view scored as it is rendered):
#     a 2,000-frame capture made from juicebox (250 test views at 960x540), the initial model of
#     --init_type random, evaluated at step 0 (eval_memory.py). This code at 20 M and 2 M
#     Gaussians; 2b260ce at 2 M only (its start-up KNN is a single-threaded KD-tree: minutes at
#     20 M), which the evaluation's host memory does not depend on in either code.
# (2) Host memory of a training run on a dataset far beyond its bound: the 20,000-frame capture
#     (29 GiB of decoded images) streamed under --image_cache_gb 2, 1,000 steps; beside it the
#     device-resident juicebox f2 run of the same length (peak_rss.py: the child's ru_maxrss).
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp /tmp/ppold && ln -sfn "$PWD" /tmp/pp/splat_train && ln -sfn "$PWD/.gpu/old" /tmp/ppold/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
BASE=$PYTHONPATH
export PYTHONPATH=/tmp/pp:$BASE
el "prelude done"
R=/tmp/r14c; rm -rf $R; mkdir -p $R/logs
S=docs/bench/large-scenes-h200/session14
J=.data/juicebox
python3 -m splat_train.scripts.repeat_capture $J /tmp/jb2k --frames 2000 --data_factor 2 > $R/logs/capture2k.log 2>&1
el "capture 2k rc=$?"
E="default --data_dir /tmp/jb2k --data_factor 2 --init_type random --max_steps 1 --eval_steps 0 --num_traj_frames 0 --no_save_eval_images"
timeout 150 python3 $S/eval_memory.py $R/eval_this_20m.json $E --init_num_pts 20000000 --result_dir $R/this20m > $R/logs/eval_this_20m.log 2>&1
el "eval this 20M rc=$?: $(grep -a 'eval memory' $R/logs/eval_this_20m.log | tail -1)"
PYTHONPATH=/tmp/ppold:$BASE timeout 120 python3 $S/eval_memory.py $R/eval_old_2m.json $E --init_num_pts 2000000 --result_dir $R/old2m > $R/logs/eval_old_2m.log 2>&1
el "eval 2b260ce 2M rc=$?: $(grep -a 'eval memory' $R/logs/eval_old_2m.log | tail -1)"
timeout 90 python3 $S/eval_memory.py $R/eval_this_2m.json $E --init_num_pts 2000000 --result_dir $R/this2m > $R/logs/eval_this_2m.log 2>&1
el "eval this 2M rc=$?: $(grep -a 'eval memory' $R/logs/eval_this_2m.log | tail -1)"
python3 -m splat_train.scripts.repeat_capture $J /tmp/jb20k --frames 20000 --data_factor 2 > $R/logs/capture20k.log 2>&1
el "capture 20k rc=$?"
P="--data_factor 2 --max_steps 1000 --eval_steps 30000 --save_steps 30000 --ply_steps 30000 --no_save_ply --num_traj_frames 0 --test_every 0"
timeout 200 python3 $S/peak_rss.py $R/rss_stream20k.json python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' default --data_dir /tmp/jb20k $P --device_images_share 0 --image_cache_gb 2 --result_dir $R/stream20k > $R/logs/stream20k.log 2>&1
el "stream 20k rc=$?: $(grep -a 'peak RSS\|train loop\|image cache:' $R/logs/stream20k.log | cut -c1-110 | tr '\n' '|')"
timeout 60 python3 $S/peak_rss.py $R/rss_device_f2.json python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' default --data_dir $J $P --result_dir $R/device_f2 > $R/logs/device_f2.log 2>&1
el "device f2 rc=$?: $(grep -a 'peak RSS\|train loop' $R/logs/device_f2.log | cut -c1-110 | tr '\n' '|')"
cp $OUT/timeline.txt $R/logs/
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call3.tar.gz -C $R .
el done

# session 14, call 1 on one H200 (issue 19): where does the streamed path's extra time go?
# juicebox f2, 3,000 steps, interleaved three times after a warm-up run that compiles Triton:
#   device     device-resident images (the default)
#   pinned     every image in pinned host memory, the next batch copied ahead (no decoding)
#   streamed   a cache of half the training images, 8 decode threads (one decode per step)
#   streamed2  the same with 2 decode threads
#   cached     streamed with a cache that holds every image (decoded once, then the same
#              upload path as streamed with no decoding)
# This code has the incremental look-ahead plan (one sampler call per step instead of 17,
# and no epoch redrawn at every step near an epoch's end).
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
R=/tmp/r14; rm -rf $R; mkdir -p $R/logs
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
P="--data_dir $J --data_factor 2 --max_steps 3000 --eval_steps 3000 --ply_steps 30000 --save_steps 30000 --num_traj_frames 0 --no_save_eval_images"
timeout 60 bash -c "$(declare -f ST); ST default $P --max_steps 100 --eval_steps 100 --result_dir $R/warm" > $R/logs/warm.log 2>&1
el "warm rc=$?"
for rep in 1 2 3; do
  for v in "device:" "pinned:--device_images_share 0" "streamed:--device_images_share 0 --image_cache_gb 0.05" "streamed2:--device_images_share 0 --image_cache_gb 0.05 --decode_threads 2" "cached:--device_images_share 0 --image_cache_gb 0.2"; do
    name=${v%%:*}_$rep; flags=${v#*:}
    timeout 45 bash -c "$(declare -f ST); ST default $P $flags --result_dir $R/$name" > $R/logs/$name.log 2>&1
    el "$name rc=$?: $(grep -a 'train loop' $R/logs/$name.log | tail -1 | cut -c1-70) | $(grep -a 'image cache:' $R/logs/$name.log | tail -1 | cut -c1-140)"
  done
done
cp $OUT/timeline.txt $R/logs/
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call1.tar.gz -C $R .
el done

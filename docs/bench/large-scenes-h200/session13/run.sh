# session 13, one H200, HEAD with the whole-step CUDA graphs (docs/gpu-bound-step.md, session 13):
# issue 19's streamed-vs-preloaded check with longer train loops than session 13's call 3 (whose
# 1,500-step loops lasted 3.4-4.4 s). juicebox f2, 3,000 steps: device-resident images (default),
# streamed with a cache of half the training images (8 decode threads, the default) and streamed
# with 1 decode thread, interleaved three times, after a warm-up run that compiles Triton.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
R=/tmp/r13; rm -rf $R; mkdir -p $R/logs
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
P="--data_dir $J --data_factor 2 --max_steps 3000 --eval_steps 3000 --ply_steps 30000 --save_steps 30000 --num_traj_frames 0 --no_save_eval_images"
timeout 40 bash -c "$(declare -f ST); ST default $P --max_steps 100 --eval_steps 100 --result_dir $R/warm" > $R/logs/warm.log 2>&1
el "warm rc=$?"
for rep in 1 2 3; do
  for v in "device:" "streamed:--device_images_share 0 --image_cache_gb 0.05" "streamed1:--device_images_share 0 --image_cache_gb 0.05 --decode_threads 1"; do
    name=${v%%:*}_$rep; flags=${v#*:}
    timeout 45 bash -c "$(declare -f ST); ST default $P $flags --result_dir $R/$name" > $R/logs/$name.log 2>&1
    el "$name rc=$?: $(grep -a 'train loop' $R/logs/$name.log | tail -1 | cut -c1-90) | $(grep -a 'cuda graphs:' $R/logs/$name.log | tail -1 | cut -c1-60) | $(grep -a -i 'stream\|decod' $R/logs/$name.log | grep -v outputs | tail -1)"
  done
done
cp $OUT/timeline.txt $R/logs/
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/s13.tar.gz -C $R .
el done

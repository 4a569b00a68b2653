# session 12, one H200: the streaming cache as one pinned buffer of slots (decode threads make no
# CUDA call), so CUDA graphs run with pinned and streamed images too. GPU tests of the two
# placements with graphs; then juicebox f2, 1,500 steps (the device budget left allowed no more): device-resident / pinned / streamed (cache
# 0.05 GiB, half the training images), interleaved twice, after a warm-up run that compiles Triton.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
R=/tmp/r12; rm -rf $R; mkdir -p $R/logs
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
P="--data_dir $J --data_factor 2 --max_steps 1500 --eval_steps 1500 --num_traj_frames 0"
timeout 35 bash -c "$(declare -f ST); ST default $P --max_steps 100 --eval_steps 100 --result_dir $R/warm" > $R/logs/warm.log 2>&1
el "warm rc=$?"
timeout 50 python3 -m pytest -q -m gpu tests/test_gpu.py -k "densifies and (extra6 or extra7)" -p no:cacheprovider > $R/logs/tests.log 2>&1
el "tests rc=$?: $(tail -1 $R/logs/tests.log)"
for rep in 1 2; do
  for v in "device:" "pinned:--device_images_share 0" "streamed:--device_images_share 0 --image_cache_gb 0.05"; do
    name=${v%%:*}_$rep; flags=${v#*:}
    timeout 20 bash -c "$(declare -f ST); ST default $P $flags --result_dir $R/$name" > $R/logs/$name.log 2>&1
    el "$name rc=$?: $(grep -a 'train loop' $R/logs/$name.log | tail -1 | cut -c1-90) | $(grep -a 'cuda graphs:' $R/logs/$name.log | tail -1) | $(grep -a 'image cache:' $R/logs/$name.log | tail -1)"
  done
done
cp $OUT/timeline.txt $R/logs/
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/s12.tar.gz -C $R .
el done

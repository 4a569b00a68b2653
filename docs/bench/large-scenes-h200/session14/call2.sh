# session 14, call 2 on one H200. (1) Issue 19's streamed-against-preloaded check in the steady
# state: `splat-train bench` from a juicebox f2 checkpoint (3,000 default steps), 2,000 steps per
# variant after 200 warm-up steps (no densification, no evaluation inside the timed loop; the
# run-to-run spread of whole 3,000-step runs in call 1 was as large as the effect), the variants
# interleaved three times in one invocation: device-resident (default), pinned, streamed with a
# cache of half the training images (8 and 2 decode threads), and a cache that holds them all.
# (2) Every GPU test on this code (session 13's review fixes had not run on a GPU).
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
R=/tmp/r14b; rm -rf $R; mkdir -p $R/logs
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
timeout 90 bash -c "$(declare -f ST); ST default --data_dir $J --data_factor 2 --max_steps 3000 --eval_steps 3000 --save_steps 3000 --ply_steps 30000 --num_traj_frames 0 --no_save_eval_images --result_dir $R/f2" > $R/logs/f2.log 2>&1
el "f2 rc=$?: $(grep -a 'train loop' $R/logs/f2.log | tail -1 | cut -c1-70)"
CK=$(ls $R/f2/ckpts/*.pt | head -1)
V=()
for rep in 1 2 3; do
  V+=(--variant "device_$rep=" --variant "pinned_$rep=--device_images_share 0" --variant "streamed_$rep=--device_images_share 0 --image_cache_gb 0.05" --variant "streamed2_$rep=--device_images_share 0 --image_cache_gb 0.05 --decode_threads 2" --variant "cached_$rep=--device_images_share 0 --image_cache_gb 0.2")
done
timeout 260 bash -c "$(declare -f ST); ST bench --data_dir $J --data_factor 2 --ckpt $CK --world_sizes 1 --variants gsplat-dist \"\$@\" --steps 2200 --warmup 200 --phase_steps 5 --out $R/bench" _ "${V[@]}" > $R/logs/bench.log 2>&1
el "bench rc=$?"; grep -a "^| " $R/bench/bench.md 2>/dev/null | cut -d'|' -f2-6 | tee -a $OUT/timeline.txt
left=$(( 560 - ($(date +%s) - T0) ))
el "gpu suite with ${left} s"
timeout $left python3 -m pytest -q -m gpu tests -p no:cacheprovider > $R/logs/gpu_tests.log 2>&1
el "gpu tests rc=$?: $(tail -1 $R/logs/gpu_tests.log)"; grep -a "^FAILED\|^ERROR" $R/logs/gpu_tests.log | head -20 | tee -a $OUT/timeline.txt
cp $OUT/timeline.txt $R/logs/
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call2.tar.gz -C $R .
el done

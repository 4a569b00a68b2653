# session 13, call 3 on one H200, HEAD with the whole-step replay. (1) Issue 19's loader check:
# juicebox f2, 1,500 steps, images device-resident / pinned / streamed (cache 0.05 GiB, half the
# training images), interleaved twice, after a warm-up run that compiles Triton. (2) The 2 M
# synthetic bench at W = 1. (3) Every GPU test, with the native build, in what time is left.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
R=/tmp/r3; rm -rf $R; mkdir -p $R/logs
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
P="--data_dir $J --data_factor 2 --max_steps 1500 --eval_steps 1500 --ply_steps 30000 --num_traj_frames 0"
timeout 40 bash -c "$(declare -f ST); ST default $P --max_steps 100 --eval_steps 100 --result_dir $R/warm" > $R/logs/warm.log 2>&1
el "warm rc=$?"
for rep in 1 2; do
  for v in "device:" "pinned:--device_images_share 0" "streamed:--device_images_share 0 --image_cache_gb 0.05"; do
    name=${v%%:*}_$rep; flags=${v#*:}
    timeout 40 bash -c "$(declare -f ST); ST default $P $flags --result_dir $R/$name" > $R/logs/$name.log 2>&1
    el "$name rc=$?: $(grep -a 'train loop' $R/logs/$name.log | tail -1 | cut -c1-90) | $(grep -a 'cuda graphs:' $R/logs/$name.log | tail -1) | $(grep -a 'image cache:\|streamed' $R/logs/$name.log | tail -1)"
  done
done
timeout 150 bash -c "$(declare -f ST); ST bench --synthetic_gaussians 2000000 --resolution 1600x1200 --num_cameras 10 --world_sizes 1 --variants gsplat-dist ours-dense --variant 'ours-dense-off=--cuda_graphs off' --steps 40 --warmup 10 --phase_steps 5 --out $R/bench_2m" > $R/logs/bench_2m.log 2>&1
el "bench 2m rc=$?"; grep -a "^| \|CUDA graphs" $R/bench_2m/bench.md 2>/dev/null | head -8 | tee -a $OUT/timeline.txt
left=$(( 540 - ($(date +%s) - T0) ))
el "gpu suite with ${left} s"
timeout $left python3 -m pytest -q -m gpu tests -p no:cacheprovider > $R/logs/gpu_tests.log 2>&1
el "gpu tests rc=$?: $(tail -1 $R/logs/gpu_tests.log)"; grep -a "^FAILED\|^ERROR" $R/logs/gpu_tests.log | head -20 | tee -a $OUT/timeline.txt
cp $OUT/timeline.txt $R/logs/
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call3.tar.gz -C $R .
el done
